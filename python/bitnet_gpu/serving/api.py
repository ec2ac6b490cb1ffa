"""The HTTP side (FastAPI): OpenAI's /v1/models, /v1/completions and /v1/chat/completions, streamed
as server-sent events (sse-starlette) or returned whole, /health and /metrics, errors in OpenAI's
JSON shape, and a bearer token where the server has an API key. The engine runs generation; this
module turns requests into its work and its ids into replies."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from sse_starlette.sse import AppStatus

from .. import _core
from ..models.text_generation import prompt_ids
from .protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    completion_id,
    created,
    error_body,
    unsupported,
)
from .requests import Generation, Piece, sampling_of

if TYPE_CHECKING:
    from .engine import Engine
    from .metrics import Metrics

__all__ = ["create_app"]

# OpenAI's default max_tokens for completions; a chat reply may take the rest of the context.
_COMPLETION_TOKENS = 16


def create_app(engine: Engine, metrics: Metrics, name: str, api_key: str | None = None) -> FastAPI:
    """The app serving `engine`'s model as `name`; the engine's thread starts with the app and
    finishes the requests in flight when it stops (uvicorn waits for their replies on SIGTERM)."""
    model = engine.model
    # Streams end when their generation does, not when the server is told to stop.
    AppStatus.disable_automatic_graceful_drain()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        yield
        engine.stop()

    app = FastAPI(title="bitnet_gpu", lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error_body(error), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        if first.get("type") == "json_invalid":
            return await api_error(request, ApiError(400, "the body is not valid JSON"))
        where = [str(part) for part in first.get("loc", ()) if part != "body"]
        field = where[0] if where else None
        message = f"{'.'.join(where)}: {first.get('msg', 'invalid')}" if where else "invalid body"
        return await api_error(request, ApiError(400, message, field))

    @app.middleware("http")
    async def count(request: Request, call_next: Any) -> Response:
        if api_key is not None and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization") != f"Bearer {api_key}":
                error = ApiError(401, "a valid API key is required (Authorization: Bearer ...)")
                response: Response = JSONResponse(error_body(error), status_code=401)
                metrics.requests.labels(request.url.path, "401").inc()
                return response
        response = await call_next(request)
        metrics.requests.labels(request.url.path, str(response.status_code)).inc()
        return response

    def check_model(body: Any) -> None:
        if body.model != name:
            raise ApiError(
                404, f"the model {body.model!r} does not exist", "model", "invalid_request_error"
            )
        unsupported(body)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": started,
                    "owned_by": "bitnet_gpu",
                    "max_model_len": engine.context,
                }
            ],
        }

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.alive else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.sample(engine.waiting, engine.running)
        return Response(metrics.text(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        check_model(body)
        prompts = _completion_prompts(model, body.prompt)
        options = sampling_of(model, body, _COMPLETION_TOKENS)
        generation = _generation(engine, metrics, body, prompts, options, "prompt")
        reply = _Reply(body, generation, "text_completion", chat=False)
        return await reply.respond(request)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        check_model(body)
        prompt = _chat_prompt(model, body.messages)
        options = sampling_of(model, body, max(1, engine.context - len(prompt) + 1))
        generation = _generation(engine, metrics, body, [prompt], options, "messages")
        reply = _Reply(body, generation, "chat.completion", chat=True)
        return await reply.respond(request)

    started = created()
    return app


def _generation(engine, metrics, body, prompts, options, field: str) -> Generation:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    ignore_eos = bool((body.model_extra or {}).get("ignore_eos", False))
    return Generation(engine, metrics, prompts, options, stop, ignore_eos, field)


def _completion_prompts(model, prompt: Any) -> list[np.ndarray]:
    """A text, a list of texts, a list of ids or a list of lists of ids: one prompt each."""
    if isinstance(prompt, str):
        texts: list[Any] = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        texts = [prompt]
    else:
        texts = list(prompt)
    if not texts:
        raise ApiError(400, "prompt: expected at least one prompt", "prompt")
    prompts = []
    vocab = model.config.vocab_size
    for item in texts:
        if isinstance(item, str):
            prompts.append(_encoded(model, item, "prompt"))
            continue
        ids = np.array(item, np.int64)
        if ids.size == 0 or ids.min() < 0 or ids.max() >= vocab:
            raise ApiError(
                400, f"prompt: token ids must lie in [0, {vocab}), one or more", "prompt"
            )
        prompts.append(ids)
    return prompts


def _chat_prompt(model, messages: list[dict[str, Any]]) -> np.ndarray:
    """The conversation through the chat template (content given as text parts joined; the
    template's own check of each role and content answers the rest)."""
    conversation = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise ApiError(400, f"messages.{i}.content: only text parts", "messages")
            content = "".join(str(p.get("text", "")) for p in content)
        conversation.append({"role": message.get("role"), "content": content})
    if not conversation:
        raise ApiError(400, "messages: expected at least one message", "messages")
    return _encoded(model, conversation, "messages")


def _encoded(model, prompt: Any, field: str) -> np.ndarray:
    try:
        return prompt_ids(model, prompt)
    except Exception as error:  # tokenizer, template (jinja2) or an empty encoding
        raise ApiError(400, f"{field}: {error}", field) from None


class _Reply:
    """A Generation as OpenAI's reply: streamed chunks (then [DONE]) or one JSON object."""

    def __init__(self, body: Any, generation: Generation, kind: str, chat: bool) -> None:
        self.body, self.generation, self.kind, self.chat = body, generation, kind, chat
        self.id = completion_id("chatcmpl" if chat else "cmpl")
        self.created = created()
        self.usage_chunks = bool((body.stream_options or {}).get("include_usage"))

    async def respond(self, request: Request) -> Any:
        if self.body.stream:
            return EventSourceResponse(self._events(request), ping=15)
        texts = [""] * len(self.generation.choices)
        reasons: list[str | None] = [None] * len(texts)
        async for piece in self.generation.pieces(request.is_disconnected):
            texts[piece.index] += piece.text
            reasons[piece.index] = piece.finish_reason or reasons[piece.index]
        choices = [
            self._choice(i, text, reason) for i, (text, reason) in enumerate(zip(texts, reasons))
        ]
        return {
            "id": self.id,
            "object": self.kind,
            "created": self.created,
            "model": self.body.model,
            "choices": choices,
            "usage": self.generation.usage(),
        }

    def _choice(self, index: int, text: str, reason: str | None) -> dict[str, Any]:
        if self.chat:
            message = {"role": "assistant", "content": text}
            return {"index": index, "message": message, "logprobs": None, "finish_reason": reason}
        return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}

    def _chunk(self, piece: Piece | None, first: bool = False) -> str:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.body.model,
            "choices": [],
        }
        if piece is not None and self.chat:
            delta = (
                {"role": "assistant", "content": piece.text} if first else {"content": piece.text}
            )
            chunk["choices"] = [
                {
                    "index": piece.index,
                    "delta": delta if piece.text or first else {},
                    "logprobs": None,
                    "finish_reason": piece.finish_reason,
                }
            ]
        elif piece is not None:
            chunk["choices"] = [
                {
                    "index": piece.index,
                    "text": piece.text,
                    "logprobs": None,
                    "finish_reason": piece.finish_reason,
                }
            ]
        if self.usage_chunks:
            chunk["usage"] = self.generation.usage() if piece is None else None
        return json.dumps(chunk, ensure_ascii=False)

    async def _events(self, request: Request) -> AsyncIterator[str]:
        opened = set()
        try:
            async for piece in self.generation.pieces(request.is_disconnected):
                yield self._chunk(piece, first=piece.index not in opened)
                opened.add(piece.index)
        except ApiError as error:
            yield json.dumps(error_body(error))
            return
        except _core.Error as error:
            yield json.dumps(error_body(ApiError(500, str(error))))
            return
        if self.usage_chunks:
            yield self._chunk(None)
        yield "[DONE]"
