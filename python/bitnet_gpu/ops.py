"""The element-wise, row and sampling ops in one namespace (bitnet_gpu.ops), as they are at the top
level: activations.py, norms.py, arithmetic.py and sampling.py hold them by family."""

from __future__ import annotations

from .activations import (
    gelu,
    gelu_backward,
    leaky_relu,
    leaky_relu_backward,
    relu,
    relu2,
    relu2_backward,
    relu2_mul,
    relu_backward,
    relu_dropout,
    sigmoid,
    sigmoid_backward,
    silu,
    silu_backward,
    silu_mul,
    swish,
    swish_backward,
    tanh,
    tanh_backward,
)
from .arithmetic import add, div, mul, sub
from .norms import layer_norm, rms_norm, softmax, softmax_backward
from .sampling import sample_logits

__all__ = [
    "add",
    "div",
    "gelu",
    "gelu_backward",
    "layer_norm",
    "leaky_relu",
    "leaky_relu_backward",
    "mul",
    "relu",
    "relu2",
    "relu2_backward",
    "relu2_mul",
    "relu_backward",
    "relu_dropout",
    "rms_norm",
    "sample_logits",
    "sigmoid",
    "sigmoid_backward",
    "silu",
    "silu_backward",
    "silu_mul",
    "softmax",
    "softmax_backward",
    "sub",
    "swish",
    "swish_backward",
    "tanh",
    "tanh_backward",
]
