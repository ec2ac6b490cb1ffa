"""BitLinear: the ternary x int8 linear layer of BitNet b1.58, and the integer matmuls under it.

NumPy in, NumPy out; Tensor in, Tensor out. docs/NUMERICS.md gives the formulas.
"""

from __future__ import annotations

import numpy as np

from . import _core
from ._core import DTypeError, Tensor
from ._args import FLOAT_DTYPES, FLOATS, float32_numpy, float32_param, result_as, Outputs, to_tensor
from .quantize import TernaryWeights, quantize_weights
from ._types import ArrayIn, Out, Result
from . import _recorded_calls as recorded_calls

__all__ = ["bitlinear", "bitlinear_backward_input", "mixed_precision_matmul"]


def _weights(w, device):
    if isinstance(w, TernaryWeights):
        return w
    if isinstance(w, Tensor) or isinstance(w, np.ndarray):
        return quantize_weights(w, device=device)
    raise DTypeError(f"w: expected TernaryWeights or a float matrix, got {type(w).__name__}")


def _recorded(x, w, bias, return_accumulator, algorithm, hardware_dot):
    """bitlinear's results from a recorded call (recorded_calls), or None to run it eagerly."""
    if type(x) is not np.ndarray or x.dtype not in FLOAT_DTYPES or x.ndim == 0:
        return None
    if not (algorithm is None or type(algorithm) is str) or hardware_dot not in (None, True, False):
        return None  # the eager call names what is wrong
    if x.shape[-1] != w.shape[1]:  # the eager call names the mismatch
        return None
    if bias is not None:
        bias = float32_numpy(bias)
        if bias is None:
            return None
    shape = x.shape[:-1] + (w.shape[0],)
    specs = [(shape, np.float32)] + ([(shape, np.int32)] if return_accumulator else [])
    handle = w.handle

    def record(inputs, outputs):
        _core.bitlinear(
            inputs[0],
            handle,
            inputs[1] if len(inputs) > 1 else None,
            bool(return_accumulator),
            algorithm or "auto",
            hardware_dot,
            outputs[0],
            outputs[1] if return_accumulator else None,
        )

    key = ("bitlinear", bool(return_accumulator), algorithm, hardware_dot)
    arrays = [x] if bias is None else [x, bias]
    return recorded_calls.call(key, arrays, specs, record, owner=w)


def bitlinear(
    x: ArrayIn,
    w: TernaryWeights | ArrayIn,
    bias: ArrayIn | None = None,
    *,
    return_accumulator: bool = False,
    algorithm: str | None = None,
    out: Out | None = None,
    _hardware_dot: bool | None = None,
) -> Result:
    """y = (x_q . W_q^T) * gamma / s (+ bias), x float32/float16 [..., K] -> float32 [..., N].

    The per-token int8 quantization of x runs on the GPU in the same submission; accumulation is
    exact in int32. w: TernaryWeights [N, K] (or a float matrix, quantized on the fly), with one
    scale or one per group along K: then y = sum_g gamma[:, g] * acc_g / s, on a kernel of its own
    (a subgroup per output row; algorithm must stay None).
    algorithm: None (automatic: 'matvec' for up to 8 rows; above, 'coopmat' where the device has
    int8 tensor cores through VK_NV_cooperative_matrix (device.info.features
    ['cooperative_matrix_int8']), else 'coopmat_khr' where it has them through
    VK_KHR_cooperative_matrix ('cooperative_matrix_khr_int8'), else 'tiled'), or one of 'matvec',
    'tiled', 'coopmat', 'coopmat_khr', 'coopmat2' (UnsupportedError where not available).
    'coopmat2' runs on VK_NV_cooperative_matrix2 ('cooperative_matrix2_int8'), 2.3 to 3.5 times
    slower than 'coopmat' on the H100.
    return_accumulator=True also returns the int32 accumulators.
    out: the target for y (a NumPy array or a Tensor), or (y, accumulators) with
    return_accumulator=True; filled and returned.
    """
    if out is None and isinstance(w, TernaryWeights):
        recorded = _recorded(x, w, bias, return_accumulator, algorithm, _hardware_dot)
        if recorded is not None:
            return tuple(recorded) if return_accumulator else recorded[0]
    tx, as_tensor = to_tensor(x, "x", None, FLOATS)
    weights = _weights(w, tx.device)
    tb = None if bias is None else float32_param(bias, tx.device, "bias")
    shape = tuple(tx.shape[:-1]) + (weights.shape[0],)
    specs = [("y", shape, np.float32)] + (
        [("accumulators", shape, np.int32)] if return_accumulator else []
    )
    fits = tx.ndim >= 1 and weights.shape[1] == tx.shape[-1]  # else the core names the mismatch
    outputs = Outputs(out, specs, None if as_tensor or not fits else tx.device)
    targets = [outputs.tensor(i) for i in range(len(specs))] + [None]
    r = _core.bitlinear(
        tx,
        weights.handle,
        tb,
        bool(return_accumulator),
        algorithm or "auto",
        _hardware_dot,
        targets[0],
        targets[1],
    )
    results = outputs.results([r.y, r.accumulators] if return_accumulator else [r.y], as_tensor)
    return tuple(results) if return_accumulator else results[0]


def bitlinear_backward_input(grad_y: ArrayIn, w: TernaryWeights | ArrayIn) -> Result:
    """grad_x = grad_y @ (W_q * gamma), the straight-through estimator: float32 [..., N] ->
    [..., K]."""
    tg, as_tensor = to_tensor(grad_y, "grad_y", None, [np.float32])
    return result_as(_core.bitlinear_backward_input(tg, _weights(w, tg.device).handle), as_tensor)


def mixed_precision_matmul(
    a: ArrayIn,
    b: TernaryWeights | ArrayIn,
    *,
    algorithm: str | None = None,
    _hardware_dot: bool | None = None,
) -> Result:
    """Exact int32 products: int8 [M, K] @ int8 [K, N], or int8 [M, K] @ W_q^T for TernaryWeights
    b of shape [N, K]. algorithm: None (tensor cores where available), 'tiled', 'coopmat',
    'coopmat_khr' or 'coopmat2'."""
    ta, as_tensor = to_tensor(a, "a", None, [np.int8])
    if isinstance(b, TernaryWeights):
        return result_as(
            _core.ternary_matmul(ta, b.handle, algorithm or "auto", _hardware_dot), as_tensor
        )
    tb, _ = to_tensor(b, "b", ta.device, [np.int8])
    return result_as(_core.int8_matmul(ta, tb, algorithm or "auto", _hardware_dot), as_tensor)
