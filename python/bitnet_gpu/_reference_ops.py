"""NumPy references of the activations, their derivatives, softmax and the norms, with their
backward passes (docs/NUMERICS.md), in float64; bitnet_gpu.reference re-exports its public names."""

from __future__ import annotations

import numpy as np

from ._reference_sampling import uniform01


def _erf(x: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf, otypes=[np.float64])(x)


def activation(name: str, x: np.ndarray, alpha: float = 0.01) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) of large negative x is inf: sigmoid 0, as meant
        return _activation(name, np.asarray(x, np.float64), alpha)


def _activation(name, x, alpha):
    if name == "relu":
        return np.maximum(x, 0)
    if name == "leaky_relu":
        return np.where(x > 0, x, alpha * x)
    if name == "relu2":
        return np.maximum(x, 0) ** 2
    if name == "gelu":
        return 0.5 * x * (1 + _erf(x / np.sqrt(2)))
    if name == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    if name == "silu":
        return x / (1 + np.exp(-x))
    if name == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if name == "tanh":
        return np.tanh(x)
    raise ValueError(name)


def activation_derivative(name: str, x: np.ndarray, alpha: float = 0.01) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return _activation_derivative(name, np.asarray(x, np.float64), alpha)


def _activation_derivative(name, x, alpha):
    if name == "relu":
        return (x > 0).astype(np.float64)
    if name == "leaky_relu":
        return np.where(x > 0, 1.0, alpha)
    if name == "relu2":
        return 2 * np.maximum(x, 0)
    if name == "gelu":
        return 0.5 * (1 + _erf(x / np.sqrt(2))) + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)
    if name == "gelu_tanh":
        c = np.sqrt(2 / np.pi)
        th = np.tanh(c * (x + 0.044715 * x**3))
        return 0.5 * (1 + th) + 0.5 * x * (1 - th**2) * c * (1 + 3 * 0.044715 * x**2)
    if name == "silu":
        s = 1 / (1 + np.exp(-x))
        return s * (1 + x * (1 - s))
    if name == "sigmoid":
        s = 1 / (1 + np.exp(-x))
        return s * (1 - s)
    if name == "tanh":
        return 1 - np.tanh(x) ** 2
    raise ValueError(name)


def relu_dropout(x: np.ndarray, p: float, seed: int) -> np.ndarray:
    """relu(x) * keep / (1 - p), keep = uniform01(seed, flat index) >= p."""
    x = np.asarray(x, np.float64)
    keep = (uniform01(seed, x.size) >= np.float32(p)).reshape(x.shape)
    return np.where(keep, np.maximum(x, 0) / (1 - p) if p < 1 else 0.0, 0.0)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * np.asarray(weight, np.float64)


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    x = np.asarray(x, np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * np.asarray(gamma, np.float64) + np.asarray(
        beta, np.float64
    )


def softmax_backward(grad_y: np.ndarray, x: np.ndarray, axis: int = -1) -> np.ndarray:
    """grad_x of softmax(x) along `axis`: s (grad_y - sum(grad_y s)), s = softmax(x)."""
    s = softmax(x, axis)
    g = np.asarray(grad_y, np.float64)
    return s * (g - (g * s).sum(axis=axis, keepdims=True))


def rms_norm_backward(grad_y: np.ndarray, x: np.ndarray, weight: np.ndarray, eps: float = 1e-6):
    """(grad_x, grad_weight) of rms_norm over the last axis, the exact derivative: with
    r = 1 / sqrt(mean(x^2) + eps), xhat = x r and gw = grad_y weight,
    grad_x = r (gw - xhat mean(gw xhat)) and grad_weight = sum over rows of grad_y xhat."""
    x, g = np.asarray(x, np.float64), np.asarray(grad_y, np.float64)
    r = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    xhat, gw = x * r, g * np.asarray(weight, np.float64)
    grad_x = r * (gw - xhat * (gw * xhat).mean(axis=-1, keepdims=True))
    return grad_x, (g * xhat).reshape(-1, x.shape[-1]).sum(axis=0)


def layer_norm_backward(grad_y: np.ndarray, x: np.ndarray, gamma: np.ndarray, eps: float = 1e-5):
    """(grad_x, grad_gamma, grad_beta) of layer_norm over the last axis, the exact derivative: with
    r = 1 / sqrt(var + eps), xhat = (x - mean) r and gw = grad_y gamma,
    grad_x = r (gw - mean(gw) - xhat mean(gw xhat))."""
    x, g = np.asarray(x, np.float64), np.asarray(grad_y, np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat, gw = (x - mean) * r, g * np.asarray(gamma, np.float64)
    grad_x = r * (
        gw - gw.mean(axis=-1, keepdims=True) - xhat * (gw * xhat).mean(axis=-1, keepdims=True)
    )
    rows = lambda v: v.reshape(-1, x.shape[-1]).sum(axis=0)  # noqa: E731
    return grad_x, rows(g * xhat), rows(g)
