"""Softmax, RMSNorm and LayerNorm on the GPU, forward and backward.

NumPy in, NumPy out; Tensor in, Tensor out; float32 or float16 (results keep x's dtype, the
norms' parameter gradients are float32; sums in float32, in a fixed order). Formulas:
docs/NUMERICS.md."""

from __future__ import annotations

import numpy as np

from . import _core
from . import _recorded_calls as recorded_calls
from ._args import FLOATS, call_unary, float32_param, integer, like, result_as, Outputs, to_tensor
from ._args import FLOAT_DTYPES, float32_numpy
from ._core import Tensor
from ._types import ArrayIn, Out, Result

__all__ = [
    "layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_backward",
    "softmax",
    "softmax_backward",
]


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
        axis = integer(axis, "axis")
        if not -ndim <= axis < ndim:
            raise _core.ShapeError(f"axis {axis} is out of bounds for shape {shape}")
        axis %= ndim
    if axis == ndim - 1 or (axis is None and ndim == 1):
        return None
    if any(isinstance(a, Tensor) for a in arrays):
        if axis is not None or not all(isinstance(a, Tensor) for a in arrays):
            raise _core.UnsupportedError(
                "a Tensor is normalized over its last axis (axis=-1) or over every "
                "element (axis=None, all operands Tensors) only"
            )
        outputs = Outputs(out, [(name, shape, np.dtype(x.dtype))])  # checks a NumPy target
        target = outputs.tensor(0)
        if target is not None and tuple(target.shape) != shape:
            raise _core.ShapeError(
                f"out ({name}): expected shape {shape}, got {tuple(target.shape)}"
            )
        flat = fn(
            *(a.reshape(1, -1) for a in arrays),  # views of the same memory
            out=None if target is None else target.reshape(1, -1),
        ).reshape(shape)
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
    Outputs(out, [(name, result.shape, result.dtype)])  # checks a NumPy target
    if isinstance(out, Tensor):
        raise _core.UnsupportedError(f"out ({name}): a Tensor target needs axis=-1")
    np.copyto(out, result)
    return out


def _row(op, x, weight, bias, eps, out, axis=-1):
    moved = _over_axis(lambda a, out=None: _row(op, a, weight, bias, eps, out), [x], axis, out, "y")
    if moved is not None:
        return moved
    if out is None:
        recorded = _recorded_row(op, x, weight, bias, eps)
        if recorded is not None:
            return recorded
    t, as_tensor = to_tensor(x, "x", None, FLOATS)
    w = None if weight is None else float32_param(weight, t.device, "weight")
    b = None if bias is None else float32_param(bias, t.device, "bias")
    host = None if as_tensor else t.device
    outputs = Outputs(out, [("y", tuple(t.shape), np.dtype(t.dtype))], host)
    return outputs.results([_core.row_op(t, op, w, b, float(eps), outputs.tensor(0))], as_tensor)[0]


def _recorded_row(op, x, weight, bias, eps):
    """_row's result from a recorded call (recorded_calls), or None to run it eagerly."""
    if type(x) is not np.ndarray or x.dtype not in FLOAT_DTYPES:
        return None
    params = [float32_numpy(p) for p in (weight, bias) if p is not None]
    if any(p is None for p in params):
        return None
    eps = float(eps)

    def record(inputs, outputs):
        given = iter(inputs[1:])
        w = None if weight is None else next(given)
        b = None if bias is None else next(given)
        _core.row_op(inputs[0], op, w, b, eps, outputs[0])

    key = ("row_op", int(op), eps, weight is None, bias is None)
    results = recorded_calls.call(key, [x, *params], [(x.shape, x.dtype)], record)
    return None if results is None else results[0]


def softmax(
    x: ArrayIn, axis: int | tuple[int, ...] | None = -1, *, out: Out | None = None
) -> Result:
    """exp(x - max) / sum(exp(x - max)) along `axis` (numerically stable, float32 sums); axis=None
    normalizes over every element."""
    return _row(_core.RowOp.softmax, x, None, None, 0.0, out, axis)


def softmax_backward(
    grad_y: ArrayIn, x: ArrayIn, axis: int | tuple[int, ...] | None = -1, *, out: Out | None = None
) -> Result:
    """grad_x of softmax(x) along `axis`: s (grad_y - sum(grad_y s)), s = softmax(x)."""
    moved = _over_axis(softmax_backward, [grad_y, x], axis, out, "grad_x")
    if moved is not None:
        return moved
    return call_unary(
        lambda g, t, o: _core.softmax_backward(g, t, o),
        grad_y,
        "grad_y",
        out,
        (x, "x"),
        key=("softmax_backward",),
    )


def rms_norm(x: ArrayIn, weight: ArrayIn, eps: float = 1e-6, *, out: Out | None = None) -> Result:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (weight: [K], cast to float32)."""
    return _row(_core.RowOp.rms_norm, x, weight, None, eps, out)


def layer_norm(
    x: ArrayIn, gamma: ArrayIn, beta: ArrayIn, eps: float = 1e-5, *, out: Out | None = None
) -> Result:
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis (biased variance)."""
    return _row(_core.RowOp.layer_norm, x, gamma, beta, eps, out)


def _rows_sum(t):
    while len(t.shape) > 1:
        t = _core.reduce(t, 0, _core.ReduceOp.sum)
    return t


def rms_norm_backward(grad_y: ArrayIn, x: ArrayIn, weight: ArrayIn, eps: float = 1e-6) -> Result:
    """(grad_x, grad_weight) of rms_norm(x, weight, eps) over the last axis; grad_x in x's dtype,
    grad_weight float32."""
    tx, as_tensor = to_tensor(x, "x", None, FLOATS)
    tg = like(grad_y, tx.device, "grad_y")
    r = _core.norm_backward(tg, tx, float32_param(weight, tx.device, "weight"), float(eps), False)
    return result_as(r.grad_x, as_tensor), result_as(_rows_sum(r.grad_times_xhat), as_tensor)


def layer_norm_backward(grad_y: ArrayIn, x: ArrayIn, gamma: ArrayIn, eps: float = 1e-5) -> Result:
    """(grad_x, grad_gamma, grad_beta) of layer_norm(x, gamma, beta, eps) over the last axis;
    grad_x in x's dtype, grad_gamma and grad_beta float32."""
    tx, as_tensor = to_tensor(x, "x", None, FLOATS)
    tg = like(grad_y, tx.device, "grad_y")
    r = _core.norm_backward(tg, tx, float32_param(gamma, tx.device, "gamma"), float(eps), True)
    grad_beta = _rows_sum(r.grad_sum)
    return (
        result_as(r.grad_x, as_tensor),
        result_as(_rows_sum(r.grad_times_xhat), as_tensor),
        result_as(grad_beta, as_tensor),
    )
