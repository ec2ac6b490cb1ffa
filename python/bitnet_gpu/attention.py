"""Decoder attention on the GPU: rotary embeddings, grouped-query attention, a KV cache.

Layouts: one token a row, [T, heads, head_dim]. NumPy in, NumPy out; Tensor in, Tensor out;
float32 or float16. Formulas: docs/NUMERICS.md.
"""

from __future__ import annotations

import math

import numpy as np

from . import _core
from ._core import Tensor
from ._args import FLOATS, count, float_dtype, integer, like, Outputs, to_tensor
from ._types import ArrayIn, Out, Result

__all__ = ["KVCache", "attention", "rope", "rope_tables"]


def rope_tables(positions: ArrayIn, head_dim: int, theta: float = 10000.0) -> Result:
    """(cos, sin) float32 [T, head_dim / 2]: angle[t, i] = positions[t] * theta^(-2i / head_dim),
    in float64 before rounding (float32 angles in the thousands of radians lose the phase)."""
    pos = np.asarray(positions.numpy() if isinstance(positions, Tensor) else positions)
    if pos.ndim != 1 or pos.dtype.kind not in "iu":
        raise _core.DTypeError(
            f"positions: expected a 1-D integer array, got {pos.dtype} {pos.shape}"
        )
    head_dim = count(head_dim, "head_dim")
    if head_dim % 2:
        raise _core.ShapeError(f"head_dim {head_dim} must be even")
    if not (np.isfinite(float(theta)) and float(theta) > 0):
        raise _core.ArgumentError(f"theta: expected a finite number > 0, got {theta}")
    inv = float(theta) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angle = pos.astype(np.float64)[:, None] * inv[None, :]
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def rope(
    x: ArrayIn, positions: ArrayIn, theta: float = 10000.0, *, out: Out | None = None
) -> Result:
    """Rotary embedding, half-split layout, of x [T, H, D] at the given token positions [T]."""
    t, as_tensor = to_tensor(x, "x", None, FLOATS)
    if len(t.shape) != 3:
        raise _core.ShapeError(f"x: expected [T, H, D], got shape {tuple(t.shape)}")
    cos, sin = rope_tables(positions, t.shape[2], theta)
    if cos.shape[0] != t.shape[0]:
        raise _core.ShapeError(
            f"positions: expected {t.shape[0]} (one per row of x), got {cos.shape[0]}"
        )
    outputs = Outputs(out, [("y", tuple(t.shape), np.dtype(t.dtype))])
    y = _core.rope(
        t, Tensor.from_numpy(cos, t.device), Tensor.from_numpy(sin, t.device), outputs.tensor(0)
    )
    return outputs.results([y], as_tensor)[0]


def attention(
    q: ArrayIn,
    k: ArrayIn,
    v: ArrayIn,
    causal: bool = True,
    *,
    kv_length: int | None = None,
    precision: str = "float32",
    out: Out | None = None,
) -> Result:
    """softmax(q k^T / sqrt(D)) v: q [TQ, HQ, D], k and v [L, HKV, D] with HQ a multiple of HKV
    (grouped-query). causal: query i is token L - TQ + i and sees keys up to it; prefill
    (TQ = L) and single-token decode (TQ = 1) are the same call. kv_length reads only the first
    rows of k and v (a KV cache's filled part).
    precision: "float32" (the products in float32), or "float16": q, k, v and the softmax weights
    rounded to float16 for the products, float32 sums, on tensor cores (PyTorch's float16 SDPA
    rounds the same way; docs/NUMERICS.md). "float16" needs the device feature
    "cooperative_matrix_khr_float16" and D of 32, 64, 96 or 128 (UnsupportedError otherwise)."""
    tq, as_tensor = to_tensor(q, "q", None, FLOATS)
    tk, tv = like(k, tq.device, "k"), like(v, tq.device, "v")
    outputs = Outputs(out, [("out", tuple(tq.shape), np.dtype(tq.dtype))])
    o = _core.attention(
        tq,
        tk,
        tv,
        bool(causal),
        None if kv_length is None else count(kv_length, "kv_length", 0),
        outputs.tensor(0),
        _half(precision),
    )
    return outputs.results([o], as_tensor)[0]


def _half(precision):
    """Whether `precision` asks for float16 products; ArgumentError for anything but the two."""
    if isinstance(precision, str) and precision in ("float32", "float16"):
        return precision == "float16"
    raise _core.ArgumentError(f"precision: expected 'float32' or 'float16', got {precision!r}")


class KVCache:
    """Keys and values of every layer on the device: [max_tokens, kv_heads, head_dim] each,
    float32 or float16 (`dtype`), appended in place. `cache.attention(layer, q)` attends over the
    filled part (float32 q over a float16 cache computes in float32 from the stored values). A
    layer index outside [0, layers) raises IndexError, as a list's does; a cache larger than the
    device's memory raises OutOfMemory before anything is allocated."""

    def __init__(self, layers, max_tokens, kv_heads, head_dim, dtype=np.float32, device=None):
        from . import default_device

        self.device = device or default_device()
        self.layers, self.max_tokens = count(layers, "layers"), count(max_tokens, "max_tokens")
        self.kv_heads, self.head_dim = count(kv_heads, "kv_heads"), count(head_dim, "head_dim")
        self.dtype = float_dtype(dtype, "KVCache: dtype")
        shape = (self.max_tokens, self.kv_heads, self.head_dim)
        nbytes = 2 * self.layers * math.prod(shape) * self.dtype.itemsize
        heaps = sum(heap["size"] for heap in self.device.memory_stats()["heaps"])
        if nbytes > heaps:  # refused before anything is allocated
            raise _core.OutOfMemory(
                f"KVCache: {self.layers} layers of {shape} keys and values take {nbytes} bytes, "
                f"more than the device's {heaps} bytes of memory"
            )
        self.keys = [self.device.empty(shape, self.dtype) for _ in range(self.layers)]
        self.values = [self.device.empty(shape, self.dtype) for _ in range(self.layers)]
        self.lengths = [0] * self.layers

    @property
    def nbytes(self):
        return sum(t.nbytes for t in self.keys + self.values)

    def append(self, layer, k, v):
        """Appends k and v [T, kv_heads, head_dim] to `layer`; returns the new length. NumPy
        float32 or float16 rows take the cache's dtype (rounded to nearest, as NumPy assigns);
        Tensors must have it."""
        layer = self._layer(layer)
        tk, tv = self._rows(k, "k"), self._rows(v, "v")
        first = self.lengths[layer]
        if first + tk.shape[0] > self.max_tokens:
            raise _core.ShapeError(
                f"layer {layer}: {first} + {tk.shape[0]} tokens exceed the cache's "
                f"max_tokens={self.max_tokens}"
            )
        _core.copy_rows(tk, self.keys[layer], first)
        _core.copy_rows(tv, self.values[layer], first)
        self.lengths[layer] = first + tk.shape[0]
        return self.lengths[layer]

    def attention(self, layer, q, causal=True, *, precision="float32", out=None):
        """Attention of q [TQ, HQ, D] over the layer's filled keys and values (precision as in
        bitnet_gpu.attention)."""
        layer = self._layer(layer)
        return attention(
            q,
            self.keys[layer],
            self.values[layer],
            causal,
            kv_length=self.lengths[layer],
            precision=precision,
            out=out,
        )

    def _rows(self, rows, name):
        """rows on the device in the cache's dtype (NumPy floats converted; Tensors as they are)."""
        if not isinstance(rows, Tensor):
            array = np.asarray(rows)
            if array.dtype in FLOATS:
                rows = array.astype(self.dtype, copy=False)
        return like(rows, self.device, name)

    def _layer(self, layer):
        """A layer's index, checked: 0 to layers - 1 (no counting from the end)."""
        index = integer(layer, "layer")
        if not 0 <= index < self.layers:
            raise IndexError(f"layer {index} is out of range for a cache of {self.layers} layers")
        return index

    def reset(self):
        self.lengths = [0] * self.layers

    def __repr__(self):
        return (
            f"<bitnet_gpu.KVCache layers={self.layers} max_tokens={self.max_tokens} "
            f"kv_heads={self.kv_heads} head_dim={self.head_dim} lengths={self.lengths}>"
        )
