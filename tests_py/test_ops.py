"""Activations, gates, dropout, softmax and norms against bitnet_gpu.reference (docs/NUMERICS.md).

Tolerances: float32 element-wise |out - ref| <= 2e-6 |ref| + 1e-6 (transcendental), reductions
||out - ref|| / ||ref|| <= 1e-5, float16 ||out - ref|| <= 2e-3 ||ref|| (+ 1e-6 sqrt(n) for results
float16 holds only as
subnormals). Backward passes are also
checked against central finite differences of the GPU forward pass (float64 of the float32 results,
step 1e-3, 1e-2 relative)."""

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import reference as ref

SHAPES = [(1,), (7,), (33,), (4097,), (3, 5), (2, 3, 7), (0,), (2, 0)]
ACTIVATIONS = {
    "relu": (bg.relu, bg.relu_backward, {}),
    "leaky_relu": (
        lambda x, **k: bg.leaky_relu(x, 0.2, **k),
        lambda g, x, **k: bg.leaky_relu_backward(g, x, 0.2, **k),
        {"alpha": 0.2},
    ),
    "relu2": (bg.relu2, bg.relu2_backward, {}),
    "gelu": (bg.gelu, bg.gelu_backward, {}),
    "gelu_tanh": (
        lambda x, **k: bg.gelu(x, "tanh", **k),
        lambda g, x, **k: bg.gelu_backward(g, x, "tanh", **k),
        {},
    ),
    "silu": (bg.silu, bg.silu_backward, {}),
    "sigmoid": (bg.sigmoid, bg.sigmoid_backward, {}),
    "tanh": (bg.tanh, bg.tanh_backward, {}),
}


def inputs(rng, shape, dtype=np.float32, scale=4.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def assert_close(got, expected, dtype, elementwise=True):
    got = np.asarray(got, np.float64)
    assert got.shape == expected.shape and not np.isnan(got).any()
    if dtype == np.float16:
        # plus a floor for results that float16 can only hold as 0 or a subnormal
        assert np.linalg.norm(got - expected) <= 2e-3 * np.linalg.norm(expected) + 1e-6 * np.sqrt(
            got.size
        )
    elif elementwise:
        assert (np.abs(got - expected) <= 2e-6 * np.abs(expected) + 1e-6).all()
    else:
        assert np.linalg.norm(got - expected) <= 1e-5 * max(np.linalg.norm(expected), 1e-30)


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_activation_parity(device, rng, name, shape, dtype):
    forward, backward, kw = ACTIVATIONS[name]
    x, g = inputs(rng, shape, dtype), inputs(rng, shape, dtype, 1.0)
    y_out = np.full(shape, np.nan, dtype)
    y = forward(x, out=y_out)
    assert y is y_out and y.dtype == dtype
    assert_close(y, ref.activation(name, x, **kw), dtype)
    gx = backward(g, x)
    assert gx.dtype == dtype
    assert_close(gx, g.astype(np.float64) * ref.activation_derivative(name, x, **kw), dtype)


def test_activation_extremes(device):
    x = np.array([-1e30, -100, -20, -1e-30, -0.0, 0.0, 1e-30, 20, 100, 1e30, 3e38], np.float32)
    for name, (forward, backward, kw) in ACTIVATIONS.items():
        if name in ("relu2", "gelu_tanh"):  # overflow to inf at 1e30 is the formula's
            continue
        expected = ref.activation(name, x, **kw)
        got = forward(x).astype(np.float64)
        assert np.allclose(got, expected, rtol=2e-6, atol=1e-6), name


@pytest.mark.parametrize("name", [n for n in ACTIVATIONS if n not in ("relu", "leaky_relu")])
def test_backward_matches_finite_differences(device, rng, name):
    forward, backward, _ = ACTIVATIONS[name]
    x = inputs(rng, (257,), np.float32, 2.0)
    x = x[np.abs(x) > 1e-2]  # away from the kinks of relu-like functions
    h = np.float32(1e-3)
    numeric = (forward(x + h).astype(np.float64) - forward(x - h).astype(np.float64)) / (
        (x + h).astype(np.float64) - (x - h).astype(np.float64)
    )
    analytic = backward(np.ones_like(x), x).astype(np.float64)
    assert np.abs(numeric - analytic).max() <= 1e-2 * max(np.abs(analytic).max(), 1.0)


@pytest.mark.parametrize("shape", [(1,), (4097,), (3, 33)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gates(device, rng, shape, dtype):
    gate, up = inputs(rng, shape, dtype), inputs(rng, shape, dtype)
    assert_close(bg.silu_mul(gate, up), ref.activation("silu", gate) * up.astype(np.float64), dtype)
    assert_close(
        bg.relu2_mul(gate, up), ref.activation("relu2", gate) * up.astype(np.float64), dtype
    )
    t = bg.silu_mul(bg.Tensor.from_numpy(gate), up)
    assert isinstance(t, bg.Tensor) and np.array_equal(t.numpy(), bg.silu_mul(gate, up))
    with pytest.raises(bg.ShapeError, match=r"gate of shape .* and up of shape"):
        bg.silu_mul(gate, np.ones((2,) + shape, dtype))
    with pytest.raises(bg.DTypeError):
        bg.silu_mul(gate, up.astype(np.float16 if dtype == np.float32 else np.float32))


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 1.0])
def test_relu_dropout(device, rng, p):
    x = inputs(rng, (5, 4099))
    y = bg.relu_dropout(x, p, seed=2**40 + 3)
    assert np.array_equal(y, bg.relu_dropout(x, p, seed=2**40 + 3))
    expected = ref.relu_dropout(x, p, 2**40 + 3)
    assert (np.abs(y - expected) <= 1e-6 * np.abs(expected) + 1e-30).all()
    if p == 0.0:
        assert np.array_equal(y, np.maximum(x, 0))
    if p == 1.0:
        assert not y.any()
    if 0 < p < 1:
        kept = (y != 0).sum() / (x > 0).sum()
        assert abs(kept - (1 - p)) < 0.03
        assert not np.array_equal(y, bg.relu_dropout(x, p, seed=4))
    with pytest.raises(bg.ArgumentError, match="probability"):
        bg.relu_dropout(x, 1.5)


@pytest.mark.parametrize(
    "shape", [(1, 1), (3, 7), (2, 4096), (5, 8192), (2, 8196), (4, 3, 33), (1, 20000)]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax_and_norms(device, rng, shape, dtype):
    x = inputs(rng, shape, dtype, 3.0)
    k = shape[-1]
    w, b = rng.standard_normal(k).astype(np.float32), rng.standard_normal(k).astype(np.float32)
    out = np.full(shape, np.nan, dtype)
    assert bg.softmax(x, out=out) is out
    assert_close(out, ref.softmax(x), dtype, elementwise=False)
    assert_close(bg.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6), dtype, elementwise=False)
    assert_close(
        bg.layer_norm(x, w, b, 1e-5), ref.layer_norm(x, w, b, 1e-5), dtype, elementwise=False
    )


def test_softmax_extremes_and_axes(device, rng):
    x = np.array([[1e4, -1e4, 0.0], [5.0, 5.0, 5.0], [-1e4, -1e4, -1e4]], np.float32)
    assert_close(bg.softmax(x), ref.softmax(x), np.float32, elementwise=False)
    assert bg.softmax(np.array([[3.0]], np.float32)).tolist() == [[1.0]]
    y = inputs(rng, (4, 5, 6))
    assert_close(bg.softmax(y, axis=1), ref.softmax(y, axis=1), np.float32, elementwise=False)
    assert bg.softmax(y, axis=0).flags.c_contiguous
    with pytest.raises(bg.UnsupportedError, match="last axis"):
        bg.softmax(bg.Tensor.from_numpy(y), axis=0)
    with pytest.raises(bg.UnsupportedError, match="last axis"):  # not silently the last axis
        bg.softmax_backward(bg.Tensor.from_numpy(y), bg.Tensor.from_numpy(y), axis=0)
    out = np.full(y.shape, np.nan, np.float32)
    assert bg.softmax(y, axis=1, out=out) is out
    assert_close(out, ref.softmax(y, axis=1), np.float32, elementwise=False)


def test_softmax_axis_none_and_out_of_range(device, rng):
    """axis=None normalizes over every element (as scipy.special.softmax and jax.nn.softmax take
    it); an axis out of range raises ShapeError instead of wrapping around to another axis."""
    y = inputs(rng, (4, 5, 6))
    flat = ref.softmax(y.reshape(1, -1)).reshape(y.shape)
    assert_close(bg.softmax(y, axis=None), flat, np.float32, elementwise=False)
    grad = inputs(rng, y.shape)
    # Within 1e-5 of the terms of s * (g - sum(g * s)), which cancel (as in
    # test_norm_backward_against_finite_differences):
    # against the result alone, 1.6e-5 for seed 18422190968275566150 on lavapipe.
    got = np.asarray(bg.softmax_backward(grad, y, axis=None), np.float64)
    s, g64 = (
        ref.softmax(y.reshape(1, -1).astype(np.float64)),
        grad.reshape(1, -1).astype(np.float64),
    )
    terms = s * (np.abs(g64) + np.abs(g64 * s).sum())
    expected = ref.softmax_backward(grad.reshape(1, -1), y.reshape(1, -1)).reshape(y.shape)
    assert got.shape == y.shape and np.linalg.norm(got - expected) <= 1e-5 * np.linalg.norm(terms)
    v = inputs(rng, (7,))
    assert_close(
        bg.softmax(bg.Tensor.from_numpy(v), axis=None).numpy(),
        ref.softmax(v),
        np.float32,
        elementwise=False,
    )
    t = bg.softmax(bg.Tensor.from_numpy(y), axis=None)  # a Tensor is flattened as a view
    assert isinstance(t, bg.Tensor) and t.shape == y.shape
    np.testing.assert_array_equal(t.numpy(), bg.softmax(y, axis=None))
    target = bg.Tensor.from_numpy(np.full(y.shape, np.nan, np.float32))
    assert bg.softmax(bg.Tensor.from_numpy(y), axis=None, out=target) is target
    np.testing.assert_array_equal(target.numpy(), t.numpy())
    with pytest.raises(
        bg.DTypeError, match="float16"
    ):  # a Tensor target is checked as on the last axis
        bg.softmax(
            bg.Tensor.from_numpy(y),
            axis=None,
            out=bg.Tensor.from_numpy(np.zeros(y.shape, np.float16)),
        )
    with pytest.raises(bg.ShapeError, match="expected shape"):  # as many values, another shape
        bg.softmax(
            bg.Tensor.from_numpy(y),
            axis=None,
            out=bg.Tensor.from_numpy(np.zeros((6, 5, 4), np.float32)),
        )
    g = bg.softmax_backward(bg.Tensor.from_numpy(grad), bg.Tensor.from_numpy(y), axis=None)
    np.testing.assert_array_equal(g.numpy(), bg.softmax_backward(grad, y, axis=None))
    with pytest.raises(bg.UnsupportedError, match="every element"):  # mixed operands
        bg.softmax_backward(grad, bg.Tensor.from_numpy(y), axis=None)
    g = device.graph()  # the views and the op record into a graph too
    with g:
        g.output("s", bg.softmax(g.input("y", y.shape), axis=None))
    np.testing.assert_array_equal(g.run(y=y, numpy=True)["s"], bg.softmax(y, axis=None))
    for axis in (3, -4, 10):
        with pytest.raises(bg.ShapeError, match=f"axis {axis} is out of bounds"):
            bg.softmax(y, axis=axis)
        with pytest.raises(bg.ShapeError, match=f"axis {axis} is out of bounds"):
            bg.softmax_backward(grad, y, axis=axis)


@pytest.mark.parametrize("x", [np.float32(2.0), np.array(2.0, np.float32)])
def test_row_ops_refuse_0d_input(device, x):
    with pytest.raises(bg.ShapeError, match="K > 0"):
        bg.softmax(x)
    with pytest.raises(bg.ShapeError, match="K > 0"):
        bg.rms_norm(x, np.ones(1, np.float32))
    with pytest.raises(bg.ShapeError, match="K > 0"):
        bg.layer_norm(x, np.ones(1, np.float32), np.zeros(1, np.float32))
    with pytest.raises(bg.DTypeError):
        bg.softmax(None)


def test_float_parameters_refuse_what_is_not_a_real_number(device, rng):
    """Norm weights and biases are cast to float32 from bool, integers and floats; complex values
    are not silently cut to their real part, and text or objects are refused."""
    x = inputs(rng, (3, 4))
    np.testing.assert_array_equal(
        bg.rms_norm(x, np.ones(4, np.int64)), bg.rms_norm(x, np.ones(4, np.float32))
    )
    for bad in (np.ones(4, np.complex64), np.array(["a", "b", "c", "d"]), np.array([object()] * 4)):
        with pytest.raises(bg.DTypeError, match="expected real numbers"):
            bg.rms_norm(x, bad)
        with pytest.raises(bg.DTypeError, match="expected real numbers"):
            bg.layer_norm(x, np.ones(4, np.float32), bad)
    w = bg.quantize_weights(rng.standard_normal((5, 4)).astype(np.float32))
    with pytest.raises(bg.DTypeError, match="bias: expected real numbers"):
        bg.bitlinear(x, w, np.ones(5, np.complex64))


def test_norm_errors(device, rng):
    x = inputs(rng, (3, 8))
    with pytest.raises(bg.ShapeError, match=r"weight: expected float32 of shape \(8,\)"):
        bg.rms_norm(x, np.ones(7, np.float32))
    with pytest.raises(bg.ShapeError, match="K > 0"):
        bg.softmax(np.ones((3, 0), np.float32))
    with pytest.raises(bg.DTypeError):
        bg.layer_norm(x.astype(np.float64), np.ones(8), np.zeros(8))
    with pytest.raises(bg.ArgumentError, match="approximate"):
        bg.gelu(x, approximate="fast")
    with pytest.raises(bg.ShapeError):
        bg.relu_backward(x, x[:, :4])


def test_layer_norm_constant_rows_and_large_offsets(device):
    x = np.array([[7.0] * 64, np.arange(64) + 1e4], np.float32)
    w, b = np.ones(64, np.float32), np.zeros(64, np.float32)
    got = bg.layer_norm(x, w, b, 1e-5)
    assert_close(got, ref.layer_norm(x, w, b, 1e-5), np.float32, elementwise=False)
    assert np.abs(got[0]).max() == 0


BINARY = {
    "add": (bg.add, np.add),
    "sub": (bg.sub, np.subtract),
    "mul": (bg.mul, np.multiply),
    "div": (bg.div, np.divide),
}


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize(
    "sa,sb",
    [
        ((7,), (7,)),
        ((4097,), (4097,)),
        ((3, 5), (5,)),
        ((3, 1), (1, 4)),
        ((2, 3, 4), (3, 1)),
        ((1,), (2, 2, 2)),
        ((), (3,)),
        ((2, 1, 3, 1, 2, 1), (1, 4, 1, 5, 1, 3)),
        ((0, 3), (3,)),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_broadcasting_binary_ops(device, rng, name, sa, sb, dtype):
    ours, numpy_op = BINARY[name]
    a = rng.standard_normal(sa).astype(dtype)
    b = (rng.uniform(0.5, 2, sb) * rng.choice([-1, 1], sb)).astype(dtype)
    expected = numpy_op(a.astype(np.float64), b.astype(np.float64))
    got = ours(a, b)
    assert got.shape == expected.shape and got.dtype == dtype
    assert_close(got, expected, dtype)
    t = ours(bg.Tensor.from_numpy(a), b)
    assert isinstance(t, bg.Tensor) and np.array_equal(t.numpy(), got)


def test_binary_scalars_out_and_errors(device, rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    assert np.array_equal(bg.mul(a, 2), a * 2) and np.allclose(bg.div(1, a), 1 / a, rtol=1e-6)
    out = np.full((3, 4), np.nan, np.float32)
    assert bg.add(a, a, out=out) is out and np.array_equal(out, a + a)
    with pytest.raises(bg.ShapeError, match=r"shapes \(3, 4\) \(5,\)"):
        bg.add(a, np.ones(5, np.float32))
    with pytest.raises(bg.DTypeError, match="one dtype"):
        bg.add(a, a.astype(np.float16))
    with pytest.raises(bg.ShapeError):
        bg.add(a, np.ones(4, np.float32), out=np.empty((4, 3), np.float32))


@pytest.mark.parametrize(
    "shape,axis",
    [
        ((7,), None),
        ((4097,), 0),
        ((3, 5), 0),
        ((3, 5), 1),
        ((2, 3, 7), (0, 2)),
        ((2, 3, 7), -2),
        ((1, 1), None),
        ((300, 2000), 1),
        ((2000, 3), 0),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_reductions(device, rng, shape, axis, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    x64 = x.astype(np.float64)
    for ours, theirs in [(bg.sum, np.sum), (bg.mean, np.mean), (bg.max, np.max)]:
        got = ours(x, axis=axis)
        expected = theirs(x64, axis=axis)
        assert np.shape(got) == np.shape(expected) and np.asarray(got).dtype == dtype
        tolerance = 2e-3 if dtype == np.float16 else 1e-5
        scale = np.abs(x64).sum(axis=axis) if theirs is not np.max else np.abs(expected)
        assert (np.abs(np.asarray(got, np.float64) - expected) <= tolerance * scale + 1e-6).all()
        assert np.shape(ours(x, axis=axis, keepdims=True)) == np.shape(
            theirs(x64, axis=axis, keepdims=True)
        )
    if axis is not None and isinstance(axis, int):
        t = bg.sum(bg.Tensor.from_numpy(x), axis=axis)
        assert isinstance(t, bg.Tensor) and np.array_equal(t.numpy(), bg.sum(x, axis=axis))


def test_reduction_errors(device):
    with pytest.raises(bg.ShapeError, match="out of bounds"):
        bg.sum(np.ones((2, 3), np.float32), axis=2)
    with pytest.raises(bg.ShapeError, match="appears twice"):  # NumPy refuses it too
        bg.mean(np.ones((2, 3), np.float32), axis=(0, -2))
    with pytest.raises(TypeError, match="axis: expected an integer"):  # not cut to axis 1
        bg.sum(np.ones((2, 3), np.float32), axis=1.5)
    with pytest.raises(TypeError, match="axis: expected an integer"):
        bg.softmax(np.ones((2, 3), np.float32), axis=0.5)
    with pytest.raises(bg.ShapeError, match="no identity"):
        bg.max(np.ones((2, 0), np.float32), axis=1)
    assert bg.sum(np.ones((2, 0), np.float32), axis=1).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (64, 64), (100, 3), (513, 1025)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_transpose_and_matmul(device, rng, shape, dtype):
    a = rng.standard_normal(shape).astype(dtype)
    assert np.array_equal(bg.transpose(a), a.T)
    b = rng.standard_normal((shape[1], 37)).astype(dtype)
    out = np.full((shape[0], 37), np.nan, dtype)
    assert bg.matmul(a, b, out=out) is out
    assert_close(out, a.astype(np.float64) @ b.astype(np.float64), dtype, elementwise=False)
    with pytest.raises(bg.ShapeError, match="cannot multiply"):
        bg.matmul(a, b[:-1] if shape[1] > 1 else np.ones((2, 2), dtype))


def _norm_losses(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32) * 2 + 0.5
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    b = rng.standard_normal(shape[-1]).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    return x, w, b, g


@pytest.mark.parametrize("shape", [(1, 8), (5, 33), (2, 3, 300)])
def test_norm_backward_against_finite_differences(device, rng, shape):
    x, w, b, g = _norm_losses(rng, shape)
    h = 1e-3

    def numeric(f, value, index):
        up, down = value.copy(), value.copy()
        up[index] += h
        down[index] -= h
        return float((g * (f(up) - f(down))).sum() / (2 * h))

    gx, gw = bg.rms_norm_backward(g, x, w, 1e-6)
    assert gx.shape == x.shape and gw.shape == (shape[-1],)
    for index in [(0,) * len(shape), tuple(d - 1 for d in shape)]:
        assert (
            abs(
                gx[index] - numeric(lambda v: ref.rms_norm(v, w, 1e-6), x.astype(np.float64), index)
            )
            < 1e-3
        )
    for j in [0, shape[-1] - 1]:
        assert (
            abs(gw[j] - numeric(lambda v: ref.rms_norm(x, v, 1e-6), w.astype(np.float64), j)) < 1e-3
        )
    gx, gg, gb = bg.layer_norm_backward(g, x, w, 1e-5)
    for index in [(0,) * len(shape), tuple(d - 1 for d in shape)]:
        assert (
            abs(
                gx[index]
                - numeric(lambda v: ref.layer_norm(v, w, b, 1e-5), x.astype(np.float64), index)
            )
            < 1e-3
        )
    for j in [0, shape[-1] - 1]:
        assert (
            abs(gg[j] - numeric(lambda v: ref.layer_norm(x, v, b, 1e-5), w.astype(np.float64), j))
            < 1e-3
        )
        assert (
            abs(gb[j] - numeric(lambda v: ref.layer_norm(x, w, v, 1e-5), b.astype(np.float64), j))
            < 1e-3
        )


# Rows held in registers (K % 4 == 0, K <= 8192) and rows read in passes (the rest); 600 rows:
# more rows than workgroups, so workgroups sum the weight-gradient terms of several rows each.
BACKWARD_SHAPES = [
    (1, 1),
    (3, 7),
    (2, 33),
    (5, 4096),
    (3, 4100),
    (2, 8192),
    (2, 8196),
    (1, 4097),
    (2, 3, 300),
    (600, 64),
    (600, 33),
]


@pytest.mark.parametrize("shape", BACKWARD_SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_backward_row_ops_against_the_reference(device, rng, shape, dtype):
    """rms_norm, layer_norm and softmax backward against the float64 derivatives of reference.py,
    every result. The tolerance is that of reductions, relative to the size of the terms that make
    each result, since they cancel (a row of one value has grad_x = 0 up to eps)."""
    x, w, _, g = _norm_losses(rng, shape)
    x, g = x.astype(dtype), g.astype(dtype)
    x64, g64, k = x.astype(np.float64), g.astype(np.float64), shape[-1]
    tolerance = 2e-3 if dtype == np.float16 else 1e-5

    def close(got, expected, terms):
        got = np.asarray(got, np.float64)
        assert got.shape == expected.shape and not np.isnan(got).any()
        assert np.linalg.norm(got - expected) <= tolerance * np.linalg.norm(terms) + 1e-30

    r = 1 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + 1e-6)
    rows = lambda v: np.abs(v).reshape(-1, k).sum(axis=0)  # noqa: E731
    gx, gw = bg.rms_norm_backward(g, x, w, 1e-6)
    rgx, rgw = ref.rms_norm_backward(g, x, w, 1e-6)
    close(gx, rgx, 2 * r * np.abs(g64 * w))
    close(gw, rgw, rows(g64 * x64 * r))
    centered = x64 - x64.mean(axis=-1, keepdims=True)
    r = 1 / np.sqrt((centered**2).mean(axis=-1, keepdims=True) + 1e-5)
    gx, gg, gb = bg.layer_norm_backward(g, x, w, 1e-5)
    rgx, rgg, rgb = ref.layer_norm_backward(g, x, w, 1e-5)
    close(gx, rgx, 3 * r * np.abs(g64 * w))
    close(gg, rgg, rows(g64 * centered * r))
    close(gb, rgb, rows(g64))
    out = np.full(shape, np.nan, dtype)  # poisoned: every element must be written
    assert bg.softmax_backward(g, x, out=out) is out
    s = ref.softmax(x64)
    close(
        out,
        ref.softmax_backward(g, x),
        s * (np.abs(g64) + np.abs(g64 * s).sum(axis=-1, keepdims=True)),
    )


@pytest.mark.parametrize("groups", [1, 3, 64])
def test_backward_norms_with_any_workgroup_count(device, rng, tune, groups):
    """The weight gradients summed over rows by any number of workgroups (norm_groups_per_sm:
    128 to 8192 of them here, 600 rows) match the reference; a bad setting raises."""
    tune(norm_groups_per_sm=groups)
    x, w, _, g = _norm_losses(rng, (600, 64))
    for got, expected in zip(bg.layer_norm_backward(g, x, w), ref.layer_norm_backward(g, x, w)):
        assert np.linalg.norm(got - expected) <= 1e-5 * np.linalg.norm(expected)
    with pytest.raises(bg.ArgumentError, match="norm_groups_per_sm=0"):
        tune(norm_groups_per_sm=0)
    assert bg.rms_norm_backward(g, x, w)[0].shape == x.shape


def test_reductions_into_out(device, rng):
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    out = np.full((5,), np.nan, np.float32)
    assert bg.sum(x, axis=(0, 2), out=out) is out
    np.testing.assert_allclose(out, x.astype(np.float64).sum(axis=(0, 2)), rtol=1e-5, atol=1e-6)
    t = bg.Tensor.from_numpy(np.zeros((4, 6), np.float32))
    assert bg.max(bg.Tensor.from_numpy(x), axis=1, out=t) is t
    assert np.array_equal(t.numpy(), x.max(axis=1))
    with pytest.raises(bg.ShapeError):
        bg.mean(x, axis=0, out=np.empty((4, 6), np.float32))


@pytest.mark.parametrize(
    "shape,axis", [((1, 1), -1), ((3, 7), -1), ((2, 4100), -1), ((4, 3, 5), 1)]
)
def test_softmax_backward(device, rng, shape, axis):
    x = rng.standard_normal(shape).astype(np.float32) * 2
    g = rng.standard_normal(shape).astype(np.float32)
    s = ref.softmax(x, axis=axis)
    expected = s * (g - (g * s).sum(axis=axis, keepdims=True))
    got = bg.softmax_backward(g, x, axis=axis)
    assert_close(got, expected, np.float32, elementwise=False)
    h, index = 1e-3, (0,) * len(shape)
    up, down = x.astype(np.float64), x.astype(np.float64)
    up[index] += h
    down[index] -= h
    numeric = (g * (ref.softmax(up, axis) - ref.softmax(down, axis))).sum() / (2 * h)
    assert abs(got[index] - numeric) < 1e-3


def test_nan_and_inf_follow_numpy():
    """relu, relu2 and max keep NaN as NumPy does (they once dropped it); Inf goes through."""
    x = np.array([np.nan, -1.0, 2.0, np.inf, -np.inf, -0.0], np.float32)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(bg.relu(x), np.maximum(x, 0))
        np.testing.assert_array_equal(bg.relu2(x), np.maximum(x, 0) ** 2)
        np.testing.assert_array_equal(bg.relu(x.astype(np.float16)), np.maximum(x, 0))
        grid = np.array([[1, np.nan, 3], [np.inf, -np.inf, 2], [5, 6, 7]], np.float32)
        for axis in (None, 0, 1):
            np.testing.assert_array_equal(bg.max(grid, axis=axis), np.max(grid, axis=axis))
            np.testing.assert_array_equal(bg.sum(grid, axis=axis), np.sum(grid, axis=axis))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_unary_ops_on_numpy_return_fresh_arrays_of_any_shape(rng, dtype):
    """A unary op given NumPy and no out= (its shortest path) returns a NumPy array of x's shape
    and dtype, for 0-d, empty and strided input too, each call's result its own memory."""
    full = (rng.standard_normal(20) * 3).astype(dtype)
    for x in (full[0, ...], full[:0], full[:0].reshape(0, 4), full[::3], full.reshape(2, 5, 2)):
        y = bg.relu(x)
        assert isinstance(y, np.ndarray) and y.dtype == dtype and y.shape == x.shape
        np.testing.assert_array_equal(y, np.maximum(x, 0))
    first = bg.relu(full)
    second = bg.relu(-full)
    assert not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, np.maximum(full, 0))
    np.testing.assert_array_equal(second, np.maximum(-full, 0))
