"""Parity of the quantization kernels with bitnet_gpu.reference (docs/NUMERICS.md).

Tolerances (NUMERICS.md): quantized integers and packed bytes exact, except that a value may be
off by one where the float64 reference puts it within 1e-6 (relative) of a .5 tie; scales that
come from reductions within 1e-5 relative; float32 element-wise results 1e-5 rel + 1e-6 abs.
"""

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import reference as ref
from conftest import rel

SHAPES = [(1, 1), (1, 4097), (33, 17), (7, 33), (64, 256), (4096, 4096)]


def assert_rounded(got, values, what):
    """got == round-half-even(values) (clipped by the caller), except within 1e-6 of a tie."""
    expected = np.rint(values)
    mismatch = got.astype(np.int64) != np.asarray(expected).astype(np.int64)
    if not mismatch.any():
        return
    v = np.asarray(values)[mismatch]
    near_tie = ref.rounding_tie_gap(v) <= 1e-6
    off_by_one = np.abs(got[mismatch].astype(np.int64) - expected[mismatch].astype(np.int64)) <= 1
    assert (near_tie & off_by_one).all(), (
        f"{what}: {(~(near_tie & off_by_one)).sum()} values differ"
    )


def poison(device, nbytes_list):
    """Fills pooled blocks of these sizes with 0xAB so outputs that reuse them start poisoned."""
    held = []
    for nbytes in nbytes_list:
        t = device.empty(max(int(nbytes), 1), np.uint8)
        np.asarray(t)[:] = 0xAB
        held.append(t)
    del held


def weights(rng, shape, dtype=np.float32):
    return (rng.standard_normal(shape) * rng.uniform(0.01, 3)).astype(dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_ternary_per_tensor_parity(device, rng, shape, dtype):
    w = weights(rng, shape, dtype)
    n, k = shape
    poison(device, [n * (-(-k // 16) * 4), 4])
    q = bg.quantize_weights(w)
    assert q.shape == shape and q.group_size is None
    assert rel(q.scale, ref.weight_scale(w)) <= 1e-5
    values = ref.ternary_values(w, q.scale)
    got = q.unpack()
    assert got.dtype == np.int8 and set(np.unique(got)) <= {-1, 0, 1}
    assert_rounded(got, np.clip(values, -1.4, 1.4), "W_q")  # clip(round(v), -1, 1) = round(clip)
    assert np.array_equal(q.packed(), ref.pack_ternary(got))
    assert q.nbytes == n * (-(-k // 16) * 4) + 4
    np.testing.assert_allclose(q.dequantize(), ref.dequantize(got, q.scale), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "shape,group", [((1, 64), 64), ((33, 96), 32), ((7, 4096), 128), ((3, 35), 7), ((5, 16), 1)]
)
def test_ternary_per_group_parity(device, rng, shape, group):
    w = weights(rng, shape)
    q = bg.quantize_weights(w, group_size=group)
    assert q.group_size == group and q.scale.shape == (shape[0], shape[1] // group)
    assert rel(q.scale, ref.weight_scale(w, group)) <= 1e-5
    got = q.unpack()
    values = np.clip(ref.ternary_values(w, q.scale, group), -1.4, 1.4)
    assert_rounded(got, values, "W_q per group")
    np.testing.assert_allclose(q.dequantize(), ref.dequantize(got, q.scale, group), rtol=1e-6)


def test_ternary_round_trip_through_the_public_layout(device, rng):
    for group in (None, 16):
        w = weights(rng, (9, 48))
        q = bg.quantize_weights(w, group_size=group)
        again = bg.TernaryWeights.from_packed(q.packed(), q.scale, q.shape, group_size=group)
        assert np.array_equal(again.unpack(), q.unpack())
        assert np.array_equal(again.dequantize(), q.dequantize())
    bad = q.packed().copy()
    bad[0, 0] = 0b11
    with pytest.raises(ValueError, match="code 3"):
        bg.TernaryWeights.from_packed(bad, q.scale, q.shape, group_size=16)
    with pytest.raises(bg.ShapeError):
        bg.TernaryWeights.from_packed(q.packed()[:, :4], q.scale, q.shape, group_size=16)
    with pytest.raises(bg.ShapeError):
        bg.TernaryWeights.from_packed(q.packed(), q.scale[:, :1], q.shape, group_size=16)


def test_quantization_is_deterministic(device, rng):
    w = weights(rng, (300, 1000))
    first, second = bg.quantize_weights(w), bg.quantize_weights(w)
    assert first.scale.tobytes() == second.scale.tobytes()
    assert np.array_equal(first.packed(), second.packed())
    x = rng.standard_normal((50, 3000)).astype(np.float32)
    assert bg.quantize_gradients(x)[1].tobytes() == bg.quantize_gradients(x)[1].tobytes()


def test_large_tensors_span_several_bindings(device, rng):
    """10^8 weights: over lavapipe's 128 MiB storage-buffer range, so the kernels walk chunks."""
    w = rng.standard_normal((10_000, 10_000), dtype=np.float32)
    q = bg.quantize_weights(w)
    assert rel(q.scale, ref.weight_scale(w)) <= 1e-5
    rows = rng.choice(10_000, size=50, replace=False)
    got = q.unpack()
    values = np.clip(ref.ternary_values(w[rows], q.scale), -1.4, 1.4)
    assert_rounded(got[rows], values, "W_q of 10^8 weights")
    x = rng.standard_normal((3, 1_000_000), dtype=np.float32)
    qx, s = bg.quantize_activations(x)
    rq, rs = ref.quantize_activations(x, scale=s)
    np.testing.assert_allclose(s, ref.activation_scale(x), rtol=1e-6)
    assert np.array_equal(qx, rq)


@pytest.mark.parametrize(
    "shape,group",
    [((1, 1), None), ((33, 17), None), ((8, 4097), None), ((6, 64), 32), ((4, 96), 96)],
)
def test_binary_parity(device, rng, shape, group):
    w = weights(rng, shape)
    b = bg.binarize_weights(w, group_size=group)
    rb, alpha, beta = ref.quantize_binary(w, group)
    assert rel(b.scale, beta if group else beta[0]) <= 1e-5
    packed = b.packed()
    # Signs may differ only where W sits within float32 rounding of the mean.
    rb_gpu, _, _ = ref.quantize_binary(w, group, alpha=b._core.means.numpy())
    assert np.array_equal(packed, ref.pack_binary(rb_gpu))
    assert np.mean(rb_gpu == rb) > 0.999  # the float64 mean flips only values at the mean
    deq = b.dequantize()
    np.testing.assert_allclose(deq, ref.dequantize(rb_gpu, b.scale, group), rtol=1e-6)


# Rows held in registers (K % 4 == 0, K <= 8192), rows read twice (K = 8196) and scalar rows.
ROW_SHAPES = [
    (1, 1),
    (1, 4097),
    (33, 17),
    (2, 3, 7),
    (128, 1000),
    (2, 4),
    (5, 1028),
    (3, 8192),
    (2, 8196),
]


@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_symmetric_activation_parity(device, rng, shape, bits, dtype):
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    poison(device, [np.prod(shape), 4 * np.prod(shape[:-1])])
    q, s = bg.quantize_activations(x, bits=bits)
    assert q.dtype == np.int8 and q.shape == shape and s.shape == shape[:-1]
    np.testing.assert_allclose(s, ref.activation_scale(x, bits), rtol=1e-6)
    rq, _ = ref.quantize_activations(x, bits, scale=s)
    assert np.array_equal(q, rq)  # x * s is a correctly rounded product: exact
    np.testing.assert_allclose(
        bg.dequantize_activations(q, s), ref.dequantize_activations(q, s), rtol=1e-6, atol=1e-30
    )


@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_asymmetric_activation_parity(device, rng, shape):
    x = (rng.standard_normal(shape) * 3 + rng.uniform(-2, 2)).astype(np.float32)
    q, step, zp = bg.quantize_activations(x, symmetric=False)
    assert q.dtype == np.uint8 and zp.dtype == np.uint8 and step.shape == shape[:-1]
    _, rstep, rzp = ref.quantize_activations_asymmetric(x)
    np.testing.assert_allclose(step, rstep, rtol=1e-6)
    # The zero point is a rounded quotient too: within 1e-6 of a tie it may differ by one (seen on
    # the H100, whose float division is not correctly rounded). q is then checked against it.
    ratio = -np.minimum(x.astype(np.float64).min(axis=-1), 0) / step.astype(np.float64)
    zp_mismatch = zp != rzp
    assert (np.abs(zp.astype(np.int64) - rzp) <= 1).all()
    assert (ref.rounding_tie_gap(ratio[zp_mismatch]) <= 1e-6).all()
    rq = ref.quantize_activations_asymmetric(x, scale=step, zero_point=zp)[0]
    values = np.clip(x.astype(np.float64) / step[..., None].astype(np.float64), -1e9, 1e9)
    mismatch = q.astype(np.int64) != rq.astype(np.int64)
    v = values[mismatch]
    assert (ref.rounding_tie_gap(v) <= 1e-6).all()
    deq = bg.dequantize_activations(q, step, zp)
    np.testing.assert_allclose(deq, ref.dequantize_activations(q, step, zp), rtol=1e-6, atol=1e-6)


def test_activation_edge_values(device):
    x = np.array([[0, 0, 0], [1e4, -1e4, 5e3], [1e-30, -1e-30, 0], [7, 7, 7]], np.float32)
    q, s = bg.quantize_activations(x)
    rq, rs = ref.quantize_activations(x, scale=s)
    np.testing.assert_allclose(s, ref.activation_scale(x), rtol=1e-6)
    assert np.array_equal(q, rq) and q[0].tolist() == [0, 0, 0] and q[3].tolist() == [127] * 3
    q, s = bg.quantize_activations(np.zeros((0, 5), np.float32))
    assert q.shape == (0, 5) and s.shape == (0,)


def test_tensors_in_give_tensors_out(device, rng):
    x = bg.Tensor.from_numpy(rng.standard_normal((4, 9)).astype(np.float32))
    q, s = bg.quantize_activations(x)
    assert isinstance(q, bg.Tensor) and isinstance(s, bg.Tensor)
    assert isinstance(bg.dequantize_activations(q, s), bg.Tensor)
    w = bg.quantize_weights(bg.Tensor.from_numpy(rng.standard_normal((4, 32)).astype(np.float32)))
    assert isinstance(w.unpack(), bg.Tensor) and isinstance(w.dequantize(), bg.Tensor)
    gq, gs = bg.quantize_gradients(x)
    assert isinstance(gq, bg.Tensor) and isinstance(gs, bg.Tensor)


@pytest.mark.parametrize("bits", [8, 5])
def test_gradient_parity(device, rng, bits):
    g = (rng.standard_normal((37, 129)) * 1e-3).astype(np.float32)
    q, s = bg.quantize_gradients(g, bits=bits)
    np.testing.assert_allclose(s, (2 ** (bits - 1) - 1) / np.abs(g).max(), rtol=1e-6)
    rq, _ = ref.quantize_gradients(g, bits, scale=s)
    assert np.array_equal(q, rq)


def test_stochastic_gradients_are_reproducible_and_unbiased(device, rng):
    g = rng.standard_normal(100_000).astype(np.float32)
    q1, s = bg.quantize_gradients(g, stochastic=True, seed=2**40 + 7)
    q2, _ = bg.quantize_gradients(g, stochastic=True, seed=2**40 + 7)
    q3, _ = bg.quantize_gradients(g, stochastic=True, seed=3)
    assert np.array_equal(q1, q2) and not np.array_equal(q1, q3)
    rq, _ = ref.quantize_gradients(g, stochastic=True, seed=2**40 + 7, scale=s)
    assert np.array_equal(q1, rq)  # the same (seed, index) hash as the reference
    bias = np.mean(q1.astype(np.float64) / s - g)
    assert abs(bias) < 5 / s / np.sqrt(g.size)  # unbiased: mean error within 5 sigma of zero
    assert np.all(np.abs(q1.astype(np.float64) / s - g) <= 1 / s + 1e-6)


def test_pack_and_unpack_on_the_gpu(device, rng):
    for shape in [(1, 1), (33, 17), (5, 4097)]:
        q = rng.integers(-1, 2, size=shape, dtype=np.int8)
        packed = bg.pack_ternary(q)
        assert np.array_equal(packed, ref.pack_ternary(q))
        assert np.array_equal(bg.unpack_ternary(packed, shape), q)
    bad = np.array([[0, 1, 2, -2, 1]], np.int8)
    with pytest.raises(ValueError, match="2 values are not"):
        bg.pack_ternary(bad)
    with pytest.raises(bg.ShapeError):
        bg.unpack_ternary(ref.pack_ternary(q), (5, 4096 + 32))


def test_nan_and_inf_raise_with_their_count(device):
    w = np.ones((4, 40), np.float32)
    w[0, 3], w[2, 7], w[3, 39] = np.nan, np.inf, -np.inf
    for call in (
        lambda: bg.quantize_weights(w),
        lambda: bg.binarize_weights(w, group_size=8),
        lambda: bg.quantize_activations(w),
        lambda: bg.quantize_gradients(w),
        lambda: bg.quantize_activations(w, symmetric=False),
    ):
        with pytest.raises(ValueError, match="contains 3 NaN or Inf values"):
            call()
    assert bg.quantize_weights(np.ones((4, 40), np.float32)).scale == 1.0  # device still fine


def test_bad_arguments_raise(device):
    w = np.ones((4, 40), np.float32)
    with pytest.raises(bg.ShapeError, match="does not divide K = 40"):
        bg.quantize_weights(w, group_size=16)
    with pytest.raises(bg.ShapeError, match="2-D"):
        bg.quantize_weights(np.ones(40, np.float32))
    with pytest.raises(bg.ShapeError, match="empty"):
        bg.quantize_weights(np.ones((0, 40), np.float32))
    with pytest.raises(bg.DTypeError):
        bg.quantize_weights(w.astype(np.float64))
    with pytest.raises(TypeError):
        bg.quantize_activations(w.astype(np.int32))
    with pytest.raises(bg.ArgumentError, match="bits"):
        bg.quantize_activations(w, bits=9)
    with pytest.raises(bg.ShapeError, match="0-d"):
        bg.quantize_activations(np.float32(3))
    with pytest.raises(bg.ShapeError, match="empty"):
        bg.quantize_activations(np.ones((3, 0), np.float32))
    with pytest.raises(bg.ShapeError):
        bg.quantize_gradients(np.ones((0,), np.float32))
    with pytest.raises(bg.ShapeError):
        bg.dequantize_activations(np.ones((3, 4), np.int8), np.ones(2, np.float32))
    with pytest.raises(bg.DTypeError):
        bg.dequantize_weights(w)
    # Whole numbers only: 8.5 bits, "8", a seed of 1.5 or a group size of True are not cut or
    # converted to something else.
    for bits in (8.5, "8", True):
        with pytest.raises(TypeError, match="bits: expected an integer"):
            bg.quantize_activations(w, bits=bits)
        with pytest.raises(TypeError, match="bits: expected an integer"):
            bg.quantize_gradients(w, bits=bits)
    with pytest.raises(TypeError, match="seed: expected an integer"):
        bg.quantize_gradients(w, stochastic=True, seed=1.5)
    with pytest.raises(TypeError, match="seed: expected an integer"):
        bg.relu_dropout(w, 0.5, seed=1.5)
    for group in (True, 1.5, "8"):
        with pytest.raises(TypeError, match="group_size: expected an integer"):
            bg.quantize_weights(w, group_size=group)
        with pytest.raises(TypeError, match="group_size: expected an integer"):
            bg.binarize_weights(w, group_size=group)
    packed = bg.pack_ternary(np.ones((2, 16), np.int8))
    for shape in (None, 5, (2,), (2, 16, 1), "ab", (2, 15.5)):
        with pytest.raises((bg.ShapeError, TypeError), match="shape"):
            bg.unpack_ternary(packed, shape)
    assert (
        bg.quantize_activations(w, bits=np.int64(4))[0].max() == 7
    )  # NumPy integers are whole numbers


def test_scales_of_huge_values_do_not_flush_to_zero(device):
    """127 / 3e38 is a normal float; drivers may compute a / b as a * (1 / b) with 1 / b flushed to
    zero when |b| > 2^126 (the H100 did), so the kernels rescale such divisions first."""
    x = np.array([[3e38, -1.0], [-3.4e38, 2e38]], np.float32)
    q, s = bg.quantize_activations(x)
    np.testing.assert_allclose(s, ref.activation_scale(x), rtol=3e-7)
    assert q.tolist() == [[127, 0], [-127, 75]]
    q, step, zp = bg.quantize_activations(x, bits=2, symmetric=False)
    rq, rstep, rzp = ref.quantize_activations_asymmetric(x, 2)
    np.testing.assert_allclose(step, rstep, rtol=3e-7)
    assert np.array_equal(zp, rzp) and np.array_equal(q, rq)
    gq, gs = bg.quantize_gradients(x)
    np.testing.assert_allclose(gs, 127 / np.float64(3.4e38), rtol=3e-7)
    assert gq.tolist() == [[112, 0], [-127, 75]]
    w = bg.quantize_weights(np.array([[3e38]], np.float32))
    np.testing.assert_allclose(w.scale, 3e38, rtol=1e-6)
    assert w.unpack().tolist() == [[1]]
    y, acc = bg.bitlinear(
        x, bg.quantize_weights(np.array([[1.0, 0.0]], np.float32)), return_accumulator=True
    )
    assert acc.ravel().tolist() == [127, -127]
    np.testing.assert_allclose(y.ravel(), [1.5e38, -1.7e38], rtol=1e-6)  # gamma = 0.5
