"""Prompts longer than the policy's prefill_chunk, fed in chunks: every sequence's ids from its
cached position in steps of at most prefill_chunk tokens (the sequences with ids left in each),
the pick taken at each sequence's last chunk. The serving engine feeds a prompt in the same chunks
between its decode steps, so a prompt's logits are the same either way."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..sampling import sampling_rows
from .step import Pick, Step, StepOutputs

__all__ = ["ChunkedResult", "run_in_chunks"]


class ChunkedResult:
    """What feeding in chunks gave, as StepResult gives it for one step: each sequence's pick
    (`ids`) and logits (`logits`: every token's for Pick.LOGITS, else after the last)."""

    def __init__(self, pick: Pick, ids: np.ndarray, logits: list[np.ndarray] | None) -> None:
        self.pick, self._ids, self._logits = pick, ids, logits

    def ids(self, step: int = 0) -> np.ndarray:
        return self._ids

    def logits(self, step: int = 0) -> np.ndarray:
        assert self._logits is not None, "the step kept no logits"
        if self.pick is not Pick.LOGITS:
            return np.stack(self._logits)
        width = max(len(rows) for rows in self._logits)
        out = np.zeros((len(self._logits), width, self._logits[0].shape[-1]), np.float32)
        for b, rows in enumerate(self._logits):
            out[b, : len(rows)] = rows
        return out


def run_in_chunks(step: Step, chunk: int, run: Callable[[Step], StepOutputs]) -> ChunkedResult:
    """`step` (one token a sequence, no verify) as steps of at most `chunk` tokens a sequence."""
    batch = step.batch
    offsets = np.zeros(batch, np.int64)
    lengths = step.lengths
    sampling = step.sampling
    if sampling is not None and np.ndim(sampling) == 1:  # keyed by each sequence, not its row
        sampling = sampling_rows([sampling] * batch, range(batch))
    keeps = step.keep_logits or step.pick in (Pick.LOGITS, Pick.LAST_LOGITS)
    ids = np.zeros(batch, np.int32)
    logits: list[list[np.ndarray]] = [[] for _ in range(batch)]
    while (offsets < lengths).any():
        active = np.flatnonzero(offsets < lengths)
        parts = tuple(step.ids[b][offsets[b] : offsets[b] + chunk] for b in active)
        result = run(
            Step(
                np.asarray(step.slots)[active],
                np.asarray(step.starts)[active] + offsets[active],
                parts,
                step.pick,
                sampling=None if sampling is None else sampling[active],
                keep_logits=step.keep_logits,
            )
        )
        picked = result.ids() if step.pick.chooses else None
        kept = result.logits() if keeps else None
        for row, b in enumerate(active):
            size = len(parts[row])
            offsets[b] += size
            if picked is not None and offsets[b] == lengths[b]:
                ids[b] = picked[row]
            if kept is not None:
                if step.pick is Pick.LOGITS:
                    logits[b].append(kept[row, :size])
                elif offsets[b] == lengths[b]:
                    logits[b].append(kept[row])
    if not keeps:
        return ChunkedResult(step.pick, ids, None)
    if step.pick is Pick.LOGITS:
        return ChunkedResult(step.pick, ids, [np.concatenate(rows) for rows in logits])
    return ChunkedResult(step.pick, ids, [rows[-1] for rows in logits])
