"""Reductions, transpose and matmul on the GPU.

NumPy in, NumPy out; Tensor in, Tensor out; float32 or float16 (results keep the dtype; sums
accumulate in float32, in a fixed order). `sum` and `max` are NumPy's names; they
shadow the builtins in this module only.
"""

from __future__ import annotations

import numpy as np

from . import _core
from ._args import FLOATS, integer, like, Outputs, result_as, to_tensor
from ._types import ArrayIn, Out, Result

__all__ = ["matmul", "max", "mean", "sum", "transpose"]


def _reduce(op, x, axis, keepdims, out=None):
    t, as_tensor = to_tensor(x, "x", None, FLOATS)
    ndim = len(t.shape)
    if axis is None:
        if ndim == 0:
            raise _core.ShapeError("x: a 0-d array has no axis to reduce")
        axes = list(range(ndim))
    else:
        axes = [integer(a, "axis") for a in (axis if isinstance(axis, (tuple, list)) else [axis])]
        for a in axes:
            if not -ndim <= a < ndim:
                raise _core.ShapeError(f"axis {a} is out of bounds for shape {tuple(t.shape)}")
        if len({a % ndim for a in axes}) != len(axes):
            raise _core.ShapeError(
                f"axis {tuple(axes)}: an axis appears twice"
            )  # as NumPy refuses it
        axes = sorted(a % ndim for a in axes)
    if keepdims and out is not None:
        raise _core.UnsupportedError("out= with keepdims=True: pass one or the other")
    final_shape = tuple(d for i, d in enumerate(t.shape) if i not in axes)
    outputs = Outputs(out, [("y", final_shape, np.dtype(t.dtype))])
    result = t
    for position, a in enumerate(
        reversed(axes)
    ):  # highest axis first: lower ones keep their numbers
        last = position == len(axes) - 1
        result = _core.reduce(result, a, op, outputs.tensor(0) if last else None)
    if out is not None:
        return outputs.results([result], as_tensor)[0]
    if keepdims:
        if as_tensor:
            raise _core.UnsupportedError(
                "keepdims=True is for NumPy inputs (Tensors have no reshape)"
            )
        shape = [1 if i in axes else d for i, d in enumerate(t.shape)]
        return result.numpy().reshape(shape)
    return result_as(result, as_tensor)


def sum(
    x: ArrayIn,
    axis: int | tuple[int, ...] | None = None,
    keepdims: bool = False,
    *,
    out: Out | None = None,
) -> Result:  # noqa: A001 - NumPy's name
    """Sum over `axis` (an int, a tuple, or None for all), float32 accumulation."""
    return _reduce(_core.ReduceOp.sum, x, axis, keepdims, out)


def mean(
    x: ArrayIn,
    axis: int | tuple[int, ...] | None = None,
    keepdims: bool = False,
    *,
    out: Out | None = None,
) -> Result:
    """Mean over `axis` (an int, a tuple, or None for all)."""
    return _reduce(_core.ReduceOp.mean, x, axis, keepdims, out)


def max(
    x: ArrayIn,
    axis: int | tuple[int, ...] | None = None,
    keepdims: bool = False,
    *,
    out: Out | None = None,
) -> Result:  # noqa: A001 - NumPy's name
    """Maximum over `axis` (an int, a tuple, or None for all)."""
    return _reduce(_core.ReduceOp.max, x, axis, keepdims, out)


def transpose(x: ArrayIn, *, out: Out | None = None) -> Result:
    """x [M, N]^T -> [N, M] (2-D, tiled through shared memory)."""
    t, as_tensor = to_tensor(x, "x", None, FLOATS)
    shape = tuple(reversed(t.shape)) if len(t.shape) == 2 else tuple(t.shape)
    outputs = Outputs(out, [("y", shape, np.dtype(t.dtype))])
    return outputs.results([_core.transpose(t, outputs.tensor(0))], as_tensor)[0]


def matmul(a: ArrayIn, b: ArrayIn, *, out: Out | None = None) -> Result:
    """a [M, K] @ b [K, N] in float32 or float16 (float32 accumulation), tiled."""
    ta, as_tensor = to_tensor(a, "a", None, FLOATS)
    tb = like(b, ta.device, "b")
    shape = (ta.shape[0], tb.shape[1]) if len(ta.shape) == 2 and len(tb.shape) == 2 else ()
    outputs = Outputs(out, [("c", shape, np.dtype(ta.dtype))])
    return outputs.results([_core.matmul(ta, tb, outputs.tensor(0))], as_tensor)[0]
