"""Activations (forward and backward), fused gates, dropout, softmax, norms and sampling on the GPU.

NumPy in, NumPy out; Tensor in, Tensor out; float32 or float16 (the output keeps the input's
dtype; arithmetic is float32). `out=` takes a NumPy array or a Tensor. Formulas: docs/NUMERICS.md.
"""

from __future__ import annotations

import numpy as np

from . import _core
from ._core import Tensor
from .quantize import _FLOATS, _float32, _integer, _like, _Outputs, _seed, _tensor

__all__ = [
    "add", "div", "mul", "sub", "gelu", "gelu_backward", "layer_norm", "leaky_relu", "leaky_relu_backward", "relu",
    "relu2", "relu2_backward", "relu2_mul", "relu_backward", "relu_dropout", "rms_norm", "sample_logits",
    "sigmoid", "sigmoid_backward", "silu", "silu_backward", "silu_mul", "softmax",
    "softmax_backward", "swish",
    "swish_backward", "tanh", "tanh_backward",
]

_A = _core.Activation


def _call(fn, x, name, out, *others):
    t, as_tensor = _tensor(x, name, None, _FLOATS)
    rest = [_like(v, t.device, n) for v, n in others]
    outputs = _Outputs(out, [("y", tuple(t.shape), np.dtype(t.dtype))])
    return outputs.results([fn(t, *rest, outputs.tensor(0))], as_tensor)[0]


def _activation(op, alpha=0.0):
    def forward(x, *, out=None):
        return _call(lambda t, o: _core.activation(t, op, alpha, o), x, "x", out)

    def backward(grad_y, x, *, out=None):
        return _call(lambda g, t, o: _core.activation_backward(g, t, op, alpha, o), grad_y,
                     "grad_y", out, (x, "x"))
    return forward, backward


relu, relu_backward = _activation(_A.relu)
relu2, relu2_backward = _activation(_A.relu2)
silu, silu_backward = _activation(_A.silu)
swish, swish_backward = silu, silu_backward
sigmoid, sigmoid_backward = _activation(_A.sigmoid)
tanh, tanh_backward = _activation(_A.tanh)
for _f, _doc in [(relu, "max(x, 0)"), (relu2, "relu(x)^2 (squared ReLU)"),
                 (silu, "x * sigmoid(x) (= swish)"), (sigmoid, "1 / (1 + exp(-x))"),
                 (tanh, "tanh(x)")]:
    _f.__doc__ = f"y = {_doc}, element-wise."


def leaky_relu(x, alpha=0.01, *, out=None):
    """y = x if x > 0 else alpha * x."""
    return _activation(_A.leaky_relu, float(alpha))[0](x, out=out)


def leaky_relu_backward(grad_y, x, alpha=0.01, *, out=None):
    return _activation(_A.leaky_relu, float(alpha))[1](grad_y, x, out=out)


def _gelu_op(approximate):
    if approximate not in ("none", "tanh"):
        raise _core.ArgumentError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    return _A.gelu if approximate == "none" else _A.gelu_tanh


def gelu(x, approximate="none", *, out=None):
    """0.5 x (1 + erf(x / sqrt 2)), or the tanh approximation."""
    return _activation(_gelu_op(approximate))[0](x, out=out)


def gelu_backward(grad_y, x, approximate="none", *, out=None):
    return _activation(_gelu_op(approximate))[1](grad_y, x, out=out)


def silu_mul(gate, up, *, out=None):
    """SwiGLU: silu(gate) * up (gate and up of one shape and dtype)."""
    return _call(lambda g, u, o: _core.gated_activation(g, u, _A.silu, o), gate, "gate", out,
                 (up, "up"))


def relu2_mul(gate, up, *, out=None):
    """relu(gate)^2 * up: BitNet b1.58 2B4T's gated FFN."""
    return _call(lambda g, u, o: _core.gated_activation(g, u, _A.relu2, o), gate, "gate", out,
                 (up, "up"))


def relu_dropout(x, p, seed=0, *, out=None):
    """relu(x) with each value kept with probability 1 - p and scaled by 1 / (1 - p). The mask
    comes from a counter-based hash of (seed, element index): the same on every device."""
    seed = _seed(seed)
    return _call(lambda t, o: _core.relu_dropout(t, float(p), seed, o), x, "x", out)


def _over_axis(fn, arrays, axis, out, name):
    """fn(*arrays, out=...) along `axis` where that is not the last axis (None: over every element,
    as scipy.special.softmax and jax.nn.softmax take it), or None where it is the last one. NumPy
    inputs are computed with the axis moved last (or flattened) and the result moved back (a copy
    each way). Tensors are flattened as views for axis=None, a Tensor target too, so the op writes
    it directly; another axis raises UnsupportedError (a Tensor has no transpose of its axes yet).
    An axis out of range raises ShapeError, as the reductions do; 0-d input is left to the op's own
    checks."""
    x = arrays[-1]
    shape = tuple(x.shape) if isinstance(x, Tensor) else np.shape(x)
    ndim = len(shape)
    if ndim == 0:
        return None
    if axis is not None:
        axis = _integer(axis, "axis")
        if not -ndim <= axis < ndim:
            raise _core.ShapeError(f"axis {axis} is out of bounds for shape {shape}")
        axis %= ndim
    if axis == ndim - 1 or (axis is None and ndim == 1):
        return None
    if any(isinstance(a, Tensor) for a in arrays):
        if axis is not None or not all(isinstance(a, Tensor) for a in arrays):
            raise _core.UnsupportedError("a Tensor is normalized over its last axis (axis=-1) or over every "
                                         "element (axis=None, all operands Tensors) only")
        outputs = _Outputs(out, [(name, shape, np.dtype(x.dtype))])  # checks a NumPy target
        target = outputs.tensor(0)
        if target is not None and tuple(target.shape) != shape:
            raise _core.ShapeError(f"out ({name}): expected shape {shape}, got {tuple(target.shape)}")
        flat = fn(*(a.reshape(1, -1) for a in arrays),  # views of the same memory
                  out=None if target is None else target.reshape(1, -1)).reshape(shape)
        if target is not None:
            return target
        return flat if out is None else outputs.results([flat], True)[0]
    if axis is None:
        moved = fn(*(np.ascontiguousarray(np.asarray(a)).reshape(1, -1) for a in arrays))
        result = np.ascontiguousarray(moved.reshape(shape))
    else:
        moved = fn(*(np.ascontiguousarray(np.moveaxis(np.asarray(a), axis, -1)) for a in arrays))
        result = np.ascontiguousarray(np.moveaxis(moved, -1, axis))
    if out is None:
        return result
    _Outputs(out, [(name, result.shape, result.dtype)])  # checks a NumPy target
    if isinstance(out, Tensor):
        raise _core.UnsupportedError(f"out ({name}): a Tensor target needs axis=-1")
    np.copyto(out, result)
    return out


def _row(op, x, weight, bias, eps, out, axis=-1):
    moved = _over_axis(lambda a, out=None: _row(op, a, weight, bias, eps, out), [x], axis, out, "y")
    if moved is not None:
        return moved
    t, as_tensor = _tensor(x, "x", None, _FLOATS)
    w = None if weight is None else _float32(weight, t.device, "weight")
    b = None if bias is None else _float32(bias, t.device, "bias")
    outputs = _Outputs(out, [("y", tuple(t.shape), np.dtype(t.dtype))])
    return outputs.results([_core.row_op(t, op, w, b, float(eps), outputs.tensor(0))], as_tensor)[0]


def softmax(x, axis=-1, *, out=None):
    """exp(x - max) / sum(exp(x - max)) along `axis` (numerically stable, float32 sums); axis=None
    normalizes over every element."""
    return _row(_core.RowOp.softmax, x, None, None, 0.0, out, axis)


def softmax_backward(grad_y, x, axis=-1, *, out=None):
    """grad_x of softmax(x) along `axis`: s (grad_y - sum(grad_y s)), s = softmax(x)."""
    moved = _over_axis(softmax_backward, [grad_y, x], axis, out, "grad_x")
    if moved is not None:
        return moved
    return _call(lambda g, t, o: _core.softmax_backward(g, t, o), grad_y, "grad_y", out, (x, "x"))


def rms_norm(x, weight, eps=1e-6, *, out=None):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (weight: [K], cast to float32)."""
    return _row(_core.RowOp.rms_norm, x, weight, None, eps, out)


def layer_norm(x, gamma, beta, eps=1e-5, *, out=None):
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis (biased variance)."""
    return _row(_core.RowOp.layer_norm, x, gamma, beta, eps, out)


def _operand(value, like_dtype, device, name):
    """A Tensor for one operand: Tensors as they are; Python scalars in the other operand's dtype."""
    if isinstance(value, Tensor):
        return value
    if np.isscalar(value) and not isinstance(value, np.generic):
        value = np.asarray(value, like_dtype)
    return _tensor(np.asarray(value), name, device, _FLOATS)[0]


def _binary(op, a, b, out):
    as_tensor = isinstance(a, Tensor) or isinstance(b, Tensor)
    device = a.device if isinstance(a, Tensor) else b.device if isinstance(b, Tensor) else None
    dtype_a = np.dtype(a.dtype) if isinstance(a, (Tensor, np.ndarray)) else None
    dtype_b = np.dtype(b.dtype) if isinstance(b, (Tensor, np.ndarray)) else None
    ta = _operand(a, dtype_b or np.float32, device, "a")
    tb = _operand(b, dtype_a or np.dtype(ta.dtype), ta.device, "b")
    try:
        shape = np.broadcast_shapes(tuple(ta.shape), tuple(tb.shape))
    except ValueError:
        shape = None  # the core raises ShapeError naming both shapes
    outputs = _Outputs(out if shape is not None else None, [("y", shape or (), np.dtype(ta.dtype))])
    return outputs.results([_core.binary(ta, tb, op, outputs.tensor(0))], as_tensor)[0]


def add(a, b, *, out=None):
    """a + b with NumPy broadcasting (a or b may be a Python number)."""
    return _binary(_core.BinaryOp.add, a, b, out)


def sub(a, b, *, out=None):
    """a - b with NumPy broadcasting."""
    return _binary(_core.BinaryOp.sub, a, b, out)


def mul(a, b, *, out=None):
    """a * b with NumPy broadcasting."""
    return _binary(_core.BinaryOp.mul, a, b, out)


def div(a, b, *, out=None):
    """a / b with NumPy broadcasting."""
    return _binary(_core.BinaryOp.div, a, b, out)


# The draw of softmax(x / t) takes the largest x + t g (t < 1) or x / t + g (t >= 1), with 1 / t
# rounded to float32, which stays a normal number up to here.
_MOST_TEMPERATURE = 1e37


def _top_p_share(top_p):
    """P = round(p 2^32) for top-p's p in (0, 1] (0: none, as p = 1 and None are), at least 1."""
    if top_p is None:
        return 0
    if isinstance(top_p, (bool, np.bool_)) or not isinstance(top_p, (int, float, np.integer, np.floating)):
        raise TypeError(f"top_p: expected None or a number, got {top_p!r}")
    if not 0 < top_p <= 1:
        raise _core.ArgumentError(f"top_p: expected None or a number in (0, 1], got {top_p}")
    return 0 if top_p == 1 else max(1, min(int(round(float(top_p) * 2.0**32)), 2**32 - 1))


def _sampling_params(temperature, top_k, seed, n, top_p=None):
    """uint32 [6] for _core.sample_rows: the float32 bits of the temperature and of its inverse,
    top_k (0: every value), the seed's two words and top-p's P = round(p 2^32) (0: none), after
    checking them (rows of n values)."""
    if isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, (int, float, np.integer, np.floating)):
        raise TypeError(f"temperature: expected a number, got {temperature!r}")
    if not (0 <= temperature <= _MOST_TEMPERATURE):
        raise _core.ArgumentError(f"temperature: expected a number in [0, {_MOST_TEMPERATURE:g}], got {temperature}")
    k = 0
    if top_k is not None:
        k = _integer(top_k, "top_k")
        if k < 1:
            raise _core.ArgumentError(f"top_k: expected None or an integer of at least 1, got {k}")
        k = 0 if k >= n else k
    share = _top_p_share(top_p)
    seed = _seed(seed)
    t = np.float32(temperature)
    inverse = np.float32(1.0 / float(t)) if t >= 1 else np.float32(0)
    return np.array([t.view(np.uint32), inverse.view(np.uint32), k, seed & 0xFFFFFFFF, seed >> 32, share], np.uint32)


def sample_logits(logits, temperature=1.0, top_k=None, top_p=None, *, seed=0, step=0, out=None):
    """One index a row of float32 logits [..., N], drawn from softmax(logits / temperature) over
    the row's top_k largest values (every value at least the top_k-th largest, so ties are kept;
    all of them where top_k is None) and, with top_p in (0, 1), of those the smallest set of the
    largest whose share of that softmax reaches top_p (nucleus sampling, after top_k as
    transformers applies them; the values equal to its smallest kept too; the share is summed in
    fixed point, docs/NUMERICS.md): int32 [...] (NumPy in, NumPy out; Tensor in, Tensor out).

    The Gumbel-max trick on the GPU: the index with the largest logits + temperature * g, g
    Gumbel noise from a counter-based hash of (seed, step, row, index), so a row's draw depends on
    those and its own values alone: the same call draws the same indices; pass a new step (or
    seed) for each new draw. temperature 0 gives np.argmax's index among the kept values; -inf
    logits are never drawn unless every kept value is -inf, +inf ones win (the first of them).
    NaN logits raise ArgumentError. reference.sample_rows computes the same draws with NumPy."""
    t, as_tensor = _tensor(logits, "logits", None, (np.float32,))
    shape = tuple(t.shape)
    if len(shape) == 0:
        raise _core.ShapeError("logits: expected [..., N], got a scalar")
    n = shape[-1]
    params = _sampling_params(temperature, top_k, seed, n, top_p)
    step = _integer(step, "step")
    if not 0 <= step < 2**32:
        raise _core.ArgumentError(f"step: expected an integer in [0, 2**32), got {step}")
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    outputs = _Outputs(out, [("indices", shape[:-1], np.dtype(np.int32))])
    target = outputs.tensor(0)
    if target is not None and tuple(target.shape) != shape[:-1]:
        raise _core.ShapeError(f"out (indices): expected shape {shape[:-1]}, got {tuple(target.shape)}")
    flat_target = None if target is None else target.reshape(rows)
    device = t.device
    drawn = _core.sample_rows(t.reshape(rows, n), Tensor.from_numpy(params, device),
                              Tensor.from_numpy(np.zeros(1, np.int32), device), step, flat_target,
                              bool(params[5]), bool(params[2]))
    return outputs.results([target if target is not None else drawn.reshape(*shape[:-1])], as_tensor)[0]
