"""DecodeSession: the decode-step API, a KV cache of its own that grows as tokens are fed.

    session = model.session()                        # a KV cache of its own (batch=1)
    logits = session.step(prompt_ids)                # [vocab]: the distribution of the next token
    logits = session.step([next_id])                 # one decode step: the cache grows by one
    for ids in session.stream(more_ids, 32): ...     # generation continues from the cache

A batch's prompts may have different lengths: pass them as a list of sequences, or as one
padded array with an `attention_mask` (1 for a token, 0 for padding, on either side, as
transformers' tokenizers produce it). Each sequence keeps its own length in the cache and its
own positions (the first real token at position 0, as transformers' `generate` counts them), so
a sequence's tokens are the ones it would get alone, up to the int8 rounding ties NUMERICS.md
names.

Generation (generation.py), speculative decoding and the serving engine drive a session through
its step primitives: `prepare` (the ids a call feeds), `feed` (one step over them), `decode` (a
chain of decode steps from the pending ids), `accept` (ids chosen) and `truncate`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from .._args import integer
from .cache_pool import CachePool
from .generation import GenerationOptions, generate_ids, generation_method, is_ragged, stream_ids
from .step import Pick, Step, StepOutputs, outside

if TYPE_CHECKING:
    from .model import BitNetModel

__all__ = ["DecodeSession"]


class DecodeSession:
    """A KV cache of `batch` sequences that grows as tokens are fed (model.session()). `step`
    feeds tokens and returns the next token's logits; `stream` and `generate` continue from what
    the cache holds. A generated sequence's last id is not in the cache yet: the next call feeds
    it first, so a conversation goes on turn after turn without computing its past again."""

    def __init__(self, model: BitNetModel, batch: int = 1, pool: CachePool | None = None) -> None:
        self.model = model
        self.batch = integer(batch, "batch")
        if self.batch < 1:
            raise _core.ArgumentError(f"batch: expected at least 1, got {batch}")
        self.pool = pool if pool is not None else model.runner.pool(self.batch)
        if self.pool.slots < self.batch:
            raise _core.ArgumentError(f"pool: {self.pool.slots} slots for {self.batch} sequences")
        self.slots = np.arange(self.batch, dtype=np.int64)
        self.reset()

    def reset(self) -> None:
        """Forgets the cached tokens (the cache's memory and the recorded graphs stay)."""
        self._cached = np.zeros(self.batch, np.int64)
        self._pending: np.ndarray | None = None
        self._tokens: list[list[int]] = [[] for _ in range(self.batch)]

    @property
    def cached(self) -> np.ndarray:
        """int64 [batch]: the tokens each sequence has in the cache."""
        return self._cached.copy()

    @property
    def lengths(self) -> np.ndarray:
        """int64 [batch]: the tokens each sequence holds (the cached ones and a generated id not
        fed yet)."""
        return self._cached + (0 if self._pending is None else 1)

    @property
    def pending(self) -> np.ndarray | None:
        """int64 [batch]: each sequence's generated id not fed yet, or None."""
        return None if self._pending is None else self._pending.copy()

    @property
    def token_ids(self) -> list[np.ndarray]:
        """Each sequence's ids so far (prompts and generated tokens), int64."""
        return [np.array(t, np.int64) for t in self._tokens]

    @property
    def cache_nbytes(self) -> int:
        return self.pool.nbytes

    def __repr__(self) -> str:
        return (
            f"<bitnet_gpu.DecodeSession batch={self.batch} lengths={self.lengths.tolist()} "
            f"max_tokens={self.model.max_tokens}>"
        )

    # ------------------------------------------------------------------------- primitives
    def prepare(self, token_ids: Any, attention_mask: Any = None) -> list[np.ndarray]:
        """Each sequence's ids a call feeds (int32, the pending id first), checked: token_ids as
        step takes them. No new ids at all (with nothing pending) feed each sequence's last
        cached id again, which gives the logits that follow it."""
        return self._sequences(token_ids, attention_mask)[0]

    def feed(
        self,
        sequences: Sequence[np.ndarray],
        pick: Pick,
        sampling: np.ndarray | None = None,
        keep_logits: bool = False,
        every_token: bool = False,
    ) -> StepOutputs:
        """One step over each sequence's ids (as prepare gives them): afterwards the cache holds
        them all and nothing is pending."""
        result = self.model.runner.run(
            self.pool,
            Step(
                self.slots,
                self._cached,
                tuple(sequences),
                pick,
                sampling=sampling,
                keep_logits=keep_logits,
                every_token=every_token,
            ),
        )
        for b, s in enumerate(sequences):
            self._tokens[b].extend(s[(self._pending is not None) :].tolist())
        self._cached = self._cached + [s.size for s in sequences]
        self._pending = None
        return result

    def decode(
        self,
        chain: int,
        pick: Pick,
        sampling: np.ndarray | None = None,
        keep_logits: bool = False,
    ) -> StepOutputs:
        """`chain` decode steps from the pending ids, each fed the id the one before chose; the
        caller accepts the ids it takes (accept)."""
        if self._pending is None:
            raise _core.ArgumentError("decode: no generated id is pending")
        ids = tuple(self._pending[b : b + 1].astype(np.int32) for b in range(self.batch))
        step = Step(
            self.slots, self._cached, ids, pick, chain, sampling=sampling, keep_logits=keep_logits
        )
        return self.model.runner.run(self.pool, step)

    def accept(self, new_ids: Sequence[np.ndarray], cached: np.ndarray | None = None) -> None:
        """Each sequence's chosen ids, the last of them now pending (none: its pending id stays);
        with `cached`, the tokens the cache now holds for each (what the step that chose them
        fed)."""
        if len(new_ids) != self.batch:
            raise _core.ShapeError(f"accept: {len(new_ids)} sequences for batch {self.batch}")
        if self._pending is None and any(len(ids) == 0 for ids in new_ids):
            raise _core.ArgumentError("accept: every sequence needs an id where none is pending")
        for b, ids in enumerate(new_ids):
            self._tokens[b].extend(int(i) for i in ids)
        if cached is not None:
            self._cached = np.asarray(cached, np.int64).copy()
        before = self._pending
        self._pending = np.array(
            [
                int(ids[-1]) if len(ids) or before is None else int(before[b])
                for b, ids in enumerate(new_ids)
            ],
            np.int64,
        )

    def verify(
        self,
        drafts: Sequence[np.ndarray],
        held: Sequence[bool],
        pick: Pick,
        sampling: np.ndarray | None = None,
        keep_logits: bool = False,
    ) -> StepOutputs:
        """One step that picks at every token (speculative decoding's verify step): each sequence
        feeds its pending id and its draft; a held sequence feeds its last cached id again
        instead (its cache rewritten with what it holds) and keeps everything as it was, its
        picks meaningless. The others' drafts are then cached and nothing is pending: the caller
        keeps what it accepts (truncate, then accept)."""
        if self._pending is None:
            raise _core.ArgumentError("verify: no generated id is pending")
        ids, starts = [], self._cached.copy()
        for b, (draft, hold) in enumerate(zip(drafts, held)):
            if hold:
                ids.append(np.array([self._tokens[b][int(self._cached[b]) - 1]], np.int32))
                starts[b] -= 1
            else:
                ids.append(np.concatenate([self._pending[b : b + 1], draft]).astype(np.int32))
        step = Step(self.slots, starts, tuple(ids), pick, sampling=sampling,
                    keep_logits=keep_logits, every_token=True)  # fmt: skip
        result = self.model.runner.run(self.pool, step)
        for b, (draft, hold) in enumerate(zip(drafts, held)):
            if not hold:
                self._tokens[b].extend(int(i) for i in draft)
                self._cached[b] += 1 + len(draft)
        return result

    def truncate(self, lengths: np.ndarray) -> None:
        """Forgets every token past lengths[b] of each sequence (their cache rows are rewritten
        before anything reads them); the last kept token becomes pending where it was not cached."""
        lengths = np.asarray(lengths, np.int64)
        if lengths.shape != (self.batch,) or (lengths < 1).any() or (lengths > self.lengths).any():
            raise _core.ArgumentError("truncate: lengths must lie in [1, the tokens held]")
        self._tokens = [t[: int(n)] for t, n in zip(self._tokens, lengths)]
        self._cached = np.minimum(self._cached, lengths - 1)
        self._pending = np.array([t[-1] for t in self._tokens], np.int64)

    # ---------------------------------------------------------------------------- stepping
    def step(self, token_ids: Any, attention_mask: Any = None) -> np.ndarray:
        """Feeds token_ids (one sequence's ids [T], a batch's [B, T] with an optional
        attention_mask, or a list of B sequences) into the cache and returns the logits of the
        token after each sequence's last, float32 [B, vocab] ([vocab] for a session of one
        sequence given 1-D ids). No new ids ([] or [B, 0]) gives the logits after what the
        cache holds."""
        sequences, _, _ = self._sequences(token_ids, attention_mask)
        logits = self.feed(sequences, Pick.LAST_LOGITS).logits()
        return logits[0] if self.batch == 1 and np.ndim(token_ids) == 1 else logits

    def forward(self, token_ids: Any, attention_mask: Any = None) -> np.ndarray:
        """As step, but the logits of every token fed: float32 [B, T, vocab] in token_ids'
        layout ([T, vocab] for 1-D ids; zeros where attention_mask is 0; for a list of
        sequences, T is the longest and the rows past a sequence's end are zeros)."""
        pending = self._pending is not None
        sequences, columns, shape = self._sequences(token_ids, attention_mask)
        computed = self.feed(sequences, Pick.LOGITS).logits()
        lengths = [s.size for s in sequences]
        width = shape[1] if shape is not None else max(lengths) - pending
        out = np.zeros((self.batch, width, self.model.config.vocab_size), np.float32)
        for b in range(self.batch):
            rows = computed[b, int(pending) : lengths[b]]
            out[b, columns[b] if shape is not None else np.arange(len(rows))] = rows
        return out[0] if self.batch == 1 and np.ndim(token_ids) == 1 else out

    @generation_method
    def stream(self, token_ids: Any, options: GenerationOptions) -> Iterator[np.ndarray]:
        """Feeds token_ids (as step takes them) and yields the next ids (int32 [B]) as they are
        generated: see BitNetModel.stream. max_new_tokens 0 feeds nothing."""
        options = options.resolved(self.model.generation_config, text=False)
        for step, (ids, _) in enumerate(stream_ids(self, token_ids, options)):
            if options.callback is not None:
                options.callback(step, ids)
            yield ids

    @generation_method
    def generate(self, token_ids: Any, options: GenerationOptions) -> Any:
        """token_ids followed by up to max_new_tokens generated ids: see BitNetModel.generate."""
        return generate_ids(self, token_ids, options.resolved(self.model.generation_config, False))

    # ----------------------------------------------------------------------------- inputs
    def _sequences(
        self, token_ids: Any, attention_mask: Any
    ) -> tuple[list[np.ndarray], list[np.ndarray], tuple[int, int] | None]:
        """(sequences, columns, shape): each sequence's new ids (int32, the pending id first),
        the columns of the caller's array they came from, and that array's [B, T] (None for a
        list of sequences)."""
        vocab = self.model.config.vocab_size
        mask = None
        if is_ragged(token_ids):
            if attention_mask is not None:
                raise _core.ArgumentError("attention_mask: pass it with one padded [B, T] array")
            rows = [np.asarray(s) for s in token_ids]
            shape = None
        else:
            ids = np.asarray(token_ids)
            if ids.ndim == 1:  # one sequence's ids, or one id a sequence of a batch
                ids = ids[None, :] if self.batch == 1 else ids[:, None]
            if ids.ndim != 2:
                raise _core.ShapeError(
                    f"token_ids: expected [T] or [B, T], got shape {np.shape(token_ids)}"
                )
            shape = (int(ids.shape[0]), int(ids.shape[1]))
            if attention_mask is None:  # every column: the rows as they are
                mask = None
                rows = list(ids)
                every_column = np.arange(shape[1])
            else:
                mask = _mask(attention_mask, ids.shape)
                rows = [ids[b][mask[b]] for b in range(ids.shape[0])]
        if len(rows) != self.batch:
            raise _core.ShapeError(
                f"token_ids: {len(rows)} sequences for a session of batch {self.batch}"
            )
        if self._pending is None and all(r.size == 0 for r in rows) and self._cached.min() > 0:
            # Nothing new: each sequence's last cached token is fed again (its keys and values
            # are written where they are), which gives the logits that follow it.
            self._cached -= 1
            self._pending = np.array([t[-1] for t in self._tokens], np.int64)
        sequences, columns = [], []
        for b, row in enumerate(rows):
            if row.dtype.kind not in "iu" and not (row.size == 0 and row.dtype.kind == "f"):
                raise _core.DTypeError(f"token_ids: expected integers, got {row.dtype}")
            if row.ndim != 1:
                raise _core.ShapeError(f"token_ids: sequence {b} is not one-dimensional")
            if outside(row, vocab):
                raise _core.ArgumentError(f"token_ids: ids must lie in [0, {vocab})")
            if self._pending is not None:
                row = np.concatenate([self._pending[b : b + 1], row.astype(np.int64)])
            if row.size == 0:
                raise _core.ShapeError(f"token_ids: sequence {b} has no tokens")
            sequences.append(row.astype(np.int32))
            if shape is not None:
                columns.append(every_column if mask is None else np.flatnonzero(mask[b]))
        return sequences, columns, shape


def _mask(attention_mask: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A [B, T] attention mask as bools, checked: 0 (padding) and 1 (token), one run of ones a
    row."""
    mask = np.asarray(attention_mask)
    if mask.ndim == 1:
        mask = mask[None, :]
    if mask.shape != tuple(shape):
        raise _core.ShapeError(
            f"attention_mask: expected shape {tuple(shape)}, got {np.shape(attention_mask)}"
        )
    if mask.dtype.kind not in "biu" or not np.isin(mask, (0, 1)).all():
        raise _core.ArgumentError("attention_mask: expected 0 (padding) and 1 (token) only")
    mask = mask.astype(bool)
    for b, row in enumerate(mask):
        on = np.flatnonzero(row)
        if on.size == 0 or on[-1] - on[0] + 1 != on.size:
            raise _core.ArgumentError(
                f"attention_mask: row {b} must hold one run of ones (padding before or "
                "after the tokens, not between them)"
            )
    return mask
