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
from bitnet_gpu import _core
from bitnet_gpu import reference as ref


def case(rng, m, k, n, dtype=np.float32):
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10)).astype(dtype)
    w = rng.standard_normal((n, k)).astype(np.float32)
    return x, bg.quantize_weights(w), rng.standard_normal(n).astype(np.float32)


def tensor_cores(device):
    return device.info.features.get("cooperative_matrix_int8", False)


def coopmat2(device):
    return device.info.features.get("cooperative_matrix2_int8", False)


def khr_tensor_cores(device):
    return device.info.features.get("cooperative_matrix_khr_int8", False)


def paths(device, m):
    """Every (algorithm, hardware dot) this device runs for m rows; the tensor-core paths ignore
    the dot flag."""
    dots = [False] + ([True] if device.info.features["integer_dot_product"] else [])
    algorithms = (["matvec"] if m <= 8 else []) + ["tiled"]
    return (
        [(a, d) for a in algorithms for d in dots]
        + ([("coopmat", None)] if tensor_cores(device) else [])
        + ([("coopmat_khr", None)] if khr_tensor_cores(device) else [])
        + ([("coopmat2", None)] if coopmat2(device) else [])
    )


def check(x, q, bias, y, acc):
    s = bg.quantize_activations(np.asarray(x, np.float32))[1]
    ry, racc = ref.bitlinear(x, q.unpack(), q.scale, bias, scale=s)
    assert acc.dtype == np.int32 and np.array_equal(acc, racc)
    assert y.dtype == np.float32 and y.shape == ry.shape
    # Float32 rounding is relative to the terms of acc * gamma / s + bias, which the bias can
    # cancel: on the H100, (1, 16, 1) with a product and a bias of about 0.1 left y = -0.0015, one
    # rounding of the product 1.1e-5 of it (seed 10579515670173296942).
    added = np.zeros(()) if bias is None else np.asarray(bias, np.float64)
    terms = np.abs(ry.astype(np.float64) - added) + np.abs(added)
    assert np.linalg.norm(y - ry) <= 1e-6 * np.linalg.norm(terms)


@pytest.mark.parametrize(
    "m,k,n",
    [
        (1, 1, 1),
        (1, 17, 33),
        (3, 4097, 7),
        (1, 2560, 257),
        (8, 1000, 64),
        (17, 33, 65),
        (64, 64, 64),
        (130, 300, 70),
        (1, 16384, 5),
        (2, 16400, 3),
        (5, 16399, 9),
    ],
)
def test_bitlinear_parity_on_every_path(device, rng, m, k, n):
    x, q, bias = case(rng, m, k, n)
    for algorithm, hardware in paths(device, m):
        y, acc = bg.bitlinear(
            x, q, bias, return_accumulator=True, algorithm=algorithm, _hardware_dot=hardware
        )
        check(x, q, bias, y, acc)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize(
    "m,k,n", [(1, 4, 1), (3, 2560, 6912), (8, 1000, 33), (1, 8192, 40), (2, 4096, 9)]
)
def test_matvec_with_and_without_its_own_pre_pass(device, rng, tune, fused, m, k, n):
    """Up to 8 float32 rows: each matvec workgroup quantizes them itself (fused_matvec, the default
    where they fit in shared memory) or a pre-pass does; both exact."""
    tune(fused_matvec=fused)
    x, q, bias = case(rng, m, k, n)
    check(x, q, bias, *bg.bitlinear(x, q, bias, return_accumulator=True))
    check(x, q, None, *bg.bitlinear(x, q, None, return_accumulator=True))
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(bg.ArgumentError, match="1 NaN or Inf value"):
        bg.bitlinear(bad, q)


@pytest.mark.parametrize("local_size", [256, 512, 1024])
@pytest.mark.parametrize(
    "m,k,n", [(1, 16384, 33), (1, 12292, 4097), (2, 4100, 77), (3, 1028, 5), (1, 4, 1)]
)
def test_strided_matvec(device, rng, tune, local_size, m, k, n):
    """The fused matvec on one round of large workgroups dealing the rows out subgroup by subgroup
    (matvec_strided, the local size): exact, bit for bit the separate pre-pass's y,
    with bias, accumulators, bitlinear_group's gated input and residual, and a NaN count. (A fused
    norm takes it only at 256 invocations, where its sum of squares adds in the pre-pass's order:
    test_matvec_masked_codes.)"""
    x, q, bias = case(rng, m, k, n)
    tune(fused_matvec=False)
    separate = bg.bitlinear(x, q, bias, return_accumulator=True)
    up = rng.standard_normal((m, k)).astype(np.float32)
    residual = rng.standard_normal((m, n)).astype(np.float32)

    def group():
        return bg._core.bitlinear_group(
            bg.Tensor.from_numpy(x),
            bg.Tensor.from_numpy(up),
            None,
            1e-5,
            [q._core],
            [bg.Tensor.from_numpy(residual)],
        )[0].numpy()

    separate_group = group()
    tune(fused_matvec=True, matvec_strided=local_size)
    for groups in [1, 3]:
        tune(matvec_strided_groups=groups)
        y, acc = bg.bitlinear(x, q, bias, return_accumulator=True)
        check(x, q, bias, y, acc)
        np.testing.assert_array_equal(y, separate[0])
        np.testing.assert_array_equal(group(), separate_group)
    bad = x.copy()
    bad[-1, -1] = np.inf
    with pytest.raises(bg.ArgumentError, match="1 NaN or Inf value"):
        bg.bitlinear(bad, q)


def fused_matvec_paths(rng, x, q, bias):
    """A function giving the fused matvec's results on x [m, k] and q [n, k] along its paths: y and
    the accumulators with `bias`, a fused norm with a residual, and the gated output of a gate/up
    pair (random norm weights, residual and gate/up weights, drawn once)."""
    (m, k), n = x.shape, q.shape[0]
    norm = rng.uniform(0.5, 1.5, k).astype(np.float32)
    residual = rng.standard_normal((m, n)).astype(np.float32)
    gate_up = [
        bg.quantize_weights(rng.standard_normal((n, k)).astype(np.float32)) for _ in range(2)
    ]

    def run():
        y, acc = bg.bitlinear(x, q, bias, return_accumulator=True)
        group = bg._core.bitlinear_group(
            bg.Tensor.from_numpy(x),
            None,
            bg.Tensor.from_numpy(norm),
            1e-5,
            [q._core],
            [bg.Tensor.from_numpy(residual)],
        )[0].numpy()
        gated = bg._core.bitlinear_group(
            bg.Tensor.from_numpy(x),
            None,
            bg.Tensor.from_numpy(norm),
            1e-5,
            [w._core for w in gate_up],
            [None, None],
            True,
        )[0].numpy()
        return y, acc, group, gated

    return run


def fused_matches_separate(rng, tune, x, q, bias, settings):
    """The fused matvec under `settings` (tuning knobs) gives exact accumulators and, along every
    path of fused_matvec_paths, bit for bit what the separate pre-pass gives."""
    run = fused_matvec_paths(rng, x, q, bias)
    tune(fused_matvec=False)
    separate = run()
    tune(fused_matvec=True, **settings)
    fused = run()
    check(x, q, bias, fused[0], fused[1])
    for a, b in zip(fused, separate):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(
    "m,k,n,strided",
    [
        (1, 4096, 70, 0),
        (2, 2048, 33, 0),
        (1, 16384, 9, 1024),
        (3, 1000, 7, 0),
        (1, 64, 1, 0),
        (1, 8192, 40, 512),
        (2, 6912, 33, 0),
        (1, 2560, 70, 256),
        (2, 1000, 33, 256),
    ],
)
def test_matvec_masked_codes(device, rng, tune, masked, m, k, n, strided):
    """The fused matvec with the weights' codes masked in place and multiplied as unsigned bytes
    into four accumulators (matvec_masked, the default for one row) or shifted down: exact, and
    bit for bit the separate pre-pass's y, with bias, accumulators, a fused norm with
    a residual, and the gated output of a gate/up pair, on both grids, with activations at +-127
    (the largest
    partial sums)."""
    x, q, bias = case(rng, m, k, n)
    x[:, ::3] = np.abs(x).max()  # many activations at the extremes
    x[:, 1::3] = -np.abs(x).max()
    fused_matches_separate(
        rng, tune, x, q, bias, {"matvec_strided": strided, "matvec_masked": masked}
    )
    with pytest.raises(bg.ArgumentError, match="matvec_masked=2"):
        tune(matvec_masked=2)


@pytest.mark.parametrize(
    "m,k,expected",
    [
        (1, 16384, "strided"),
        (2, 8192, "strided"),
        (1, 6912, "strided"),
        (1, 4096, "fused"),
        (2, 4096, "fused"),
        (3, 4096, "pre-pass"),
        (3, 2560, "pre-pass"),
        (4, 1024, "pre-pass"),
        (4, 8192, "pre-pass"),
        (6, 2560, "pre-pass"),
        (1, 16400, "pre-pass"),
    ],
)
def test_matvec_default_grid(device, rng, m, k, expected):
    """Which matvec runs by default: strided (one fused dispatch) for one or two float32 rows of
    6912 to 16384 values where the multiprocessor count is known (the H100), else the ordinary
    fused matvec for one or two rows up to 16384 values of x, else a separate pre-pass (the split
    one from K = 12288) before the matvec, or from six rows before the tensor cores where the
    device has them."""
    x, q, _ = case(rng, m, k, 64)
    with bg.profile(device) as p:
        bg.bitlinear(x, q)
    kernels = [name for name, _ in p.timings if name.startswith("bitlinear")]  # not the copies back
    if expected == "strided" and not device.info.multiprocessors:
        expected = "fused" if m <= 2 and m * k <= 16384 else "pre-pass"
    features = device.info.features
    tensor_cores = features["cooperative_matrix_int8"] or features["cooperative_matrix_khr_int8"]
    if expected == "pre-pass":
        last = "bitlinear_coopmat" if tensor_cores and m >= 6 else "bitlinear_matvec"
        assert kernels[-1].startswith(last) and not kernels[-1].endswith("_fused")
        assert (
            all(name.startswith("bitlinear_prepare") for name in kernels[:-1]) and len(kernels) >= 2
        )
    else:
        assert (
            len(kernels) == 1
            and kernels[0].startswith("bitlinear_matvec")
            and kernels[0].endswith("_fused")
        )


def test_fused_matvec_limit_setting(device, rng, tune):
    """fused_matvec_most moves the values of x up to which every matvec workgroup quantizes x
    itself (none from three rows by default): (4, 2560) takes the pre-pass by default, one fused
    dispatch under 16384, exact either way; a value out of range raises naming it. (The matvec
    takes the 4 rows: on devices with tensor cores they would go to the matmul.)"""
    x, q, bias = case(rng, 4, 2560, 40)
    for most, fused in [(None, False), (16384, True)]:
        tune(fused_matvec_most=most, matvec_most_rows=8)
        with bg.profile(device) as p:
            result = bg.bitlinear(x, q, bias, return_accumulator=True)
        check(x, q, bias, *result)
        kernels = [
            name for name, _ in p.timings if name.startswith("bitlinear")
        ]  # not the copies back
        assert kernels[-1].endswith("_fused") == fused and len(kernels) == (1 if fused else 2)
    with pytest.raises(bg.ArgumentError, match="fused_matvec_most=0"):
        tune(fused_matvec_most=0)
    assert bg.get_tuning()["fused_matvec_most"] == 16384  # a refused setting changes nothing


def test_strided_matvec_setting_is_checked(device, rng, tune):
    tune(matvec_strided=512)
    for name, value in [("matvec_strided", 300), ("matvec_strided_groups", 9)]:
        with pytest.raises(bg.ArgumentError, match=f"{name}={value}"):
            tune(**{name: value})
    assert bg.get_tuning()["matvec_strided"] == 512


@pytest.mark.parametrize("rows,unroll", [(1, 1), (3, 2), (16, 1), (2, 4)])
@pytest.mark.parametrize("m,k,n", [(1, 300, 37), (8, 4096, 70), (2, 16384, 9)])
def test_matvec_rows_setting(device, rng, tune, rows, unroll, m, k, n):
    """Every rows-per-subgroup and unroll setting the matvec kernel takes (the tuning knobs) stays
    exact, with rows of W longer and shorter than a subgroup's sweep."""
    tune(matvec_rows=rows, matvec_unroll=unroll)
    x, q, bias = case(rng, m, k, n)
    check(x, q, bias, *bg.bitlinear(x, q, bias, return_accumulator=True, algorithm="matvec"))


def test_matvec_rows_setting_is_checked(device, rng, tune):
    x, q, _ = case(rng, 1, 32, 8)
    with pytest.raises(bg.ArgumentError, match="matvec_rows=0"):
        tune(matvec_rows=0)
    with pytest.raises(bg.ArgumentError, match="matvec_unroll='3x'"):
        tune(matvec_rows=2, matvec_unroll="3x")
    assert bg.get_tuning()["matvec_rows"] is None  # nothing of a refused setting stays
    assert bg.bitlinear(x, q, algorithm="tiled").shape == (1, 8)  # the device is still usable


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize(
    "m,k,n,algorithm",
    [
        (1, 4096, 9, "matvec"),
        (3, 16400, 5, "matvec"),
        (2, 2052, 7, None),
        (20, 4100, 6, "tiled"),
        (1, 4097, 3, None),
        (8, 8, 4, None),
        (40, 300, 6, None),  # the tensor cores where a GPU has them: no row sums
    ],
)
def test_both_pre_passes(device, rng, tune, split, m, k, n, algorithm):
    """The one-workgroup-a-row pre-pass and the chunked one (decode) give identical results."""
    tune(prepare_split=split)
    x, q, bias = case(rng, m, k, n, np.float16 if k == 2052 else np.float32)
    check(
        x.astype(np.float32),
        q,
        bias,
        *bg.bitlinear(x, q, bias, return_accumulator=True, algorithm=algorithm),
    )
    bad = x.copy()
    bad[m - 1, k - 1], bad[0, 0] = np.nan, np.inf
    with pytest.raises(ValueError, match="2 NaN or Inf values"):
        bg.bitlinear(bad, q, algorithm=algorithm)


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
    if not tensor_cores(device):
        with pytest.raises(bg.UnsupportedError, match="coopmat.*cooperative matri"):
            bg.bitlinear(x, q, algorithm="coopmat")
    if not khr_tensor_cores(device):
        with pytest.raises(bg.UnsupportedError, match="coopmat_khr.*VK_KHR_cooperative_matrix"):
            bg.bitlinear(x, q, algorithm="coopmat_khr")
    if not coopmat2(device):
        with pytest.raises(bg.UnsupportedError, match="coopmat2.*cooperative matrices 2"):
            bg.bitlinear(x, q, algorithm="coopmat2")
    with pytest.raises(bg.ArgumentError):
        bg.bitlinear(x, q, algorithm="fast")
    grouped = bg.quantize_weights(rng.standard_normal((8, 32)).astype(np.float32), group_size=16)
    with pytest.raises(bg.UnsupportedError, match="group_size=16 .*own kernel"):
        bg.bitlinear(x, grouped, algorithm="tiled")
    bad = x.copy()
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match="1 NaN or Inf value"):
        bg.bitlinear(bad, q)
    assert bg.bitlinear(np.zeros((0, 32), np.float32), q).shape == (0, 8)
    check(x, q, bias, *bg.bitlinear(x, q, bias, return_accumulator=True))


@pytest.mark.parametrize(
    "m,k,n,g",
    [
        (1, 256, 33, 64),
        (3, 96, 7, 32),
        (17, 70, 9, 7),
        (1, 4097, 5, 17),
        (8, 2560, 257, 128),
        (1000, 64, 9, 16),
        (2, 33, 3, 33),
        (1, 48, 1, 1),
        (9, 4096, 3, 4096),
        (1, 192, 5, 192),
    ],
)
def test_bitlinear_with_one_scale_per_group(device, rng, m, k, n, g):
    """Weights with group_size = g: y = sum_g gamma[:, g] acc_g / s within 1e-5 of the float64
    reference (NUMERICS.md's matmul tolerance: the lanes add their float sums in their own order),
    and each output within 1e-5 of the magnitudes it adds (sum_k |x_q W_q| gamma / s), since
    terms can cancel (one output of 48 groups of one weight came out 1e-4 off its own tiny value
    on the H100), accumulators exact;
    groups of 16-weight multiples (in whole 64-weight vectors or not) and
    groups that split a 16-weight word; odd N (two rows a subgroup);
    poisoned out= targets, with and without bias, float16 x."""
    w = rng.standard_normal((n, k)).astype(np.float32) * rng.uniform(0.5, 2.0, (n, 1)).astype(
        np.float32
    )
    q = bg.quantize_weights(w, group_size=g)
    assert q.scale.shape == (n, k // g)
    bias = rng.standard_normal(n).astype(np.float32)
    for dtype, b in [(np.float32, None), (np.float32, bias), (np.float16, bias)]:
        x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10)).astype(dtype)
        y = np.full((m, n), np.nan, np.float32)
        acc = np.full((m, n), -7, np.int32)
        bg.bitlinear(x, q, b, return_accumulator=True, out=(y, acc))
        s = bg.quantize_activations(np.asarray(x, np.float32))[1]
        ry, racc = ref.bitlinear(x, q.unpack(), q.scale, b, scale=s)
        assert np.array_equal(acc, racc)
        # the magnitudes the kernel adds in float: sum_k |x_q[k] W_q[n, k]| gamma[n, group of k] / s
        xq = np.abs(bg.quantize_activations(np.asarray(x, np.float32))[0].astype(np.float64))
        per_group = np.einsum(
            "mgj,ngj->mng",
            xq.reshape(m, k // g, g),
            np.abs(q.unpack().reshape(n, k // g, g).astype(np.float64)),
        )
        terms = (per_group * q.scale[None].astype(np.float64)).sum(-1) / s[:, None]
        assert np.linalg.norm(y - ry) <= 1e-5 * max(np.linalg.norm(ry), np.linalg.norm(terms))
        assert (np.abs(y - ry) <= 1e-5 * (terms + (0 if b is None else np.abs(b))) + 1e-30).all()


def test_group_scales_change_the_result_as_the_formula_says(device, rng):
    """Scaling one group's gamma by 3 adds 2 * gamma_g * acc_g / s to y (a test that fails if the
    kernel used one scale for the row)."""
    n, k, g = 4, 128, 32
    q = bg.quantize_weights(rng.standard_normal((n, k)).astype(np.float32), group_size=g)
    scale = q.scale.copy()
    scale[:, 2] *= 3
    q3 = bg.TernaryWeights.from_packed(q.packed(), scale, (n, k), group_size=g)
    x = rng.standard_normal((1, k)).astype(np.float32)
    y, y3 = bg.bitlinear(x, q), bg.bitlinear(x, q3)
    xq, s = bg.quantize_activations(x)
    acc2 = xq[:, 2 * g : 3 * g].astype(np.int64) @ q.unpack()[:, 2 * g : 3 * g].T.astype(np.int64)
    np.testing.assert_allclose(y3 - y, 2 * q.scale[:, 2] * acc2 / s[:, None], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "m,k,n,g", [(1, 48, 5, 16), (3, 70, 9, 7), (17, 256, 33, 64), (2, 33, 1, 1)]
)
def test_backward_input_with_one_scale_per_group(device, rng, m, k, n, g):
    """grad_x = grad_y @ (W_q * gamma[n, k // g]) for group weights, within 1e-5 of the float64
    reference (and of the layer's backward_input)."""
    w = rng.standard_normal((n, k)).astype(np.float32)
    q = bg.quantize_weights(w, group_size=g)
    grad_y = rng.standard_normal((m, n)).astype(np.float32)
    got = bg.bitlinear_backward_input(grad_y, q)
    want = ref.bitlinear_backward_input(grad_y, q.unpack(), q.scale)
    assert got.shape == (m, k) and np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)
    layer = bg.nn.BitLinear.from_float(w, group_size=g)
    np.testing.assert_array_equal(layer.backward_input(grad_y), got)


def test_group_scaled_weights_in_mixed_precision_matmul(device, rng):
    """int8 x ternary products do not depend on the scales: group weights give the exact int32."""
    q = bg.quantize_weights(rng.standard_normal((9, 96)).astype(np.float32), group_size=32)
    a = rng.integers(-128, 128, (5, 96), dtype=np.int8)
    np.testing.assert_array_equal(
        bg.mixed_precision_matmul(a, q), a.astype(np.int64) @ q.unpack().T.astype(np.int64)
    )


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (5, 33, 7), (70, 129, 65)])
def test_int8_matmul_is_exact(device, rng, m, k, n):
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    expected = a.astype(np.int32) @ b.astype(np.int32)
    for algorithm, hardware in paths(device, 100):
        out = bg.mixed_precision_matmul(a, b, algorithm=algorithm, _hardware_dot=hardware)
        assert out.dtype == np.int32 and np.array_equal(out, expected)
    with pytest.raises(bg.ShapeError):
        bg.mixed_precision_matmul(a, b[:-1] if k > 1 else np.ones((2, n), np.int8))


def test_int8_times_ternary_is_exact(device, rng):
    a = rng.integers(-128, 128, (19, 50), dtype=np.int8)
    q = bg.quantize_weights(rng.standard_normal((23, 50)).astype(np.float32))
    for algorithm, hardware in paths(device, 19):
        if algorithm != "matvec":
            out = bg.mixed_precision_matmul(a, q, algorithm=algorithm, _hardware_dot=hardware)
            assert np.array_equal(out, a.astype(np.int32) @ q.unpack().astype(np.int32).T)
    with pytest.raises(bg.ArgumentError, match="'tiled', 'coopmat', 'coopmat_khr' or 'coopmat2'"):
        bg.mixed_precision_matmul(a, q, algorithm="matvec")


def check_tensor_cores(rng, m, k, n, algorithm="coopmat"):
    """A cooperative-matrix kernel under the current settings: BitLinear (y and exact
    accumulators) and the int8 x int8 product. (test_decoder_ops adds residuals on the automatic
    path.)"""
    x, q, bias = case(rng, m, k, n)
    check(x, q, bias, *bg.bitlinear(x, q, bias, return_accumulator=True, algorithm=algorithm))
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    assert np.array_equal(
        bg.mixed_precision_matmul(a, b, algorithm=algorithm), ref.exact_int_matmul(a, b)
    )


@pytest.mark.skipif("not bg.default_device().info.features.get('cooperative_matrix2_int8')")
@pytest.mark.parametrize(
    "tile", ["128x128x64", "64x64x32", "32x128x64", "64x128x128", "128x256x64", "256x128x64"]
)
@pytest.mark.parametrize(
    "m,k,n", [(9, 16, 1), (33, 4097, 65), (300, 2560, 700), (2048, 2560, 6912), (256, 256, 256)]
)
def test_coopmat2_every_tile(device, rng, tune, tile, m, k, n):
    """The cooperative-matrix-2 kernel (GPU only): edges of every tile size (zeros read past M, N
    and K, stores past them dropped) and whole tiles; exact accumulators."""
    tune(coopmat2_tile=tile)
    check_tensor_cores(rng, m, k, n, "coopmat2")


@pytest.mark.skipif("not bg.default_device().info.features.get('cooperative_matrix_int8')")
@pytest.mark.parametrize(
    "tile",
    [
        "128x128",
        "64x64",
        "64x128",
        "128x256",
        "256x128",
        "64x128x128",
        "128x128x128",
        "64x256x128",
        "160x128x128",
        "128x96x128",
        "96x128x128",
    ],
)
@pytest.mark.parametrize(
    "m,k,n", [(1, 16, 1), (33, 4097, 65), (300, 2560, 700), (2048, 2560, 6912)]
)
def test_tensor_core_path_every_tile(device, rng, tune, tile, m, k, n):
    """The cooperative-matrix kernel (GPU only): edges of every tile size, exact accumulators."""
    tune(coopmat_tile=tile)
    check_tensor_cores(rng, m, k, n)


@pytest.mark.skipif("not bg.default_device().info.features.get('cooperative_matrix_khr_int8')")
@pytest.mark.parametrize(
    "tile,subgroup_rows,depth",
    [
        ("128x128", 2, 2),
        ("256x128", 4, 2),
        ("64x128", 2, 1),
        ("128x128x128", 4, 1),
        ("64x256x128", 1, 2),
        ("160x128x128", 2, 2),
        ("128x96x128", 4, 1),
    ],
)
@pytest.mark.parametrize(
    "m,k,n", [(1, 16, 1), (33, 4097, 65), (70, 200, 130), (300, 2560, 700), (256, 256, 256)]
)
def test_khr_tensor_core_path(device, rng, tune, tile, subgroup_rows, depth, m, k, n):
    """The same kernel through VK_KHR_cooperative_matrix (GPU only): tiles, subgroup layouts and
    steps ahead, edges and whole tiles (FULL_TILES); exact accumulators."""
    tune(coopmat_tile=tile, coopmat_subgroup_rows=subgroup_rows, coopmat_depth=depth)
    check_tensor_cores(rng, m, k, n, "coopmat_khr")


@pytest.mark.skipif("not bg.default_device().info.features.get('cooperative_matrix_int8')")
@pytest.mark.parametrize(
    "tile,subgroup_rows",
    [
        ("256x128", 4),
        ("256x128", 8),
        ("128x256", 1),
        ("128x128x128", 4),
        ("64x128", 4),
        ("128x128", 2),
        ("128x128x128", 2),
        ("256x128", 2),
    ],
)
@pytest.mark.parametrize("m,k,n", [(1, 16, 1), (33, 4097, 65), (300, 2560, 700)])
def test_tensor_core_subgroup_layouts(device, rng, tune, tile, subgroup_rows, m, k, n):
    """The 8 subgroups split a tile rows x (8 / rows) (coopmat_subgroup_rows, GPU only)."""
    tune(coopmat_tile=tile, coopmat_subgroup_rows=subgroup_rows)
    check_tensor_cores(rng, m, k, n)


@pytest.mark.skipif("not bg.default_device().info.features.get('cooperative_matrix_int8')")
@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("tile", ["256x128", "64x128", "128x128x128", "128x128"])
@pytest.mark.parametrize(
    "m,k,n", [(1, 16, 1), (33, 4097, 65), (300, 2560, 700), (70, 200, 130), (20, 448, 30)]
)
def test_tensor_core_loads_steps_ahead(device, rng, tune, depth, tile, m, k, n):
    """coopmat_depth (GPU only): one K step (K = 16), numbers of steps that are and are
    not multiples of the depth, a partial last step; exact accumulators."""
    tune(coopmat_tile=tile, coopmat_depth=depth)
    check_tensor_cores(rng, m, k, n)


@pytest.mark.skipif("not bg.default_device().info.features.get('cooperative_matrix_int8')")
@pytest.mark.parametrize(
    "m,k,n",
    [
        (128, 300, 640),
        (512, 300, 2560),
        (512, 300, 6912),
        (1030, 77, 129),
        (1030, 77, 2600),
        (100, 77, 17000),
        (2048, 300, 2560),
        (256, 256, 256),
    ],
)
def test_tensor_core_automatic_tile(device, rng, m, k, n):
    """The tile chosen from the multiprocessor count (GPU only; on the H100 these shapes take the
    64, 128 and 256-row tiles, (512, 300, 2560) and (100, 77, 17000) 128 x 96 tiles, (2048, 300,
    2560) 160 x 128 tiles with partial tiles, and (256, 256, 256) whole tiles, FULL_TILES): exact
    accumulators."""
    check_tensor_cores(rng, m, k, n)


@pytest.mark.skipif(
    "not bg.default_device().info.features.get('cooperative_matrix_int8') and "
    "not bg.default_device().info.features.get('cooperative_matrix_khr_int8')"
)
@pytest.mark.parametrize("splits", [None, 1, 2, 7, 64])
@pytest.mark.parametrize(
    "m,k,n",
    [
        (3, 2560, 3840),
        (8, 6912, 2560),
        (16, 2560, 1000),
        (24, 2560, 1000),
        (24, 100, 40000),
        (40, 100, 40000),
        (33, 4097, 65),
        (64, 300, 700),
        (5, 16, 1),
        (6, 2560, 9000),
    ],
)
def test_tensor_cores_with_k_split(device, rng, tune, splits, m, k, n):
    """Few rows on the tensor cores with K split over workgroups (GPU only; None: the rule, which
    splits none of (6, 2560, 9000)'s 71 tiles on a GPU of fewer than 142 multiprocessors, and
    gives (24 and 40, 100, 40000) the screened head's one tile of all the rows on one of up to 156):
    exact accumulators, y as the reference and bit for bit the unsplit y, the same again on the next
    call (the split sums and tickets are left zero), and a residual added in the epilogue. From
    three rows: the matvec, which takes up to five by default, is kept to two."""
    tune(matvec_most_rows=2)
    if splits is not None:
        tune(coopmat_splits=splits)
    x, q, bias = case(rng, m, k, n)
    y, acc = bg.bitlinear(x, q, bias, return_accumulator=True)
    check(x, q, bias, y, acc)
    again, acc_again = bg.bitlinear(x, q, bias, return_accumulator=True)
    assert np.array_equal(again, y) and np.array_equal(acc_again, acc)
    with bg.tuning(coopmat_splits=1):
        np.testing.assert_array_equal(bg.bitlinear(x, q, bias), y)
    residual = rng.standard_normal((m, n)).astype(np.float32)
    (out,) = _core.bitlinear_group(
        bg.Tensor.from_numpy(x), None, None, 1e-5, [q.handle], [bg.Tensor.from_numpy(residual)]
    )
    np.testing.assert_array_equal(out.numpy(), bg.bitlinear(x, q) + residual)


@pytest.mark.skipif("not bg.default_device().info.features.get('cooperative_matrix_int8')")
@pytest.mark.parametrize(
    "tile,subgroup_rows",
    [((16, 128, 256), 1), ((32, 64, 128), 2), ((32, 128, 128), 2), ((64, 128, 64), 2)],
)
def test_few_row_tiles_give_the_rule_bits(device, rng, tune, tile, subgroup_rows):
    """The few-row tiles (GPU only; the rule takes tiles of 16 rows up to 16 and of 32 up to 64,
    so 40 rows make two 32-row tiles, the second partial): every one gives the rule's accumulators
    and y, K split or not."""
    tune(matvec_most_rows=2)
    x, q, bias = case(rng, 40, 2600, 700)
    y, acc = bg.bitlinear(x, q, bias, return_accumulator=True)
    check(x, q, bias, y, acc)
    tune(coopmat_tile=tile, coopmat_subgroup_rows=subgroup_rows)
    for splits in (None, 1, 3):
        tune(coopmat_splits=splits)
        got, got_acc = bg.bitlinear(x, q, bias, return_accumulator=True)
        np.testing.assert_array_equal(got_acc, acc)
        np.testing.assert_array_equal(got, y)


@pytest.mark.parametrize("most", [1, 2, 8])
def test_matvec_most_rows_setting(device, rng, tune, most):
    """matvec_most_rows moves the rows where the matvec stops and the matmul paths start: every
    setting gives the same accumulators."""
    x, q, bias = case(rng, 5, 300, 70)
    want = bg.bitlinear(x, q, bias, return_accumulator=True)[1]
    tune(matvec_most_rows=most)
    np.testing.assert_array_equal(bg.bitlinear(x, q, bias, return_accumulator=True)[1], want)


@pytest.mark.skipif("not bg.default_device().info.features.get('cooperative_matrix_int8')")
def test_coopmat_tile_setting_is_checked(device, rng, tune):
    x, q, _ = case(rng, 20, 32, 8)
    with pytest.raises(bg.ArgumentError, match="coopmat_tile=100x7"):
        tune(coopmat_tile="100x7")
    tune(coopmat_tile=(256, 256, 128))  # over 48 KiB of shared memory
    with pytest.raises(bg.UnsupportedError, match="shared memory"):
        bg.bitlinear(x, q, algorithm="coopmat")
    tune(coopmat_tile="96x96x128")  # 2 x 4 subgroups: 24 columns each
    with pytest.raises(bg.ArgumentError, match="coopmat_tile=96x96x128: its 8 subgroups"):
        bg.bitlinear(x, q, algorithm="coopmat")
    tune(coopmat_subgroup_rows=1)  # 96 x 12: refused too
    with pytest.raises(bg.ArgumentError, match="coopmat_subgroup_rows=1"):
        bg.bitlinear(x, q, algorithm="coopmat")
    tune(coopmat_tile="64x128", coopmat_subgroup_rows=None)
    with pytest.raises(bg.ArgumentError, match="coopmat_subgroup_rows=3"):  # not a power of two
        tune(coopmat_subgroup_rows=3)
    tune(coopmat_subgroup_rows=8)  # 64 rows in 8 parts of 8: refused where the tile is known
    with pytest.raises(bg.ArgumentError, match="coopmat_subgroup_rows=8"):
        bg.bitlinear(x, q, algorithm="coopmat")


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
    for bad in [(0, 4), (4, -1)]:
        with pytest.raises(bg.ArgumentError, match="expected an integer of at least 1"):
            bg.nn.BitLinear(*bad)
    with pytest.raises(TypeError, match="out_features: expected an integer"):
        bg.nn.BitLinear(4, 4.5)
    layer = bg.nn.BitLinear(64, 48, seed=3)
    assert layer.nbytes == 48 * 16 + 4 and "BitLinear(in_features=64" in repr(layer)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    y = layer(x)
    check(
        x,
        layer.weight,
        layer.bias,
        y,
        bg.bitlinear(x, layer.weight, layer.bias, return_accumulator=True)[1],
    )
    w = rng.standard_normal((10, 64)).astype(np.float32)
    a, b = (
        bg.nn.BitLinear.from_float(w),
        bg.nn.BitLinear.from_packed(
            bg.quantize_weights(w).packed(), bg.quantize_weights(w).scale, (10, 64)
        ),
    )
    assert np.array_equal(a(x), b(x)) and a.bias is None
    assert layer.backward_input(np.ones((3, 48), np.float32)).shape == (3, 64)
    with pytest.raises(ValueError):
        bg.nn.BitLinear(65, 48, _weights=layer.weight)
    grouped = bg.nn.BitLinear.from_float(w, np.ones(10, np.float32), group_size=16)
    q = bg.quantize_weights(w, group_size=16)
    packed = bg.nn.BitLinear.from_packed(q.packed(), q.scale, (10, 64), group_size=16)
    assert grouped.nbytes == 10 * 16 + 4 * 10 * 4 and grouped.weight.group_size == 16
    np.testing.assert_allclose(grouped(x), packed(x) + 1, rtol=1e-6, atol=1e-6)
    s = bg.quantize_activations(x)[1]
    ry = ref.bitlinear(x, q.unpack(), q.scale, np.ones(10, np.float32), scale=s)[0]
    assert np.linalg.norm(grouped(x) - ry) <= 1e-5 * np.linalg.norm(ry)


def test_bitlinear_layer_bias_stays_in_step_with_its_device_copy(device, rng):
    layer = bg.nn.BitLinear(32, 6, seed=1)
    x = rng.standard_normal((2, 32)).astype(np.float32)
    with pytest.raises(ValueError, match="read-only"):
        layer.bias[0] = 5.0
    new_bias = rng.standard_normal(6).astype(np.float32)
    layer.bias = new_bias
    new_bias[:] = 0  # the layer holds its own copy
    expected = bg.bitlinear(x, layer.weight, layer.bias)
    assert np.array_equal(layer(x), expected) and not np.array_equal(layer.bias, new_bias)
    layer.bias = None
    assert np.array_equal(layer(x), bg.bitlinear(x, layer.weight))
    with pytest.raises(ValueError, match=r"\(6,\)"):
        layer.bias = np.ones(5, np.float32)


def test_reference_integer_matmul_is_exact_on_both_routes(rng):
    a = rng.integers(-128, 128, (5, 300), dtype=np.int8)
    b = rng.integers(-1, 2, (300, 4), dtype=np.int8)
    expected = [
        [sum(int(a[i, t]) * int(b[t, j]) for t in range(300)) for j in range(4)] for i in range(5)
    ]
    assert ref.exact_int_matmul(a, b).tolist() == expected  # float64 BLAS route
    big = np.array([[2**40, 3]], np.int64), np.array([[2**20 + 1], [5]], np.int64)
    assert ref.exact_int_matmul(*big).tolist() == [[2**60 + 2**40 + 15]]  # int64 route


def test_bitlinear_out_targets(device, rng):
    x, q, bias = case(rng, 3, 70, 9)
    expected_y, expected_acc = bg.bitlinear(x, q, bias, return_accumulator=True)
    y_out = np.full((3, 9), np.nan, np.float32)
    assert bg.bitlinear(x, q, bias, out=y_out) is y_out and np.array_equal(y_out, expected_y)
    ty, tacc = (
        bg.Tensor.from_numpy(y_out * 0 + 7),
        bg.Tensor.from_numpy(np.full((3, 9), -5, np.int32)),
    )
    got = bg.bitlinear(bg.Tensor.from_numpy(x), q, bias, return_accumulator=True, out=(ty, tacc))
    assert got[0] is ty and got[1] is tacc
    assert np.array_equal(ty.numpy(), expected_y) and np.array_equal(tacc.numpy(), expected_acc)
    with pytest.raises(bg.ShapeError, match=r"\(3, 9\)"):
        bg.bitlinear(x, q, out=np.empty((3, 8), np.float32))
    with pytest.raises(bg.DTypeError, match="float32"):
        bg.bitlinear(x, q, out=bg.Tensor.from_numpy(np.empty((3, 9), np.int32)))
    with pytest.raises(ValueError, match="expected 1 target"):
        bg.bitlinear(x, q, out=(y_out, np.empty((3, 9), np.int32)))
    with pytest.raises(bg.ShapeError, match="accumulators"):
        bg.bitlinear(x, q, return_accumulator=True, out=(None, np.empty((9, 3), np.int32)))
    assert np.array_equal(y_out, expected_y)  # the failed calls left the earlier result alone


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize(
    "m,k,n,strided",
    [
        (1, 2560, 70, 0),
        (2, 2048, 33, 0),
        (1, 16384, 9, 1024),
        (3, 1000, 7, 0),
        (1, 64, 1, 0),
        (1, 6912, 40, 512),
    ],
)
def test_matvec_prefetch(device, rng, tune, prefetch, m, k, n, strided):
    """The fused matvec with each subgroup's first weights requested before the pre-pass
    (matvec_prefetch, by default only for rows of up to 4096 values) or not:
    exact, and bit for bit the separate pre-pass's y, with bias, accumulators, a fused norm with a
    residual and the gated output of a gate/up pair, on both grids."""
    x, q, bias = case(rng, m, k, n)
    fused_matches_separate(
        rng, tune, x, q, bias, {"matvec_strided": strided, "matvec_prefetch": prefetch}
    )
