"""rope, grouped-query attention and the KV cache against bitnet_gpu.reference (float64).
Tolerance: ||out - ref|| / ||ref|| <= 1e-5 (float32), 2e-3 (float16), plus the rounding of the
scores themselves where they are in the thousands (test_attention_float16_tensors_and_extremes);
precision="float16" (tensor cores) within 2e-3 max|v| of the reference of the rounded inputs."""

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import reference as ref
from conftest import rel


def qkv(rng, tq, l, hq, hkv, d, dtype=np.float32, scale=1.0):
    return tuple(
        (rng.standard_normal(s) * scale).astype(dtype)
        for s in [(tq, hq, d), (l, hkv, d), (l, hkv, d)]
    )


@pytest.mark.parametrize(
    "tq,l,hq,hkv,d",
    [
        (1, 1, 1, 1, 1),
        (5, 5, 4, 2, 16),
        (1, 33, 20, 5, 128),
        (7, 7, 3, 3, 33),
        (3, 4500, 2, 1, 8),
        (2, 2049, 4, 4, 256),
    ],
)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_parity(device, rng, tq, l, hq, hkv, d, causal):
    q, k, v = qkv(rng, tq, l, hq, hkv, d)
    out = np.full(q.shape, np.nan, np.float32)
    assert bg.attention(q, k, v, causal, out=out) is out
    assert rel(out, ref.attention(q, k, v, causal)) <= 1e-5


def test_attention_float16_tensors_and_extremes(device, rng):
    q, k, v = qkv(rng, 4, 40, 6, 3, 64, np.float16)
    o = bg.attention(bg.Tensor.from_numpy(q), bg.Tensor.from_numpy(k), bg.Tensor.from_numpy(v))
    assert isinstance(o, bg.Tensor) and o.dtype == np.float16
    assert rel(o.numpy(), ref.attention(q, k, v)) <= 2e-3
    # Scores in the thousands: a stable softmax. A float32 score is only known to about the unit
    # roundoff u = 2^-24 times the magnitude of its terms (sum |q_i k_i| / sqrt(d), about 1600
    # here), and exp turns that absolute error into the weights' relative error, so the bound is
    # 1e-5 plus 2 u times that magnitude (the worst of 300 seeds reached 0.28 of the second term;
    # 1e-5 alone failed for 5 of them, up to 5.3e-5, seed 13093089362076369457 in CI).
    q, k, v = qkv(rng, 2, 50, 2, 1, 8, scale=30.0)
    magnitude = np.einsum(
        "thd,lhd->thl",
        np.abs(q.astype(np.float64)),
        np.abs(np.repeat(k, 2, axis=1).astype(np.float64)),
    ).max() / np.sqrt(8)
    tolerance = 1e-5 + 2 * 2.0**-24 * magnitude
    assert rel(bg.attention(q, k, v), ref.attention(q, k, v)) <= tolerance


def float16_tensor_cores(device):
    return device.info.features.get("cooperative_matrix_khr_float16", False)


def check_float16_attention(q, k, v, out, causal=True, kv_length=None):
    """precision="float16" (NUMERICS.md): against the float64 attention of q, k, v rounded to
    float16, each output within 2e-3 * max|v| (the weights rounded to float16: 2^-11 each, in the
    sum and the normalization)."""
    rounded = [np.asarray(a, np.float16).astype(np.float64) for a in (q, k, v)]
    expected = ref.attention(*rounded, causal, kv_length=kv_length)
    assert np.isfinite(out).all()
    assert np.abs(out - expected).max() <= 2e-3 * np.abs(rounded[2]).max()


@pytest.mark.skipif("not bg.default_device().info.features.get('cooperative_matrix_khr_float16')")
@pytest.mark.parametrize(
    "tq,l,hq,hkv,d,causal",
    [
        (1, 1, 1, 1, 32, True),
        (33, 33, 4, 2, 64, True),
        (130, 200, 20, 5, 128, True),
        (70, 70, 2, 1, 128, False),
        (100, 300, 4, 4, 96, True),
        (64, 64, 3, 1, 128, True),
        (20, 513, 2, 2, 128, False),
        (1030, 1030, 4, 1, 96, True),
        (1100, 1200, 2, 2, 32, False),
    ],
)
def test_float16_attention_on_tensor_cores(device, rng, tq, l, hq, hkv, d, causal):
    """precision="float16" (GPU only): partial query blocks and key tiles, keys past the queries,
    grouped heads, every head dimension, workgroups of 64 and (from 1024 queries) 128 query rows;
    float32 and float16 tensors."""
    q, k, v = qkv(rng, tq, l, hq, hkv, d)
    out = np.full(q.shape, np.nan, np.float32)
    assert bg.attention(q, k, v, causal, precision="float16", out=out) is out
    check_float16_attention(q, k, v, out, causal)
    halves = [bg.Tensor.from_numpy(a.astype(np.float16)) for a in (q, k, v)]
    o16 = bg.attention(*halves, causal, precision="float16")
    assert o16.dtype == np.float16
    check_float16_attention(q, k, v, o16.numpy().astype(np.float32), causal)


@pytest.mark.skipif("not bg.default_device().info.features.get('cooperative_matrix_khr_float16')")
def test_float16_attention_over_a_kv_cache(device, rng):
    """A cache's filled part only (kv_length), then prefill and decode over a KVCache."""
    q, k, v = qkv(rng, 50, 400, 4, 2, 128)
    out = bg.attention(q, k, v, True, kv_length=300, precision="float16")
    check_float16_attention(q, k, v, out, True, kv_length=300)
    cache = bg.KVCache(1, 200, 2, 128)
    cache.append(0, k[:150], v[:150])
    out = cache.attention(0, q, precision="float16")
    check_float16_attention(q, k[:150], v[:150], out)


def test_float16_attention_is_checked(device, rng):
    q, k, v = qkv(rng, 4, 4, 4, 2, 48)
    with pytest.raises(bg.ArgumentError, match="precision"):
        bg.attention(q, k, v, precision="bfloat16")
    for d in (48, 256):
        q, k, v = qkv(rng, 4, 4, 4, 2, d)
        match = f"head dim {d}" if float16_tensor_cores(device) else "float16 cooperative matrices"
        with pytest.raises(bg.UnsupportedError, match=match):
            bg.attention(q, k, v, precision="float16")


def test_attention_errors(device, rng):
    q, k, v = qkv(rng, 4, 4, 4, 2, 8)
    with pytest.raises(bg.ShapeError, match="multiple of HKV"):
        bg.attention(q[:, :3], k, v)
    with pytest.raises(bg.ShapeError, match="at least as many keys"):
        bg.attention(q, k[:3], v[:3])
    with pytest.raises(bg.DTypeError):
        bg.attention(q, k.astype(np.float16), v)
    with pytest.raises(bg.UnsupportedError, match="head dim"):
        bg.attention(*qkv(rng, 1, 1, 1, 1, 300))
    with pytest.raises(bg.ShapeError, match="kv_length"):
        bg.attention(q, k, v, kv_length=9)


@pytest.mark.parametrize("t,h,d", [(1, 1, 2), (7, 3, 8), (33, 2, 128)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rope(device, rng, t, h, d, dtype):
    x = rng.standard_normal((t, h, d)).astype(dtype)
    positions = rng.integers(0, 8192, t)
    y = bg.rope(x, positions, theta=500000.0)
    assert y.dtype == dtype
    assert rel(y, ref.rope(x, positions, 500000.0)) <= (2e-3 if dtype == np.float16 else 1e-6)
    with pytest.raises(bg.ShapeError):
        bg.rope(x, positions[:-1] if t > 1 else np.arange(2))


def test_kv_length_is_a_whole_number(device, rng):
    q, k, v = qkv(rng, 1, 6, 2, 1, 8)
    with pytest.raises(TypeError, match="kv_length: expected an integer"):
        bg.attention(q, k, v, kv_length=4.5)
    assert rel(bg.attention(q, k, v, kv_length=np.int64(4)), ref.attention(q, k[:4], v[:4])) <= 1e-5


def test_rope_table_arguments_are_checked(device):
    for head_dim in (0, -2, 8.5):
        with pytest.raises((bg.ArgumentError, TypeError), match="head_dim"):
            bg.rope_tables(np.arange(3), head_dim)
    for theta in (0.0, -1.0, float("nan"), float("inf")):  # would give NaN angles
        with pytest.raises(bg.ArgumentError, match="theta"):
            bg.rope(np.ones((2, 1, 8), np.float32), np.arange(2), theta=theta)


def test_kv_cache_decode_equals_full_attention(device, rng):
    layers, hq, hkv, d, prompt, steps = 2, 8, 2, 32, 9, 6
    cache = bg.KVCache(layers, prompt + steps, hkv, d)
    assert cache.nbytes == 2 * layers * (prompt + steps) * hkv * d * 4
    q, k, v = qkv(rng, prompt + steps, prompt + steps, hq, hkv, d)
    for layer in range(layers):
        assert cache.append(layer, k[:prompt], v[:prompt]) == prompt
        got = cache.attention(layer, q[:prompt])
        assert rel(got, ref.attention(q[:prompt], k[:prompt], v[:prompt])) <= 1e-5
    full = ref.attention(q, k, v)
    for step in range(prompt, prompt + steps):  # one token at a time, as in decoding
        cache.append(0, k[step : step + 1], v[step : step + 1])
        got = cache.attention(0, q[step : step + 1])
        assert rel(got, full[step : step + 1]) <= 1e-5
    with pytest.raises(bg.ShapeError, match="max_tokens"):
        cache.append(0, k[:1], v[:1])
    cache.reset()
    assert cache.lengths == [0, 0]
    for layer in (2, -1):  # no counting from the end: -1 is a mistake, not the last layer
        with pytest.raises(IndexError, match="out of range"):
            cache.attention(layer, q[:1])
        with pytest.raises(IndexError, match="out of range"):
            cache.append(layer, k[:1], v[:1])
    assert cache.lengths == [0, 0]


@pytest.mark.parametrize(
    "args", [(0, 8, 1, 8), (1, 0, 1, 8), (1, 8, 0, 8), (1, 8, 1, 0), (-1, 8, 1, 8)]
)
def test_kv_cache_sizes_are_checked(device, args):
    with pytest.raises(bg.ArgumentError, match="expected an integer of at least 1"):
        bg.KVCache(*args)
    with pytest.raises(TypeError, match="expected an integer"):
        bg.KVCache(1, 8.5, 1, 8)  # not cut to 8


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize(
    "tq,l,hq,hkv,d,causal",
    [
        (1, 600, 20, 5, 128, True),
        (3, 1000, 4, 2, 33, True),
        (2, 257, 2, 1, 256, False),
        (1, 1, 1, 1, 8, True),
        (8, 4100, 2, 2, 16, True),
        (2, 9000, 2, 1, 64, True),
    ],
)
def test_split_key_attention_matches(device, rng, tune, split, tq, l, hq, hkv, d, causal):
    """Decode attention with the keys split over workgroups and merged, against the reference."""
    tune(attention_split=split)
    for dtype, tolerance in [(np.float32, 1e-5), (np.float16, 2e-3)]:
        q, k, v = qkv(rng, tq, l, hq, hkv, d, dtype)
        assert rel(bg.attention(q, k, v, causal), ref.attention(q, k, v, causal)) <= tolerance


@pytest.mark.parametrize("tiled,tile_keys", [(False, None), (True, None), (True, 8), (True, 16)])
@pytest.mark.parametrize(
    "tq,l,hq,hkv,d,causal",
    [
        (16, 16, 4, 2, 16, True),
        (33, 33, 3, 1, 128, True),
        (17, 50, 2, 2, 33, False),
        (100, 130, 4, 4, 64, True),
        (1, 5, 2, 1, 8, True),
        (40, 40, 2, 1, 7, True),
        (65, 97, 8, 2, 128, True),
        (300, 2100, 2, 1, 128, True),
        (33, 40, 2, 1, 256, True),
        (20, 70, 2, 2, 130, False),
        (50, 300, 4, 2, 200, True),
        (1600, 1600, 1, 1, 64, True),
        (1540, 1700, 2, 1, 40, False),
    ],
)
def test_tiled_attention_matches(device, rng, tune, tiled, tile_keys, tq, l, hq, hkv, d, causal):
    """Prefill attention with blocks of 32 queries (64 from 1536 queries a sequence up to D = 128)
    sharing key tiles (D <= 256; the default from 16 queries a sequence; tiles of 8, 16 or the
    most keys that fit) and without, against the reference."""
    tune(attention_tiled=tiled, attention_tile_keys=tile_keys)
    for dtype, tolerance in [(np.float32, 1e-5), (np.float16, 2e-3)]:
        q, k, v = qkv(rng, tq, l, hq, hkv, d, dtype)
        out = np.full(q.shape, np.nan, dtype)
        bg.attention(q, k, v, causal, out=out)
        assert rel(out, ref.attention(q, k, v, causal)) <= tolerance


def test_tile_keys_setting_is_checked(device, rng, tune):
    with pytest.raises(bg.ArgumentError, match="expected 8, 16 or 32"):
        tune(attention_tile_keys=12)
    # 32-key tiles take 20608 bytes of shared memory at D = 128 and 36992 at D = 256: within
    # lavapipe's 32 KiB, and over it.
    tune(attention_tile_keys=32)
    for d, shared_bytes in [(128, 20608), (256, 36992)]:
        q, k, v = qkv(rng, 32, 32, 2, 1, d)
        if shared_bytes > device.info.max_shared_memory:
            with pytest.raises(
                bg.ArgumentError, match=f"{shared_bytes} bytes are over this device's"
            ):
                bg.attention(q, k, v)
        else:
            assert rel(bg.attention(q, k, v), ref.attention(q, k, v)) <= 1e-5


def test_split_setting_is_checked(device, rng, tune):
    with pytest.raises(bg.ArgumentError, match="attention_split='yes'"):
        tune(attention_split="yes")
    assert bg.attention(*qkv(rng, 1, 4, 2, 1, 8)).shape == (1, 2, 8)
