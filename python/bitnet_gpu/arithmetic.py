"""Element-wise arithmetic with NumPy broadcasting on the GPU: add, sub, mul, div.

NumPy in, NumPy out; Tensor in, Tensor out; float32 or float16; Python numbers take the other
operand's dtype."""

from __future__ import annotations

import numpy as np

from . import _core
from ._args import FLOATS, Outputs, to_tensor
from ._core import Tensor
from ._types import ArrayIn, Out, Result

__all__ = ["add", "div", "mul", "sub"]


def _operand(value, like_dtype, device, name):
    """A Tensor for one operand: Tensors as they are; Python scalars in the other operand's
    dtype."""
    if isinstance(value, Tensor):
        return value
    if np.isscalar(value) and not isinstance(value, np.generic):
        value = np.asarray(value, like_dtype)
    return to_tensor(np.asarray(value), name, device, FLOATS)[0]


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
    outputs = Outputs(out if shape is not None else None, [("y", shape or (), np.dtype(ta.dtype))])
    return outputs.results([_core.binary(ta, tb, op, outputs.tensor(0))], as_tensor)[0]


def add(a: ArrayIn, b: ArrayIn, *, out: Out | None = None) -> Result:
    """a + b with NumPy broadcasting (a or b may be a Python number)."""
    return _binary(_core.BinaryOp.add, a, b, out)


def sub(a: ArrayIn, b: ArrayIn, *, out: Out | None = None) -> Result:
    """a - b with NumPy broadcasting."""
    return _binary(_core.BinaryOp.sub, a, b, out)


def mul(a: ArrayIn, b: ArrayIn, *, out: Out | None = None) -> Result:
    """a * b with NumPy broadcasting."""
    return _binary(_core.BinaryOp.mul, a, b, out)


def div(a: ArrayIn, b: ArrayIn, *, out: Out | None = None) -> Result:
    """a / b with NumPy broadcasting."""
    return _binary(_core.BinaryOp.div, a, b, out)
