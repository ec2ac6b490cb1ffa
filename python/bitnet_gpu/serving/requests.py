"""One HTTP request's generation on the event loop: its prompts turned into engine requests, the
ids the engine thread makes brought onto the loop, and the text of each choice as it grows (stop
strings cut it); what the routes of api.py stream or return."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from ..models.generation import GenerationOptions, end_ids
from .engine import EngineRequest, QueueFull
from .protocol import ApiError, TextStream

if TYPE_CHECKING:
    from ..models import BitNetModel
    from .engine import Engine
    from .metrics import Metrics

__all__ = ["Generation", "Piece", "sampling_of"]


def sampling_of(model: BitNetModel, body: Any, default_tokens: int) -> GenerationOptions:
    """The request's options as generate_text resolves them (unset sampling fields from
    generation_config.json; no seed: a fresh one), ApiError 400 naming a bad field."""
    top_k = body.top_k
    if top_k is not None and top_k < -1:
        raise ApiError(400, f"top_k must be -1, 0 (none) or at least 1, got {top_k}", "top_k")
    tokens = body.max_completion_tokens if body.max_tokens is None else body.max_tokens
    seed = secrets.randbits(63) if body.seed is None else body.seed
    try:
        options = GenerationOptions(
            default_tokens if tokens is None else tokens,
            temperature=body.temperature,
            top_k=top_k if top_k is not None and top_k > 0 else None,
            top_p=body.top_p,
            seed=seed,
        )
        options = options.resolved(model.generation_config, text=True)
        options.sampling(model.config.vocab_size)  # checks top_k against the vocabulary
    except (_core.Error, TypeError) as error:
        raise ApiError(400, str(error)) from None
    return options


@dataclasses.dataclass(frozen=True)
class Piece:
    """New text of choice `index`, and its finish_reason once it ends ("stop" or "length")."""

    index: int
    text: str
    finish_reason: str | None = None


@dataclasses.dataclass(eq=False)
class _Choice:
    request: EngineRequest
    text: TextStream
    first: float = 0.0
    last: float = 0.0
    reason: str | None = None


class Generation:
    """The engine requests of one HTTP request (one a prompt), submitted at construction: ApiError
    429 where the queue is full (none of them left queued), 400 where a prompt does not fit."""

    def __init__(
        self,
        engine: Engine,
        metrics: Metrics,
        prompts: list[np.ndarray],
        options: GenerationOptions,
        stop: list[str],
        ignore_eos: bool,
        prompt_field: str,
    ) -> None:
        model = engine.model
        self.metrics = metrics
        self.arrived = time.perf_counter()
        self.queue: asyncio.Queue[tuple[int, int | None, str | None]] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        tokenizer = model.tokenizer
        if tokenizer is None:
            raise ApiError(400, "this server's model has no tokenizer to write text with")
        ends = frozenset() if ignore_eos else frozenset(end_ids(None, model.generation_config))
        sampling = options.sampling(model.config.vocab_size)
        self.choices: list[_Choice] = []
        for index, prompt in enumerate(prompts):  # every prompt checked before any is queued
            misfit = engine.misfit(len(prompt), int(options.max_new_tokens or 0))
            if misfit is not None:
                field = prompt_field if misfit[0] == "prompt" else "max_tokens"
                raise ApiError(400, misfit[1], field)
            request = EngineRequest(
                prompt=prompt,
                max_new_tokens=int(options.max_new_tokens or 0),
                sampling=sampling,
                ends=ends,
                emit=functools.partial(self._post_token, loop, index),
                finish=functools.partial(self._post_end, loop, index),
            )
            self.choices.append(_Choice(request, TextStream(tokenizer, stop)))
        try:
            for choice in self.choices:
                engine.submit(choice.request)
        except QueueFull as error:
            self.cancel()
            raise ApiError(429, str(error)) from None
        except _core.Error as error:
            self.cancel()
            raise ApiError(400, str(error), prompt_field) from None
        metrics.prompt_tokens.inc(sum(len(p) for p in prompts))

    def _post_token(self, loop: asyncio.AbstractEventLoop, index: int, token: int) -> None:
        self._post(loop, (index, token, None))

    def _post_end(self, loop: asyncio.AbstractEventLoop, index: int, reason: str) -> None:
        self._post(loop, (index, None, reason))

    def _post(
        self, loop: asyncio.AbstractEventLoop, item: tuple[int, int | None, str | None]
    ) -> None:
        """From the engine's thread onto the loop's queue."""
        try:
            loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop has closed: nobody is listening
            pass

    def cancel(self) -> None:
        for choice in self.choices:
            choice.request.cancel()

    @property
    def prompt_tokens(self) -> int:
        return sum(len(c.request.prompt) for c in self.choices)

    @property
    def completion_tokens(self) -> int:
        return sum(c.request.made for c in self.choices)

    def usage(self) -> dict[str, int]:
        prompt, made = self.prompt_tokens, self.completion_tokens
        return {"prompt_tokens": prompt, "completion_tokens": made, "total_tokens": prompt + made}

    async def pieces(self, disconnected: Callable[[], Awaitable[bool]]) -> AsyncIterator[Piece]:
        """Each choice's text as it grows, then its end; every engine request is cancelled when
        the client goes away (`disconnected`, asked between ids) or the iteration stops early."""
        open_choices = len(self.choices)
        try:
            while open_choices:
                try:
                    index, token, reason = await asyncio.wait_for(self.queue.get(), 0.1)
                except asyncio.TimeoutError:
                    if await disconnected():
                        return
                    continue
                choice = self.choices[index]
                if token is not None:
                    text = self._token(choice, token)
                    if text:
                        yield Piece(index, text)
                    continue
                open_choices -= 1
                yield Piece(index, choice.text.close(), self._finished(choice, reason or ""))
        finally:
            self.cancel()
            self.metrics.latency.observe(time.perf_counter() - self.arrived)

    def _token(self, choice: _Choice, token: int) -> str:
        now = time.perf_counter()
        if choice.first == 0.0:
            choice.first = now
            self.metrics.ttft.observe(now - self.arrived)
        else:
            self.metrics.itl.observe(now - choice.last)
        choice.last = now
        self.metrics.generated_tokens.inc()
        if choice.text.stopped:
            return ""
        text = choice.text.push(token)
        if choice.text.stopped:  # a stop string: the engine may drop the request
            choice.request.cancel()
        return text

    @staticmethod
    def _finished(choice: _Choice, reason: str) -> str:
        if reason.startswith("error"):
            raise ApiError(500, f"generation failed: {reason}")
        return "stop" if choice.text.stopped or reason == "stop" else "length"
