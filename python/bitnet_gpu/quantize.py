"""The BitNet quantizers: NumPy in, NumPy out; Tensor in, Tensor out.

Formulas: docs/NUMERICS.md. Every function runs on the GPU now; float inputs holding NaN or Inf
raise ArgumentError (a ValueError) with the count, found in the same GPU pass.
"""

from __future__ import annotations

import numpy as np

from . import _core
from ._args import FLOATS, count, matrix_shape, Outputs, seed_value, to_tensor
from ._core import Device, DTypeError, Tensor
from ._types import ArrayIn, Out, Result

__all__ = [
    "BinaryWeights",
    "TernaryWeights",
    "binarize_weights",
    "dequantize_activations",
    "dequantize_weights",
    "pack_ternary",
    "quantize_activations",
    "quantize_gradients",
    "quantize_weights",
    "unpack_ternary",
]


class _PackedWeights:
    """Weights kept on the device, packed, with their scales (one, or one per group along K)."""

    def __init__(self, core, returns_tensors=False):
        self._core = core
        self._returns_tensors = returns_tensors

    @property
    def handle(self) -> _core.QuantizedWeights:
        """The compiled module's weights object: what ops taking several weights at once
        (``_core.bitlinear_group``, the decoder's fused projections) are given."""
        return self._core

    @property
    def shape(self):
        return (self._core.rows, self._core.cols)

    @property
    def group_size(self):
        return self._core.group_size or None

    @property
    def device(self):
        return self._core.packed.device

    @property
    def scale(self):
        """float32: a scalar per tensor, or [N, K // group_size] per group."""
        scales = self._core.scales.numpy()
        if self.group_size is None:
            return scales[0]
        return scales.reshape(self.shape[0], self.shape[1] // self.group_size)

    @property
    def nbytes(self):
        """Bytes on the device: the packed weights plus the float32 scales."""
        return self._core.packed.nbytes + self._core.scales.nbytes

    @property
    def packed_tensor(self):
        return self._core.packed

    @property
    def scale_tensor(self):
        return self._core.scales

    def packed(self):
        """uint8 [N, row_bytes] in the public packed layout (docs/NUMERICS.md)."""
        return self._core.packed.numpy()

    def dequantize(self, out=None):
        outputs = Outputs(out, [("weights", self.shape, np.float32)])
        t = _core.dequantize_weights(self._core, outputs.tensor(0))
        return outputs.results([t], self._returns_tensors)[0]

    def __repr__(self):
        groups = "per tensor" if self.group_size is None else f"group_size={self.group_size}"
        return (
            f"<bitnet_gpu.{type(self).__name__} shape={self.shape} {groups} nbytes={self.nbytes}>"
        )

    @classmethod
    def _from_packed(cls, packed, scale, shape, group_size, binary, device):
        rows, cols = matrix_shape(shape)
        packed_t, _ = to_tensor(packed, "packed", device, [np.uint8])
        scale_t, _ = to_tensor(
            np.asarray(scale, np.float32).reshape(-1) if not isinstance(scale, Tensor) else scale,
            "scale",
            packed_t.device,
            [np.float32],
        )
        core = _core.weights_from_packed(
            packed_t, scale_t, rows, cols, _group_size(group_size), binary
        )
        if not binary:
            codes = packed_t.numpy()
            if (((codes[..., None] >> np.array([0, 2, 4, 6], np.uint8)) & 3) == 3).any():
                raise _core.ArgumentError("packed: code 3 is never a valid ternary weight")
        return cls(core)


class TernaryWeights(_PackedWeights):
    """Absmean ternary weights (BitNet b1.58): W_q in {-1, 0, 1}, 2 bits each, scale gamma."""

    def unpack(self, out=None):
        """int8 [N, K] in {-1, 0, 1}."""
        core = self._core
        outputs = Outputs(out, [("values", self.shape, np.int8)])
        t = _core.unpack_ternary(core.packed, core.rows, core.cols, outputs.tensor(0))
        return outputs.results([t], self._returns_tensors)[0]

    @classmethod
    def from_packed(cls, packed, scale, shape, group_size=None, device=None):
        return cls._from_packed(packed, scale, shape, group_size, False, device)


class BinaryWeights(_PackedWeights):
    """1-bit sign weights (BitNet): W_b in {-1, +1}, 1 bit each, scale beta."""

    @classmethod
    def from_packed(cls, packed, scale, shape, group_size=None, device=None):
        return cls._from_packed(packed, scale, shape, group_size, True, device)


def _group_size(group_size):
    """group_size as the core takes it: None (or 0) for one scale per tensor."""
    return 0 if group_size is None else count(group_size, "group_size", 0)


def quantize_weights(w, *, group_size=None, device=None) -> TernaryWeights:
    """Absmean ternary quantization of a float32/float16 matrix [N, K] (per tensor or group)."""
    t, as_tensor = to_tensor(w, "w", device, FLOATS)
    return TernaryWeights(_core.quantize_weights(t, _group_size(group_size), False), as_tensor)


def binarize_weights(w, *, group_size=None, device=None) -> BinaryWeights:
    """1-bit sign quantization around the mean, scale beta = mean|W| (per tensor or group)."""
    t, as_tensor = to_tensor(w, "w", device, FLOATS)
    return BinaryWeights(_core.quantize_weights(t, _group_size(group_size), True), as_tensor)


def dequantize_weights(q: TernaryWeights, *, out: Out | None = None) -> Result:
    """float32 [N, K]: W_q * gamma (ternary) or W_b * beta (binary)."""
    if not isinstance(q, _PackedWeights):
        raise DTypeError(f"q: expected TernaryWeights or BinaryWeights, got {type(q).__name__}")
    return q.dequantize(out=out)


def pack_ternary(q: ArrayIn, *, out: Out | None = None, device: Device | None = None) -> Result:
    """int8 [N, K] in {-1, 0, 1} to uint8 [N, ceil(K / 16) * 4], packed on the GPU."""
    t, as_tensor = to_tensor(q, "q", device, [np.int8])
    if t.ndim != 2:
        _core.pack_ternary(t)  # raises ShapeError naming the shape
    rows, cols = t.shape
    outputs = Outputs(out, [("packed", (rows, -(-cols // 16) * 4), np.uint8)])
    return outputs.results([_core.pack_ternary(t, outputs.tensor(0))], as_tensor)[0]


def unpack_ternary(
    packed: ArrayIn, shape: tuple[int, int], *, out: Out | None = None, device: Device | None = None
) -> Result:
    """uint8 packed ternary weights to int8 [N, K] in {-1, 0, 1}, on the GPU."""
    t, as_tensor = to_tensor(packed, "packed", device, [np.uint8])
    rows, cols = matrix_shape(shape)
    outputs = Outputs(out, [("values", (rows, cols), np.int8)])
    return outputs.results([_core.unpack_ternary(t, rows, cols, outputs.tensor(0))], as_tensor)[0]


def quantize_activations(
    x: ArrayIn,
    *,
    bits: int = 8,
    symmetric: bool = True,
    out: Out | None = None,
    device: Device | None = None,
) -> Result:
    """Per-row (per-token) quantization of x [..., K].

    symmetric: (q int8, scale float32 [...]) with scale = qmax / max|x|;
    otherwise (q uint8, scale float32 [...], zero_point uint8 [...]).
    out: a tuple of targets for those results (NumPy arrays or Tensors; None for any one of
    them allocates it), filled and returned.
    """
    t, as_tensor = to_tensor(x, "x", device, FLOATS)
    shape = tuple(t.shape)
    specs = [("q", shape, np.int8 if symmetric else np.uint8), ("scale", shape[:-1], np.float32)]
    if not symmetric:
        specs.append(("zero_point", shape[:-1], np.uint8))
    outputs = Outputs(out, specs)
    r = _core.quantize_rows(
        t, count(bits, "bits"), bool(symmetric), *(outputs.tensor(i) for i in range(len(specs)))
    )
    results = [r.q, r.scales] if symmetric else [r.q, r.scales, r.zero_points]
    return tuple(outputs.results(results, as_tensor))


def dequantize_activations(
    q: ArrayIn,
    scale: ArrayIn,
    zero_point: ArrayIn | None = None,
    *,
    out: Out | None = None,
    device: Device | None = None,
) -> Result:
    """x = q / scale (symmetric) or (q - zero_point) * scale (asymmetric), float32."""
    tq, as_tensor = to_tensor(q, "q", device, [np.int8, np.uint8])
    ts, _ = to_tensor(scale, "scale", tq.device, [np.float32])
    tz = (
        None
        if zero_point is None
        else to_tensor(zero_point, "zero_point", tq.device, [np.uint8])[0]
    )
    outputs = Outputs(out, [("x", tuple(tq.shape), np.float32)])
    return outputs.results([_core.dequantize_rows(tq, ts, tz, outputs.tensor(0))], as_tensor)[0]


def quantize_gradients(
    g: ArrayIn,
    *,
    bits: int = 8,
    stochastic: bool = False,
    seed: int = 0,
    out: Out | None = None,
    device: Device | None = None,
) -> Result:
    """Per-tensor absmax quantization: (q int8, scale float32) with scale = qmax / max|g|.

    stochastic=True rounds down or up at random, from a counter-based hash of (seed, element
    index): the same seed gives the same q on every device. out: (q, scale) targets, scale a
    float32 array of shape (1,).
    """
    t, as_tensor = to_tensor(g, "g", device, FLOATS)
    seed = seed_value(seed)
    outputs = Outputs(out, [("q", tuple(t.shape), np.int8), ("scale", (1,), np.float32)])
    r = _core.quantize_tensor(
        t, count(bits, "bits"), bool(stochastic), seed, outputs.tensor(0), outputs.tensor(1)
    )
    q, scale = outputs.results([r.q, r.scale], as_tensor)
    if out is None and not as_tensor:
        scale = scale[0]
    return q, scale
