"""The screened head: an int8 copy of the float head that brackets every logit, so that a decode
step of one sequence computes exactly only the head rows that can win (``_core.screened_argmax``
and ``_core.screened_sample``: bit for bit the float head's argmax or draw, at half its bytes)."""

from __future__ import annotations

import math
import os

import numpy as np

from .. import _core
from .._core import Device, Tensor

__all__ = ["ScreenedHead", "screening_tables"]


def screening_tables(head: np.ndarray, chunk_rows: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """The int8 copy of a float head [V, K] that ``_core.screened_argmax`` screens with: q int8
    [V, Kp] (K rounded up to 16, zero-padded), q_v = clip(rint(head[v] * (127 / m_v)), -127, 127)
    with m_v = max|head[v]| and sigma_v = float32(m_v / 127), and meta float32 [V, 4]: sigma_v;
    D' = D_v + gamma (N_v + D_v) and N_v, each bounded from above, where D_v = ||head[v] -
    sigma_v q_v||, N_v = ||head[v]|| and gamma = n u / (1 - n u) + 8 u, n = K + 64, u = 2^-24,
    bounds the float32 rounding of a K-term dot product in any order and of the screening's own
    products (shaders/screened_head/head_screen.comp has the bound). D_v and N_v are computed in
    float32
    and raised by what that rounding can hide: (1 + 2^-10) for a sum of K squares (K < 2^20), and
    1.02 sqrt(K) u m_v for the K differences. Rows with NaN or Inf, or whose largest value is below
    1e-15 (their squares could underflow), get D' = N = inf: never screened out."""
    head = np.asarray(head)
    if head.ndim != 2 or head.dtype not in (np.float16, np.float32):
        raise _core.ShapeError(
            f"head: expected float16 or float32 [V, K], got {head.dtype} {head.shape}"
        )
    v, k = head.shape
    if k >= 1 << 20:
        raise _core.ShapeError(f"head: rows of at most 2^20 values, got {k}")
    padded = -(-k // 16) * 16
    q = np.zeros((v, padded), np.int8)
    meta = np.zeros((v, 4), np.float32)
    u = 2.0**-24
    n = k + 64
    gamma = n * u / (1 - n * u) + 8 * u

    def rounded_up(values):
        single = values.astype(np.float32)
        return np.where(
            single.astype(np.float64) < values, np.nextafter(single, np.float32(np.inf)), single
        )

    def fill(first_chunk, chunk_step):
        rows_buffer = np.empty(
            (min(chunk_rows, v), k), np.float32
        )  # reused: no page faults a chunk
        work_buffer = np.empty_like(rows_buffer)
        for first in range(first_chunk * chunk_rows, v, chunk_step * chunk_rows):
            end = min(first + chunk_rows, v)
            rows, work = rows_buffer[: end - first], work_buffer[: end - first]
            rows[...] = head[first:end]
            with np.errstate(invalid="ignore", over="ignore"):
                amax = np.abs(rows, out=work).max(axis=1)
            bounded = np.isfinite(amax) & ((amax >= 1e-15) | (amax == 0))
            rows[~bounded] = 0.0
            amax = np.where(bounded, amax, np.float32(0))
            sigma = amax / np.float32(127)
            inverse = np.where(
                amax > 0, np.float32(127) / np.where(amax > 0, amax, np.float32(1)), np.float32(0)
            )
            values = np.multiply(rows, inverse[:, None], out=work)
            np.rint(values, out=values)
            np.clip(values, -127, 127, out=values)
            q[first:end, :k] = values
            error = np.multiply(values, sigma[:, None], out=values)
            np.subtract(rows, error, out=error)
            amax64 = amax.astype(np.float64)
            d = (
                np.sqrt(np.einsum("ij,ij->i", error, error, dtype=np.float32).astype(np.float64))
                * (1 + 2.0**-10)
                + 1.02 * math.sqrt(k) * u * amax64
            ) * (1 + 2.0**-20)
            norm = np.sqrt(
                np.einsum("ij,ij->i", rows, rows, dtype=np.float32).astype(np.float64)
            ) * (1 + 2.0**-10)
            meta[first:end, 0] = sigma
            meta[first:end, 1] = np.where(
                bounded, rounded_up(d + gamma * (norm + d)), np.float32(np.inf)
            )
            meta[first:end, 2] = np.where(bounded, rounded_up(norm), np.float32(np.inf))

    # Rows are independent: chunks dealt to threads (NumPy's loops release the GIL).
    threads = max(1, min(8, os.cpu_count() or 1, -(-v // chunk_rows)))
    if threads == 1:
        fill(0, 1)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            for done in [pool.submit(fill, t, threads) for t in range(threads)]:
                done.result()
    return q, meta


class ScreenedHead:
    """The screening copy of one head tensor, built when first needed (NumPy over the whole head:
    seconds for the 2B4T vocabulary) and again if the head is replaced."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self._head: Tensor | None = None
        self._tables: tuple[Tensor, Tensor] | None = None

    def tables(self, head: Tensor) -> tuple[Tensor, Tensor]:
        """(q, meta) on the device for `head`."""
        if self._tables is None or self._head is not head:
            q, meta = screening_tables(head.numpy())
            self._tables = (Tensor.from_numpy(q, self.device), Tensor.from_numpy(meta, self.device))
            self._head = head
        return self._tables

    @property
    def nbytes(self) -> int:
        """Bytes of the copy on the device (0 until built)."""
        return sum(t.nbytes for t in self._tables) if self._tables else 0

    def __repr__(self) -> str:
        built = self._tables is not None
        return f"<bitnet_gpu.models.ScreenedHead built={built} nbytes={self.nbytes}>"
