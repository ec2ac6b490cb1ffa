"""Layers: BitLinear keeps its packed ternary weights on the device."""

from __future__ import annotations

import numpy as np

from . import _core
from ._core import Tensor
from .linear import bitlinear, bitlinear_backward_input
from ._args import count
from .quantize import TernaryWeights, quantize_weights

__all__ = ["BitLinear"]


class BitLinear:
    """y = BitLinear(x): per-token int8 activations times ternary weights, plus an optional bias.

    ``BitLinear(in_features, out_features, bias=True)`` draws weights like a float linear layer
    (uniform in +-1/sqrt(in_features)) and quantizes them; ``BitLinear.from_float(w, bias)`` and
    ``BitLinear.from_packed(packed, scale, shape, bias)`` wrap existing ones, with one scale per
    tensor or, given ``group_size``, one per group of that many weights along K. Called on NumPy
    arrays it returns NumPy; on Tensors, Tensors.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        seed=None,
        device=None,
        _weights: TernaryWeights | None = None,
        _bias=None,
    ):
        self.in_features = count(in_features, "in_features")
        self.out_features = count(out_features, "out_features")
        if _weights is None:
            rng = np.random.default_rng(seed)
            bound = 1.0 / np.sqrt(self.in_features)
            w = rng.uniform(-bound, bound, (self.out_features, self.in_features)).astype(np.float32)
            _weights = quantize_weights(w, device=device)
            if bias:
                _bias = rng.uniform(-bound, bound, self.out_features).astype(np.float32)
        self.weight = _weights
        self.bias = _bias
        if self.weight.shape != (self.out_features, self.in_features):
            raise ValueError(
                f"weights of shape {self.weight.shape} do not match "
                f"({self.out_features}, {self.in_features})"
            )

    @classmethod
    def from_float(cls, w, bias=None, device=None, *, group_size=None) -> "BitLinear":
        q = quantize_weights(w, group_size=group_size, device=device)
        return cls(q.shape[1], q.shape[0], _weights=q, _bias=bias)

    @classmethod
    def from_packed(
        cls, packed, scale, shape, bias=None, device=None, *, group_size=None
    ) -> "BitLinear":
        q = TernaryWeights.from_packed(packed, scale, shape, group_size=group_size, device=device)
        return cls(q.shape[1], q.shape[0], _weights=q, _bias=bias)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed weights and their scales on the device."""
        return self.weight.nbytes

    @property
    def bias(self):
        """float32 [out_features] (read-only: assign a new array to change it), or None."""
        return self._bias

    @bias.setter
    def bias(self, value):
        if value is None:
            self._bias = self._bias_tensor = None
            return
        given = np.asarray(value)
        if given.dtype.kind not in "biuf":  # complex would lose its imaginary part, text fail
            raise _core.DTypeError(f"bias: expected real numbers, got {given.dtype}")
        bias = np.array(given, np.float32)  # our own copy, so the device copy cannot go stale
        if bias.shape != (self.out_features,):
            raise ValueError(f"bias: expected shape ({self.out_features},), got {bias.shape}")
        bias.flags.writeable = False
        self._bias = bias
        self._bias_tensor = Tensor.from_numpy(bias, self.weight.device)  # uploaded once

    def __call__(self, x, *, algorithm=None):
        return bitlinear(x, self.weight, self._bias_tensor, algorithm=algorithm)

    def backward_input(self, grad_y):
        return bitlinear_backward_input(grad_y, self.weight)

    def __repr__(self):
        return (
            f"BitLinear(in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, nbytes={self.nbytes})"
        )
