"""NumPy references of the draws (shaders/sampling/, docs/NUMERICS.md's sampling section) and of
the counter-based random numbers they and stochastic rounding share; bitnet_gpu.reference
re-exports its public names."""

from __future__ import annotations

import numpy as np


@np.errstate(over="ignore")  # uint32 arithmetic wraps, as in the shader
def _pcg_hash(v) -> np.ndarray:
    v = np.asarray(v, np.uint32)
    state = (v * np.uint32(747796405) + np.uint32(2891336453)).astype(np.uint32)
    word = (
        ((state >> ((state >> np.uint32(28)) + np.uint32(4))) ^ state) * np.uint32(277803737)
    ).astype(np.uint32)
    return ((word >> np.uint32(22)) ^ word).astype(np.uint32)


def uniform01(seed: int, count: int) -> np.ndarray:
    """The counter-based uniform numbers in [0, 1) of stochastic rounding: element i's number
    depends on (seed, i) alone."""
    lo, hi = np.uint32(seed & 0xFFFFFFFF), np.uint32(seed >> 32)
    key = _pcg_hash(lo ^ _pcg_hash(hi))
    h = _pcg_hash(np.arange(count, dtype=np.uint32) ^ key)
    return ((h >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)).astype(
        np.float32
    )


def sampling_scores(logits_row, temperature, seed, step, row):
    """float64 [N]: the scores shaders/sampling/sample_rows.comp draws the largest of for row `row`
    of a sample_rows call: x + t g where t < 1, else x (1 / t) + g, with t and 1 / t rounded to
    float32, g = -log(-log1p(-u)), u = (h + 0.5) / 2^32, h = pcg(pcg(j) ^ key),
    key = pcg(row ^ pcg(step ^ pcg(seed_lo ^ pcg(seed_hi)))) (uint32, wrapping). The GPU rounds
    to float32, so ids may differ where two kept scores lie within its rounding of each other."""
    x = np.asarray(logits_row, np.float32)
    lo, hi = np.uint32(seed & 0xFFFFFFFF), np.uint32(seed >> 32)
    base = _pcg_hash(np.uint32(step & 0xFFFFFFFF) ^ _pcg_hash(lo ^ _pcg_hash(hi)))
    key = _pcg_hash(np.uint32(row & 0xFFFFFFFF) ^ base)
    h = _pcg_hash(_pcg_hash(np.arange(x.size, dtype=np.uint32)) ^ key).astype(np.float64)
    g = -np.log(-np.log1p(-(h + 0.5) / 2.0**32))
    t = np.float32(temperature)
    with np.errstate(invalid="ignore"):  # inf + t g stays inf
        if t >= 1:
            return x.astype(np.float64) * float(np.float32(1.0 / float(t))) + g
        return x.astype(np.float64) + float(t) * g


def top_p_share(top_p):
    """top-p's P = round(p 2^32) (0: none, for None and 1), as bitnet_gpu.sample_logits passes
    it."""
    if top_p is None or top_p == 1:
        return 0
    return max(1, min(int(round(float(top_p) * 2.0**32)), 2**32 - 1))


def _top_k_kept(x, top_k):
    numbers = ~np.isnan(x)
    if top_k is None or top_k >= numbers.sum():
        return numbers
    return numbers & (x >= np.partition(x[numbers], -top_k)[-top_k])


def nucleus_weights(values, largest, temperature):
    """int64: shaders/sampling/sample_nucleus.comp's weights W = roundEven(exp(d) 2^31), d = (x - m)
    (1 / t) for t >= 1, (x - m) / t below (x - m, 1 / t and the product in float32), of float32
    values against the largest kept value m; the exponential in float64 (the GPU's is float32)."""
    t = np.float32(temperature)
    d = (np.asarray(values, np.float32) - np.float32(largest)).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        e = (
            (d * np.float32(1.0 / float(t))).astype(np.float32)
            if t >= 1
            else (d / t).astype(np.float32)
        )
        return np.rint(np.exp(e.astype(np.float64)) * 2.0**31).astype(np.int64)


def nucleus_threshold(logits_row, top_k, top_p, temperature):
    """(tau, margin): the smallest value top-p keeps among the top_k values of a float32 row
    (None where top-p keeps every one of them: no top_p, temperature 0, or an infinite largest
    value) and how close the rule came to keeping one value more or one fewer, relative to P Z
    (inf where nothing lies on the other side). A value v is kept where A(v) 2^32 < P Z, A(v) the
    weights (nucleus_weights) of the kept values above v and Z all of them; exact integers."""
    x = np.asarray(logits_row, np.float32)
    return _nucleus(x, _top_k_kept(x, top_k), top_p, temperature)


def _nucleus(x, kept, top_p, temperature):
    """nucleus_threshold of float32 row x whose top_k values are the mask `kept`."""
    share = top_p_share(top_p)
    if share == 0 or np.float32(temperature) == 0 or not kept.any():
        return None, np.inf
    values = x[kept]
    largest = values.max()
    if not np.isfinite(largest):
        return None, np.inf
    distinct, inverse = np.unique(values, return_inverse=True)  # ascending; -0 and +0 one value
    distinct, mass = (
        distinct[::-1],
        np.bincount(inverse, nucleus_weights(values, largest, temperature), distinct.size)[
            ::-1
        ].astype(np.int64),
    )
    above = np.concatenate([[0], np.cumsum(mass)[:-1]])  # A(v) for each distinct value, descending
    total = int(mass.sum())
    bound = -(-(share * total) // 2**32)  # A 2^32 < P Z  <=>  A < ceil(P Z / 2^32)
    inside = above < bound
    last = int(np.flatnonzero(inside)[-1])
    pz = float(share) * float(total)
    margin = (pz - float(above[last]) * 2.0**32) / pz
    if last + 1 < distinct.size:
        margin = min(margin, (float(above[last + 1]) * 2.0**32 - pz) / pz)
    return distinct[last], margin


def sampling_kept(logits_row, top_k, top_p=None, temperature=1.0):
    """bool [N]: the values a draw takes from, those at least the row's top_k-th largest (every
    one where top_k is None or at least the row's count of numbers) and, with top_p, at least its
    nucleus_threshold; NaN never."""
    x = np.asarray(logits_row, np.float32)
    kept = _top_k_kept(x, top_k)
    tau, _ = _nucleus(x, kept, top_p, temperature)
    return kept if tau is None else kept & (x >= tau)


def sample_rows(logits, temperature, top_k=None, seed=0, step=0, top_p=None, first_row=0):
    """int32 [...]: bitnet_gpu.sample_logits's draw from each row of logits [..., N]: the first
    kept index with the largest sampling_scores (row m keyed as row first_row + m); -1 for a row
    holding a NaN."""
    x = np.asarray(logits, np.float32)
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty(rows.shape[0], np.int32)
    for m, row in enumerate(rows):
        if np.isnan(row).any():
            out[m] = -1
            continue
        kept = np.flatnonzero(sampling_kept(row, top_k, top_p, temperature))
        scores = sampling_scores(row, temperature, seed, step, first_row + m)
        out[m] = kept[np.argmax(scores[kept])]
    return out.reshape(x.shape[:-1])


# How close (relative to P Z) top-p's rule may come to a value before a device, whose weights
# differ from nucleus_weights' by its float32 exponential, may keep or drop that value.
NUCLEUS_MARGIN = 1e-5


def sampling_differences(
    logits, drawn, temperature, top_k=None, seed=0, step=0, top_p=None, first_row=0
):
    """The rows where `drawn` (indices [...] a device drew from logits [..., N] with these
    arguments) is not sample_rows's index: (row, drawn index, the reference's index, whether the
    drawn index is a kept one, the reference's best score, how far below it the drawn index's score
    lies; float64, inf where the drawn index is out of range). Where top-p's rule lies within
    NUCLEUS_MARGIN of keeping one value more or one fewer, the kept set closest to the drawn index
    of those is the reference's. Docs/NUMERICS.md says which of those a device may show: near
    ties, within float32 rounding."""
    rows = np.asarray(logits, np.float32).reshape(-1, np.shape(logits)[-1])
    drawn = np.asarray(drawn).reshape(-1)
    expected = sample_rows(rows, temperature, top_k, seed, step, top_p, first_row)
    differences = []
    for m in np.flatnonzero(drawn != expected):
        got = int(drawn[m])
        scores = sampling_scores(rows[m], temperature, seed, step, first_row + m)
        inside = 0 <= got < rows.shape[1]
        top = _top_k_kept(rows[m], top_k)
        tau, margin = _nucleus(rows[m], top, top_p, temperature)
        kept_sets = [top if tau is None else top & (rows[m] >= tau)]  # sampling_kept's
        if tau is not None and margin < NUCLEUS_MARGIN:
            below = rows[m][top & (rows[m] < tau)]
            kept_sets.append(top & (rows[m] > tau))  # one value fewer (tau's ties)
            if below.size:
                kept_sets.append(top & (rows[m] >= below.max()))  # one more
        options = []
        for kept_mask in kept_sets:
            if not kept_mask.any():
                continue
            kept = np.flatnonzero(kept_mask)
            want = int(kept[np.argmax(scores[kept])])
            is_kept = inside and bool(kept_mask[got])
            gap = float(scores[want] - scores[got]) if inside else np.inf
            options.append((not is_kept, gap, want, is_kept))
        _, gap, want, is_kept = min(options)
        if got == want:
            continue
        differences.append((int(m), got, want, is_kept, float(scores[want]), gap))
    return differences
