"""One typed description of a decoder step: which sequences (cache slots), how many tokens each,
from which positions, which logits come back and how the next token is chosen.

A ``Step`` is what a caller asks for; the ``StepPlan`` derived from it (plus the model's choices:
the attention split, the screened head, float16 prefill attention) is the shape of the recorded
graph that runs it, and the key under which that graph is kept (``graph_cache.GraphCache``).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Protocol

import numpy as np

from .. import _core

__all__ = ["Pick", "Step", "StepOutputs", "StepPlan", "DecodePolicy"]


class Pick(enum.Enum):
    """What a step hands back for each sequence."""

    LOGITS = "logits"  # the logits of every token fed (forward)
    LAST_LOGITS = "last_logits"  # the logits after each sequence's last token, and their argmax
    ARGMAX = "argmax"  # the next id, greedy
    SAMPLE = "sample"  # the next id drawn: temperature and top-k
    NUCLEUS = "nucleus"  # drawn with top-p too
    NUCLEUS_TOP_K = "nucleus_top_k"  # drawn with top-p and top-k

    @property
    def draws(self) -> bool:
        # Identity, not `in (...)`: an enum's equality and hash are Python calls, read several
        # times a step.
        return self is Pick.SAMPLE or self is Pick.NUCLEUS or self is Pick.NUCLEUS_TOP_K

    @property
    def chooses(self) -> bool:
        """Whether the step picks next ids (every pick but LOGITS)."""
        return self is not Pick.LOGITS

    @classmethod
    def for_sampling(cls, sampling: np.ndarray | None) -> Pick:
        """ARGMAX without sampling parameters (or where every temperature is 0), else the draw they
        need: sampling.sampling_params' [6] ([2] top_k, [5] top-p's share) or sampling_rows'
        [B, 8] (the nucleus passes where any row has top-p)."""
        if sampling is None:
            return cls.ARGMAX
        rows = np.asarray(sampling).reshape(-1, np.shape(sampling)[-1])
        if not rows[:, 0].any():
            return cls.ARGMAX
        if not rows[:, 5].any():
            return cls.SAMPLE
        return cls.NUCLEUS_TOP_K if rows[:, 2].all() else cls.NUCLEUS


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """The shape of a recorded step graph (and its key)."""

    batch: int  # sequences (rows) of the step
    tokens: int  # new tokens a sequence, the longest (shorter sequences padded after theirs)
    pick: Pick
    chain: int = 1  # decode steps in a row, each fed the ids the one before chose
    every_token: bool = False  # the pick at every token fed, not only each sequence's last
    keep_logits: bool = False  # each step's logits as an output too (through the float head)
    split_keys: int = 0  # keys a decode attention workgroup takes (0 for steps of several tokens)
    screened: bool = False  # the next id through the screened head
    float16_attention: bool = False  # attention over the new tokens on float16 tensor cores
    row_sampling: bool = False  # each sequence's own sampling parameters (sampling_rows)

    @property
    def prefill(self) -> bool:
        return self.tokens > 1

    @property
    def rows(self) -> int:
        return self.batch * self.tokens


@dataclasses.dataclass(frozen=True)
class Step:
    """One replay: each sequence's new ids after what its cache slot holds.

    slots: the cache slot each sequence reads and writes; starts: the tokens each slot holds
    before these; ids: each sequence's new ids (any lengths, at least one each); chain > 1 (one id
    a sequence): that many decode steps, each feeding the id the one before chose; sampling:
    uint32 [6] as sampling.sampling_params makes it (None: greedy); keep_logits: the logits of
    each step too; every_token: the pick after every token fed (a verify step), not only the last.
    """

    slots: np.ndarray
    starts: np.ndarray
    ids: tuple[np.ndarray, ...]
    pick: Pick
    chain: int = 1
    sampling: np.ndarray | None = None
    keep_logits: bool = False
    every_token: bool = False
    # Each sequence's new ids and the longest, counted once here: a step is read many times on its
    # way to the GPU (the step's width, `tokens`, is the longest).
    lengths: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)
    tokens: int = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Python ints and lists, not NumPy reductions: a decode step's arrays hold a few values,
        # where each NumPy call costs microseconds of the step's wall time.
        batch = len(self.ids)
        sizes = [ids.size if isinstance(ids, np.ndarray) else np.size(ids) for ids in self.ids]
        object.__setattr__(self, "lengths", np.array(sizes, np.int64))
        if batch == 0 or np.shape(self.slots) != (batch,) or np.shape(self.starts) != (batch,):
            raise _core.ShapeError(
                f"step: {batch} sequences need {batch} slots and starts, got "
                f"{np.shape(self.slots)} and {np.shape(self.starts)}"
            )
        if 0 in sizes or any(np.ndim(ids) != 1 for ids in self.ids):
            raise _core.ShapeError("step: every sequence needs one or more new ids")
        object.__setattr__(self, "tokens", max(sizes))
        if self.chain > 1 and self.tokens != 1:
            raise _core.ArgumentError("step: a chain of decode steps feeds one id a sequence")
        if self.pick.draws and self.sampling is None:
            raise _core.ArgumentError(f"step: pick {self.pick.value} needs sampling parameters")
        if self.sampling is not None and np.shape(self.sampling) not in ((6,), (batch, 8)):
            raise _core.ShapeError(
                f"step: sampling parameters [6] or [{batch}, 8], got {np.shape(self.sampling)}"
            )

    @property
    def batch(self) -> int:
        return len(self.ids)

    def padded_ids(self) -> np.ndarray:
        """int32 [B, T]: each sequence's ids first, zeros after."""
        if all(np.size(ids) == self.tokens for ids in self.ids):  # no padding (a decode step)
            return np.array(self.ids, np.int32).reshape(self.batch, self.tokens)
        out = np.zeros((self.batch, self.tokens), np.int32)
        for b, ids in enumerate(self.ids):
            out[b, : np.size(ids)] = ids
        return out

    def last_start(self) -> int:
        """The most tokens any of the step's slots holds before it."""
        return max(np.asarray(self.starts).tolist())


def outside(values: np.ndarray, high: int) -> bool:
    """Whether any of values lies outside [0, high): Python's min and max over a few values (a
    decode step's ids or slots), where NumPy's reductions cost microseconds each."""
    if values.size > 64:
        return bool(values.min() < 0 or values.max() >= high)
    listed = values.tolist()
    return bool(listed) and (min(listed) < 0 or max(listed) >= high)


class StepOutputs(Protocol):
    """What running a Step gives: the ids each step of its chain picked (int32 [B], or [B, T] for
    a pick at every token) and the logits it kept."""

    def ids(self, step: int = 0) -> np.ndarray: ...

    def logits(self, step: int = 0) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class DecodePolicy:
    """The model's choices of graph shapes (docs/PERFORMANCE.md has the measurements behind them).

    A decode step of one sequence attends with 16 keys a workgroup while its context is at most
    short_context tokens, 32 up to long_context and 64 beyond (one recorded decode graph for each):
    smaller splits fill the GPU at short contexts, larger ones keep the merge to one chunk and the
    workgroups to one round at long ones. A step of several sequences, whose rows sit at different
    positions, takes batch_split keys whatever their contexts, as does every step where
    split_by_context is False: a sequence's attention then sums in the same order whatever shares
    its step (the serving engine's steps, speculative verify steps of a batch). Greedy and sampled
    decoding record up to decode_chunk steps in one graph; prefill graphs hold their
    intermediates, so only the latest kept_prefill_graphs of them are kept. A prompt of more than
    prefill_chunk tokens a sequence is fed in steps of that many (chunked.py)."""

    decode_chunk: int = 8
    short_context: int = 384
    long_context: int = 640
    kept_prefill_graphs: int = 2
    batch_split: int = 64
    split_by_context: bool = True
    prefill_chunk: int = 512

    def split_keys(self, tokens: int, start: int, batch: int = 1) -> int:
        """The keys a decode attention workgroup takes for one-token rows of `batch` sequences, the
        last of them after `start` cached tokens (0 for a prefill: `tokens` > 1 a sequence)."""
        if tokens > 1:
            return 0
        if batch > 1 or not self.split_by_context:
            return self.batch_split
        context = start + 1
        return 16 if context <= self.short_context else 32 if context <= self.long_context else 64

    def chain(self, start: int, remaining: int, batch: int = 1) -> int:
        """Decode steps the next replay runs from `start` cached tokens, `remaining` wanted:
        decode_chunk, else (fewer wanted, or the attention's split changing within the chunk,
        which must not change a step's graph) the largest power of two that fits."""
        most = min(self.decode_chunk, remaining)
        split = self.split_keys(1, start, batch)
        steps = 1
        while steps < most and self.split_keys(1, start + steps, batch) == split:
            steps += 1
        return steps if steps == self.decode_chunk else 1 << (steps.bit_length() - 1)

    def verify_tokens(self, start: int, most: int) -> int:
        """How many tokens of one sequence after `start` cached ones a verify step may take (at
        most `most`): rows whose decode steps would all take one split, so that each is computed
        as its decode step would be."""
        split = self.split_keys(1, start)
        tokens = 1
        while tokens < most and self.split_keys(1, start + tokens) == split:
            tokens += 1
        return tokens
