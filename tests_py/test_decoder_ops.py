"""The decoder's own ops against NumPy: embedding, the float head, argmax, RoPE with the KV-cache
append, decode attention, and BitLinear groups with fused norms, gates and residuals."""

import re

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import _core, reference
from conftest import device_tensor as to_tensor, poisoned as _poisoned, rel

rng = np.random.default_rng()
FLOAT_TOL = {np.float32: 1e-5, np.float16: 2e-3}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("v,h,t", [(1, 1, 1), (7, 33, 7), (33, 4097, 3), (500, 64, 33)])
def test_embedding(dtype, v, h, t):
    table = rng.standard_normal((v, h)).astype(dtype)
    ids = rng.integers(0, v, t).astype(np.int32)
    out = _poisoned((t, h), np.float32)
    _core.embedding(to_tensor(table), to_tensor(ids), out)
    np.testing.assert_array_equal(out.numpy(), table[ids].astype(np.float32))


def test_embedding_rejects_ids_out_of_range():
    table = to_tensor(rng.standard_normal((5, 4)).astype(np.float32))
    with pytest.raises(bg.ArgumentError, match="2 token ids are outside"):
        _core.embedding(table, to_tensor(np.array([0, 5, -1, 4], np.int32)))
    with pytest.raises(bg.DTypeError):
        _core.embedding(table, to_tensor(np.array([0], np.int64)))
    np.testing.assert_array_equal(
        _core.embedding(table, to_tensor(np.array([4], np.int32))).numpy(), table.numpy()[[4]]
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 7, 33), (3, 64, 1000), (5, 4097, 7), (9, 36, 17)])
def test_linear_rows(dtype, m, k, n):
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(dtype)
    out = _poisoned((m, n), np.float32)
    _core.linear_rows(to_tensor(x), to_tensor(w), out)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    assert rel(out.numpy(), ref) <= 1e-5


def test_argmax_rows_follows_numpy():
    x = rng.standard_normal((6, 1000)).astype(np.float32)
    x[1, [3, 700]] = 50.0  # equal maxima: the first
    x[2, :] = -np.inf
    x[3, [10, 20]] = np.nan  # NaN wins, the first one
    x[4, :] = 0.0
    x[5, 999] = 1e30
    out = _poisoned((6,), np.int32)
    _core.argmax_rows(to_tensor(x), out)
    np.testing.assert_array_equal(out.numpy(), np.argmax(x, axis=1))
    one = rng.standard_normal((1, 1)).astype(np.float32)
    assert _core.argmax_rows(to_tensor(one)).numpy()[0] == 0
    with pytest.raises(bg.ShapeError):
        _core.argmax_rows(to_tensor(np.zeros((2, 0), np.float32)))


def test_argmax_over_many_chunks():
    x = rng.standard_normal((3, 4096 * 3 + 7)).astype(np.float32)
    x[0, [5000, 9000]] = 80.0  # equal maxima in two chunks: the first
    x[1, -1] = np.inf
    x[2, [100, 8200]] = np.nan  # the first NaN, in the first chunk
    np.testing.assert_array_equal(_core.argmax_rows(to_tensor(x)).numpy(), np.argmax(x, axis=1))
    vocab = rng.standard_normal((3, 128256)).astype(
        np.float32
    )  # 126 chunks of 1024, the last partial
    vocab[0, [128255, 1023, 1024]] = 9.0  # equal maxima across chunk edges: the first
    vocab[1, -1] = np.nan  # the NaN in the last, partial chunk
    vocab[2, :] = -np.inf
    np.testing.assert_array_equal(
        _core.argmax_rows(to_tensor(vocab)).numpy(), np.argmax(vocab, axis=1)
    )


def _starts(start):
    """int32 [1] for one start shared by every sequence, [B] for one a sequence."""
    return np.array(start if isinstance(start, tuple) else [start], np.int32)


@pytest.mark.parametrize(
    "batch,tokens,start", [(1, 1, 0), (2, 3, 9), (3, 1, 62), (3, 2, (0, 5, 62)), (2, 1, (40, 2))]
)
def test_rope_append(batch, tokens, start):
    """One start for every sequence, or one a sequence."""
    hq, hkv, d, rows = 4, 2, 16, 64
    q = rng.standard_normal((batch * tokens, hq, d)).astype(np.float32)
    k = rng.standard_normal((batch * tokens, hkv, d)).astype(np.float32)
    v = rng.standard_normal((batch * tokens, hkv, d)).astype(np.float32)
    cos, sin = bg.rope_tables(np.arange(rows), d, 10000.0)
    k_cache = to_tensor(np.full((batch, rows, hkv, d), 7, np.float32))
    v_cache = to_tensor(np.full((batch, rows, hkv, d), 7, np.float32))
    q_out = _core.rope_append(
        to_tensor(q),
        to_tensor(k),
        to_tensor(v),
        to_tensor(cos),
        to_tensor(sin),
        to_tensor(_starts(start)),
        k_cache,
        v_cache,
    )
    pos = np.repeat(np.broadcast_to(start, (batch,)), tokens) + np.arange(batch * tokens) % tokens
    assert rel(q_out.numpy(), reference.rope(q, pos, 10000.0)) <= 1e-5
    kc, vc = k_cache.numpy(), v_cache.numpy()
    k_ref = reference.rope(k, pos, 10000.0)
    for r in range(batch * tokens):
        b, p = r // tokens, pos[r]
        if p < rows:
            assert rel(kc[b, p], k_ref[r]) <= 1e-5
            np.testing.assert_array_equal(vc[b, p], v[r])
    untouched = np.ones((batch, rows), bool)
    for r in range(batch * tokens):
        if pos[r] < rows:
            untouched[r // tokens, pos[r]] = False
    assert (kc[untouched] == 7).all() and (vc[untouched] == 7).all()


def _decode_attention_reference(q, k, v, k_cache, v_cache, start, theta):
    """rope + append + causal attention of one new token a sequence, in NumPy (float64); start:
    one for every sequence or one a sequence."""
    batch, rows = k_cache.shape[:2]
    pos = np.array(np.broadcast_to(start, (batch,)))
    kc, vc = k_cache.copy(), v_cache.copy()
    k_rotated = reference.rope(k, pos, theta)
    for b in range(batch):
        if pos[b] < rows:
            kc[b, pos[b]] = k_rotated[b]
            vc[b, pos[b]] = v[b]
    qr = reference.rope(q, pos, theta)
    out = np.stack(
        [
            reference.attention(
                qr[b : b + 1], kc[b], vc[b], causal=False, kv_length=min(pos[b] + 1, rows)
            )[0]
            for b in range(batch)
        ]
    )
    return out, kc, vc


def _decode_attention_inputs(batch, hq, hkv, d, rows, cache_dtype=np.float32):
    """Random q [B, HQ, D], the new k and v [B, HKV, D] and caches [B, rows, HKV, D] of
    cache_dtype for decode_attention."""
    q = rng.standard_normal((batch, hq, d)).astype(np.float32)
    k = rng.standard_normal((batch, hkv, d)).astype(np.float32)
    v = rng.standard_normal((batch, hkv, d)).astype(np.float32)
    k_host = rng.standard_normal((batch, rows, hkv, d)).astype(cache_dtype)
    v_host = rng.standard_normal((batch, rows, hkv, d)).astype(cache_dtype)
    return q, k, v, k_host, v_host


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(
    "batch,hq,hkv,d,rows,start",
    [
        (1, 1, 1, 4, 1, 0),
        (1, 4, 1, 16, 64, 0),
        (2, 8, 2, 128, 100, 31),
        (3, 20, 5, 128, 130, 32),
        (1, 6, 2, 36, 70, 69),
        (2, 8, 1, 256, 40, 33),
        (1, 3, 3, 6, 9, 5),
        (1, 16, 1, 8, 33, 20),
        (1, 16, 2, 8, 1100, 1090),
        (2, 4, 1, 16, 2300, 2299),
        (1, 8, 1, 4, 8300, 8250),
        (3, 20, 5, 128, 130, (0, 64, 129)),
        (2, 16, 1, 8, 40, (7, 3)),
        (17, 20, 5, 128, 130, 100),
    ],
)
def test_decode_attention(tune, fused, batch, hq, hkv, d, rows, start):
    """rope + KV append + attention in one dispatch (where D % 4 == 0, D <= 256 and HQ / HKV <= 8;
    (6, 3) and 16 query heads a KV head take the two-op path; the merge takes up to 260 splits,
    eight at a time, its invocations one output vector each over 1 to 32 shares of the splits, or
    two each for 8 heads of 256) against NumPy, with the cache rows it must not touch poisoned;
    one position for every sequence, or one a sequence."""
    tune(fused_attention=fused)
    q, k, v, k_host, v_host = _decode_attention_inputs(batch, hq, hkv, d, rows)
    for b, position in enumerate(np.broadcast_to(start, (batch,))):
        k_host[b, position + 1 :] = np.nan  # rows past the new key are never read
        v_host[b, position + 1 :] = np.nan
    cos, sin = bg.rope_tables(np.arange(rows), d, 500000.0)
    k_cache, v_cache = to_tensor(k_host), to_tensor(v_host)
    out = _core.decode_attention(
        to_tensor(q),
        to_tensor(k),
        to_tensor(v),
        to_tensor(cos),
        to_tensor(sin),
        to_tensor(_starts(start)),
        k_cache,
        v_cache,
    )
    ref, kc, vc = _decode_attention_reference(q, k, v, k_host, v_host, start, 500000.0)
    assert out.shape == (batch, hq, d)
    assert rel(out.numpy(), ref) <= 1e-5
    np.testing.assert_array_equal(np.isnan(k_cache.numpy()), np.isnan(kc))
    assert rel(np.nan_to_num(k_cache.numpy()), np.nan_to_num(kc)) <= 1e-6
    np.testing.assert_array_equal(v_cache.numpy(), vc)


@pytest.mark.parametrize("split", [16, 64])
@pytest.mark.parametrize(
    "batch,hq,hkv,d,rows,start",
    [
        (1, 4, 1, 16, 64, 0),
        (3, 20, 5, 128, 130, 32),
        (1, 8, 4, 36, 70, 69),
        (2, 4, 1, 256, 300, 250),
        (1, 8, 1, 8, 200, 150),
    ],
)
def test_decode_attention_with_other_split_sizes(tune, split, batch, hq, hkv, d, rows, start):
    """16 and 64 keys a workgroup (decode_split; 64 only where G * 64 <= 256, the last case keeps
    32) against NumPy, the untouched cache rows poisoned."""
    tune(decode_split=split)
    test_decode_attention(tune, True, batch, hq, hkv, d, rows, start)


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
def test_decode_attention_rows_of_a_batch_are_bit_for_bit_alone(kv_dtype):
    """Each sequence's row of a 19-sequence step is bit for bit the row the same sequence gets
    alone: the decoder's batches and the server's rely on it."""
    batch, hq, hkv, d, rows = 19, 20, 5, 128, 200
    starts = rng.integers(0, rows, batch).astype(np.int32)
    q, k, v, k_host, v_host = _decode_attention_inputs(batch, hq, hkv, d, rows, kv_dtype)
    cos, sin = (to_tensor(t) for t in bg.rope_tables(np.arange(rows), d, 500000.0))

    def step(rows_of):
        return _core.decode_attention(
            to_tensor(q[rows_of]),
            to_tensor(k[rows_of]),
            to_tensor(v[rows_of]),
            cos,
            sin,
            to_tensor(starts[rows_of]),
            to_tensor(k_host[rows_of]),
            to_tensor(v_host[rows_of]),
        ).numpy()

    together = step(slice(None))
    for b in range(batch):
        np.testing.assert_array_equal(together[b], step(slice(b, b + 1))[0])


def test_decode_attention_replays_at_growing_lengths():
    """A recorded step replayed over many positions: the merge's counters start from zero every
    time, and each replay appends its key for the next."""
    batch, hq, hkv, d, rows = 2, 8, 2, 64, 100
    k_host = np.zeros((batch, rows, hkv, d), np.float32)
    v_host = np.zeros((batch, rows, hkv, d), np.float32)
    k_cache, v_cache = to_tensor(k_host), to_tensor(v_host)
    cos, sin = bg.rope_tables(np.arange(rows), d, 10000.0)
    graph = bg.default_device().graph()
    with graph:
        q_in = graph.input("q", (batch, hq, d), np.float32)
        k_in = graph.input("k", (batch, hkv, d), np.float32)
        v_in = graph.input("v", (batch, hkv, d), np.float32)
        start = graph.input("start", (1,), np.int32)
        graph.output(
            "out",
            _core.decode_attention(
                q_in, k_in, v_in, to_tensor(cos), to_tensor(sin), start, k_cache, v_cache
            ),
        )
    for position in [0, 1, 2, 31, 32, 33, 64, 99]:
        q = rng.standard_normal((batch, hq, d)).astype(np.float32)
        k = rng.standard_normal((batch, hkv, d)).astype(np.float32)
        v = rng.standard_normal((batch, hkv, d)).astype(np.float32)
        out = graph.run(q=q, k=k, v=v, start=np.array([position], np.int32), numpy=True)["out"]
        ref, k_host, v_host = _decode_attention_reference(
            q, k, v, k_host, v_host, position, 10000.0
        )
        assert rel(out, ref) <= 1e-5, position


def test_decode_attention_rejects_bad_input():
    q, kv = to_tensor(np.zeros((1, 4, 8), np.float32)), to_tensor(np.zeros((1, 2, 8), np.float32))
    cache = to_tensor(np.zeros((1, 16, 2, 8), np.float32))
    cos, sin = (to_tensor(t) for t in bg.rope_tables(np.arange(16), 8, 10000.0))
    start = to_tensor(np.array([3], np.int32))
    with pytest.raises(bg.DTypeError, match="start"):
        _core.decode_attention(
            q, kv, kv, cos, sin, to_tensor(np.array([3], np.uint32)), cache, cache
        )
    with pytest.raises(bg.DTypeError, match="start"):  # one a sequence, or one for all
        _core.decode_attention(
            q, kv, kv, cos, sin, to_tensor(np.array([3, 4], np.int32)), cache, cache
        )
    with pytest.raises(bg.ShapeError):
        _core.decode_attention(
            q, kv, kv, cos, sin, start, to_tensor(np.zeros((1, 16, 4, 8), np.float32)), cache
        )
    with pytest.raises(bg.DTypeError, match="q"):
        _core.decode_attention(
            to_tensor(np.zeros((1, 4, 8), np.float16)), kv, kv, cos, sin, start, cache, cache
        )


@pytest.mark.parametrize(
    "m,k", [(1, 64), (3, 2560), (2, 4096), (8, 1000), (1, 4100), (2, 8192), (8, 4096)]
)
@pytest.mark.parametrize("gated_in", [False, True])
def test_gated_output_equals_gate_and_up(m, k, gated_in):
    """bitlinear_group(..., gated_output=True) gives relu(g)^2 * u of the two products it replaces,
    bit for bit (one dispatch where the rows fit and K % 64 == 0, else the products and the gating
    as ops: K of 1000 and 4100, and (8, 4096), whose x is over the fused matvec's limit), and so
    does the down projection after it."""
    x = to_tensor(rng.standard_normal((m, k)).astype(np.float32))
    up = to_tensor(rng.standard_normal((m, k)).astype(np.float32)) if gated_in else None
    norm_w = to_tensor(rng.uniform(0.5, 1.5, k).astype(np.float32))
    gate_w, up_w = (
        bg.quantize_weights(rng.standard_normal((40, k)).astype(np.float32))._core for _ in range(2)
    )
    down_w = bg.quantize_weights(rng.standard_normal((5, 40)).astype(np.float32))._core
    g, u = _core.bitlinear_group(x, up, norm_w, 1e-5, [gate_w, up_w], [None, None])
    (h,) = _core.bitlinear_group(x, up, norm_w, 1e-5, [gate_w, up_w], [None, None], True)
    gv, uv = g.numpy(), u.numpy()
    r = np.maximum(gv, np.float32(0))
    np.testing.assert_array_equal(h.numpy(), r * r * uv)
    # gated_output_fuses says whether the gating runs in the products' dispatch, not on its own.
    with bg.profile(x.device) as profile:
        _core.bitlinear_group(x, up, norm_w, 1e-5, [gate_w, up_w], [None, None], True)
    gating_apart = any(re.search("gated|elementwise", name) for name, _ in profile.timings)
    assert _core.gated_output_fuses(x, gate_w, True) == (not gating_apart)
    sub = to_tensor(
        rng.uniform(0.5, 1.5, 40).astype(np.float32)
    )  # the down matvec fuses norm (and gating)
    (y_pair,) = _core.bitlinear_group(g, u, sub, 1e-5, [down_w], [None])
    (y_gated,) = _core.bitlinear_group(h, None, sub, 1e-5, [down_w], [None])
    np.testing.assert_array_equal(y_gated.numpy(), y_pair.numpy())
    with pytest.raises(bg.ArgumentError, match="gated_output"):
        _core.bitlinear_group(x, None, None, 1e-5, [gate_w], [None], True)


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("k", [4, 1000, 4100])
@pytest.mark.parametrize("gated", [False, True])
def test_fused_matvec_equals_the_separate_pre_pass(tune, m, k, gated):
    """For decode-sized inputs every matvec workgroup quantizes the rows itself, for one weight
    (with a residual) or up to three in one dispatch: bit for bit what the separate pre-pass
    gives (fused_matvec=False)."""
    x = to_tensor(rng.standard_normal((m, k)).astype(np.float32))
    up = to_tensor(rng.standard_normal((m, k)).astype(np.float32)) if gated else None
    norm_w = to_tensor(rng.uniform(0.5, 1.5, k).astype(np.float32))
    weights = [
        bg.quantize_weights(rng.standard_normal((n, k)).astype(np.float32))._core
        for n in (1, 300, 37)
    ]
    residual = to_tensor(rng.standard_normal((m, 300)).astype(np.float32))
    calls = [(weights, [None] * 3), (weights[:2], [None, None]), (weights[1:2], [residual])]
    results = {}
    for setting in (True, False):
        tune(fused_matvec=setting)
        results[setting] = [_core.bitlinear_group(x, up, norm_w, 1e-5, w, r) for w, r in calls]
    for fused, separate in zip(results[True], results[False]):
        for a, b in zip(fused, separate):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    bad = x.numpy()
    bad[-1, -1] = np.inf
    tune(fused_matvec=True)
    with pytest.raises(bg.ArgumentError, match="contains 1 NaN or Inf value"):  # counted once
        _core.bitlinear_group(to_tensor(bad), None, norm_w, 1e-5, weights, [None] * 3)
    # A NaN makes the whole normalized row NaN; either pre-pass counts the input's values (the
    # norm's sum of squares and max are one reduction, docs/NUMERICS.md).
    bad[-1, -1] = np.nan
    for setting in (True, False):
        tune(fused_matvec=setting)
        with pytest.raises(bg.ArgumentError, match="contains 1 NaN or Inf value"):
            _core.bitlinear_group(to_tensor(bad), None, norm_w, 1e-5, weights, [None] * 3)


@pytest.mark.parametrize(
    "m,k,n",
    [
        (1, 16, 1),
        (1, 64, 33),
        (3, 2560, 129),
        (8, 6912, 65),
        (1, 16384, 17),
        (2, 20000, 9),
        (9, 64, 33),
        (130, 300, 200),
        (257, 2560, 129),
        (256, 256, 256),
    ],
)
def test_the_residual_is_added_bit_for_bit(m, k, n):
    """bitlinear_group's [M, N] residual: up to 8 rows (decode) the matvec adds it, with its own
    pre-pass (K <= 8192 values), after the split pre-pass (K = 16384) or on the unfused path
    (K > 16384); past them (prefill) the tiled or tensor-core kernel adds it in its epilogue (in
    16-byte vectors where N % 4 == 0, without bounds tests for whole tiles: (256, 256, 256)). Each
    is bit for bit the float32 sum of the
    output and the residual (on the H100 the compiler had contracted the scaling's division and
    the addition into one FMA, in the tensor-core kernel and then in the matvec: one rounding
    off)."""
    x = to_tensor(rng.standard_normal((m, k)).astype(np.float32))
    w = bg.quantize_weights(rng.standard_normal((n, k)).astype(np.float32))._core
    residual = rng.standard_normal((m, n)).astype(np.float32)
    (plain,) = _core.bitlinear_group(x, None, None, 1e-5, [w], [None])
    (summed,) = _core.bitlinear_group(x, None, None, 1e-5, [w], [to_tensor(residual)])
    np.testing.assert_array_equal(summed.numpy(), plain.numpy() + residual)


def test_pre_pass_rows_past_the_grid():
    """More rows than a grid's workgroups (the pre-pass's workgroups take a row each and go round
    again): every row, normed, as it is in a call of its rows alone, and the Inf in the last row
    (a workgroup's second row) counted."""
    limit = bg.default_device().info.max_workgroup_count[0]
    if limit > 1 << 17:
        pytest.skip("the grid holds more rows than this test makes")
    m, k = limit + 1000, 64
    x = rng.standard_normal((m, k)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, k).astype(np.float32)
    w = bg.quantize_weights(rng.standard_normal((5, k)).astype(np.float32))
    (full,) = _core.bitlinear_group(to_tensor(x), None, to_tensor(norm_w), 1e-5, [w._core], [None])
    tail = slice(limit - 1000, m)
    (alone,) = _core.bitlinear_group(
        to_tensor(np.ascontiguousarray(x[tail])), None, to_tensor(norm_w), 1e-5, [w._core], [None]
    )
    np.testing.assert_array_equal(full.numpy()[tail], alone.numpy())
    x[m - 1, 3] = np.inf
    with pytest.raises(bg.ArgumentError, match="1 NaN or Inf value"):
        _core.bitlinear_group(to_tensor(x), None, to_tensor(norm_w), 1e-5, [w._core], [None])


@pytest.mark.parametrize("m", [1, 3, 9, 300])
@pytest.mark.parametrize("k", [64, 33, 20000])
@pytest.mark.parametrize("gated", [False, True])
def test_bitlinear_group_fuses_norm_gate_and_residual(m, k, gated):
    """One pre-pass for several projections: v = relu(x)^2 * up (gated), then rms_norm, then
    bitlinear per weight plus a residual; the same as the separate ops (fused where K % 4 == 0
    and K <= 16384, run as separate ops otherwise). From 9 rows the weights' matmuls share one
    tensor-core tile, chosen for their outputs together."""
    x = rng.standard_normal((m, k)).astype(np.float32)
    up = rng.standard_normal((m, k)).astype(np.float32)
    norm_w = rng.uniform(0.5, 1.5, k).astype(np.float32)
    weights = [bg.quantize_weights(rng.standard_normal((n, k)).astype(np.float32)) for n in (7, 33)]
    residual = rng.standard_normal((m, 33)).astype(np.float32)
    ys = _core.bitlinear_group(
        to_tensor(x),
        to_tensor(up) if gated else None,
        to_tensor(norm_w),
        1e-5,
        [w._core for w in weights],
        [None, to_tensor(residual)],
    )
    v = (reference.activation("relu2", x) * up).astype(np.float32) if gated else x
    v = reference.rms_norm(v, norm_w, 1e-5).astype(np.float32)
    for i, w in enumerate(weights):
        q, gamma = w.unpack(), float(np.asarray(w.scale).reshape(-1)[0])
        y_ref, _ = reference.bitlinear(v, q, gamma)
        if i == 1:
            y_ref = y_ref + residual
        # The GPU normalizes in float32, the reference in float64: an int8 may round the other way
        # where x * s lies within 1e-6 of a .5 tie (docs/NUMERICS.md), moving y by gamma / s per
        # such value. Everywhere else y matches to float32 rounding.
        scale = reference.activation_scale(v).astype(np.float64)
        xs = v.astype(np.float64) * scale[:, None]
        near_ties = (reference.rounding_tie_gap(xs) < 1e-6).sum(axis=1)
        err = np.abs(ys[i].numpy() - y_ref)
        for r in range(m):
            bound = near_ties[r] * gamma / scale[r] + 1e-5 * np.abs(y_ref[r]).max() + 1e-6
            assert err[r].max() <= bound, f"row {r}: {near_ties[r]} near ties"
    with pytest.raises(bg.ShapeError):
        _core.bitlinear_group(
            to_tensor(x), None, to_tensor(norm_w[:-1]), 1e-5, [weights[0]._core], [None]
        )
    with pytest.raises(bg.ShapeError):
        _core.bitlinear_group(
            to_tensor(x), None, None, 1e-5, [weights[1]._core], [to_tensor(residual[:, :5])]
        )
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(bg.ArgumentError, match="NaN"):
        _core.bitlinear_group(to_tensor(bad), None, None, 1e-5, [weights[0]._core], [None])


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(
    "batch,tokens,start,rows",
    [
        (1, 1, 0, 8),
        (2, 1, 600, 1024),
        (1, 7, 30, 64),
        (2, 33, 0, 40),
        (3, 9, 4, 300),
        (2, 20, 17, 64),
        (3, 9, (0, 4, 50), 300),
        (2, 1, (600, 5), 1024),
        (2, 20, (17, 0), 64),
    ],
)
def test_attention_cached_matches_full_attention(tune, tiled, dtype, batch, tokens, start, rows):
    """Prefill and decode over batched caches, with the query-block kernel (where more than 8
    tokens a sequence would not take the split path) and with the one-query kernel; one start for
    every sequence, or one a sequence."""
    tune(attention_tiled=tiled)
    hq, hkv, d = 4, 2, 32
    k_all = rng.standard_normal((batch, rows, hkv, d)).astype(dtype)
    v_all = rng.standard_normal((batch, rows, hkv, d)).astype(dtype)
    q = rng.standard_normal((batch * tokens, hq, d)).astype(dtype)
    out = _poisoned(q.shape, dtype)
    _core.attention_cached(
        to_tensor(q), to_tensor(k_all), to_tensor(v_all), to_tensor(_starts(start)), True, out
    )
    for b in range(batch):
        length = int(np.broadcast_to(start, (batch,))[b]) + tokens
        ref = reference.attention(
            q[b * tokens : (b + 1) * tokens], k_all[b, :length], v_all[b, :length], True
        )
        assert rel(out.numpy()[b * tokens : (b + 1) * tokens], ref) <= FLOAT_TOL[dtype]
