"""Text in, text out: a prompt or a conversation through the checkpoint's tokenizer and chat
template, the new ids streamed back as whole characters (BitNetModel.stream_text and
generate_text)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from ..text import Tokenizer, stream_pieces
from .generation import GenerationOptions, end_ids, stream_ids

if TYPE_CHECKING:
    from .model import BitNetModel
    from .session import DecodeSession

__all__ = ["prompt_ids", "stream_text", "generate_text"]


def _tokenizer(model: BitNetModel) -> Tokenizer:
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise _core.ArgumentError(
            "this model has no tokenizer: load a checkpoint directory holding tokenizer.json, "
            "or set model.tokenizer"
        )
    return tokenizer


def _is_conversation(prompt: Any) -> bool:
    return (
        isinstance(prompt, (list, tuple))
        and bool(prompt)
        and all(isinstance(m, dict) for m in prompt)
    )


def prompt_ids(model: BitNetModel, prompt: Any) -> np.ndarray:
    """The ids of a text prompt (encoded with the special tokens the tokenizer adds) or of a
    conversation ([{"role": ..., "content": ...}], through the chat template, ready for the
    assistant's turn)."""
    tokenizer = _tokenizer(model)
    if isinstance(prompt, str):
        ids: Any = tokenizer.encode(prompt)
    elif _is_conversation(prompt):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    else:
        raise TypeError("prompt: expected a str or a list of {'role', 'content'} messages")
    if not ids:
        raise _core.ArgumentError("prompt: the text encodes to no tokens")
    return np.array(ids, np.int64)


def _continued(model: BitNetModel, ids: np.ndarray, session: Any) -> tuple[DecodeSession, Any]:
    """(the session to feed, the ids to feed it): a given session of one sequence goes on where
    the prompt's ids begin with the ones it holds (only the rest is fed), else starts again."""
    from .session import DecodeSession

    if session is None:
        return model.shared_session(1), ids
    if not isinstance(session, DecodeSession) or session.model is not model or session.batch != 1:
        raise _core.ArgumentError("session: expected a DecodeSession of this model's, batch 1")
    held = session.token_ids[0]
    if len(held) <= len(ids) and np.array_equal(held, ids[: len(held)]):
        return session, ids[len(held) :]
    session.reset()
    return session, ids


def stream_text(model: BitNetModel, prompt: Any, options: GenerationOptions) -> Iterator[str]:
    """See BitNetModel.stream_text."""
    ids = prompt_ids(model, prompt)
    tokenizer = _tokenizer(model)
    options = options.resolved(model.generation_config, text=True)
    ends = set(end_ids(options.eos_token_id, model.generation_config))
    session, fed = _continued(model, ids, options.session)

    def new_ids() -> Iterator[int]:
        for step, (chosen, _) in enumerate(stream_ids(session, fed, options)):
            token = int(chosen[0])
            if options.callback is not None:
                options.callback(step, token)
            if token in ends:
                return
            yield token

    yield from stream_pieces(tokenizer, new_ids())


def generate_text(model: BitNetModel, prompt: Any, options: GenerationOptions) -> str | list[str]:
    """See BitNetModel.generate_text."""
    batch = isinstance(prompt, (list, tuple)) and all(
        isinstance(p, str) or _is_conversation(p) for p in prompt
    )
    if not batch or not prompt or _is_conversation(prompt):
        return "".join(stream_text(model, prompt, options))
    if options.session is not None:
        raise _core.ArgumentError("session: a list of prompts runs in a batch of its own")
    prompts = [prompt_ids(model, p) for p in prompt]
    tokenizer = _tokenizer(model)
    options = options.resolved(model.generation_config, text=True)
    ends = set(end_ids(options.eos_token_id, model.generation_config))
    session = model.shared_session(len(prompts))
    new = [chosen for chosen, _ in stream_ids(session, prompts, options)]
    texts = []
    for b in range(len(prompts)):
        ids = [int(step[b]) for step in new]
        stop = next((i for i, t in enumerate(ids) if t in ends), len(ids))
        texts.append("".join(stream_pieces(tokenizer, iter(ids[:stop]))))
    return texts
