"""The decoder's fused ops, on Tensors, as bitnet_gpu.models records them: public so that
benchmarks and investigations can run and time each alone.

Each takes and returns Tensors (no NumPy conversion, no out= targets beyond the ones named);
shapes, dtypes and exceptions are those the compiled module's stubs (_core.pyi) and the core's
headers (cpp/ops/*.hpp) give, and tests_py/test_decoder_ops.py checks each against the reference:

- bitlinear_group(x, up, norm_weight, eps, weights, residuals, gated_output=False): RMSNorm and
  x's int8 pre-pass once, then several BitLinear projections of it (TernaryWeights.handle each),
  each with an optional residual added in place; up: a second input gated as relu(x)^2 * up.
- decode_attention(q, k, v, cos, sin, start, k_cache, v_cache, split_keys=0): one new token a
  sequence: RoPE, the KV-cache append and attention in one dispatch (start: int32 [1], [B], or
  [2, B] with each sequence's cache slot).
- rope_append, attention_cached: the same for several new tokens a sequence, in two ops.
- embedding(table, ids), linear_rows(x, head), argmax_rows(x): the embedding, the float head and
  the greedy pick; sample_rows: the draw (sampling.sampling_params' parameters).
- screened_argmax, screened_sample, screened_argmax_fits: the head through its int8 screening
  copy (models.screening_tables).
"""

from ._core import (
    argmax_rows,
    attention_cached,
    bitlinear_group,
    decode_attention,
    embedding,
    linear_rows,
    rope_append,
    sample_rows,
    screened_argmax,
    screened_argmax_fits,
    screened_sample,
)

__all__ = [
    "argmax_rows",
    "attention_cached",
    "bitlinear_group",
    "decode_attention",
    "embedding",
    "linear_rows",
    "rope_append",
    "sample_rows",
    "screened_argmax",
    "screened_argmax_fits",
    "screened_sample",
]
