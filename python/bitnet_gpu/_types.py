"""Type aliases of the public Python API (for type checkers; nothing here runs a check)."""

from __future__ import annotations

from typing import Any, Union

import numpy as np
import numpy.typing as npt

from ._core import Tensor

__all__ = ["ArrayIn", "Out", "Result"]

# An op's array argument: a Tensor, or anything NumPy takes as an array (uploaded).
ArrayIn = Union[Tensor, npt.ArrayLike]
# out=: a Tensor or a NumPy array to write into (a tuple of them for several results).
Out = Union[Tensor, np.ndarray, tuple[Any, ...]]
# What an op returns: a Tensor where its input was one, else a NumPy array (or a tuple of them).
Result = Any
