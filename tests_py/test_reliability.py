"""Reliability (see README "Guarantees"): inputs are never written, memory stays flat over many
calls, threads sharing a device get correct results, and property-based tests over random shapes,
dtypes, strides, placements and values (signed zeros, subnormals, huge values, NaN/Inf) compare
every public function with its NumPy reference or its documented exception."""

import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import bitnet_gpu as bg
from bitnet_gpu import reference as ref
from conftest import check_draws

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "investigations"))
import soak as bench_soak  # noqa: E402

PROPERTY = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def public_calls(rng):
    """(name, function, inputs): every public function on NumPy inputs, some of them failing."""
    w = rng.standard_normal((24, 80)).astype(np.float32)
    x = rng.standard_normal((3, 80)).astype(np.float32)
    x16 = x.astype(np.float16)
    bad = x.copy()
    bad[1, 1] = np.inf
    values = rng.integers(-1, 2, (5, 37), dtype=np.int8)
    q = bg.quantize_weights(w)
    packed, scale = q.packed(), np.array([q.scale], np.float32)
    xq, s = bg.quantize_activations(x)
    aq, astep, azp = bg.quantize_activations(x, symmetric=False)
    a8 = rng.integers(-128, 128, (6, 80), dtype=np.int8)
    b8 = rng.integers(-128, 128, (80, 7), dtype=np.int8)
    bias = rng.standard_normal(24).astype(np.float32)
    gy = rng.standard_normal((3, 24)).astype(np.float32)
    layer = bg.nn.BitLinear(80, 24, seed=1)
    return [
        ("quantize_weights", lambda a: bg.quantize_weights(a), [w]),
        ("quantize_weights group", lambda a: bg.quantize_weights(a, group_size=16), [w]),
        ("binarize_weights", lambda a: bg.binarize_weights(a), [w]),
        (
            "from_packed",
            lambda p, c: bg.TernaryWeights.from_packed(p, c, (24, 80)),
            [packed, scale],
        ),
        ("pack_ternary", bg.pack_ternary, [values]),
        ("unpack_ternary", lambda p: bg.unpack_ternary(p, (24, 80)), [packed]),
        ("quantize_activations", bg.quantize_activations, [x16]),
        ("quantize_activations NaN", bg.quantize_activations, [bad]),
        ("quantize_activations asym", lambda a: bg.quantize_activations(a, symmetric=False), [x]),
        ("dequantize_activations", bg.dequantize_activations, [xq, s]),
        ("dequantize_activations asym", bg.dequantize_activations, [aq, astep, azp]),
        ("quantize_gradients", lambda g: bg.quantize_gradients(g, stochastic=True, seed=5), [x]),
        ("bitlinear", lambda a, b: bg.bitlinear(a, q, b), [x, bias]),
        ("bitlinear float weights", bg.bitlinear, [x, w]),
        ("bitlinear NaN", lambda a: bg.bitlinear(a, q), [bad]),
        ("bitlinear_backward_input", lambda g: bg.bitlinear_backward_input(g, q), [gy]),
        ("mixed_precision_matmul", bg.mixed_precision_matmul, [a8, b8]),
        ("mixed_precision_matmul ternary", lambda a: bg.mixed_precision_matmul(a, q), [a8[:, :80]]),
        ("nn.BitLinear", layer, [x]),
        ("sample_logits", lambda a: bg.sample_logits(a, 0.7, 5, seed=2), [x]),
        ("sample_logits NaN", lambda a: bg.sample_logits(np.where(np.isinf(a), np.nan, a)), [bad]),
        ("Tensor.from_numpy", bg.Tensor.from_numpy, [x]),
    ]


def test_public_functions_never_write_their_inputs(device, rng):
    for name, fn, inputs in public_calls(rng):
        before = [a.copy() for a in inputs]
        try:
            fn(*inputs)
        except ValueError:
            pass  # the NaN/Inf cases raise; their inputs must still be untouched
        for a, b in zip(inputs, before):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{name} wrote its input"


def test_zero_copy_inputs_are_never_written(device, rng):
    if not device.info.features["external_memory_host"]:
        pytest.skip("no VK_EXT_external_memory_host")
    x = bg.aligned_empty((5, 128), np.float32)
    x[:] = rng.standard_normal((5, 128))
    before = x.copy()
    t = bg.Tensor.from_numpy(x, zero_copy=True)
    bg.quantize_activations(t)
    bg.bitlinear(t, bg.quantize_weights(rng.standard_normal((9, 128)).astype(np.float32)))
    assert np.array_equal(x, before)


ODD_INPUTS = {
    "empty": np.zeros((0,), np.float32),
    "no rows": np.zeros((0, 16), np.float32),
    "no columns": np.zeros((3, 0), np.float32),
    "NumPy scalar": np.float32(3.0),
    "0-d": np.array(2.0, np.float32),
    "int64": np.arange(12).reshape(3, 4),
    "bool": np.ones((3, 4), bool),
    "complex": np.ones((3, 4), np.complex64),
    "float64": np.ones((3, 4)),
    "strided": np.ones((4, 8), np.float32)[:, ::2],
    "transposed": np.ones((4, 8), np.float32).T,
    "NaN": np.full((3, 4), np.nan, np.float32),
    "3-D": np.ones((2, 3, 4), np.float32),
    "list": [[1.0, 2.0], [3.0, 4.0]],
    "None": None,
    "text": "abc",
    "objects": np.array([object()] * 4),
}
ONE_INPUT = [
    "relu",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "relu2",
    "softmax",
    "sum",
    "max",
    "mean",
    "transpose",
    "quantize_activations",
    "quantize_weights",
    "binarize_weights",
    "pack_ternary",
    "unpack_ternary",
    "dequantize_activations",
    "dequantize_weights",
    "quantize",
    "quantize_gradients",
    "sample_logits",
]
TWO_INPUTS = [
    "add",
    "sub",
    "mul",
    "div",
    "matmul",
    "mixed_precision_matmul",
    "silu_mul",
    "relu2_mul",
    "relu_backward",
    "gelu_backward",
    "sigmoid_backward",
    "tanh_backward",
    "silu_backward",
    "relu2_backward",
    "softmax_backward",
]


def test_odd_inputs_raise_the_documented_exceptions(device, rng):
    """Every public function given empty, 0-d, wrongly typed, strided, non-finite or non-array
    input either works or raises bitnet_gpu's errors (or NumPy's TypeError / ValueError): never
    another exception (a 0-d array once reached a ZeroDivisionError in softmax), and the device
    stays usable."""
    x = rng.standard_normal((3, 4)).astype(np.float32)
    w = bg.quantize_weights(rng.standard_normal((5, 4)).astype(np.float32))
    calls = []
    for odd_name, odd in ODD_INPUTS.items():
        calls += [
            (f"{name}({odd_name})", lambda f=getattr(bg, name), a=odd: f(a)) for name in ONE_INPUT
        ]
        for name in TWO_INPUTS:
            calls.append((f"{name}(x, {odd_name})", lambda f=getattr(bg, name), a=odd: f(x, a)))
            calls.append((f"{name}({odd_name}, x)", lambda f=getattr(bg, name), a=odd: f(a, x)))
        calls += [
            (f"bitlinear({odd_name})", lambda a=odd: bg.bitlinear(a, w)),
            (f"bitlinear(x, w, bias={odd_name})", lambda a=odd: bg.bitlinear(x, w, a)),
            (f"rms_norm({odd_name})", lambda a=odd: bg.rms_norm(a, np.ones(4, np.float32))),
            (f"rms_norm(x, {odd_name})", lambda a=odd: bg.rms_norm(x, a)),
            (
                f"layer_norm(x, ones, {odd_name})",
                lambda a=odd: bg.layer_norm(x, np.ones(4, np.float32), a),
            ),
            (f"attention({odd_name})", lambda a=odd: bg.attention(a, a, a)),
            (f"rope({odd_name})", lambda a=odd: bg.rope(a, 0)),
            (
                f"bitlinear_backward_input({odd_name})",
                lambda a=odd: bg.bitlinear_backward_input(a, w),
            ),
            (f"Tensor.from_numpy({odd_name})", lambda a=odd: np.asarray(bg.Tensor.from_numpy(a))),
        ]
    wrong = []
    with np.errstate(all="ignore"):
        for label, call in calls:
            try:
                call()
            except (bg.Error, TypeError, ValueError):
                pass
            except Exception as error:  # noqa: BLE001 - the point of the test
                wrong.append(f"{label}: {type(error).__name__}: {error}")
    assert not wrong, "\n".join(wrong)
    np.testing.assert_array_equal(bg.relu(x), np.maximum(x, 0))


def test_soak_keeps_memory_flat(device):
    s = bench_soak.soak(calls=2000, cycles=1000, device=device)
    before, after = s["memory_stats_before"], s["memory_stats_after"]
    for key in ("in_use_bytes", "allocated_bytes", "live_blocks", "pool_misses"):
        assert after[key] == before[key], key
    assert s["rss_after"] - s["rss_before"] < 16 * 2**20


def test_threads_share_a_device_correctly(device):
    t = bench_soak.threads(count=8, seconds=3, device=device)
    assert t["errors"] == [] and t["calls"] > 8


# Values that stress the kernels: signed zeros, subnormals, huge and tiny magnitudes.
SPECIAL = st.sampled_from([0.0, -0.0, 1e-45, -1e-40, 1e-38, 3e38, -3e38, 1.0, -1.0, 0.5, 127.5])
FLOATS = st.one_of(st.floats(-1e6, 1e6, width=32), SPECIAL)


def arrays(dtype, shape, elements=FLOATS):
    return hnp.arrays(dtype, shape, elements=elements)


def placed(a, how):
    """The same values as NumPy, a non-contiguous view, or a Tensor in device or host memory."""
    if how == "strided":
        wide = np.repeat(a, 2, axis=-1)
        return wide[..., ::2]
    if how in ("device", "host"):
        return bg.Tensor.from_numpy(a, memory=how)
    return a


def as_numpy(v):
    return v.numpy() if isinstance(v, bg.Tensor) else np.asarray(v)


HOW = st.sampled_from(["numpy", "strided", "device", "host"])


@PROPERTY
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=40),
    data=st.data(),
    how=HOW,
    dtype=st.sampled_from([np.float32, np.float16]),
)
def test_property_quantize_activations(device, shape, data, how, dtype):
    elements = FLOATS if dtype == np.float32 else st.floats(-6e4, 6e4, width=16)
    x = data.draw(arrays(np.float32, shape, elements)).astype(dtype)
    q, s = bg.quantize_activations(placed(x, how))
    q, s = as_numpy(q), as_numpy(s)
    x32 = x.astype(np.float32)
    np.testing.assert_allclose(
        s, ref.activation_scale(x32.reshape(-1, shape[-1])).reshape(shape[:-1]), rtol=3e-7
    )
    expected, _ = ref.quantize_activations(x32.reshape(-1, shape[-1]), scale=s.reshape(-1))
    assert np.array_equal(q.reshape(-1, shape[-1]), expected)


@PROPERTY
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=40),
    data=st.data(),
    how=HOW,
    temperature=st.sampled_from([0.0, 1e-30, 0.3, 1.0, 7.0, 1e37]),
    top_k=st.integers(0, 45),
    infinite=st.booleans(),
)
def test_property_sample_logits(device, shape, data, how, temperature, top_k, infinite):
    """Draws on special values (signed zeros, subnormals, +-3e38, and +-inf where `infinite`) at
    temperatures from 0 to 1e37: reference.sample_rows's index, or one whose reference score lies
    within float32 rounding of the best, and always a kept one."""
    elements = st.one_of(FLOATS, st.sampled_from([np.inf, -np.inf])) if infinite else FLOATS
    x = data.draw(arrays(np.float32, shape, elements))
    top_k = top_k or None
    drawn = as_numpy(bg.sample_logits(placed(x, how), temperature, top_k, seed=9, step=4))
    check_draws(x, drawn, temperature, top_k, 9, 4)


@PROPERTY
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=2, max_side=30),
    data=st.data(),
    poison=st.sampled_from([np.nan, np.inf, -np.inf]),
)
def test_property_nonfinite_inputs_raise_with_their_count(device, shape, data, poison):
    x = data.draw(arrays(np.float32, shape))
    flat = x.reshape(-1)
    where = data.draw(st.lists(st.integers(0, flat.size - 1), min_size=1, max_size=4, unique=True))
    flat[where] = poison
    word = "value" if len(where) == 1 else "values"
    for fn in (
        bg.quantize_activations,
        bg.quantize_gradients,
        lambda a: bg.quantize_weights(a.reshape(1, -1)),
    ):
        with pytest.raises(ValueError, match=f"{len(where)} NaN or Inf {word}"):
            fn(x)


def grouped(quantize, w, group):
    """quantize(w, group_size=group), or None after checking that a group size which does not
    divide K raises ShapeError."""
    if group is not None and w.shape[1] % group:
        with pytest.raises(bg.ShapeError):
            quantize(w, group_size=group)
        return None
    return quantize(w, group_size=group)


@PROPERTY
@given(
    n=st.integers(1, 20), k=st.integers(1, 70), data=st.data(), group=st.sampled_from([None, 4, 7])
)
def test_property_quantize_weights(device, n, k, data, group):
    w = data.draw(arrays(np.float32, (n, k), st.floats(-1e3, 1e3, width=32)))
    q = grouped(bg.quantize_weights, w, group)
    if q is None:
        return
    rq, rscale = ref.quantize_ternary(w, group)
    np.testing.assert_allclose(np.ravel(q.scale), np.ravel(rscale), rtol=1e-5)
    v = q.unpack()
    values = ref.ternary_values(w, q.scale, group)  # W / gamma with the GPU's own gamma
    differ = v != np.clip(np.rint(values), -1, 1)
    near_tie = ref.rounding_tie_gap(values) <= 1e-6
    assert (near_tie | ~differ).all()  # only values within 1e-6 of a rounding tie may differ
    assert np.array_equal(
        bg.TernaryWeights.from_packed(q.packed(), q.scale, (n, k), group).unpack(), v
    )


@PROPERTY
@given(
    m=st.integers(1, 12),
    k=st.integers(1, 90),
    n=st.integers(1, 40),
    data=st.data(),
    how=HOW,
    algorithm=st.sampled_from([None, "matvec", "tiled"]),
)
def test_property_bitlinear_accumulators_are_exact(device, m, k, n, data, how, algorithm):
    if algorithm == "matvec" and m > 8:
        algorithm = None
    x = data.draw(arrays(np.float32, (m, k), st.floats(-100, 100, width=32)))
    w = data.draw(arrays(np.float32, (n, k), st.floats(-1, 1, width=32)))
    q = bg.quantize_weights(w)
    y, acc = bg.bitlinear(placed(x, how), q, return_accumulator=True, algorithm=algorithm)
    s = bg.quantize_activations(x)[1]
    ry, racc = ref.bitlinear(x, q.unpack(), q.scale, scale=s)
    assert np.array_equal(as_numpy(acc), racc)
    np.testing.assert_allclose(as_numpy(y), ry, rtol=1e-6, atol=1e-30)


@PROPERTY
@given(n=st.integers(1, 10), k=st.integers(1, 60), data=st.data())
def test_property_pack_round_trip_and_invalid_values(device, n, k, data):
    v = data.draw(hnp.arrays(np.int8, (n, k), elements=st.integers(-1, 1)))
    packed = bg.pack_ternary(v)
    assert np.array_equal(packed, ref.pack_ternary(v))
    assert np.array_equal(bg.unpack_ternary(packed, (n, k)), v)
    bad = v.copy()
    bad.flat[data.draw(st.integers(0, v.size - 1))] = data.draw(st.sampled_from([2, -2, 127, -128]))
    with pytest.raises(ValueError, match="1 value is not"):
        bg.pack_ternary(bad)


@PROPERTY
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=30),
    data=st.data(),
    seed=st.integers(0, 2**64 - 1),
    stochastic=st.booleans(),
)
def test_property_quantize_gradients(device, shape, data, seed, stochastic):
    g = data.draw(arrays(np.float32, shape, st.floats(-1e4, 1e4, width=32)))
    q, s = bg.quantize_gradients(g, stochastic=stochastic, seed=seed)
    rq, rs = ref.quantize_gradients(g, 8, stochastic=stochastic, seed=seed, scale=s)
    np.testing.assert_allclose(s, rs, rtol=3e-7)
    if stochastic:
        assert np.array_equal(q, rq)  # the same (seed, index) hash as the reference
    else:
        product = g.astype(np.float64) * np.float64(s)
        near_tie = ref.rounding_tie_gap(product) <= 1e-6
        assert (near_tie | (q == rq)).all()


@PROPERTY
@given(
    n=st.integers(1, 12), k=st.integers(1, 70), data=st.data(), group=st.sampled_from([None, 2, 5])
)
def test_property_binarize_weights(device, n, k, data, group):
    w = data.draw(arrays(np.float32, (n, k), st.floats(-1e3, 1e3, width=32)))
    b = grouped(bg.binarize_weights, w, group)
    if b is None:
        return
    _, _, beta = ref.quantize_binary(w, group)
    np.testing.assert_allclose(np.ravel(b.scale), np.ravel(beta), rtol=1e-5, atol=1e-12)
    deq = bg.dequantize_weights(b)
    assert deq.shape == (n, k) and np.isin(np.sign(deq), [-1, 1]).all()


@PROPERTY
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 70),
    n=st.integers(1, 30),
    data=st.data(),
    algorithm=st.sampled_from([None, "tiled"]),
)
def test_property_int8_matmul_is_exact(device, m, k, n, data, algorithm):
    a = data.draw(hnp.arrays(np.int8, (m, k)))
    b = data.draw(hnp.arrays(np.int8, (k, n)))
    assert np.array_equal(
        bg.mixed_precision_matmul(a, b, algorithm=algorithm), ref.exact_int_matmul(a, b)
    )


@PROPERTY
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=30),
    data=st.data(),
    symmetric=st.booleans(),
)
def test_property_dequantize_activations(device, shape, data, symmetric):
    x = data.draw(arrays(np.float32, shape, st.floats(-1e3, 1e3, width=32)))
    if symmetric:
        q, s = bg.quantize_activations(x)
        got, expected = bg.dequantize_activations(q, s), ref.dequantize_activations(q, s)
    else:
        q, step, zp = bg.quantize_activations(x, symmetric=False)
        got, expected = (
            bg.dequantize_activations(q, step, zp),
            ref.dequantize_activations(q, step, zp),
        )
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-30)


@PROPERTY
@given(m=st.integers(1, 6), n=st.integers(1, 40), k=st.integers(1, 50), data=st.data())
def test_property_backward_input(device, m, n, k, data):
    g = data.draw(arrays(np.float32, (m, n), st.floats(-10, 10, width=32)))
    q = bg.quantize_weights(data.draw(arrays(np.float32, (n, k), st.floats(-1, 1, width=32))))
    expected = ref.bitlinear_backward_input(g, q.unpack(), q.scale)
    got = bg.bitlinear_backward_input(g, q)
    assert np.linalg.norm(got - expected) <= 1e-5 * max(np.linalg.norm(expected), 1e-30)


@PROPERTY
@given(
    dtype=st.sampled_from([np.float32, np.float16, np.int8, np.uint8, np.int32, np.uint32]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9),
    data=st.data(),
    memory=st.sampled_from(["device", "host"]),
    strided=st.booleans(),
)
def test_property_tensor_round_trip(device, dtype, shape, data, memory, strided):
    a = data.draw(hnp.arrays(dtype, shape))
    source = np.repeat(a, 2, axis=-1)[..., ::2] if strided and a.ndim else a
    t = bg.Tensor.from_numpy(source, memory=memory)
    back = t.numpy()
    assert back.dtype == a.dtype and back.shape == a.shape and back.tobytes() == a.tobytes()


@PROPERTY
@given(
    m=st.integers(1, 20),
    n=st.integers(1, 30),
    k=st.integers(1, 60),
    data=st.data(),
    group=st.sampled_from([None, 3]),
    bias=st.booleans(),
)
def test_property_weights_layer_and_ternary_matmul(device, m, n, k, data, group, bias):
    w = data.draw(arrays(np.float32, (n, k), st.floats(-2, 2, width=32)))
    if group is not None and k % group:
        group = None
    q = bg.quantize_weights(w, group_size=group)
    np.testing.assert_allclose(
        bg.dequantize_weights(q), ref.dequantize(q.unpack(), q.scale, group), rtol=1e-6
    )
    a = data.draw(hnp.arrays(np.int8, (m, k)))
    assert np.array_equal(bg.mixed_precision_matmul(a, q), ref.exact_int_matmul(a, q.unpack().T))
    b = data.draw(arrays(np.float32, (n,), st.floats(-1, 1, width=32))) if bias else None
    layer = bg.nn.BitLinear.from_packed(q.packed(), q.scale, (n, k), bias=b, group_size=group)
    x = data.draw(arrays(np.float32, (m, k), st.floats(-50, 50, width=32)))
    xq, s = bg.quantize_activations(x)
    # y = acc * gamma / s + bias can cancel to ~0 (the H100 found such a case); the rounding
    # error is relative to the terms (each group's gamma * acc_g / s, and the bias), not to their
    # sum.
    groups = 1 if group is None else k // group
    per_group = np.einsum(
        "mgj,ngj->mng",
        xq.reshape(m, groups, -1).astype(np.float64),
        q.unpack().reshape(n, groups, -1).astype(np.float64),
    )
    gamma = np.broadcast_to(
        np.asarray(q.scale, np.float64).reshape(-1, groups) if group else q.scale, (n, groups)
    )
    terms = (np.abs(per_group) * gamma[None]).sum(-1) / s[:, None].astype(np.float64)
    terms = terms + (0 if b is None else np.abs(b.astype(np.float64)))
    expected = ref.bitlinear(x, q.unpack(), q.scale, b, scale=s)[0].astype(np.float64)
    # one rounding per term and per addition: 1e-6 of the terms with one scale, 1e-5 with groups
    tolerance = 1e-6 if group is None else 1e-5
    assert (np.abs(layer(x) - expected) <= tolerance * terms + 1e-30).all()
