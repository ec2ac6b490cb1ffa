"""Argument helpers shared by the Python API: NumPy input to Tensors with its dtype checked, whole
numbers that are not floats or bools, float32 parameters, and `out=` as NumPy's ufuncs take it."""

from __future__ import annotations

import functools
import math
import operator

import numpy as np

from . import _core
from ._core import DTypeError, Tensor
from . import _recorded_calls as recorded_calls

FLOATS = (np.float32, np.float16)


@functools.lru_cache(maxsize=64)
def _dtype_set(dtypes):
    return frozenset(np.dtype(d) for d in dtypes)


FLOAT_DTYPES = _dtype_set(FLOATS)


def to_tensor(x, name, device=None, dtypes=None):
    """(Tensor, given_as_tensor): uploads NumPy input, checking its dtype first."""
    if isinstance(x, Tensor):
        return x, True
    a = np.asarray(x)
    if dtypes is not None and a.dtype not in _dtype_set(tuple(dtypes)):
        names = ", ".join(np.dtype(d).name for d in dtypes)
        raise DTypeError(f"{name}: expected {names}, got {a.dtype}")
    return Tensor.from_numpy(a, device), False


def integer(value, name):
    """A whole number: Python or NumPy integers, not floats (which int() would cut silently) or
    bools."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {value!r}") from None


def count(value, name, least=1):
    """A whole number of at least `least` (a size, a count), as integer takes it."""
    number = integer(value, name)
    if number < least:
        raise _core.ArgumentError(f"{name}: expected an integer of at least {least}, got {number}")
    return number


def matrix_shape(shape):
    """(rows, cols) of a weight matrix: two whole numbers."""
    if isinstance(shape, (str, bytes)) or np.ndim(shape) != 1 or len(shape) != 2:
        raise _core.ShapeError(f"shape: expected (rows, cols), got {shape!r}")
    return tuple(count(d, "shape", 0) for d in shape)


def seed_value(seed):
    """A random seed: an integer in [0, 2**64) (not a float, which int() would cut)."""
    value = count(seed, "seed", 0)
    if value >= 2**64:
        raise _core.ArgumentError("seed: expected an integer in [0, 2**64)")
    return value


def float_dtype(value, name):
    """`value` (a name or a NumPy dtype) as the dtype float32 or float16; DTypeError naming `name`
    for anything else."""
    try:
        dtype = np.dtype(value) if value is not None else None
    except TypeError:
        dtype = None
    if dtype not in _dtype_set(FLOATS):
        raise DTypeError(f"{name}: expected float16 or float32, got {value!r}")
    return dtype


def like(value, device, name, dtypes=FLOATS):
    """`value` as a Tensor on `device`: Tensors as they are, other input uploaded (dtype
    checked)."""
    return value if isinstance(value, Tensor) else to_tensor(value, name, device, dtypes)[0]


def float32_param(value, device, name):
    """A float32 parameter (a bias, a norm's weight): Tensors as they are, other real numbers cast
    (bool, integers, floats); complex, object, text and time values raise DTypeError."""
    if isinstance(value, Tensor):
        return value
    a = np.asarray(value)
    if not _real(a):
        raise DTypeError(f"{name}: expected real numbers (cast to float32), got {a.dtype}")
    return like(a.astype(np.float32, copy=False), device, name)


def _real(a):
    # float32_param's input: bool, integers or floats, which cast to float32.
    return a.dtype.kind in "biuf"


def float32_numpy(value):
    """A NumPy parameter as float32_param casts it, as a C-contiguous float32 array; None for
    anything else (a Tensor, a list, values float32_param refuses), which the eager call takes."""
    if type(value) is not np.ndarray or not _real(value):
        return None
    return np.ascontiguousarray(value, np.float32)


def result_as(t, as_tensor):
    """A result as the input came: a Tensor, or NumPy. Inside a recording graph results are always
    Tensors: their values exist only once the graph runs. A result in host memory (which is
    host-cached where the device has such memory) comes back as a NumPy view of it, whose base
    keeps the Tensor alive: copying it into a fresh array would cost more than the call (its pages
    are new to the process, docs/PERFORMANCE.md)."""
    if as_tensor or _core.recording(t.device):
        return t
    return np.asarray(t) if t.memory == "host" and t.size else t.numpy()


def host_target(device, shape, dtype):
    """A host-memory Tensor for a result going back to NumPy, or None where the core should make
    the result itself (empty results, inside a recording graph, host memory short)."""
    if math.prod(shape) == 0 or _core.recording(device):
        return None
    try:
        return device.empty(shape, np.dtype(dtype), memory="host")
    except _core.OutOfMemory:  # host memory the driver can map is short: the core makes one
        return None


class Outputs:
    """`out=` as NumPy's ufuncs take it: one target per result (a tuple when there are several).

    A Tensor target is written by the kernel itself (checked in the core); a NumPy target is
    checked here before anything runs and filled once the call has succeeded, so a call that
    raises leaves it untouched.
    """

    def __init__(self, out, specs, host=None):
        """host: the device of a call whose results go back to NumPy: its results are then written
        by the GPU straight into host-cached memory and handed back as views of it (result_as),
        with no copy submission of their own (tens of microseconds) nor a copy on the CPU."""
        self.specs = specs
        self.host = host if out is None else None
        if out is None:
            self.targets = [None] * len(specs)
            return
        targets = list(out) if isinstance(out, tuple) else [out]
        if len(targets) != len(specs):
            names = ", ".join(name for name, _, _ in specs)
            raise _core.ArgumentError(
                f"out: expected {len(specs)} target(s) ({names}), got {len(targets)}"
            )
        arrays = []
        for target, (name, shape, dtype) in zip(targets, specs):
            if target is None or isinstance(target, Tensor):
                continue
            if not isinstance(target, np.ndarray):
                raise DTypeError(
                    f"out ({name}): expected a NumPy array or a Tensor, got {type(target).__name__}"
                )
            if target.dtype != np.dtype(dtype):
                raise DTypeError(
                    f"out ({name}): expected {np.dtype(dtype).name}, got {target.dtype}"
                )
            if target.shape != tuple(shape):
                raise _core.ShapeError(
                    f"out ({name}): expected shape {tuple(shape)}, got {target.shape}"
                )
            if not (target.flags.c_contiguous and target.flags.writeable):
                raise _core.ArgumentError(f"out ({name}): expected a writeable C-contiguous array")
            if any(np.shares_memory(target, other) for other in arrays):
                raise _core.ArgumentError("out: the outputs of one call must not overlap")
            arrays.append(target)
        self.targets = targets

    def tensor(self, i):
        """The Tensor target the core should write into, or None (the core makes one)."""
        target = self.targets[i]
        if isinstance(target, Tensor):
            return target
        _, shape, dtype = self.specs[i]
        return None if self.host is None else host_target(self.host, shape, dtype)

    def results(self, tensors, as_tensor):
        """What the call returns: each target filled, or each result as the input came."""
        values = []
        for target, t in zip(self.targets, tensors):
            if isinstance(target, np.ndarray):
                if _core.recording(t.device):
                    raise _core.ArgumentError(
                        "out: inside a recording graph, targets must be Tensors "
                        "(a NumPy array would be filled before the graph runs)"
                    )
                values.append(t.numpy(out=target))
            elif target is not None:
                values.append(target)
            else:
                values.append(result_as(t, as_tensor))
        return values


def call_unary(fn, x, name, out, *others, key=None):
    """fn(x, *others, out) for an op whose result has x's shape and dtype; `others` are (value,
    name) pairs taken onto x's device. key: names fn and its parameters, so that small NumPy
    calls repeated with it replay a recorded command buffer (recorded_calls)."""
    if key is not None and out is None:
        arrays = [x, *[v for v, _ in others]]
        if all(type(a) is np.ndarray and a.dtype in FLOAT_DTYPES for a in arrays):
            results = recorded_calls.call(
                key, arrays, [(x.shape, x.dtype)], lambda i, o: fn(*i, o[0])
            )
            if results is not None:
                return results[0]
    t, as_tensor = to_tensor(x, name, None, FLOATS)
    if out is None and not others and not as_tensor:  # the common call, without Outputs' work
        return result_as(fn(t, host_target(t.device, tuple(t.shape), t.dtype)), False)
    rest = [like(v, t.device, n) for v, n in others]
    host = None if as_tensor else t.device
    outputs = Outputs(out, [("y", tuple(t.shape), np.dtype(t.dtype))], host)
    return outputs.results([fn(t, *rest, outputs.tensor(0))], as_tensor)[0]
