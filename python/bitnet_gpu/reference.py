"""NumPy references for every bitnet_gpu kernel, written from the formulas in docs/NUMERICS.md.

These are the ground truth of the parity tests: plain, float64 where it matters, no shortcuts.
"""

from __future__ import annotations

import numpy as np

from ._reference_ops import (  # noqa: F401 (re-exported)
    activation,
    activation_derivative,
    layer_norm,
    layer_norm_backward,
    relu_dropout,
    rms_norm,
    rms_norm_backward,
    softmax,
    softmax_backward,
)
from ._reference_sampling import (  # noqa: F401 (re-exported)
    NUCLEUS_MARGIN,
    nucleus_threshold,
    nucleus_weights,
    sample_rows,
    sampling_differences,
    sampling_kept,
    sampling_scores,
    top_p_share,
    uniform01,
)


def axpy(a: float, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """y + a * x in float32, as the built-in ``axpy`` test kernel computes it."""
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.float32)
    return (np.float32(a) * x + y).astype(np.float32)


def copy(x: np.ndarray) -> np.ndarray:
    """The built-in ``copy_vec4`` kernel: an exact copy."""
    return np.array(x, copy=True)


EPS = 1e-5


def _groups(w: np.ndarray, group_size):
    """w [N, K] as [N, K // g, g] (one group = the whole tensor when group_size is None)."""
    n, k = w.shape
    if group_size is None:
        return w.reshape(1, 1, n * k)
    return w.reshape(n, k // group_size, group_size)


def weight_scale(w: np.ndarray, group_size=None) -> np.ndarray:
    """gamma = max(mean(|W|), eps) in float64, per tensor ([1]) or per group ([N, K // g])."""
    g = _groups(np.asarray(w, np.float64), group_size)
    gamma = np.maximum(np.abs(g).mean(axis=-1), EPS)
    return gamma.reshape(-1) if group_size is None else gamma


def ternary_values(w: np.ndarray, gamma, group_size=None) -> np.ndarray:
    """W / gamma in float64, before rounding (for the parity tests' tie check)."""
    g = _groups(np.asarray(w, np.float64), group_size)
    gamma = np.asarray(gamma, np.float64).reshape(g.shape[0], g.shape[1], 1)
    return (g / gamma).reshape(np.shape(w))


def quantize_ternary(w: np.ndarray, group_size=None, gamma=None):
    """(W_q int8 in {-1, 0, 1}, gamma): W_q = clip(round(W / gamma), -1, 1)."""
    gamma = weight_scale(w, group_size) if gamma is None else np.asarray(gamma)
    q = np.clip(np.rint(ternary_values(w, gamma, group_size)), -1, 1).astype(np.int8)
    return q, gamma


def quantize_binary(w: np.ndarray, group_size=None, alpha=None):
    """(W_b int8 in {-1, +1}, alpha, beta): W_b = sign(W - alpha), sign(0) = +1."""
    g = _groups(np.asarray(w, np.float64), group_size)
    mean = (
        g.mean(axis=-1, keepdims=True)
        if alpha is None
        else np.asarray(alpha, np.float64).reshape(g.shape[0], g.shape[1], 1)
    )
    beta = np.maximum(np.abs(g).mean(axis=-1), EPS)
    b = np.where(g - mean >= 0, 1, -1).astype(np.int8).reshape(np.shape(w))
    shape = (-1,) if group_size is None else g.shape[:2]
    return b, mean.reshape(shape), beta.reshape(shape)


def dequantize(q: np.ndarray, scale, group_size=None) -> np.ndarray:
    """W_q * gamma (or W_b * beta) as float32."""
    g = _groups(q.astype(np.float64), group_size)
    scale = np.asarray(scale, np.float64).reshape(g.shape[0], g.shape[1], 1)
    return (g * scale).reshape(q.shape).astype(np.float32)


def pack_ternary(q: np.ndarray) -> np.ndarray:
    """Codes q + 1, 4 per byte (weight 4b+i in bits 2i..2i+1), rows padded with code 1 to a
    multiple of 16 weights."""
    n, k = q.shape
    padded = np.ones((n, -(-k // 16) * 16), np.uint8)
    padded[:, :k] = (q.astype(np.int16) + 1).astype(np.uint8)
    codes = padded.reshape(n, -1, 4)
    return (codes[..., 0] | codes[..., 1] << 2 | codes[..., 2] << 4 | codes[..., 3] << 6).astype(
        np.uint8
    )


def unpack_ternary(packed: np.ndarray, shape) -> np.ndarray:
    n, k = shape
    codes = (packed[..., None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
    return (codes.reshape(n, -1)[:, :k].astype(np.int8) - 1).astype(np.int8)


def pack_binary(b: np.ndarray) -> np.ndarray:
    """Bits (1 for +1), 8 per byte (weight 8b+i in bit i), rows padded with 0 bits to a multiple
    of 32 weights."""
    n, k = b.shape
    bits = np.zeros((n, -(-k // 32) * 32), np.uint8)
    bits[:, :k] = b > 0
    return np.packbits(bits.reshape(n, -1, 8), axis=-1, bitorder="little").reshape(n, -1)


def activation_scale(x: np.ndarray, bits=8) -> np.ndarray:
    """s = qmax / max(max|x|, eps) per row, float32 (as the kernel returns it)."""
    qmax = 2 ** (bits - 1) - 1
    absmax = np.abs(np.asarray(x, np.float32)).max(axis=-1)
    return (np.float32(qmax) / np.maximum(absmax, np.float32(EPS))).astype(np.float32)


def quantize_activations(x: np.ndarray, bits=8, scale=None):
    """(x_q int8, s): x_q = clip(round(x * s), -qmax - 1, qmax), x * s in float32 as the GPU
    computes it (a correctly rounded product)."""
    qmax = 2 ** (bits - 1) - 1
    x = np.asarray(x, np.float32)
    s = activation_scale(x, bits) if scale is None else np.asarray(scale, np.float32)
    q = np.clip(np.rint(x * s[..., None]), -qmax - 1, qmax).astype(np.int8)
    return q, s


def quantize_activations_asymmetric(x: np.ndarray, bits=8, scale=None, zero_point=None):
    """(x_q uint8, step, zero_point) with lo = min(min x, 0), hi = max(max x, 0),
    step = max(hi - lo, eps) / levels, zero_point = clip(round(-lo / step), 0, levels),
    x_q = clip(round(x / step) + zero_point, 0, levels), levels = 2^bits - 1."""
    levels = 2**bits - 1
    x64 = np.asarray(x, np.float64)
    lo = np.minimum(x64.min(axis=-1), 0)
    hi = np.maximum(x64.max(axis=-1), 0)
    step = np.maximum(hi - lo, EPS) / levels if scale is None else np.asarray(scale, np.float64)
    zp = (
        np.clip(np.rint(-lo / step), 0, levels)
        if zero_point is None
        else np.asarray(zero_point, np.float64)
    )
    q = np.clip(np.rint(x64 / step[..., None]) + zp[..., None], 0, levels).astype(np.uint8)
    return q, step.astype(np.float32), zp.astype(np.uint8)


def dequantize_activations(q, scale, zero_point=None) -> np.ndarray:
    scale = np.asarray(scale, np.float32)[..., None]
    if zero_point is None:
        return (q.astype(np.float32) / scale).astype(np.float32)
    return ((q.astype(np.float32) - np.asarray(zero_point, np.float32)[..., None]) * scale).astype(
        np.float32
    )


def quantize_gradients(g: np.ndarray, bits=8, stochastic=False, seed=0, scale=None):
    """(q int8, s) per tensor: s = qmax / max(max|g|, eps); q = clip(round(g * s)) or, stochastic,
    clip(floor(g * s + u)) with u = uniform01(seed)."""
    qmax = 2 ** (bits - 1) - 1
    g = np.asarray(g, np.float32)
    if scale is None:
        scale = np.float32(qmax) / np.maximum(np.abs(g).max(), np.float32(EPS))
    s = np.float32(scale)
    product = (g * s).astype(np.float32)
    if stochastic:
        value = np.floor((product.reshape(-1) + uniform01(seed, g.size)).astype(np.float32))
        value = value.reshape(g.shape)
    else:
        value = np.rint(product)
    return np.clip(value, -qmax - 1, qmax).astype(np.int8), s


def exact_int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for integer matrices, exactly, as int64: through float64 BLAS where every partial sum
    is an integer below 2**53 (so exact in any order), else in int64."""
    a, b = np.asarray(a), np.asarray(b)
    bound = float(np.abs(a).max(initial=0)) * float(np.abs(b).max(initial=0)) * a.shape[-1]
    if bound < 2.0**53:
        return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.int64)
    return a.astype(np.int64) @ b.astype(np.int64)


def bitlinear(x: np.ndarray, q: np.ndarray, gamma, bias=None, scale=None):
    """(y float32, acc int32): x_q, s = quantize_activations(x); acc = x_q . W_q^T exactly;
    y = acc * gamma / s (+ bias), in float32 in the kernel's order. gamma of shape [N, K // g]
    (one scale per group of g weights along K): y = sum_g gamma[:, g] * acc_g / s, acc_g the exact
    sum over group g, in float64; acc is still the sum over all of K."""
    x = np.asarray(x, np.float32)
    k = x.shape[-1]
    xq, s = quantize_activations(
        x.reshape(-1, k), 8, None if scale is None else np.asarray(scale, np.float32).reshape(-1)
    )
    acc = exact_int_matmul(xq, q.T)
    gamma = np.asarray(gamma, np.float32)
    if gamma.ndim == 2:
        groups = gamma.shape[1]
        size = k // groups
        # [M, N, groups]: integers below 2**53 in float64 (|x_q| <= 128, |W_q| <= 1, K < 2**45)
        per_group = np.einsum(
            "mgj,ngj->mng",
            xq.reshape(-1, groups, size).astype(np.float64),
            np.asarray(q).reshape(-1, groups, size).astype(np.float64),
        )
        y = (per_group.astype(np.float64) * gamma.astype(np.float64)[None]).sum(-1) / s[
            :, None
        ].astype(np.float64)
    else:
        y = (acc.astype(np.float32) * np.float32(gamma)) / s[:, None]
    if bias is not None:
        y = y + np.asarray(bias, np.float32)
    shape = x.shape[:-1] + (q.shape[0],)
    return y.astype(np.float32).reshape(shape), acc.astype(np.int32).reshape(shape)


def bitlinear_backward_input(grad_y: np.ndarray, q: np.ndarray, gamma) -> np.ndarray:
    """grad_x = grad_y @ (W_q * gamma), in float64; gamma a scalar or [N, K // g] (one scale per
    group of g weights along K)."""
    gamma = np.asarray(gamma, np.float64)
    if gamma.ndim == 2:
        gamma = np.repeat(gamma, q.shape[1] // gamma.shape[1], axis=1)
    return (np.asarray(grad_y, np.float64) @ (q.astype(np.float64) * gamma)).astype(np.float32)


def rope(x: np.ndarray, positions, theta: float = 10000.0) -> np.ndarray:
    """Half-split rotary embedding of x [T, H, D], in float64."""
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    inv = float(theta) ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    angle = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    c, s = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal=True, kv_length=None
) -> np.ndarray:
    """softmax(q k^T / sqrt(D)) v with grouped-query heads, in float64: q [TQ, HQ, D],
    k and v [L, HKV, D]; causal: query i sees keys j <= L - TQ + i."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    length = k.shape[0] if kv_length is None else kv_length
    k, v = k[:length], v[:length]
    tq, hq, d = q.shape
    group = hq // k.shape[1]
    out = np.zeros_like(q)
    for h in range(hq):
        scores = q[:, h, :] @ k[:, h // group, :].T / np.sqrt(d)
        if causal:
            visible = np.arange(length)[None, :] <= (length - tq + np.arange(tq))[:, None]
            scores = np.where(visible, scores, -np.inf)
        out[:, h, :] = softmax(scores) @ v[:, h // group, :]
    return out


def rounding_tie_gap(v: np.ndarray) -> np.ndarray:
    """Per value: how far v lies from a rounding tie (k + .5), relative to max(|v|, 1). Below
    1e-6 NUMERICS.md lets a quantized value differ by one from the reference."""
    v = np.asarray(v, np.float64)
    return np.abs(v - np.floor(v) - 0.5) / np.maximum(np.abs(v), 1.0)


def tie_distance(x: np.ndarray) -> np.ndarray:
    """Per row of x [M, K]: the smallest rounding_tie_gap of x * s in int8 activation
    quantization."""
    x = np.asarray(x, np.float32)
    return rounding_tie_gap(
        x.astype(np.float64) * activation_scale(x).astype(np.float64).reshape(-1, 1)
    ).min(axis=-1)


# Int8 activation quantization rounds x * s to the nearest integer: where the GPU's float32 value
# of x * s and the reference's fall on two sides of a .5 tie, one int8 differs by one and the
# logits of that token, and of the later tokens that attend to it, move by up to about 1e-2
# relative. NUMERICS.md allows that within 1e-6 of a tie for one op; through a decoder's layers the
# float32 differences (norms, attention sums in another order) grow, and one flip was seen at
# 1.1e-6 on the H100, so a decoder's logits are compared with this window.
TIE_WINDOW = 1e-5


def logits_agreement(logits, expected, ties):
    """For one sequence's logits [T, vocab] against bitnet_forward's, with its ties [T]:
    (clean, error, whole): the tokens before the first within TIE_WINDOW of a tie, the relative
    error over them (0 where there are none), and over every token. The decoder matches where
    error <= 1e-4 and whole <= 5e-2 (what one int8 step can move)."""
    logits, expected = np.asarray(logits, np.float64), np.asarray(expected, np.float64)
    near = np.flatnonzero(np.asarray(ties) <= TIE_WINDOW)
    clean = int(near[0]) if near.size else len(expected)

    def relative(a, b):
        return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))

    error = relative(logits[:clean], expected[:clean]) if clean else 0.0
    return clean, error, relative(logits, expected)


def bitnet_forward(
    params: dict, config, token_ids: np.ndarray, return_ties=False, kv_dtype=np.float32
):
    """Logits [B, T, vocab] of the BitNet b1.58 decoder (bitnet_gpu.models) from an empty cache,
    in NumPy: params as BitNetModel.reference_params() gives them (ternary values and gammas,
    norm weights, the embedding and head as float32). return_ties=True also returns, per token
    [B, T], the smallest tie_distance of any activation quantized for it: near a tie an int8 may
    round the other way on the GPU, and the logits of that token and of the later tokens of its
    sequence (which attend to it) move with it. kv_dtype=np.float16: the keys (after RoPE) and
    values are rounded from float32 to float16 before attention reads them, as a float16 KV
    cache keeps them."""

    def cached(values):
        return np.asarray(values, np.float32).astype(kv_dtype).astype(np.float64)

    ids = np.asarray(token_ids)
    ids = ids[None, :] if ids.ndim == 1 else ids
    batch, tokens = ids.shape
    h, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    d, eps = config.head_dim, config.rms_norm_eps
    positions = np.arange(tokens)
    ties = np.full((batch, tokens), np.inf)

    def linear(x, weights):
        np.minimum(ties, tie_distance(x).reshape(batch, tokens), out=ties)
        return bitlinear(x, *weights)[0]

    x = np.asarray(params["embed"], np.float32)[ids.reshape(-1)]
    for layer in params["layers"]:
        w, n = layer["proj"], layer["norms"]
        a = rms_norm(x, n["input_layernorm"], eps).astype(np.float32)
        q = linear(a, w["q"]).reshape(batch, tokens, heads, d)
        k = linear(a, w["k"]).reshape(batch, tokens, kv_heads, d)
        v = linear(a, w["v"]).reshape(batch, tokens, kv_heads, d)
        out = np.concatenate(
            [
                attention(
                    rope(q[b], positions, config.rope_theta),
                    cached(rope(k[b], positions, config.rope_theta)),
                    cached(v[b]),
                    causal=True,
                )
                for b in range(batch)
            ]
        ).astype(np.float32)
        out = rms_norm(out.reshape(batch * tokens, h), n["self_attn.attn_sub_norm"], eps).astype(
            np.float32
        )
        x = (x + linear(out, w["o"])).astype(np.float32)
        m = rms_norm(x, n["post_attention_layernorm"], eps).astype(np.float32)
        f = (activation("relu2", linear(m, w["gate"])) * linear(m, w["up"])).astype(np.float32)
        f = rms_norm(f, n["mlp.ffn_sub_norm"], eps).astype(np.float32)
        x = (x + linear(f, w["down"])).astype(np.float32)
    x = rms_norm(x, params["norm"], eps)
    logits = (
        (x @ np.asarray(params["lm_head"], np.float64).T)
        .astype(np.float32)
        .reshape(batch, tokens, -1)
    )
    return (logits, ties) if return_ties else logits


def bitnet_generate(
    params: dict,
    config,
    token_ids: np.ndarray,
    max_new_tokens: int,
    temperature=0.0,
    top_k=None,
    seed=0,
    top_p=None,
    kv_dtype=np.float32,
) -> np.ndarray:
    """Generation with bitnet_forward over the whole sequence at every step (kv_dtype as
    there): greedy, or at temperature > 0 sample_rows' draw with the drawn token's position as its
    step. token_ids: [T], [B, T], or a list of sequences of any lengths (each generated alone, its
    draws keyed by its index in the list; a list of arrays comes back)."""
    if isinstance(token_ids, (list, tuple)) and any(np.ndim(s) == 1 for s in token_ids):
        out = []
        for b, sequence in enumerate(token_ids):
            ids = np.asarray(sequence)[None, :]
            for _ in range(max_new_tokens):
                logits = bitnet_forward(params, config, ids, kv_dtype=kv_dtype)[:, -1, :]
                nxt = (
                    logits.argmax(axis=-1)
                    if temperature == 0
                    else sample_rows(logits, temperature, top_k, seed, ids.shape[1], top_p, b)
                )
                ids = np.concatenate([ids, nxt[:, None].astype(ids.dtype)], axis=1)
            out.append(ids[0])
        return out
    ids = np.asarray(token_ids)
    squeeze = ids.ndim == 1
    ids = ids[None, :] if squeeze else ids
    for _ in range(max_new_tokens):
        logits = bitnet_forward(params, config, ids, kv_dtype=kv_dtype)[:, -1, :]
        nxt = (
            logits.argmax(axis=-1)
            if temperature == 0
            else sample_rows(logits, temperature, top_k, seed, ids.shape[1], top_p)
        )
        ids = np.concatenate([ids, nxt[:, None].astype(ids.dtype)], axis=1)
    return ids[0] if squeeze else ids


def screening_bracket(h: np.ndarray, q: np.ndarray, meta: np.ndarray, scale: int = 32767):
    """(low, high) float64 [V]: the bracket _core.screened_argmax's screening pass gives each row
    of a head around its logit h . head[v], from the head's int8 copy q [V, Kp] and its row data
    meta [V, 4] (models.screening_tables): h16 = rint(h * float32(scale / max|h|)) (its high and
    low bytes multiplied apart: the integer sum q_v . h16 exactly), approx = sigma_h sigma_v
    (q_v . h16), and bound = ((||h|| + E_h) D' + E_h N) (1 + 2^-8) + 1e-36 with sigma_h = max|h| /
    scale and E_h = 0.52 sqrt(K) sigma_h. scale: 32767 for one row of h
    (shaders/screened_head/head_screen.comp), 32639 for several (head_split_rows.comp, whose bytes
    are signed). For finite h with max|h| = 0 or >= 1e-18; the kernel marks every other h's
    brackets NaN."""
    h = np.asarray(h, np.float32).reshape(-1)
    k = h.size
    amax = np.float32(np.abs(h).max())
    inverse = np.float32(scale) / amax if amax > 0 else np.float32(0)
    h16 = np.clip(np.rint(h * inverse), -scale, scale).astype(np.int64)
    values = np.asarray(q)[:, :k].astype(np.int64)
    total = 256 * (values @ (h16 >> 8)) + values @ (h16 & 255)
    sigma_h = float(np.float32(amax) / np.float32(scale))
    approx = sigma_h * total * meta[:, 0].astype(np.float64)
    norm_h = float(np.linalg.norm(h.astype(np.float64)))
    error_h = 0.52 * np.sqrt(k) * sigma_h
    bound = ((norm_h + error_h) * meta[:, 1].astype(np.float64) + error_h * meta[:, 2]) * (
        1 + 1 / 256
    ) + 1e-36
    return approx - bound, approx + bound
