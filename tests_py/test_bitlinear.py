"""BitLinear parity (docs/NUMERICS.md): int32 accumulators bit-identical to the reference for every
path; y within float32 rounding of the reference (1e-6 relative: the same float32 operations in
the same order, so in practice equal).

The reference quantizes x with the GPU's own per-row scale s = 127 / max|x| (from
quantize_activations, the same expression): Vulkan lets that division be 2.5 ulp off, and one ulp
can move a product x * s across a .5 tie (the case NUMERICS.md allows); with equal s the int8
values, and so the accumulators, must match exactly."""

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import reference as ref


def case(rng, m, k, n, dtype=np.float32):
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10)).astype(dtype)
    w = rng.standard_normal((n, k)).astype(np.float32)
    return x, bg.quantize_weights(w), rng.standard_normal(n).astype(np.float32)


def paths(device, m):
    dots = [False] + ([True] if device.info.features["integer_dot_product"] else [])
    algorithms = (["matvec"] if m <= 8 else []) + ["tiled"]
    return [(a, d) for a in algorithms for d in dots]


def check(x, q, bias, y, acc):
    s = bg.quantize_activations(np.asarray(x, np.float32))[1]
    ry, racc = ref.bitlinear(x, q.unpack(), q.scale, bias, scale=s)
    assert acc.dtype == np.int32 and np.array_equal(acc, racc)
    assert y.dtype == np.float32 and y.shape == ry.shape
    assert np.linalg.norm(y - ry) <= 1e-6 * np.linalg.norm(ry)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 17, 33), (3, 4097, 7), (1, 2560, 257),
                                   (8, 1000, 64), (17, 33, 65), (64, 64, 64), (130, 300, 70)])
def test_bitlinear_parity_on_every_path(device, rng, m, k, n):
    x, q, bias = case(rng, m, k, n)
    for algorithm, hardware in paths(device, m):
        y, acc = bg.bitlinear(x, q, bias, return_accumulator=True, algorithm=algorithm,
                              _hardware_dot=hardware)
        check(x, q, bias, y, acc)


def test_bitlinear_m_1000_and_leading_axes(device, rng):
    x, q, bias = case(rng, 1000, 96, 48)
    y, acc = bg.bitlinear(x.reshape(10, 100, 96), q, bias, return_accumulator=True)
    assert y.shape == (10, 100, 48)
    check(x, q, bias, y.reshape(1000, 48), acc.reshape(1000, 48))


def test_bitlinear_float16_input_without_bias(device, rng):
    x, q, _ = case(rng, 4, 129, 31, np.float16)
    y, acc = bg.bitlinear(x, q, return_accumulator=True)
    check(x.astype(np.float32), q, None, y, acc)  # float16 widens exactly to float32


def test_bitlinear_from_float_weights_and_tensors(device, rng):
    x = rng.standard_normal((2, 40)).astype(np.float32)
    w = rng.standard_normal((12, 40)).astype(np.float32)
    y = bg.bitlinear(x, w)
    q = bg.quantize_weights(w)
    assert np.array_equal(y, bg.bitlinear(x, q))
    ty = bg.bitlinear(bg.Tensor.from_numpy(x), q)
    assert isinstance(ty, bg.Tensor) and np.array_equal(ty.numpy(), y)


def test_bitlinear_errors(device, rng):
    x, q, bias = case(rng, 2, 32, 8)
    with pytest.raises(bg.ShapeError, match=r"\(2, 31\).*\(8, 32\)"):
        bg.bitlinear(x[:, :31], q)
    with pytest.raises(bg.ShapeError, match="bias"):
        bg.bitlinear(x, q, bias[:5])
    with pytest.raises(bg.DTypeError):
        bg.bitlinear(x.astype(np.float64), q)
    with pytest.raises(bg.UnsupportedError, match="8 rows"):
        bg.bitlinear(np.ones((9, 32), np.float32), q, algorithm="matvec")
    with pytest.raises(bg.UnsupportedError, match="coopmat"):
        bg.bitlinear(x, q, algorithm="coopmat")
    with pytest.raises(bg.ArgumentError):
        bg.bitlinear(x, q, algorithm="fast")
    with pytest.raises(bg.UnsupportedError, match="group_size"):
        bg.bitlinear(x, bg.quantize_weights(rng.standard_normal((8, 32)).astype(np.float32),
                                            group_size=16))
    bad = x.copy()
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match="1 NaN or Inf value"):
        bg.bitlinear(bad, q)
    assert bg.bitlinear(np.zeros((0, 32), np.float32), q).shape == (0, 8)
    check(x, q, bias, *bg.bitlinear(x, q, bias, return_accumulator=True))


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (5, 33, 7), (70, 129, 65)])
def test_int8_matmul_is_exact(device, rng, m, k, n):
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    expected = a.astype(np.int32) @ b.astype(np.int32)
    for _, hardware in paths(device, 100):
        out = bg.mixed_precision_matmul(a, b, _hardware_dot=hardware)
        assert out.dtype == np.int32 and np.array_equal(out, expected)
    with pytest.raises(bg.ShapeError):
        bg.mixed_precision_matmul(a, b[:-1] if k > 1 else np.ones((2, n), np.int8))


def test_int8_times_ternary_is_exact(device, rng):
    a = rng.integers(-128, 128, (19, 50), dtype=np.int8)
    q = bg.quantize_weights(rng.standard_normal((23, 50)).astype(np.float32))
    out = bg.mixed_precision_matmul(a, q)
    assert np.array_equal(out, a.astype(np.int32) @ q.unpack().astype(np.int32).T)


def test_backward_input_matches_the_straight_through_estimator(device, rng):
    for m, n, k in [(1, 1, 1), (3, 33, 17), (16, 64, 200)]:
        g = rng.standard_normal((m, n)).astype(np.float32)
        q = bg.quantize_weights(rng.standard_normal((n, k)).astype(np.float32))
        got = bg.bitlinear_backward_input(g, q)
        expected = ref.bitlinear_backward_input(g, q.unpack(), q.scale)
        assert got.shape == (m, k)
        assert np.linalg.norm(got - expected) <= 1e-5 * np.linalg.norm(expected)
    with pytest.raises(bg.ShapeError):
        bg.bitlinear_backward_input(g[:, :-1], q)


def test_bitlinear_layer(device, rng):
    layer = bg.nn.BitLinear(64, 48, seed=3)
    assert layer.nbytes == 48 * 16 + 4 and "BitLinear(in_features=64" in repr(layer)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    y = layer(x)
    check(x, layer.weight, layer.bias, y, bg.bitlinear(x, layer.weight, layer.bias,
                                                       return_accumulator=True)[1])
    w = rng.standard_normal((10, 64)).astype(np.float32)
    a, b = bg.nn.BitLinear.from_float(w), bg.nn.BitLinear.from_packed(
        bg.quantize_weights(w).packed(), bg.quantize_weights(w).scale, (10, 64))
    assert np.array_equal(a(x), b(x)) and a.bias is None
    assert layer.backward_input(np.ones((3, 48), np.float32)).shape == (3, 64)
    with pytest.raises(ValueError):
        bg.nn.BitLinear(65, 48, _weights=layer.weight)
