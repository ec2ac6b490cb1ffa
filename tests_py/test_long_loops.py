"""Kernels whose invocations loop over millions of values, against NumPy.

lavapipe (the CI's Vulkan device) ends every loop of an invocation once its loops have made 65535
passes in all, without an error (Mesa's guard against endless loops): a row op or reduction that
took one value a pass gave wrong results from 5.6M values a row (softmax) or 16.7M (a sum), a
matmul from K of about 200k, prefill attention from about 25k keys. The kernels now take 16 steps
a pass (shaders/runtime/strided_loop.glsl) or unroll their inner loops; each case here is past
the length where the old loops went wrong. Outputs start poisoned (out= arrays filled with NaN).
Tolerances as in test_ops.py; sums of small integers are exact in float32, so those compare
exactly.
"""

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import reference as ref
from conftest import rel


def poisoned(shape, dtype=np.float32):
    return np.full(shape, np.nan, dtype)


@pytest.mark.parametrize(
    "op,n", [("softmax", 6_000_000), ("layer_norm", 6_000_000), ("rms_norm", 9_000_000)]
)
def test_row_ops_on_rows_of_millions(rng, op, n):
    x = rng.standard_normal((1, n)).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = poisoned(x.shape)
    if op == "softmax":
        bg.softmax(x, out=out)
        expected = ref.softmax(x)
    elif op == "layer_norm":
        bg.layer_norm(x, w, b, out=out)
        expected = ref.layer_norm(x, w, b, 1e-5)
    else:
        bg.rms_norm(x, w, out=out)
        expected = ref.rms_norm(x, w, 1e-6)
    assert rel(out, expected) <= 1e-5


def test_softmax_backward_on_a_row_of_millions(rng):
    """Four loops over the row (its max, its sum, the gradient's dot product, the result)."""
    n = 4_500_000
    x = rng.standard_normal((1, n)).astype(np.float32)
    g = rng.standard_normal((1, n)).astype(np.float32)
    out = poisoned(x.shape)
    bg.softmax_backward(g, x, out=out)
    s = ref.softmax(x.astype(np.float64))
    expected = s * (g - (g * s).sum(axis=-1, keepdims=True))
    assert rel(out, expected) <= 1e-5


@pytest.mark.parametrize("op", ["sum", "max", "mean"])
def test_reductions_of_17_million_values(rng, op):
    """Integers from -8 to 8 (and a 9 at the very end, for max): every partial sum is exact in
    float32, so the sum must be exact; the whole array (axis=None) and its last axis."""
    x = rng.integers(-8, 9, size=(1, 17_000_000)).astype(np.float32)
    x[0, -1] = 9.0
    fn = getattr(bg, op)
    expected = getattr(np, op)(x.astype(np.float64))

    def matches(value):
        if op == "mean":
            return abs(value - expected) <= 1e-6 * max(1.0, abs(expected))
        return value == expected

    assert matches(float(np.asarray(fn(x))))
    out = poisoned((1,))
    fn(x, axis=1, out=out)
    assert matches(float(out[0]))


def test_sum_keeps_float32_precision_over_millions_of_values(rng):
    """Each invocation adds about 66k values; compensated sums keep the error at float32's (the
    values have mean 1, so the sum does not cancel to a size where any rounding looks large)."""
    x = (rng.standard_normal((1, 17_000_000)) + 1.0).astype(np.float32)
    assert rel(np.asarray(bg.sum(x, axis=1)), x.astype(np.float64).sum(axis=1)) <= 1e-6


def test_matmul_with_k_of_300_thousand(rng):
    """Small integers: the float32 accumulators hold the exact products' sums."""
    k = 300_000
    a = rng.integers(-2, 3, size=(3, k)).astype(np.float32)
    b = rng.integers(-2, 3, size=(k, 5)).astype(np.float32)
    out = poisoned((3, 5))
    bg.matmul(a, b, out=out)
    np.testing.assert_array_equal(out, a.astype(np.float64) @ b)


def test_quantize_activations_of_a_row_of_millions_not_a_multiple_of_4(rng):
    """K % 4 != 0 takes the one-value-at-a-time loops (two over the row)."""
    n = 9_000_001
    x = rng.standard_normal((1, n)).astype(np.float32)
    q_out, s_out = np.full((1, n), 99, np.int8), poisoned((1,))
    q, s = bg.quantize_activations(x, out=(q_out, s_out))
    expected_s = 127.0 / np.abs(x.astype(np.float64)).max()
    assert abs(float(s[0]) - expected_s) <= 1e-6 * expected_s
    values = x.astype(np.float64) * float(s[0])
    mismatch = q.astype(np.int64) != np.clip(np.rint(values), -128, 127).astype(np.int64)
    assert (ref.rounding_tie_gap(values[mismatch]) <= 1e-6).all()


def test_prefill_attention_over_40_thousand_keys(rng):
    """The query-block kernel's tile loop (16 keys a pass) held loops of variable length, whose
    passes ran past lavapipe's 65535 between 20k and 25k keys (right at 20k, wrong at 25k, D =
    128)."""
    length, queries, d = 40_000, 16, 64
    q = rng.standard_normal((queries, 2, d)).astype(np.float32)
    k = rng.standard_normal((length, 1, d)).astype(np.float32)
    v = rng.standard_normal((length, 1, d)).astype(np.float32)
    out = poisoned(q.shape)
    bg.attention(q, k, v, out=out)
    assert rel(out, ref.attention(q, k, v)) <= 1e-5
