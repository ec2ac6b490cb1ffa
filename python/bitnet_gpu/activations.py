"""Activations and their backward passes, fused gates and dropout on the GPU.

NumPy in, NumPy out; Tensor in, Tensor out; float32 or float16 (the output keeps the input's
dtype; arithmetic is float32). `out=` takes a NumPy array or a Tensor. Formulas:
docs/NUMERICS.md."""

from __future__ import annotations

from typing import Protocol

from . import _core
from ._args import call_unary, seed_value
from ._types import ArrayIn, Out, Result

__all__ = [
    "gelu",
    "gelu_backward",
    "leaky_relu",
    "leaky_relu_backward",
    "relu",
    "relu2",
    "relu2_backward",
    "relu2_mul",
    "relu_backward",
    "relu_dropout",
    "sigmoid",
    "sigmoid_backward",
    "silu",
    "silu_backward",
    "silu_mul",
    "swish",
    "swish_backward",
    "tanh",
    "tanh_backward",
]


_A = _core.Activation


class _Forward(Protocol):
    def __call__(self, x: ArrayIn, *, out: Out | None = None) -> Result: ...


class _Backward(Protocol):
    def __call__(self, grad_y: ArrayIn, x: ArrayIn, *, out: Out | None = None) -> Result: ...


def _activation(op: _core.Activation, alpha: float = 0.0) -> tuple[_Forward, _Backward]:
    # The recorded calls' keys, made once: an enum hashes slower than its number.
    forward_key, backward_key = (
        ("activation", int(op), alpha),
        ("activation_backward", int(op), alpha),
    )

    def forward(x: ArrayIn, *, out: Out | None = None) -> Result:
        return call_unary(
            lambda t, o: _core.activation(t, op, alpha, o),
            x,
            "x",
            out,
            key=forward_key,
        )

    def backward(grad_y: ArrayIn, x: ArrayIn, *, out: Out | None = None) -> Result:
        return call_unary(
            lambda g, t, o: _core.activation_backward(g, t, op, alpha, o),
            grad_y,
            "grad_y",
            out,
            (x, "x"),
            key=backward_key,
        )

    return forward, backward


relu, relu_backward = _activation(_A.relu)
relu2, relu2_backward = _activation(_A.relu2)
silu, silu_backward = _activation(_A.silu)
swish, swish_backward = silu, silu_backward
sigmoid, sigmoid_backward = _activation(_A.sigmoid)
tanh, tanh_backward = _activation(_A.tanh)
for _f, _doc in [
    (relu, "max(x, 0)"),
    (relu2, "relu(x)^2 (squared ReLU)"),
    (silu, "x * sigmoid(x) (= swish)"),
    (sigmoid, "1 / (1 + exp(-x))"),
    (tanh, "tanh(x)"),
]:
    _f.__doc__ = f"y = {_doc}, element-wise."


def leaky_relu(x: ArrayIn, alpha: float = 0.01, *, out: Out | None = None) -> Result:
    """y = x if x > 0 else alpha * x."""
    return _activation(_A.leaky_relu, float(alpha))[0](x, out=out)


def leaky_relu_backward(
    grad_y: ArrayIn, x: ArrayIn, alpha: float = 0.01, *, out: Out | None = None
) -> Result:
    return _activation(_A.leaky_relu, float(alpha))[1](grad_y, x, out=out)


def _gelu_op(approximate):
    if approximate not in ("none", "tanh"):
        raise _core.ArgumentError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    return _A.gelu if approximate == "none" else _A.gelu_tanh


def gelu(x: ArrayIn, approximate: str = "none", *, out: Out | None = None) -> Result:
    """0.5 x (1 + erf(x / sqrt 2)), or the tanh approximation."""
    return _activation(_gelu_op(approximate))[0](x, out=out)


def gelu_backward(
    grad_y: ArrayIn, x: ArrayIn, approximate: str = "none", *, out: Out | None = None
) -> Result:
    return _activation(_gelu_op(approximate))[1](grad_y, x, out=out)


def _gated(op: _core.Activation, gate: ArrayIn, up: ArrayIn, out: Out | None) -> Result:
    return call_unary(
        lambda g, u, o: _core.gated_activation(g, u, op, o),
        gate,
        "gate",
        out,
        (up, "up"),
        key=("gated_activation", int(op)),
    )


def silu_mul(gate: ArrayIn, up: ArrayIn, *, out: Out | None = None) -> Result:
    """SwiGLU: silu(gate) * up (gate and up of one shape and dtype)."""
    return _gated(_A.silu, gate, up, out)


def relu2_mul(gate: ArrayIn, up: ArrayIn, *, out: Out | None = None) -> Result:
    """relu(gate)^2 * up: BitNet b1.58 2B4T's gated FFN."""
    return _gated(_A.relu2, gate, up, out)


def relu_dropout(x: ArrayIn, p: float, seed: int = 0, *, out: Out | None = None) -> Result:
    """relu(x) with each value kept with probability 1 - p and scaled by 1 / (1 - p). The mask
    comes from a counter-based hash of (seed, element index): the same on every device."""
    seed = seed_value(seed)
    p = float(p)
    return call_unary(
        lambda t, o: _core.relu_dropout(t, p, seed, o), x, "x", out, key=("relu_dropout", p, seed)
    )
