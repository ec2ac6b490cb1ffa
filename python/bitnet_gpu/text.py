"""Text in and out: a checkpoint's tokenizer and chat template, read as transformers reads them.

``tokenizer.json`` goes through the ``tokenizers`` library and the chat template through
``jinja2`` (both in the ``text`` extra: ``pip install "bitnet_gpu[text]"``); nothing here
tokenizes by hand. ``tokenizer_config.json`` gives the special tokens and the chat template,
``generation_config.json`` the end-of-sequence ids and default sampling.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import numpy as np

from ._args import integer
from ._core import ArgumentError

__all__ = ["Tokenizer", "load_generation_config"]


def _require(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        raise ImportError(
            f"bitnet_gpu's text features need the '{module}' package: "
            'pip install "bitnet_gpu[text]"'
        ) from None


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as error:
        raise ArgumentError(f"{path}: not a JSON file ({error})") from None
    if not isinstance(value, dict):
        raise ArgumentError(f"{path}: expected a JSON object")
    return value


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_generation_config(folder: str) -> dict:
    """generation_config.json's settings, or {} where there is none; eos_token_id as a list."""
    path = os.path.join(folder, "generation_config.json")
    if not os.path.exists(path):
        return {}
    config = _read_json(path)
    eos = config.get("eos_token_id")
    if eos is not None:
        config["eos_token_id"] = [eos] if isinstance(eos, int) else list(eos)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in config["eos_token_id"]):
            raise ArgumentError(f"{path}: eos_token_id must be an integer or a list of them")
    return config


class Tokenizer:
    """A checkpoint's tokenizer: encode, decode and apply_chat_template, as transformers does."""

    def __init__(self, tokenizer_json: str, tokenizer_config: dict | None = None):
        tokenizers = _require("tokenizers")
        try:
            self._tokenizer = tokenizers.Tokenizer.from_file(tokenizer_json)
        except Exception as error:  # the library's own parse error
            raise ArgumentError(f"{tokenizer_json}: not a tokenizer.json ({error})") from None
        config = tokenizer_config or {}
        self.chat_template: str | None = config.get("chat_template")
        if isinstance(self.chat_template, list):  # named templates: the default one
            named = {
                t.get("name"): t.get("template") for t in self.chat_template if isinstance(t, dict)
            }
            self.chat_template = named.get("default")
        self.special_tokens = {
            key: text
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
            if (text := _token_text(config.get(key))) is not None
        }

    @classmethod
    def from_directory(cls, folder: str) -> Tokenizer | None:
        """The tokenizer of a checkpoint directory, or None where it has no tokenizer.json."""
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.exists(path):
            return None
        config_path = os.path.join(folder, "tokenizer_config.json")
        config = _read_json(config_path) if os.path.exists(config_path) else {}
        return cls(path, config)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of `ids` (integers in [0, vocab_size): a list, or a 1-D array)."""
        if isinstance(ids, (str, bytes)) or np.ndim(ids) != 1:
            raise TypeError(f"ids: expected a sequence of token ids, got {type(ids).__name__}")
        values = [integer(i, "ids") for i in ids]
        vocab = self.vocab_size
        bad = next((i for i in values if not 0 <= i < vocab), None)
        if bad is not None:
            raise ArgumentError(
                f"ids: {bad} is not a token id of this tokenizer (0 to {vocab - 1})"
            )
        return self._tokenizer.decode(values, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[dict],
        add_generation_prompt: bool = False,
        tokenize: bool = False,
        **variables: Any,
    ) -> str | list[int]:
        """The conversation rendered by the checkpoint's chat template, as transformers renders it
        (jinja2's sandbox, trim_blocks and lstrip_blocks, raise_exception and strftime_now): the
        text, or with tokenize=True its ids (the template writes the special tokens itself)."""
        if not self.chat_template:
            raise ArgumentError("this tokenizer has no chat_template (tokenizer_config.json)")
        jinja2 = _require("jinja2")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = raise_exception
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent)
        conversation = _conversation(messages)
        try:
            text = environment.from_string(self.chat_template).render(
                messages=conversation,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
                **variables,
            )
        except jinja2.exceptions.TemplateError as error:  # the template's raise_exception too
            raise ArgumentError(f"the chat template refused the conversation: {error}") from None
        except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as error:
            raise ArgumentError(
                f"the chat template failed on the conversation ({type(error).__name__}: {error})"
            ) from None
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def __repr__(self) -> str:
        return (
            f"<bitnet_gpu.text.Tokenizer vocab_size={self.vocab_size} "
            f"chat_template={'yes' if self.chat_template else 'no'}>"
        )


def _conversation(messages: Any) -> list[dict]:
    """The messages, checked: a list of dicts, each with a str role and a str content (or a list
    of content parts, as OpenAI's API sends them)."""
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Sequence):
        kind = type(messages).__name__
        raise TypeError(f"messages: expected a list of {{'role', 'content'}} dicts, got {kind}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise TypeError(f"messages[{i}]: expected a dict, got {type(message).__name__}")
        if not isinstance(message.get("role"), str):
            raise ArgumentError(f"messages[{i}]: needs a 'role' string")
        if not isinstance(message.get("content"), (str, list)):
            raise ArgumentError(f"messages[{i}]: needs a 'content' string (or a list of parts)")
    return list(messages)


def stream_pieces(tokenizer: Tokenizer, ids: Iterator[int]) -> Iterator[str]:
    """Text pieces as the ids arrive, never a broken UTF-8 character: the text so far is decoded
    again with each id, and a piece is yielded once it no longer ends in half a character."""
    taken: list[int] = []
    emitted = ""
    for token in ids:
        taken.append(int(token))
        text = tokenizer.decode(taken)
        if text.endswith("\ufffd"):  # the bytes of a character are not all there yet
            continue
        if len(text) > len(emitted):
            yield text[len(emitted) :]
            emitted = text
    text = tokenizer.decode(taken).rstrip("\ufffd")  # a character cut off at the end: not shown
    if len(text) > len(emitted):
        yield text[len(emitted) :]
