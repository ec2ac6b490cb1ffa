"""A float16 KV cache beside float32 queries (docs/NUMERICS.md, "KV cache in float16"): the ops
that write it (rope_append, decode_attention) store each key and value rounded from float32 to
float16, and every attention path reads them as they are. Tolerances: a stored value within half a
float16 unit of the float64 reference's (plus 1e-6 of the largest, the float32 rotation's);
attention over the stored values within 1e-5 of the float64 reference over the same values; the
decoder's logits within 1e-4 of bitnet_forward(..., kv_dtype=np.float16)."""

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import _core, reference
from bitnet_gpu.models import BitNetConfig, BitNetModel
from conftest import device_tensor as to_tensor, poisoned, rel

VOCAB = 384


def _halves(rng, *shape):
    return rng.standard_normal(shape).astype(np.float16)


def _within_a_half_unit(stored, exact):
    """Each float16 in `stored` is a rounding of `exact` (float64): at most half a unit of the
    float16 grid away, plus 1e-6 of the largest value for the float32 rotation's own error (a
    value near a tie may round either way)."""
    stored = stored.astype(np.float64)
    unit = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
    assert (np.abs(stored - exact) <= unit / 2 + 1e-6 * np.abs(exact).max()).all()


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "tq,l,hq,hkv,d",
    [
        (1, 1, 1, 1, 8),
        (1, 700, 6, 2, 64),
        (5, 37, 4, 1, 32),
        (20, 40, 6, 3, 64),
        (33, 33, 2, 2, 36),
    ],
)
def test_attention_over_float16_keys_and_values(tune, rng, tiled, causal, tq, l, hq, hkv, d):
    """The one-query, split (a few queries over 512 keys or more) and tiled kernels read float16
    keys and values beside float32 queries; the result is float32."""
    tune(attention_tiled=tiled)
    q = rng.standard_normal((tq, hq, d)).astype(np.float32)
    k, v = _halves(rng, l, hkv, d), _halves(rng, l, hkv, d)
    out = poisoned(q.shape, np.float32)
    _core.attention(to_tensor(q), to_tensor(k), to_tensor(v), causal, None, out, False)
    assert out.dtype == np.float32
    assert rel(out.numpy(), reference.attention(q, k, v, causal)) <= 1e-5
    assert rel(bg.attention(q, k, v, causal), reference.attention(q, k, v, causal)) <= 1e-5


@pytest.mark.skipif("not bg.default_device().info.features.get('cooperative_matrix_khr_float16')")
def test_float16_precision_over_float16_keys_and_values(rng):
    """precision="float16" (tensor cores) with float32 queries over float16 keys and values: as
    over the same values in float32 (the kernel rounds them to float16 either way)."""
    q = rng.standard_normal((70, 4, 64)).astype(np.float32)
    k, v = _halves(rng, 90, 2, 64), _halves(rng, 90, 2, 64)
    out = bg.attention(q, k, v, precision="float16")
    same = bg.attention(q, k.astype(np.float32), v.astype(np.float32), precision="float16")
    np.testing.assert_array_equal(out, same)


def test_keys_and_values_dtypes_are_checked(rng):
    q32 = rng.standard_normal((2, 2, 8)).astype(np.float32)
    k16, k32 = _halves(rng, 4, 1, 8), rng.standard_normal((4, 1, 8)).astype(np.float32)
    with pytest.raises(bg.DTypeError, match="k and v"):  # float32 keys beside float16 q
        bg.attention(q32.astype(np.float16), k32, k32)
    with pytest.raises(bg.DTypeError, match="k and v"):  # keys and values of two dtypes
        bg.attention(q32, k16, k32)


def test_a_float16_kv_cache_object(rng):
    """bg.KVCache(dtype=np.float16): NumPy float32 rows are rounded into it as NumPy assigns, and
    float32 queries attend over the stored values."""
    cache = bg.KVCache(2, 40, 2, 16, dtype=np.float16)
    assert cache.nbytes == 2 * 2 * 40 * 2 * 16 * 2
    q = rng.standard_normal((5, 4, 16)).astype(np.float32)
    k = rng.standard_normal((30, 2, 16)).astype(np.float32)
    v = rng.standard_normal((30, 2, 16)).astype(np.float32)
    assert cache.append(1, k, v) == 30
    np.testing.assert_array_equal(cache.keys[1].numpy()[:30], k.astype(np.float16))
    out = cache.attention(1, q)
    assert out.dtype == np.float32
    want = reference.attention(q, k.astype(np.float16), v.astype(np.float16))
    assert rel(out, want) <= 1e-5
    with pytest.raises(bg.DTypeError, match="k and v"):  # float16 q over a float32 cache
        bg.KVCache(1, 4, 1, 8).attention(0, q[:1, :1, :8].astype(np.float16))
    for bad in (np.int8, "bfloat16"):
        with pytest.raises(bg.DTypeError, match="dtype"):
            bg.KVCache(1, 4, 1, 8, dtype=bad)


def _rope_inputs(rng, batch, hq, hkv, d, rows):
    q = rng.standard_normal((batch, hq, d)).astype(np.float32)
    k = rng.standard_normal((batch, hkv, d)).astype(np.float32)
    v = rng.standard_normal((batch, hkv, d)).astype(np.float32)
    cos, sin = bg.rope_tables(np.arange(rows), d, 10000.0)
    return q, k, v, to_tensor(cos), to_tensor(sin)


def test_rope_append_rounds_into_a_float16_cache(rng):
    batch, hq, hkv, d, rows, start = 3, 4, 2, 16, 40, np.array([0, 7, 39], np.int32)
    q, k, v, cos, sin = _rope_inputs(rng, batch, hq, hkv, d, rows)
    caches = [to_tensor(np.full((batch, rows, hkv, d), 7, np.float16)) for _ in range(2)]
    q_out = _core.rope_append(
        to_tensor(q), to_tensor(k), to_tensor(v), cos, sin, to_tensor(start), *caches
    )
    assert rel(q_out.numpy(), reference.rope(q, start, 10000.0)) <= 1e-5
    kc, vc = (c.numpy() for c in caches)
    k_ref = reference.rope(k, start, 10000.0)
    for b, position in enumerate(start):
        _within_a_half_unit(kc[b, position], k_ref[b])
        np.testing.assert_array_equal(vc[b, position], v[b].astype(np.float16))
        kc[b, position] = vc[b, position] = 7
    assert (kc == 7).all() and (vc == 7).all()  # no other row written


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(
    "batch,hq,hkv,d,rows,start",
    [(1, 4, 1, 16, 64, 0), (2, 8, 2, 128, 100, 31), (3, 20, 5, 128, 700, (0, 64, 699))],
)
def test_decode_attention_over_a_float16_cache(tune, rng, fused, batch, hq, hkv, d, rows, start):
    """The fused step (and the two ops it falls back to) appends the new key and value rounded to
    float16 and attends with them as stored: against NumPy over the cache the step leaves."""
    tune(fused_attention=fused)
    q, k, v, cos, sin = _rope_inputs(rng, batch, hq, hkv, d, rows)
    positions = np.array(np.broadcast_to(start, (batch,)), np.int32)
    k_cache, v_cache = (to_tensor(_halves(rng, batch, rows, hkv, d)) for _ in range(2))
    out = _core.decode_attention(
        to_tensor(q), to_tensor(k), to_tensor(v), cos, sin, to_tensor(positions), k_cache, v_cache
    )
    kc, vc = k_cache.numpy(), v_cache.numpy()
    k_ref, q_ref = reference.rope(k, positions, 10000.0), reference.rope(q, positions, 10000.0)
    for b, position in enumerate(positions):
        _within_a_half_unit(kc[b, position], k_ref[b])
        np.testing.assert_array_equal(vc[b, position], v[b].astype(np.float16))
        want = reference.attention(
            q_ref[b : b + 1], kc[b], vc[b], causal=False, kv_length=position + 1
        )[0]
        assert rel(out.numpy()[b], want) <= 1e-5


@pytest.fixture(scope="module")
def models():
    config = BitNetConfig.preset("tiny", tie_word_embeddings=False)
    return [
        BitNetModel.random(
            config, seed=5, embedding_dtype=np.float32, max_tokens=64, kv_cache_dtype=dtype
        )
        for dtype in ("float16", "float32")
    ]


def test_the_decoder_over_a_float16_cache(models):
    """Prefill (chunks of the prompt over the cache), decode and verify steps against the NumPy
    decoder whose keys and values are rounded to float16; half the cache bytes of float32."""
    half, single = models
    assert half.kv_cache_dtype == np.float16 and single.kv_cache_dtype == np.float32
    ids = np.random.default_rng(3).integers(0, VOCAB, (2, 20))
    params = half.reference_params()
    want = reference.bitnet_forward(params, half.config, ids, kv_dtype=np.float16)
    logits = half.forward(ids)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    session = half.session(1)
    session.step(ids[0, :12])
    session.step(ids[0, 12:])  # a chunk over the cache's first 12 tokens
    step = session.step(ids[0, -1:])
    extended = np.concatenate([ids[0], ids[0, -1:]])[None]
    want_step = reference.bitnet_forward(params, half.config, extended, kv_dtype=np.float16)
    np.testing.assert_allclose(
        step, want_step[0, -1], rtol=1e-4, atol=1e-4 * np.abs(want_step).max()
    )
    single.forward(ids)
    assert half.cache_nbytes * 2 == single.cache_nbytes > 0


def test_greedy_ids_over_a_float16_cache(models):
    """generate's greedy ids: the NumPy decoder's over a float16 cache; a batch gives each
    sequence its ids alone; speculative decoding the ids of plain decoding."""
    half = models[0]
    prompts = np.random.default_rng(11).integers(0, VOCAB, (2, 6))
    params = half.reference_params()
    got = half.generate(prompts, max_new_tokens=8)
    want = reference.bitnet_generate(params, half.config, prompts, 8, kv_dtype=np.float16)
    np.testing.assert_array_equal(got, want)
    for b in range(2):
        np.testing.assert_array_equal(half.generate(prompts[b], max_new_tokens=8), got[b])
    drafted = half.generate(prompts, max_new_tokens=8, prompt_lookup_num_tokens=3)
    np.testing.assert_array_equal(drafted, got)


@pytest.mark.parametrize("bad", ["bfloat16", np.float64, None, 3])
def test_kv_cache_dtype_is_checked(bad):
    config = BitNetConfig.preset("tiny")
    with pytest.raises(bg.DTypeError, match="kv_cache_dtype"):
        BitNetModel.random(config, max_tokens=8, kv_cache_dtype=bad)


@pytest.mark.skipif("not bg.default_device().info.features.get('cooperative_matrix_khr_float16')")
def test_float16_prefill_attention_over_a_float16_cache():
    """prefill_attention="float16" over a float16 cache (GPU only): the prefill reads the stored
    values straight into its float16 tiles; its logits within 2e-2 of the NumPy decoder's over a
    float16 cache, as test_model's float16 prefill is of float32's."""
    config = BitNetConfig.preset("tiny", hidden_size=128, tie_word_embeddings=False)
    model = BitNetModel.random(
        config,
        seed=7,
        embedding_dtype=np.float32,
        max_tokens=64,
        prefill_attention="float16",
        kv_cache_dtype="float16",
    )
    ids = np.random.default_rng(8).integers(0, VOCAB, (2, 40))
    want = reference.bitnet_forward(model.reference_params(), config, ids, kv_dtype=np.float16)
    assert rel(model.forward(ids), want) <= 2e-2
