"""Generation in one place: its options and their defaults (``GenerationOptions``, the one
signature every generate, stream and text method takes), the stop rule, the loop that streams a
session's new ids, and what generate returns.

    model.generate(prompt, 64, temperature=0.8, top_k=50, seed=1)    # options by keyword
    session.stream(more_ids, 32)                                       # the same options
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import numbers
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import numpy as np

from .. import _core
from .._args import integer
from ..sampling import sampling_params, processed_scores
from .speculative import check_speculative, continue_speculative
from .step import Pick

if TYPE_CHECKING:
    from .session import DecodeSession

__all__ = ["GenerateOutput", "GenerationOptions", "generation_method", "stream_ids"]


@dataclasses.dataclass(frozen=True)
class GenerationOptions:
    """How a sequence is continued (transformers' names), written once for every generate, stream
    and text method and for the command line.

    max_new_tokens: the most new ids (None: 256, fewer where the cache has less room left).
    temperature: 0 is greedy (argmax on the GPU); otherwise each id is drawn on the GPU from
    softmax(logits / temperature) over the top_k largest logits (every one at least the top_k-th
    largest; all if None) and, with top_p in (0, 1), of those the smallest set of the largest
    holding that share of the probability (nucleus sampling), as bitnet_gpu.sample_logits draws
    with `seed`, the sequence's index in the batch and the id's position as its step: the same
    call draws the same ids however it is chunked. None (the default) is greedy for the id
    methods; the text methods take generation_config.json's sampling there (greedy without one).
    eos_token_id: an id or a list of ids that end a sequence (None: generation_config.json's);
    generation stops when every sequence has produced one, and a finished sequence then takes
    pad_token_id (else generation_config.json's, else the first end id).
    attention_mask: for one padded [B, T] array of ids, 1 for a token and 0 for padding before or
    after it; each sequence then takes its own positions, as alone.
    callback(step, ids): called as each step's ids arrive (int32 [B]; the text methods pass the
    id alone).
    output_logits / output_scores / return_dict_in_generate: generate returns a GenerateOutput
    holding each step's raw logits and the logits as the draw saw them (transformers').
    prompt_lookup_num_tokens: speculative decoding with up to this many drafted ids a round, found
    by prompt lookup (the text so far's earlier occurrences of its last max_matching_ngram_size
    ids, 2 unless given); proposer(ids so far, count) -> up to count ids drafts instead (with
    prompt_lookup_num_tokens as the most a round, 8 unless given). Either way the ids are those
    plain decoding gives, greedy or sampled, bit for bit; fewer drafts are asked for where they
    keep failing.
    session: a DecodeSession to continue instead of a fresh cache (the model's methods).
    """

    max_new_tokens: int | None = None
    _: dataclasses.KW_ONLY
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    eos_token_id: int | Sequence[int] | None = None
    pad_token_id: int | None = None
    attention_mask: Any = None
    callback: Callable[[int, Any], object] | None = None
    output_logits: bool = False
    output_scores: bool = False
    return_dict_in_generate: bool = False
    prompt_lookup_num_tokens: int | None = None
    max_matching_ngram_size: int | None = None
    proposer: Callable[[np.ndarray, int], Sequence[int]] | None = None
    session: DecodeSession | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None and integer(self.max_new_tokens, "max_new_tokens") < 0:
            raise _core.ArgumentError("max_new_tokens must be >= 0")
        if self.top_k is not None and integer(self.top_k, "top_k") < 1:
            raise _core.ArgumentError(f"top_k must be at least 1, got {self.top_k}")
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, numbers.Real)
            ):
                raise TypeError(f"{name}: expected a number, got {value!r}")
        if self.callback is not None and not callable(self.callback):
            raise TypeError(f"callback: expected a callable, got {self.callback!r}")
        if self.pad_token_id is not None:
            integer(self.pad_token_id, "pad_token_id")
        end_ids(self.eos_token_id, {})  # checks the ids
        check_speculative(self)

    @property
    def speculative(self) -> bool:
        """Whether ids are drafted and verified (prompt lookup or a proposer)."""
        return bool(self.prompt_lookup_num_tokens) or self.proposer is not None

    def resolved(self, generation_config: dict, text: bool) -> GenerationOptions:
        """These options with the sampling left unset filled in: greedy for the id methods; for
        the text methods generation_config.json's where it samples (do_sample), else greedy."""
        temperature, top_k, top_p = self.temperature, self.top_k, self.top_p
        sampled = text and bool(generation_config.get("do_sample"))
        if temperature is None:
            temperature = float(generation_config.get("temperature", 1.0)) if sampled else 0.0
        if top_k is None and sampled:
            top_k = generation_config.get("top_k") or None
        if top_p is None and sampled:
            top_p = generation_config.get("top_p")
        return dataclasses.replace(self, temperature=temperature, top_k=top_k, top_p=top_p)

    def sampling(self, vocab: int) -> np.ndarray | None:
        """uint32 [6] of sample_rows (None for greedy), checked against a vocabulary of `vocab`."""
        if self.top_k is not None and self.top_k > vocab:
            raise _core.ArgumentError(f"top_k must lie in [1, {vocab}], got {self.top_k}")
        params = sampling_params(self.temperature or 0.0, self.top_k, self.seed, vocab, self.top_p)
        return None if params[0] == 0 else params


P = ParamSpec("P")
S = TypeVar("S")
R = TypeVar("R")


def _options_of(
    cls: Callable[P, GenerationOptions],
) -> Callable[[Callable[[S, Any, GenerationOptions], R]], Callable[Concatenate[S, Any, P], R]]:
    def decorate(
        method: Callable[[S, Any, GenerationOptions], R],
    ) -> Callable[Concatenate[S, Any, P], R]:
        @functools.wraps(method)
        def call(self: S, inputs: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            return method(self, inputs, cls(*args, **kwargs))

        own = list(inspect.signature(method).parameters.values())[:2]
        options = list(inspect.signature(cls).parameters.values())
        call.__signature__ = inspect.Signature(own + options)  # type: ignore[attr-defined]
        call.__doc__ = (
            (method.__doc__ or "")
            + "\n\nOptions (GenerationOptions):\n"
            + (inspect.cleandoc(GenerationOptions.__doc__ or "").split("\n", 2)[-1])
        )
        return call

    return decorate


# Gives `method(self, inputs, options)` GenerationOptions' parameters: it is called as
# method(self, inputs, max_new_tokens, temperature=..., ...), and help() and mypy see them.
generation_method = _options_of(GenerationOptions)


@dataclasses.dataclass
class GenerateOutput:
    """What generate(..., return_dict_in_generate=True) returns, as transformers'
    GenerateDecoderOnlyOutput: `sequences` (the prompt and the new ids), and where asked for,
    `logits` (each step's raw logits, float32 [B, vocab]) and `scores` (each step's logits as the
    draw saw them: divided by the temperature, -inf outside the top-k and top-p kept values; the
    raw logits for greedy decoding)."""

    sequences: np.ndarray | list[np.ndarray]
    scores: tuple[np.ndarray, ...] | None = None
    logits: tuple[np.ndarray, ...] | None = None


def end_ids(eos_token_id: Any, generation_config: dict) -> list[int]:
    """The ids that end a sequence: eos_token_id (an id or a list of them), else
    generation_config.json's."""
    if eos_token_id is None:
        return [int(i) for i in generation_config.get("eos_token_id") or []]
    if isinstance(eos_token_id, (str, bytes)) or (
        np.ndim(eos_token_id) > 1 if not isinstance(eos_token_id, (list, tuple)) else False
    ):
        raise TypeError(
            f"eos_token_id: expected an integer or a list of them, got {eos_token_id!r}"
        )
    ids = [eos_token_id] if np.ndim(eos_token_id) == 0 else list(eos_token_id)
    return [integer(i, "eos_token_id") for i in ids]


def pad_id(pad_token_id: int | None, generation_config: dict, ends: list[int]) -> int:
    """The id a finished sequence takes: pad_token_id, else generation_config.json's, else the
    first end id (transformers' rule)."""
    if pad_token_id is not None:
        return integer(pad_token_id, "pad_token_id")
    configured = generation_config.get("pad_token_id")
    if isinstance(configured, (list, tuple)):
        configured = configured[0] if configured else None
    if configured is not None:
        return int(configured)
    return ends[0] if ends else 0


class StopRule:
    """Which sequences have ended: a sequence that chose an end id takes the padding id after."""

    def __init__(self, options: GenerationOptions, generation_config: dict, batch: int) -> None:
        self.ends = end_ids(options.eos_token_id, generation_config)
        self.pad = pad_id(options.pad_token_id, generation_config, self.ends)
        self.done = np.zeros(batch, bool)

    def apply(self, chosen: np.ndarray) -> np.ndarray:
        """The ids as generated: the padding id for sequences that had ended."""
        if not self.ends:
            return chosen
        chosen = np.where(self.done, self.pad, chosen).astype(np.int32)
        self.done |= np.isin(chosen, self.ends)
        return chosen

    @property
    def finished(self) -> bool:
        return bool(self.ends) and bool(self.done.all())


def stream_ids(
    session: DecodeSession, token_ids: Any, options: GenerationOptions, want_logits: bool = False
) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """Feeds token_ids into the session and yields (ids int32 [B], that step's logits or None) as
    they are generated: one step for the prompt, then one replay a chain of up to the model's
    decode_chunk decode steps, each fed the id the one before chose (yielded together as the
    replay ends). A sequence's last id waits in the session, fed first by the next call."""
    model, batch = session.model, session.batch
    config = model.generation_config
    sequences = session.prepare(token_ids, options.attention_mask)
    lengths = session.cached + np.array([s.size for s in sequences])
    room = model.max_tokens - int(lengths.max()) + 1
    wanted = options.max_new_tokens
    new_tokens = min(256, max(room, 0)) if wanted is None else int(wanted)
    if new_tokens > room:
        raise _core.ShapeError(
            f"{int(lengths.max())} tokens and {new_tokens} new ones exceed "
            f"max_tokens={model.max_tokens}"
        )
    sampling = options.sampling(model.config.vocab_size)
    if new_tokens == 0:
        return
    pick = Pick.for_sampling(sampling)
    stop = StopRule(options, config, batch)
    result = session.feed(sequences, pick, sampling, keep_logits=want_logits)
    if options.speculative:
        yield from continue_speculative(
            session, result, new_tokens, pick, sampling, stop, options, want_logits
        )
        return
    steps, made, base = 1, 0, None
    while True:
        for step in range(steps):
            chosen = stop.apply(result.ids(step))
            # A chain's step `step` has fed the ids before `chosen`: the cache holds those, and
            # `chosen` waits (however far the caller reads).
            session.accept([c[None] for c in chosen], None if base is None else base + step + 1)
            made += 1
            yield chosen, result.logits(step) if want_logits else None
            if made == new_tokens or stop.finished:
                return
        base = session.cached.copy()
        steps = model.policy.chain(int(base.max()), new_tokens - made, batch)
        result = session.decode(steps, pick, sampling, keep_logits=want_logits)


def generate_ids(session: DecodeSession, token_ids: Any, options: GenerationOptions) -> Any:
    """token_ids followed by the new ids (see BitNetModel.generate), or a GenerateOutput."""
    want_logits = options.output_logits or options.output_scores
    new: list[np.ndarray] = []
    logits: list[np.ndarray] = []
    for step, (chosen, step_logits) in enumerate(
        stream_ids(session, token_ids, options, want_logits)
    ):
        new.append(chosen)
        if step_logits is not None:
            logits.append(step_logits)
        if options.callback is not None:
            options.callback(step, chosen)
    sequences = joined(token_ids, new)
    if not options.return_dict_in_generate:
        return sequences
    raw = tuple(logits) if options.output_logits else None
    scores = None
    if options.output_scores:
        t = float(options.temperature or 0.0)
        scores = tuple(processed_scores(x, t, options.top_k, options.top_p) for x in logits)
    return GenerateOutput(sequences, scores, raw)


def session_for(model: Any, token_ids: Any, options: GenerationOptions) -> DecodeSession:
    """options.session (checked to be `model`'s), else the model's shared session for the batch."""
    from .session import DecodeSession  # the session module imports this one

    session = options.session
    if session is None:
        return model.shared_session(batch_of(token_ids))
    if not isinstance(session, DecodeSession) or session.model is not model:
        raise _core.ArgumentError("session: expected a DecodeSession of this model's")
    return session


def is_ragged(token_ids: Any) -> bool:
    """Whether token_ids is a list of sequences (of any lengths) rather than one array."""
    return isinstance(token_ids, (list, tuple)) and any(
        np.ndim(s) == 1 or isinstance(s, (list, tuple)) for s in token_ids
    )


def batch_of(token_ids: Any) -> int:
    """The sequences token_ids holds: [T] one, [B, T] B, a list of sequences its length;
    ShapeError for anything else or for no tokens."""
    if is_ragged(token_ids):
        if len(token_ids) == 0:
            raise _core.ShapeError("token_ids: no sequences")
        return len(token_ids)
    shape = np.shape(token_ids)
    if len(shape) not in (1, 2) or 0 in shape:
        raise _core.ShapeError(
            f"token_ids: expected [T] or [B, T] with B, T > 0, got shape {shape}"
        )
    return 1 if len(shape) == 1 else int(shape[0])


def joined(token_ids: Any, new: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """The prompt followed by the new ids, in the prompt's form: [T + n], [B, T + n], or for a
    list of sequences a list of arrays."""
    if is_ragged(token_ids):
        return [
            np.concatenate([np.asarray(s, np.int64), np.array([n[b] for n in new], np.int64)])
            for b, s in enumerate(token_ids)
        ]
    ids = np.asarray(token_ids)
    squeeze = ids.ndim == 1
    ids = ids[None, :] if squeeze else ids
    out = np.concatenate([ids] + [n.reshape(-1, 1).astype(ids.dtype) for n in new], axis=1)
    return out[0] if squeeze else out
