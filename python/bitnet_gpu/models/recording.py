"""Records a step's graph from its StepPlan: the ops of the embedding, the layers and the head,
over a CachePool's KV caches. The graph's inputs and outputs are named here and nowhere else;
``RecordedStep.run`` fills them from a Step and hands back a StepResult."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import _core
from .._core import Tensor
from ..graph import Graph
from ..norms import rms_norm
from .step import Pick, Step, StepPlan

if TYPE_CHECKING:
    from .config import BitNetConfig
    from .screened_head import ScreenedHead
    from .weights import DecoderWeights

__all__ = ["StepRecorder", "RecordedStep", "StepResult"]

# Logits up to this size go back through host-cached memory (a decode step of 32 sequences of a
# 128,256-token vocabulary: 16 MiB).
_HOST_LOGITS_BYTES = 16 << 20


class StepResult:
    """What one replay gave: the ids each step chose and the logits it kept, as NumPy."""

    def __init__(self, plan: StepPlan, outputs: dict[str, Tensor]) -> None:
        self.plan = plan
        self._outputs = outputs

    def ids(self, step: int = 0) -> np.ndarray:
        """int32 [B] (or [B, T] for a pick at every token): the ids step `step` of the chain
        chose."""
        ids = self._outputs[f"ids{step}"].numpy()
        return ids.reshape(self.plan.batch, -1) if self.plan.every_token else ids

    def logits(self, step: int = 0) -> np.ndarray:
        """float32 [B, vocab] ([B, T, vocab] for Pick.LOGITS or a pick at every token): the logits
        of step `step` of the chain."""
        logits = self._outputs[f"logits{step}"].numpy()
        if self.plan.pick is Pick.LOGITS or self.plan.every_token:
            return logits.reshape(self.plan.batch, self.plan.tokens, -1)
        return logits


class RecordedStep:
    """A step's graph and the names of its inputs and outputs."""

    def __init__(self, plan: StepPlan, graph: Graph) -> None:
        self.plan, self.graph = plan, graph

    def run(self, step: Step) -> StepResult:
        """Copies the step's ids, positions and parameters in, replays the graph once and returns
        its outputs."""
        plan = self.plan
        starts = np.asarray(step.starts, np.int64)
        slots = np.asarray(step.slots, np.int64)
        lengths = step.lengths
        inputs: dict[str, np.ndarray] = {"ids": step.padded_ids().reshape(-1)}
        for i in range(plan.chain):
            if plan.every_token:  # a row a token: its position, its sequence's slot
                at = starts[:, None] + i + np.arange(plan.tokens)[None, :]
                rows = np.stack([at.reshape(-1), np.repeat(slots, plan.tokens)])
                inputs[f"positions{i}"] = rows.astype(np.int32)
            else:
                inputs[f"positions{i}"] = np.array([starts + i, slots], np.int32)
            if plan.pick.draws:
                # The drawn token's position keys its draw: after the last token fed, or after
                # each token for a pick at every token.
                if plan.every_token:
                    at = starts[:, None] + 1 + np.arange(plan.tokens)[None, :]
                    inputs[f"drawn_at{i}"] = at.reshape(-1).astype(np.int32)
                else:
                    inputs[f"drawn_at{i}"] = (starts + lengths + i).astype(np.int32)
        if plan.prefill and plan.pick is not Pick.LOGITS and not plan.every_token:
            inputs["last"] = (np.arange(plan.batch) * plan.tokens + lengths - 1).astype(np.int32)
        if plan.pick.draws:
            assert step.sampling is not None  # Step checks it
            sampling = np.asarray(step.sampling, np.uint32)
            if plan.row_sampling and plan.every_token:  # each of a sequence's rows its parameters
                sampling = np.repeat(sampling, plan.tokens, axis=0)
            inputs["sampling"] = sampling
        return StepResult(plan, self.graph.run(**inputs))

    def timings(self) -> list[tuple[str, float]]:
        """[(kernel, seconds)] of the last run (a recorder with timings on)."""
        return self.graph.timings()


class StepRecorder:
    """Records step graphs over a model's weights; `timings` (False, True or "total") is how
    Graph times them (benchmarks)."""

    def __init__(
        self,
        config: BitNetConfig,
        weights: DecoderWeights,
        cos: Tensor,
        sin: Tensor,
        screened_head: ScreenedHead,
    ) -> None:
        self.config, self.weights = config, weights
        self.cos, self.sin = cos, sin
        self.screened_head = screened_head
        self.device = cos.device
        self.timings: bool | str = False

    def record(self, plan: StepPlan, caches: list[tuple[Tensor, Tensor]]) -> RecordedStep:
        # A prefill's layers hold MBs of intermediates each, and a decode step's attention its
        # partial sums (sized by the cache's rows): a layer's, reused, not every layer's and step's.
        graph = Graph(self.device, timings=self.timings, reuse_memory=True)
        with graph:
            ids = graph.input("ids", (plan.rows,), np.int32)
            sampling = None
            if plan.pick.draws:
                picked = plan.rows if plan.every_token else plan.batch
                shape = (picked, 8) if plan.row_sampling else (6,)
                sampling = graph.input("sampling", shape, np.uint32)
            last = None
            if plan.prefill and plan.pick is not Pick.LOGITS and not plan.every_token:
                last = graph.input("last", (plan.batch,), np.int32)
            for i in range(plan.chain):
                # [2, B] (a sequence's position and slot), or [2, B * T] a row each (verify).
                width = plan.rows if plan.every_token else plan.batch
                positions = graph.input(f"positions{i}", (2, width), np.int32)
                drawn_at = None
                if plan.pick.draws:
                    count = plan.rows if plan.every_token else plan.batch
                    drawn_at = graph.input(f"drawn_at{i}", (count,), np.int32)
                x = self._layers(plan, caches, ids, positions)
                if last is not None:
                    x = _core.embedding(x, last)  # each sequence's last row
                chosen, logits = self._head(plan, x, sampling, drawn_at)
                if logits is not None:
                    graph.output(f"logits{i}", self._readable(logits))
                if chosen is not None:
                    graph.output(f"ids{i}", chosen)
                    ids = chosen
        return RecordedStep(plan, graph)

    def _readable(self, logits: Tensor) -> Tensor:
        """The logits copied into host-cached memory at the graph's end, so that reading them back
        is a memcpy, not a copy submission of its own (up to _HOST_LOGITS_BYTES: a long prompt's
        logits stay on the device, downloaded when asked for)."""
        if logits.nbytes > _HOST_LOGITS_BYTES:
            return logits
        host = self.device.empty(tuple(logits.shape), np.float32, memory="host")
        host.copy_from(logits)
        return host

    def _layers(
        self, plan: StepPlan, caches: list[tuple[Tensor, Tensor]], ids: Tensor, positions: Tensor
    ) -> Tensor:
        """The embedding and every layer: the final norm's input, float32 [rows, hidden]."""
        c, rows, eps = self.config, plan.rows, self.config.rms_norm_eps
        x = _core.embedding(self.weights.embed, ids)
        for layer, (k_cache, v_cache) in zip(self.weights.layers, caches):
            w = {name: weights.handle for name, weights in layer.projections.items()}
            norms = layer.norms
            # The norm and int8 pre-pass once, then q, k and v (bitlinear_group fuses them).
            q, k, v = _core.bitlinear_group(
                x, None, norms["input_layernorm"], eps, [w["q"], w["k"], w["v"]], [None] * 3
            )
            q = q.reshape(rows, c.num_attention_heads, c.head_dim)
            k = k.reshape(rows, c.num_key_value_heads, c.head_dim)
            v = v.reshape(rows, c.num_key_value_heads, c.head_dim)
            if plan.tokens == 1:  # RoPE, the cache append and attention in one dispatch
                a = _core.decode_attention(
                    q, k, v, self.cos, self.sin, positions, k_cache, v_cache, plan.split_keys
                )
            elif plan.every_token:
                # A verify step: every token's keys and values appended first, then each token's
                # attention as its decode step computes it (its row of positions; it appends its key
                # again, the same values), so that its logits are the decode step's, bit for bit.
                _core.rope_append(q, k, v, self.cos, self.sin, positions, k_cache, v_cache)
                a = _core.decode_attention(
                    q, k, v, self.cos, self.sin, positions, k_cache, v_cache, plan.split_keys
                )
            else:
                q = _core.rope_append(q, k, v, self.cos, self.sin, positions, k_cache, v_cache)
                a = _core.attention_cached(
                    q, k_cache, v_cache, positions, True, None, plan.float16_attention
                )
            (x,) = _core.bitlinear_group(
                a.reshape(rows, c.hidden_size), None, norms["self_attn.attn_sub_norm"], eps,
                [w["o"]], [x],
            )  # fmt: skip
            if plan.tokens == 1 and _core.gated_output_fuses(x, w["gate"], True):
                # The gate/up dispatch writes relu(gate)^2 * up itself.
                (f,) = _core.bitlinear_group(
                    x, None, norms["post_attention_layernorm"], eps, [w["gate"], w["up"]],
                    [None, None], True,
                )  # fmt: skip
                (x,) = _core.bitlinear_group(
                    f, None, norms["mlp.ffn_sub_norm"], eps, [w["down"]], [x]
                )
            else:  # relu(gate)^2 * up in the down projection's pre-pass
                g, u = _core.bitlinear_group(
                    x, None, norms["post_attention_layernorm"], eps, [w["gate"], w["up"]],
                    [None, None],
                )  # fmt: skip
                (x,) = _core.bitlinear_group(g, u, norms["mlp.ffn_sub_norm"], eps, [w["down"]], [x])
        return rms_norm(x, self.weights.norm, eps)

    def _head(
        self, plan: StepPlan, x: Tensor, sampling: Tensor | None, drawn_at: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """(the chosen ids int32 [rows picked], in host memory so that reading them back is a
        memcpy; the logits, where the plan keeps them)."""
        head = self.weights.lm_head
        picked_rows = x.shape[0]
        if plan.screened:
            head_q, head_meta = self.screened_head.tables(head)
            picked = self.device.empty((picked_rows,), np.int32, memory="host")
            if plan.pick.draws:
                assert sampling is not None and drawn_at is not None
                top_p = plan.pick is not Pick.SAMPLE
                chosen = _core.screened_sample(
                    x, head, head_q, head_meta, sampling, drawn_at, 0, picked, None, top_p
                )
                return chosen, None
            return _core.screened_argmax(x, head, head_q, head_meta, picked), None
        logits = _core.linear_rows(x, head)
        keeps = plan.keep_logits or plan.pick in (Pick.LOGITS, Pick.LAST_LOGITS)
        kept = logits if keeps else None
        if not plan.pick.chooses:
            return None, kept
        out = self.device.empty((picked_rows,), np.int32, memory="host")
        if plan.pick.draws:
            assert sampling is not None and drawn_at is not None
            top_p, top_k = plan.pick is not Pick.SAMPLE, True
            return _core.sample_rows(logits, sampling, drawn_at, 0, out, top_p, top_k), kept
        return _core.argmax_rows(logits, out), kept
