"""Runs Steps: chooses each one's StepPlan (the attention split, the screened head, float16
prefill attention: the model's choices), checks it against the pool it runs on, and replays the
pool's graph for it."""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import _core
from ..sampling import sampling_rows
from .._core import Tensor
from ..attention import rope_tables
from .cache_pool import CachePool
from .chunked import run_in_chunks
from .config import BitNetConfig
from .screened_head import ScreenedHead
from .weights import DecoderWeights
from .recording import RecordedStep, StepRecorder
from .step import DecodePolicy, Pick, Step, StepOutputs, StepPlan, outside

__all__ = ["StepRunner"]

# The picks the screened head serves, for one row or several (a batch's decode step, a verify
# step's tokens): top-p without top-k would make its candidates most of the vocabulary, slower
# than the float head (docs/PERFORMANCE.md).
_SCREENED = (Pick.ARGMAX, Pick.SAMPLE, Pick.NUCLEUS_TOP_K)
# Attention over more new tokens than this a sequence runs in float16 where the model asks.
_FLOAT16_FROM_TOKENS = 8


class StepRunner:
    """policy: DecodePolicy; screened_head: whether steps pick through the screened head (the
    argmax or draw of their rows); float16_prefill: whether attention over more than 8 new
    tokens a sequence runs in float16; kv_dtype: the KV caches' dtype (float32 or float16). `last`
    is the RecordedStep of the latest replay (benchmarks read its timings). The runner also keeps
    the model's shared pools, one a batch size, which forward, generate and stream use; sessions
    hold pools of their own."""

    def __init__(
        self,
        recorder: StepRecorder,
        max_tokens: int,
        policy: DecodePolicy,
        screened_head: bool,
        kv_dtype: np.dtype = np.dtype(np.float32),
    ) -> None:
        self.recorder = recorder
        self.kv_dtype = np.dtype(kv_dtype)
        self.max_tokens = max_tokens
        self.policy = policy
        self.screened_head = screened_head
        self.float16_prefill = False
        self.last: RecordedStep | None = None
        self.shared: dict[int, CachePool] = {}

    @classmethod
    def build(
        cls,
        config: BitNetConfig,
        weights: DecoderWeights,
        max_tokens: int,
        screened_head: bool | None,
        decode_chunk: int,
        kv_dtype: np.dtype = np.dtype(np.float32),
    ) -> StepRunner:
        """A runner over `weights`, with RoPE's tables for max_tokens positions; screened_head:
        True, False, or None for wherever the device takes the hidden size."""
        device = weights.embed.device
        cos, sin = rope_tables(np.arange(max_tokens), config.head_dim, config.rope_theta)
        fits = _core.screened_argmax_fits(device, config.hidden_size)
        if screened_head and not fits:
            raise _core.ArgumentError(
                f"screened_head: hidden size {config.hidden_size} does not fit screened_argmax "
                "on this device"
            )
        recorder = StepRecorder(
            config,
            weights,
            Tensor.from_numpy(cos, device),
            Tensor.from_numpy(sin, device),
            ScreenedHead(device),
        )
        screens = fits if screened_head is None else bool(screened_head)
        policy = DecodePolicy(decode_chunk=decode_chunk)
        return cls(recorder, max_tokens, policy, screens, kv_dtype)

    def set_prefill_precision(self, precision: str) -> None:
        """ "float32", or "float16" for attention over more than 8 new tokens a sequence on
        float16 tensor cores (UnsupportedError where the device or the head dim cannot)."""
        if not (isinstance(precision, str) and precision in ("float32", "float16")):
            raise _core.ArgumentError(
                f"prefill_attention: expected the precision 'float32' or 'float16', not "
                f"{precision!r}"
            )
        if precision == "float16":  # the op's own checks, on a query of the model's head shape
            zero = np.zeros((1, 1, self.recorder.config.head_dim), np.float32)
            query = Tensor.from_numpy(zero, self.recorder.device)
            _core.attention(query, query, query, False, None, None, True)
        self.float16_prefill = precision == "float16"

    def pool(self, slots: int) -> CachePool:
        """A new pool of `slots` KV cache slots (allocated at its first step)."""
        return CachePool(
            self.recorder,
            self.recorder.config,
            self.max_tokens,
            slots,
            self.policy.kept_prefill_graphs,
            self.kv_dtype,
        )

    def shared_pool(self, batch: int) -> CachePool:
        """The shared pool for `batch` sequences, made now if not yet."""
        if batch not in self.shared:
            self.shared[batch] = self.pool(batch)
        return self.shared[batch]

    def release_shared(self, batch: int | None = None) -> None:
        """Frees the shared pool of `batch` sequences (every one where None): its KV caches and
        graphs, made again when next needed."""
        for size in list(self.shared) if batch is None else [batch]:
            self.shared.pop(size, None)

    def plan(self, step: Step) -> StepPlan:
        tokens = step.tokens
        picked = step.batch * tokens if step.every_token else step.batch
        screened = (
            self.screened_head
            and not step.keep_logits
            and step.pick in _SCREENED
            and (picked == 1 or self.screens_rows(picked))
        )
        return StepPlan(
            batch=step.batch,
            tokens=tokens,
            pick=step.pick,
            chain=step.chain,
            every_token=step.every_token,
            keep_logits=step.keep_logits,
            split_keys=self.policy.split_keys(
                1 if step.every_token else tokens,
                step.last_start() + (tokens - 1 if step.every_token else 0),
                step.batch,
            ),
            screened=screened,
            float16_attention=self.float16_prefill and tokens > _FLOAT16_FROM_TOKENS,
            row_sampling=step.pick.draws and step.sampling is not None and step.sampling.ndim == 2,
        )

    def screens_rows(self, rows: int) -> bool:
        """Whether the screened head takes `rows` rows of hidden states at once on this device."""
        return _core.screened_argmax_fits(
            self.recorder.device, self.recorder.config.hidden_size, rows
        )

    def run(self, pool: CachePool, step: Step) -> StepOutputs:
        """One replay of `step` over `pool`'s caches (one a chunk where a sequence feeds more than
        the policy's prefill_chunk tokens)."""
        if step.tokens > self.policy.prefill_chunk and step.chain == 1 and not step.every_token:
            return run_in_chunks(step, self.policy.prefill_chunk, lambda part: self.run(pool, part))
        slots = np.asarray(step.slots)
        if slots.dtype.kind not in "iu" or outside(slots, pool.slots):
            raise _core.ArgumentError(f"step: slots must lie in [0, {pool.slots})")
        listed = slots.tolist()
        if len(set(listed)) != len(listed):
            raise _core.ArgumentError("step: two sequences of one step share a slot")
        starts = np.asarray(step.starts).tolist()
        end = max(s + n for s, n in zip(starts, step.lengths.tolist())) + step.chain - 1
        if min(starts) < 0 or end > pool.max_tokens:
            raise _core.ShapeError(
                f"{max(starts)} cached + {step.tokens + step.chain - 1} new tokens "
                f"exceed max_tokens={pool.max_tokens}"
            )
        if (
            step.every_token
            and step.pick.draws
            and step.sampling is not None
            and step.sampling.ndim == 1
        ):
            # Every row of a sequence drawn as that sequence's (keyed by its index), not by its row.
            rows = sampling_rows([step.sampling] * step.batch, range(step.batch))
            step = dataclasses.replace(step, sampling=rows)
        graph = pool.graphs.get(self.plan(step))
        self.last = graph
        return graph.run(step)

    def replace_policy(self, policy: DecodePolicy) -> None:
        """Takes a new policy; the pools keep as many prefill graphs as it says."""
        self.policy = policy
        for pool in self.shared.values():
            pool.graphs.kept_prefill = policy.kept_prefill_graphs
