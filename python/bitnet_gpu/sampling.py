"""Drawing token indices from logits on the GPU: temperature, top-k and top-p (nucleus) sampling."""

from __future__ import annotations

import numpy as np

from . import _core
from ._args import integer, Outputs, seed_value, to_tensor
from ._core import Tensor
from ._types import ArrayIn, Out, Result

__all__ = ["sample_logits"]


# The draw of softmax(x / t) takes the largest x + t g (t < 1) or x / t + g (t >= 1), with 1 / t
# rounded to float32, which stays a normal number up to here.
_MOST_TEMPERATURE = 1e37


def _top_p_share(top_p):
    """P = round(p 2^32) for top-p's p in (0, 1] (0: none, as p = 1 and None are), at least 1."""
    if top_p is None:
        return 0
    if isinstance(top_p, (bool, np.bool_)) or not isinstance(
        top_p, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"top_p: expected None or a number, got {top_p!r}")
    if not 0 < top_p <= 1:
        raise _core.ArgumentError(f"top_p: expected None or a number in (0, 1], got {top_p}")
    return 0 if top_p == 1 else max(1, min(int(round(float(top_p) * 2.0**32)), 2**32 - 1))


def sampling_params(temperature, top_k, seed, n, top_p=None):
    """uint32 [6] for _core.sample_rows: the float32 bits of the temperature and of its inverse,
    top_k (0: every value), the seed's two words and top-p's P = round(p 2^32) (0: none), after
    checking them (rows of n values)."""
    if isinstance(temperature, (bool, np.bool_)) or not isinstance(
        temperature, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"temperature: expected a number, got {temperature!r}")
    if not (0 <= temperature <= _MOST_TEMPERATURE):
        raise _core.ArgumentError(
            f"temperature: expected a number in [0, {_MOST_TEMPERATURE:g}], got {temperature}"
        )
    k = 0
    if top_k is not None:
        k = integer(top_k, "top_k")
        if k < 1:
            raise _core.ArgumentError(f"top_k: expected None or an integer of at least 1, got {k}")
        k = 0 if k >= n else k
    share = _top_p_share(top_p)
    seed = seed_value(seed)
    t = np.float32(temperature)
    inverse = np.float32(1.0 / float(t)) if t >= 1 else np.float32(0)
    return np.array(
        [t.view(np.uint32), inverse.view(np.uint32), k, seed & 0xFFFFFFFF, seed >> 32, share],
        np.uint32,
    )


def sampling_rows(params, key_rows) -> np.ndarray:
    """uint32 [B, 8]: each row's own sampling parameters (sampling_params' [6] each) and, at 6, the
    row its draws are keyed by (its index in a batch, or 0 for a sequence drawn as alone): what
    _core.sample_rows takes for rows of different settings."""
    rows = np.zeros((len(params), 8), np.uint32)
    for b, (row, key) in enumerate(zip(params, key_rows)):
        rows[b, :6] = np.asarray(row, np.uint32)
        rows[b, 6] = key
    return rows


def sample_logits(
    logits: ArrayIn,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    *,
    seed: int = 0,
    step: int = 0,
    out: Out | None = None,
) -> Result:
    """One index a row of float32 logits [..., N], drawn from softmax(logits / temperature) over
    the row's top_k largest values (every value at least the top_k-th largest, so ties are kept;
    all of them where top_k is None) and, with top_p in (0, 1), of those the smallest set of the
    largest whose share of that softmax reaches top_p (nucleus sampling, after top_k as
    transformers applies them; the values equal to its smallest kept too; the share is summed in
    fixed point, docs/NUMERICS.md): int32 [...] (NumPy in, NumPy out; Tensor in, Tensor out).

    The Gumbel-max trick on the GPU: the index with the largest logits + temperature * g, g
    Gumbel noise from a counter-based hash of (seed, step, row, index), so a row's draw depends on
    those and its own values alone: the same call draws the same indices; pass a new step (or
    seed) for each new draw. temperature 0 gives np.argmax's index among the kept values; -inf
    logits are never drawn unless every kept value is -inf, +inf ones win (the first of them).
    NaN logits raise ArgumentError. reference.sample_rows computes the same draws with NumPy."""
    t, as_tensor = to_tensor(logits, "logits", None, (np.float32,))
    shape = tuple(t.shape)
    if len(shape) == 0:
        raise _core.ShapeError("logits: expected [..., N], got a scalar")
    n = shape[-1]
    params = sampling_params(temperature, top_k, seed, n, top_p)
    step = integer(step, "step")
    if not 0 <= step < 2**32:
        raise _core.ArgumentError(f"step: expected an integer in [0, 2**32), got {step}")
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    outputs = Outputs(out, [("indices", shape[:-1], np.dtype(np.int32))])
    target = outputs.tensor(0)
    if target is not None and tuple(target.shape) != shape[:-1]:
        raise _core.ShapeError(
            f"out (indices): expected shape {shape[:-1]}, got {tuple(target.shape)}"
        )
    flat_target = None if target is None else target.reshape(rows)
    device = t.device
    drawn = _core.sample_rows(
        t.reshape(rows, n),
        Tensor.from_numpy(params, device),
        Tensor.from_numpy(np.zeros(1, np.int32), device),
        step,
        flat_target,
        bool(params[5]),
        bool(params[2]),
    )
    return outputs.results(
        [target if target is not None else drawn.reshape(*shape[:-1])], as_tensor
    )[0]


def processed_scores(logits, temperature, top_k=None, top_p=None) -> np.ndarray:
    """float32 [..., N]: logits as a draw with these settings sees them (transformers' processed
    scores): divided by the temperature over the values it keeps, -inf elsewhere; the logits
    themselves at temperature 0. Kept are the values at least the top_k-th largest and, with top_p,
    those at least the smallest value the nucleus rule of docs/NUMERICS.md keeps (the integer
    weights roundEven(exp(d) 2^31) of the values' distance d from the largest, in float64 here)."""
    x = np.asarray(logits, np.float32)
    if float(temperature) == 0:
        return x.copy()
    t = np.float32(temperature)
    share = _top_p_share(top_p)
    out = np.full(x.shape, -np.inf, np.float32)
    flat_in, flat_out = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
    for row, target in zip(flat_in, flat_out):
        kept = ~np.isnan(row)
        if top_k is not None and top_k < kept.sum():
            kept &= row >= np.sort(row[kept])[-top_k]
        if share and kept.any() and np.isfinite(row[kept].max()):
            values = row[kept]
            distance = (values - values.max()).astype(np.float32)
            with np.errstate(invalid="ignore", over="ignore"):
                exponent = distance * np.float32(1.0 / float(t)) if t >= 1 else distance / t
                weights = np.rint(np.exp(exponent.astype(np.float32).astype(np.float64)) * 2.0**31)
            order = np.argsort(-values, kind="stable")
            ranked, ranked_weights = values[order], weights[order].astype(np.int64)
            # The weight strictly above each value (equal values share their group's start).
            first_of_value = np.concatenate([[True], ranked[1:] != ranked[:-1]])
            above = np.concatenate([[0], np.cumsum(ranked_weights)[:-1]])
            above = np.maximum.accumulate(np.where(first_of_value, above, 0))
            bound = -(-(share * int(ranked_weights.sum())) // 2**32)
            kept &= row >= ranked[above < bound].min()
        target[kept] = row[kept] / t
    return out
