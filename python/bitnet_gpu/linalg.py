"""Matrix decompositions on the GPU with numpy.linalg's signatures, results and exceptions.

    import bitnet_gpu as bg
    L = bg.linalg.cholesky(a)                  # a [..., N, N] -> L with L @ L.T == a
    Q, R = bg.linalg.qr(a)                     # mode "reduced", "complete" or "r"
    U, S, Vh = bg.linalg.svd(a)                # full_matrices=True, compute_uv=True
    w, v = bg.linalg.eigh(a)                   # ascending eigenvalues, eigenvectors as columns
    x = bg.linalg.solve(a, b)                  # a x = b

float32 and float64 (float64 where the device has shaderFloat64, as lavapipe and NVIDIA GPUs do;
UnsupportedError elsewhere). NumPy arrays in give NumPy arrays out; Tensors give Tensors. Leading
dimensions are a batch. A matrix with no decomposition raises bitnet_gpu.LinAlgError, a subclass
of numpy.linalg.LinAlgError, naming the matrix of the batch and the order of the failing leading
minor (Cholesky) or pivot (solve). The algorithms and their accuracy: docs/NUMERICS.md.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import _core
from ._core import Tensor
from ._types import ArrayIn, Result

__all__ = [
    "LinAlgError",
    "QRResult",
    "SVDResult",
    "EighResult",
    "cholesky",
    "qr",
    "svd",
    "eigh",
    "eigvalsh",
    "solve",
]

LinAlgError = _core.LinAlgError


class QRResult(NamedTuple):
    Q: np.ndarray | Tensor
    R: np.ndarray | Tensor


class SVDResult(NamedTuple):
    U: np.ndarray | Tensor
    S: np.ndarray | Tensor
    Vh: np.ndarray | Tensor


class EighResult(NamedTuple):
    eigenvalues: np.ndarray | Tensor
    eigenvectors: np.ndarray | Tensor


def _matrices(a, name="a", square=False):
    """(a as a Tensor [B, M, N], the batch shape, whether a came as a Tensor), after numpy.linalg's
    checks: at least two dimensions (LinAlgError), square where asked (LinAlgError), float32 or
    float64 (DTypeError: integers and complex numbers are refused, not converted), no empty
    matrix (ShapeError), and for NumPy input every value finite (ArgumentError; a Tensor's values
    are not read back: a NaN there makes cholesky and solve raise LinAlgError, and the others
    return NaN)."""
    from . import default_device

    given = isinstance(a, Tensor)
    host = None if given else np.asarray(a)
    shape = tuple(a.shape) if given else host.shape
    dtype = np.dtype(a.dtype) if given else host.dtype
    if len(shape) < 2:
        raise LinAlgError(
            f"{name}: {len(shape)}-dimensional array given. Array must be at least two-dimensional"
        )
    if square and shape[-1] != shape[-2]:
        raise LinAlgError(f"{name}: last 2 dimensions of the array must be square")
    if dtype not in (np.float32, np.float64):
        raise _core.DTypeError(
            f"{name}: expected float32 or float64, got {dtype} (convert it first)"
        )
    if 0 in shape:
        raise _core.ShapeError(f"{name}: empty matrices {shape}")
    if host is not None and not np.isfinite(host).all():
        raise _core.ArgumentError(f"{name}: contains NaN or Inf")
    batch = shape[:-2]
    flat = (int(np.prod(batch, dtype=np.int64)),) + shape[-2:]
    if given:
        return a.reshape(*flat), batch, True
    return (
        Tensor.from_numpy(np.ascontiguousarray(host).reshape(flat), default_device()),
        batch,
        False,
    )


def _back(t: Tensor, batch, as_tensor):
    """A result [B, ...] in the batch shape the input had, as a Tensor or NumPy array."""
    shaped = t.reshape(*(tuple(batch) + tuple(t.shape[1:])))
    return shaped if as_tensor else shaped.numpy()


def _out(out: Any) -> Tensor | None:
    """out=, checked: None or a Tensor (results are written into it on the device)."""
    if out is not None and not isinstance(out, Tensor):
        raise TypeError(f"out: expected a Tensor, got {type(out).__name__}")
    return out


def cholesky(a: ArrayIn, upper: bool = False, *, out: Tensor | None = None) -> Result:
    """The Cholesky factor of each symmetric positive definite matrix of a [..., N, N] (its lower
    triangle read): L with L L^T = a, or L^T with upper=True, zeros in the other triangle.
    LinAlgError where a matrix is not positive definite, naming it and the order of its first
    leading minor that is not. out: a Tensor [..., N, N] of a's dtype to write into."""
    out = _out(out)
    t, batch, as_tensor = _matrices(a, square=True)
    target = None if out is None else out.reshape(*t.shape)
    result = _core.cholesky(t, bool(upper), target)
    return out if out is not None else _back(result, batch, as_tensor)


def qr(a: ArrayIn, mode: str = "reduced") -> Result:
    """Householder QR of each matrix of a [..., M, N], K = min(M, N): mode "reduced" gives
    QRResult(Q [..., M, K], R [..., K, N]), "complete" Q [..., M, M] and R [..., M, N], "r" R
    alone [..., K, N]. R's diagonal carries LAPACK's signs, as numpy.linalg.qr's."""
    if mode not in ("reduced", "complete", "r"):
        raise _core.ArgumentError(f"mode: expected 'reduced', 'complete' or 'r', got {mode!r}")
    t, batch, as_tensor = _matrices(a)
    q, r = _core.qr(t, mode == "complete", mode != "r")
    if mode == "r":
        return _back(r, batch, as_tensor)
    return QRResult(_back(q, batch, as_tensor), _back(r, batch, as_tensor))


def svd(
    a: ArrayIn, full_matrices: bool = True, compute_uv: bool = True, hermitian: bool = False
) -> Result:
    """Singular values of each matrix of a [..., M, N], descending, and with compute_uv
    SVDResult(U, S, Vh) with a = U diag(S) Vh: U [..., M, M] and Vh [..., N, N] with
    full_matrices, else [..., M, K] and [..., K, N]. hermitian is numpy's hint and changes
    nothing here. Records in a Graph (past 32 x 64 with all 40 Jacobi sweeps, those after
    convergence skipping their work; a plain call stops at the first sweep without rotations)."""
    t, batch, as_tensor = _matrices(a)
    u, s, vh = _core.svd(t, bool(full_matrices), bool(compute_uv))
    if not compute_uv:
        return _back(s, batch, as_tensor)
    return SVDResult(
        _back(u, batch, as_tensor), _back(s, batch, as_tensor), _back(vh, batch, as_tensor)
    )


def eigh(a: ArrayIn, UPLO: str = "L") -> Result:
    """EighResult(eigenvalues [..., N] ascending, eigenvectors [..., N, N] as columns) of the
    symmetric matrices a [..., N, N], from their lower (UPLO="L") or upper ("U") triangle. Records
    in a Graph (as svd)."""
    w, v = _eigh(a, UPLO, True)
    return EighResult(w, v)


def eigvalsh(a: ArrayIn, UPLO: str = "L") -> Result:
    """The eigenvalues alone of eigh, ascending."""
    return _eigh(a, UPLO, False)[0]


def _eigh(a, uplo, compute_v):
    if uplo not in ("L", "U"):
        raise _core.ArgumentError(f"UPLO: expected 'L' or 'U', got {uplo!r}")
    t, batch, as_tensor = _matrices(a, square=True)
    w, v = _core.eigh(t, compute_v, uplo == "U")
    return _back(w, batch, as_tensor), (_back(v, batch, as_tensor) if compute_v else None)


def solve(a: ArrayIn, b: ArrayIn, *, out: Tensor | None = None) -> Result:
    """x with a x = b for square a [..., N, N]: b [N] (one vector, as numpy.linalg.solve takes a
    1-D b) or [..., N, K]; NumPy arrays' batch dimensions broadcast. Through a's QR (backward
    stable). LinAlgError where a matrix is singular (an exact zero pivot), naming it. out: a
    Tensor of the result's shape and dtype to write into."""
    out = _out(out)
    return _solve(a, b, out)


def _solve(a: Any, b: Any, out: Tensor | None) -> Result:
    a = a if isinstance(a, Tensor) else np.asarray(a)
    b = b if isinstance(b, Tensor) else np.asarray(b)
    vector = np.ndim(b) == 1 if not isinstance(b, Tensor) else len(b.shape) == 1
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        a_host, b_host = a, b
        if vector:
            b_host = b_host[:, None]
        if a_host.ndim >= 2 and b_host.ndim >= 2:
            batch = np.broadcast_shapes(a_host.shape[:-2], b_host.shape[:-2])
            a_host = np.broadcast_to(a_host, batch + a_host.shape[-2:])
            b_host = np.broadcast_to(b_host, batch + b_host.shape[-2:])
        a, b = a_host, b_host
    elif vector:
        b = b.reshape(b.shape[0], 1)
    ta, batch, as_tensor = _matrices(a, square=True)
    tb, batch_b, _ = _matrices(b, "b")
    if tuple(batch_b) != tuple(batch) or tb.shape[1] != ta.shape[1]:
        raise _core.ShapeError(
            f"solve: a {tuple(batch) + tuple(ta.shape[1:])} and b "
            f"{tuple(batch_b) + tuple(tb.shape[1:])} do not fit"
        )
    x = _core.solve(ta, tb)
    result = _back(x, batch, True)
    if vector:
        result = result.reshape(*result.shape[:-1])
    if out is not None:
        out.copy_from(result)
        return out
    return result if as_tensor or isinstance(b, Tensor) else result.numpy()
