"""The OpenAI API subset the server speaks: request bodies (pydantic), the options they map to,
errors in OpenAI's JSON shape, and a reply's text as tokens arrive (stop strings held back)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..text import Tokenizer

__all__ = [
    "ApiError",
    "ChatRequest",
    "CompletionRequest",
    "TextStream",
    "completion_id",
    "created",
    "error_body",
    "unsupported",
]


class ApiError(Exception):
    """An error as OpenAI's API reports it: an HTTP status, a message, the parameter it names."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.kind = kind or {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
            429: "rate_limit_error",
        }.get(status, "server_error")


def error_body(error: ApiError) -> dict[str, Any]:
    return {
        "error": {
            "message": error.message,
            "type": error.kind,
            "param": error.param,
            "code": None,
        }
    }


class _Request(BaseModel):
    """What completions and chat completions share. Fields the server does not run raise 400
    when set to anything but their neutral value (unsupported)."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=1e37)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = None  # vLLM's extension: -1 or 0 for none
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    user: str | None = None


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]


class ChatRequest(_Request):
    messages: list[dict[str, Any]]


# Options OpenAI clients may send that change what a reply would be: allowed only at the value that
# changes nothing.
_NEUTRAL: dict[str, Any] = {
    "n": 1,
    "best_of": 1,
    "echo": False,
    "logprobs": None,
    "top_logprobs": None,
    "logit_bias": None,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "repetition_penalty": 1,
    "suffix": None,
    "tools": None,
    "tool_choice": None,
    "functions": None,
    "function_call": None,
    "min_p": 0,
    "response_format": None,
}


def unsupported(request: _Request) -> None:
    """ApiError 400 naming the first option set to a value the server does not run."""
    values = request.model_dump()
    values.update(request.model_extra or {})
    for name, neutral in _NEUTRAL.items():
        value = values.get(name, neutral)
        if name == "logprobs" and value is False:
            continue
        if name == "response_format" and value in (None, {"type": "text"}):
            continue
        if value not in (neutral, None) or (name == "n" and value != 1):
            raise ApiError(400, f"{name}={value!r} is not supported by this server", name)


class TextStream:
    """A reply's text as its ids arrive: whole characters only, and never text that could begin a
    stop string until it cannot (`stopped` once one appears: the text ends before it).

    Each id decodes only the ids since the last piece was cut, and a few before them for context
    (incremental detokenization, as vLLM's): the cost of an id stays flat however long the reply."""

    def __init__(self, tokenizer: Tokenizer, stop: list[str]) -> None:
        self.tokenizer, self.stop = tokenizer, [s for s in stop if s]
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] decode to the text already cut into pieces ...
        self.read = 0  # ... and ids[read:] to what is still pending
        self.decoded = ""  # the text of every id so far, as its pieces were cut
        self.sent = 0
        self.stopped = False
        self.text = ""

    def push(self, token: int) -> str:
        """The new text safe to send after `token`."""
        self.ids.append(token)
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        now = self.tokenizer.decode(self.ids[self.prefix :])
        if len(now) <= len(before) or now.endswith("\ufffd"):  # a character's bytes not all there
            return ""
        self.decoded += now[len(before) :]
        self.prefix, self.read = self.read, len(self.ids)
        return self._advance(self.decoded, final=False)

    def close(self) -> str:
        """The text held back, at the reply's end."""
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        now = self.tokenizer.decode(self.ids[self.prefix :]).rstrip("\ufffd")
        if len(now) > len(before):
            self.decoded += now[len(before) :]
        return self._advance(self.decoded, final=True)

    def _advance(self, text: str, final: bool) -> str:
        if self.stopped:
            return ""
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            text, self.stopped, final = text[:cut], True, True
        # Text that could be the start of a stop string waits until it cannot.
        hold = 0 if final else max((len(s) - 1 for s in self.stop), default=0)
        safe = max(self.sent, len(text) - hold)
        piece = text[self.sent : safe]
        self.sent = safe
        self.text = text[:safe] if not final else text
        return piece


def completion_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def created() -> int:
    return int(time.time())
