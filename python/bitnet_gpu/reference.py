"""NumPy references for every bitnet_gpu kernel, written from the formulas in docs/NUMERICS.md.

These are the ground truth of the parity tests: plain, float64 where it matters, no shortcuts.
"""

from __future__ import annotations

import numpy as np


def axpy(a: float, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """y + a * x in float32, as the built-in ``axpy`` test kernel computes it."""
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.float32)
    return (np.float32(a) * x + y).astype(np.float32)


def copy(x: np.ndarray) -> np.ndarray:
    """The built-in ``copy_vec4`` kernel: an exact copy."""
    return np.array(x, copy=True)
