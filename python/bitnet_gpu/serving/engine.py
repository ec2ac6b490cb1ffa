"""The engine: one thread owns the model and the GPU, and runs continuous batching over a pool of
KV cache slots. Each turn of its loop admits waiting requests into free slots, feeds the next
chunk of the oldest prompt still being read (with the chunks of as many tokens of other prompts,
up to the model's prefill_chunk tokens in all), and runs one decode step of every request already
decoding; a request leaves the batch (its slot freed) when it ends, is cancelled, or its client
goes away.

A request's ids are those generate_text gives it alone on the same model: its prompt is fed in
the chunks generation feeds it in, every step computes each row as that row alone (decode steps
of any size take one attention split: the engine sets the model's split_by_context off), and each
row draws with its own sampling parameters keyed by its own seed and positions, as alone.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .. import _core
from ..models import Pick, Step
from ..sampling import sampling_params, sampling_rows

if TYPE_CHECKING:
    from ..models import BitNetModel

__all__ = ["Engine", "EngineRequest", "QueueFull"]


class QueueFull(_core.Error):
    """Every slot is busy and the waiting queue is full (HTTP 429)."""


@dataclasses.dataclass(eq=False)
class EngineRequest:
    """One sequence to continue: its prompt ids, how many new ids at most, its sampling parameters
    (sampling.sampling_params' [6], None for greedy) and end ids; `emit(id)` gets each new id and
    `finish(reason)` the end ("stop", "length", "cancelled" or an error's message), both on the
    engine's thread."""

    prompt: np.ndarray
    max_new_tokens: int
    sampling: np.ndarray | None
    ends: frozenset[int]
    emit: Callable[[int], None]
    finish: Callable[[str], None]
    id: int = dataclasses.field(default_factory=itertools.count().__next__)
    arrived: float = dataclasses.field(default_factory=time.perf_counter)
    # The engine's state of it.
    slot: int = -1
    cached: int = 0  # prompt ids (then ids) in its cache slot
    pending: int = -1  # the last id made, fed by the next decode step
    made: int = 0
    cancelled: bool = False

    def cancel(self) -> None:
        """Asks the engine to drop the request at its next turn (its slot freed within a step)."""
        self.cancelled = True

    @property
    def prefilled(self) -> bool:
        return self.cached >= len(self.prompt)


class Engine:
    """Continuous batching over `max_batch` slots of `model`, on a thread of its own (start()).
    Requests wait in a queue of at most `max_queue`; submit() raises QueueFull beyond it. `on_step`
    (batch size, seconds) is called after every decode step (metrics)."""

    def __init__(
        self,
        model: BitNetModel,
        max_batch: int = 64,
        max_queue: int = 256,
        on_step: Callable[[int, float], None] | None = None,
    ) -> None:
        self.model = model
        self.max_batch, self.max_queue = max_batch, max_queue
        self.on_step = on_step
        # Every step of any size sums a row's attention as alone (step.DecodePolicy).
        model.policy = dataclasses.replace(model.policy, split_by_context=False)
        self.pool = model.runner.pool(max_batch)
        self._free = list(range(max_batch))
        self._waiting: collections.deque[EngineRequest] = collections.deque()
        self._active: list[EngineRequest] = []
        self._lock = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.steps = 0

    # ------------------------------------------------------------------------------ public
    def warm_up(self, prompt_tokens: Sequence[int] = ()) -> None:
        """Builds the screened head and records the decode graphs of every batch size and pick,
        and the prefill graphs of prompts (or prompt chunks) of `prompt_tokens` tokens, so that no
        request waits for a recording (a prompt of another length records its graph when it
        comes: of those, the pool keeps the latest few)."""
        self.model.prepare_screened_head()
        vocab = self.model.config.vocab_size
        picks = [
            (Pick.ARGMAX, None),
            (Pick.SAMPLE, sampling_params(1.0, 50, 0, vocab)),
            (Pick.NUCLEUS, sampling_params(1.0, None, 0, vocab, 0.9)),
            (Pick.NUCLEUS_TOP_K, sampling_params(1.0, 50, 0, vocab, 0.9)),
        ]
        chunk = self.model.policy.prefill_chunk
        shapes = [(batch, 1) for batch in range(1, self.max_batch + 1)]
        widths = {min(t, chunk) for t in prompt_tokens} | {t % chunk for t in prompt_tokens}
        for width in sorted(widths - {0}):  # chunks of one width prefill together
            most = min(self.max_batch, max(1, chunk // width))
            shapes += [(batch, width) for batch in range(1, most + 1)]
        prefill = len(picks) * sum(1 for _, tokens in shapes if tokens > 1)
        self.pool.graphs.kept_prefill = max(self.pool.graphs.kept_prefill, prefill)
        for batch, tokens in shapes:
            for pick, params in picks:
                rows = None if params is None else sampling_rows([params] * batch, [0] * batch)
                ids = tuple(np.zeros(tokens, np.int32) for _ in range(batch))
                step = Step(np.arange(batch), np.zeros(batch, np.int64), ids, pick, sampling=rows)
                self.pool.graphs.get(self.model.runner.plan(step))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="bitnet-gpu-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Finishes the requests already admitted or waiting, then ends the thread."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, request: EngineRequest) -> EngineRequest:
        """Queues a request: ShapeError where its prompt leaves no room in a slot, QueueFull where
        the queue is full, ArgumentError once the engine is stopping."""
        if request.max_new_tokens < 1:
            raise _core.ArgumentError("max_new_tokens must be at least 1")
        misfit = self.misfit(len(request.prompt), request.max_new_tokens)
        if misfit is not None:
            raise _core.ShapeError(misfit[1])
        with self._lock:
            if self._stopping:
                raise _core.ArgumentError("the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"the queue of {self.max_queue} waiting requests is full")
            self._waiting.append(request)
            self._lock.notify_all()
        return request

    def misfit(self, prompt_tokens: int, max_new_tokens: int) -> tuple[str, str] | None:
        """What keeps a request out of a slot: ("prompt", why) where its prompt leaves no room,
        ("max_new_tokens", why) where its new ids would pass the context (the last new id is made,
        not cached, as generation bounds it), else None."""
        if 0 < prompt_tokens < self.context and prompt_tokens + max_new_tokens - 1 <= self.context:
            return None
        field = "prompt" if not 0 < prompt_tokens < self.context else "max_new_tokens"
        return field, (
            f"this model's context is {self.context} tokens: {prompt_tokens} prompt tokens and "
            f"{max_new_tokens} new ones exceed it"
        )

    @property
    def context(self) -> int:
        """Tokens a slot holds: a prompt and its new ids (less the last) must fit."""
        return self.pool.max_tokens

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._active)

    # ------------------------------------------------------------------------------- loop
    def _loop(self) -> None:
        while True:
            with self._lock:
                while not (self._waiting or self._active or self._stopping):
                    self._lock.wait()
                if self._stopping and not self._waiting and not self._active:
                    return
                for request in [r for r in self._waiting if r.cancelled]:
                    self._waiting.remove(request)
                    request.finish("cancelled")
                while self._waiting and self._free:
                    request = self._waiting.popleft()
                    request.slot = self._free.pop(0)
                    self._active.append(request)
            try:
                self._turn()
            except Exception as error:  # a device error, out of memory: every request ends
                for request in self._active:
                    self._release(request, f"error: {error}")

    def _turn(self) -> None:
        for request in [r for r in self._active if r.cancelled]:
            self._release(request, "cancelled")
        reading = [r for r in self._active if not r.prefilled]
        if reading:
            self._prefill(reading)
        decoding = [r for r in self._active if r.prefilled and r.made > 0]
        if decoding:
            self._decode(decoding)

    def _rows(self, requests: list[EngineRequest]) -> tuple[Pick, np.ndarray | None]:
        """The pick a step of these requests needs and each one's sampling parameters (keyed by
        row 0: each drawn as alone)."""
        vocab = self.model.config.vocab_size
        params = [
            r.sampling if r.sampling is not None else sampling_params(0.0, None, 0, vocab)
            for r in requests
        ]
        rows = sampling_rows(params, [0] * len(requests))
        pick = Pick.for_sampling(rows)
        return pick, (rows if pick.draws else None)

    def _chunk(self, request: EngineRequest) -> int:
        """Tokens of the request's prompt its next prefill step feeds."""
        return min(self.model.policy.prefill_chunk, len(request.prompt) - request.cached)

    def _prefill(self, reading: list[EngineRequest]) -> None:
        """One prefill step: the next chunk of the oldest prompt still being read, with those of
        the prompts whose next chunks are as long (up to prefill_chunk tokens in all): a step of
        chunks of one length computes each row as alone; mixed lengths would not."""
        reading = sorted(reading, key=lambda r: r.arrived)
        width = self._chunk(reading[0])
        most = max(1, self.model.policy.prefill_chunk // width)
        group = [r for r in reading if self._chunk(r) == width][:most]
        pick, rows = self._rows(group)
        ids = tuple(r.prompt[r.cached : r.cached + width].astype(np.int32) for r in group)
        step = Step(
            np.array([r.slot for r in group]),
            np.array([r.cached for r in group]),
            ids,
            pick,
            sampling=rows,
        )
        chosen = self.model.runner.run(self.pool, step).ids()
        for request, token in zip(group, chosen):
            request.cached += width
            if request.prefilled:
                self._made(request, int(token))

    def _decode(self, requests: list[EngineRequest]) -> None:
        """One decode step of every request: each one's pending id fed, its next id made."""
        pick, rows = self._rows(requests)
        step = Step(
            np.array([r.slot for r in requests]),
            np.array([r.cached for r in requests]),
            tuple(np.array([r.pending], np.int32) for r in requests),
            pick,
            sampling=rows,
        )
        begin = time.perf_counter()
        chosen = self.model.runner.run(self.pool, step).ids()
        self.steps += 1
        if self.on_step is not None:
            self.on_step(len(requests), time.perf_counter() - begin)
        for request, token in zip(requests, chosen):
            request.cached += 1
            self._made(request, int(token))

    def _made(self, request: EngineRequest, token: int) -> None:
        request.made += 1
        request.pending = token
        if token in request.ends:
            self._release(request, "stop")
            return
        request.emit(token)
        if request.made >= request.max_new_tokens:
            self._release(request, "length")

    def _release(self, request: EngineRequest, reason: str) -> None:
        if request in self._active:
            self._active.remove(request)
            self._free.append(request.slot)
            self._free.sort()
        request.finish(reason)
