"""The head read through its int8 screening copy: the same argmax and the same draws as the float
head, bit for bit, on fresh heads, near ties and special values."""

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import _core, reference
from bitnet_gpu.models import screening_tables
from bitnet_gpu.sampling import sampling_params, sampling_rows
from conftest import device_tensor as to_tensor, poisoned as _poisoned

rng = np.random.default_rng()


def _screened(h, head, out=None, high=None):
    q, meta = screening_tables(head)
    return _core.screened_argmax(
        to_tensor(h), to_tensor(head), to_tensor(q), to_tensor(meta), out, high
    )


def _float_head_argmax(h, head):
    return _core.argmax_rows(_core.linear_rows(to_tensor(h), to_tensor(head))).numpy()[0]


def _check_brackets(h, head, high, exact, scale=32767):
    """Each bracket holds its logit (the bracket is symmetric: its upper end tells), and is the
    reference's: float32 against float64 arithmetic on the same integer sums (within a thousandth
    of the bracket's half-width), but for those of h's 16-bit values that the GPU may round the
    other way, where its 32767 / max|h| is not correctly rounded (the H100's division): values of
    h * 32767 / max|h| within a few float32 ulps of a .5 tie. Each moves a row's middle by
    sigma_h sigma_v |q_vk|. h [1, K]; high and exact [V]; scale: reference.screening_bracket's."""
    k = h.shape[1]
    assert (high >= exact).all()
    q, meta = screening_tables(head)
    ref_low, ref_high = reference.screening_bracket(h, q, meta, scale)
    scaled = np.abs(h[0].astype(np.float64)) * scale / np.abs(h).max()
    may_flip = np.abs(scaled % 1 - 0.5) <= 4 * 2.0**-24 * scaled + 1e-9
    sigma_h = np.abs(h).max() / scale
    flips = sigma_h * meta[:, 0] * np.abs(q[:, :k][:, may_flip].astype(np.float64)).sum(axis=1)
    slack = 1e-5 * np.abs(ref_high) + 1e-3 * (ref_high - ref_low) / 2 + 1.01 * flips
    assert (np.abs(high - ref_high) <= slack).all(), np.max(np.abs(high - ref_high) / slack)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("v,k", [(1, 4), (7, 60), (33, 64), (1000, 16), (4097, 2560), (2100, 1028)])
def test_screened_argmax_is_the_float_heads_argmax(dtype, v, k):
    """The screened argmax gives the index argmax_rows gives on linear_rows' logits (the same
    bits: the candidates are computed as linear_rows computes them), on fresh random heads."""
    for _ in range(2):
        head = rng.standard_normal((v, k)).astype(dtype)
        h = rng.standard_normal((1, k)).astype(np.float32)
        out, high = _poisoned((1,), np.int32), _poisoned((v,), np.float32)
        _screened(h, head, out, high)
        assert out.numpy()[0] == _float_head_argmax(h, head)
        exact = h.astype(np.float64) @ head.astype(np.float64).T
        _check_brackets(h, head, high.numpy(), exact[0])
        top2 = np.sort(exact[0])[-2:]
        if v == 1 or top2[1] - top2[0] > 1e-3 * np.abs(exact).max():
            assert out.numpy()[0] == np.argmax(exact)


def _coarse_head(v, k):
    """A head whose int8 copy orders rows wrongly: pairs of rows a hair apart, in random order,
    and 40 rows with one huge value (coarse int8 steps, wide brackets)."""
    base = rng.standard_normal((v // 2, k)).astype(np.float32)
    head = np.concatenate([base, base + 1e-4 * rng.standard_normal(base.shape).astype(np.float32)])
    head = head[rng.permutation(v)]
    head[rng.integers(0, v, 40), rng.integers(0, k, 40)] = 300.0
    return head


def _hidden_with_outliers(k, outliers):
    h = rng.standard_normal((1, k)).astype(np.float32)
    if outliers:
        h[0, rng.integers(0, k, 3)] *= 200.0
    return h


def test_screened_argmax_near_ties_and_coarse_rows():
    """Rows whose int8 copies order them wrongly: pairs of rows a hair apart (the int8 copy of
    the larger may be the smaller), exact duplicates (the first wins), rows with one huge
    value (coarse int8 steps, wide brackets) and h with outliers."""
    k, v = 256, 3000
    head = _coarse_head(v, k)
    for trial in range(6):
        h = _hidden_with_outliers(k, trial % 2)
        logits = h.astype(np.float64) @ head.astype(np.float64).T
        best = int(np.argmax(logits))
        head[(best + 17) % v] = head[best]  # an exact duplicate, before or after it
        high = _poisoned((v,), np.float32)
        assert _screened(h, head, high=high).numpy()[0] == _float_head_argmax(h, head)
        assert (high.numpy() >= h.astype(np.float64) @ head.astype(np.float64).T).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("m,v,k", [(2, 7, 60), (3, 1000, 16), (9, 4097, 2560), (37, 2100, 1028)])
def test_screened_argmax_of_several_rows(dtype, m, v, k):
    """Rows of x (a decode step of several sequences, a verify step's tokens) each get the index
    argmax_rows gives on linear_rows' logits, and each row's brackets are its own (through the
    int8 matmul of their 16-bit values with the head's int8 copy), as the reference gives them."""
    head = rng.standard_normal((v, k)).astype(dtype)
    h = rng.standard_normal((m, k)).astype(np.float32)
    h[m // 2] *= 300.0  # rows of different scales share a workgroup
    out, high = _poisoned((m,), np.int32), _poisoned((m, v), np.float32)
    with bg.profile(bg.default_device()) as profile:
        _screened(h, head, out, high)
    names = [name for name, _ in profile.timings]  # the matmul named for the head in timings
    assert "head_screen_matmul" in names and not any("bitlinear" in n for n in names), names
    expected = _core.argmax_rows(_core.linear_rows(to_tensor(h), to_tensor(head))).numpy()
    np.testing.assert_array_equal(out.numpy(), expected)
    exact = h.astype(np.float64) @ head.astype(np.float64).T
    for row in range(m):  # several rows' 16-bit values are scaled to +-32639 (signed bytes)
        _check_brackets(h[row : row + 1], head, high.numpy()[row], exact[row], 32639)


def test_screened_argmax_of_several_rows_near_ties_and_special_values():
    """Among rows of x: near-tied and duplicated head rows, h with outliers, a row with NaN, one
    with Inf, a zero row and one too small to bracket: each row's index is the float head's, and
    the rows without a bracket do not disturb the others'."""
    k, v = 256, 3000
    head = _coarse_head(v, k)
    h = np.concatenate([_hidden_with_outliers(k, trial % 2) for trial in range(10)])
    best = np.argmax(h[:4].astype(np.float64) @ head.astype(np.float64).T, axis=1)
    head[(best + 17) % v] = head[best]  # exact duplicates of four rows' winners
    h[4, 5], h[5, 9] = np.nan, np.inf
    h[6] = 0.0
    h[7] *= np.float32(1e-25)
    expected = _core.argmax_rows(_core.linear_rows(to_tensor(h), to_tensor(head))).numpy()
    high = _poisoned((10, v), np.float32)
    np.testing.assert_array_equal(_screened(h, head, high=high).numpy(), expected)
    assert np.isnan(high.numpy()[[4, 5, 7]]).all()
    assert (high.numpy()[:4] >= h[:4].astype(np.float64) @ head.astype(np.float64).T).all()
    head[1234, 3] = np.nan  # the first NaN wins: row 1234, or 0 where h holds NaN or Inf
    expected = _core.argmax_rows(_core.linear_rows(to_tensor(h), to_tensor(head))).numpy()
    np.testing.assert_array_equal(_screened(h, head).numpy(), expected)
    assert (expected[[0, 1, 2, 3, 6, 7, 8, 9]] == 1234).all()


@pytest.mark.parametrize("case", ["nan_h", "inf_h", "nan_row", "zero_h", "tiny_h", "zero_head"])
def test_screened_argmax_special_values(case):
    """NaN and Inf follow np.argmax of the float head's logits (the first NaN wins), and h too
    small to bracket falls back to checking every row exactly."""
    v, k = 1500, 64
    head = rng.standard_normal((v, k)).astype(np.float16)
    h = rng.standard_normal((1, k)).astype(np.float32)
    if case == "nan_h":
        h[0, 5] = np.nan
    elif case == "inf_h":
        h[0, 9] = np.inf
    elif case == "nan_row":
        head[1234, 3] = np.nan
    elif case == "zero_h":
        h[:] = 0.0
    elif case == "tiny_h":
        h *= np.float32(1e-25)
    elif case == "zero_head":
        head[:] = 0.0
    expected = _float_head_argmax(h, head)
    assert _screened(h, head).numpy()[0] == expected
    if case == "nan_row":
        assert expected == 1234


SAMPLINGS = [(0.0, None), (0.3, 1), (0.8, None), (0.8, 5), (1.0, 50), (3.0, None), (6.0, 40)]


# With top-p: (temperature, top_k, top_p)
NUCLEUS_SAMPLINGS = [
    (0.8, None, 0.9),
    (0.3, None, 0.5),
    (1.0, 50, 0.95),
    (3.0, None, 0.99),
    (0.8, None, 1e-6),
]


def _screened_draw(h, head, temperature, top_k, seed, step, exact=None, top_p=None):
    q, meta = screening_tables(head)
    params = to_tensor(sampling_params(temperature, top_k, seed, head.shape[0], top_p))
    return _core.screened_sample(
        to_tensor(h),
        to_tensor(head),
        to_tensor(q),
        to_tensor(meta),
        params,
        to_tensor(np.array([step], np.int32)),
        1,
        None,
        exact,
        top_p is not None,
    ).numpy()[0]


def _float_head_draw(h, head, temperature, top_k, seed, step, top_p=None):
    params = to_tensor(sampling_params(temperature, top_k, seed, head.shape[0], top_p))
    return _core.sample_rows(
        _core.linear_rows(to_tensor(h), to_tensor(head)),
        params,
        to_tensor(np.array([step], np.int32)),
        1,
        None,
        top_p is not None,
    ).numpy()[0]


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("v,k", [(1, 4), (7, 60), (1000, 16), (4097, 2560), (2100, 1028)])
def test_screened_sample_is_the_float_heads_draw(dtype, v, k):
    """The screened draw gives the index sample_rows draws from linear_rows' logits, bit for bit,
    at temperatures 0 to 6 with and without top_k: its candidates' logits are linear_rows' (the
    same bits), every other row is -inf, and the candidates are few (the screening prunes)."""
    head = rng.standard_normal((v, k)).astype(dtype)
    for temperature, top_k in SAMPLINGS:
        h = rng.standard_normal((1, k)).astype(np.float32)
        seed, step = int(rng.integers(0, 2**63)), int(rng.integers(0, 2**31))
        exact = _poisoned((v,), np.float32)
        drawn = _screened_draw(h, head, temperature, top_k, seed, step, exact)
        assert drawn == _float_head_draw(h, head, temperature, top_k, seed, step)
        logits = _core.linear_rows(to_tensor(h), to_tensor(head)).numpy()[0]
        got = exact.numpy()
        candidates = got != -np.inf
        np.testing.assert_array_equal(got[candidates], logits[candidates])
        assert candidates[drawn]
        if top_k is not None and top_k < v:  # every kept logit is a candidate
            assert candidates[reference.sampling_kept(logits, top_k)].all()
        if v >= 1000:
            assert candidates.sum() <= v // 4, candidates.sum()


needs_int64_atomics = pytest.mark.skipif(
    not bg.default_device().info.features["int64_atomics"],
    reason="top-p needs 64-bit integer atomics",
)


@needs_int64_atomics
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize(
    "v,k,scale",
    [
        (1, 4, 1.0),
        (7, 60, 1.0),
        (1000, 16, 1.0),
        (4097, 2560, 1.0),
        (4097, 2560, 0.02),
        (2100, 1028, 0.05),
    ],
)
def test_screened_top_p_is_the_float_heads_draw(dtype, v, k, scale):
    """With top-p the screened draw gives the float head's draw bit for bit: without top_k its
    candidates are the rows within 22.5 t of the largest lower end (the others' weights are 0),
    and every row the nucleus keeps is one. scale shrinks the logits (to about 1 standard
    deviation at 0.02 for K = 2560, as a trained model's are), so that many rows lie within reach
    of the largest."""
    head = (rng.standard_normal((v, k)) * scale).astype(dtype)
    for temperature, top_k, top_p in NUCLEUS_SAMPLINGS:
        h = rng.standard_normal((1, k)).astype(np.float32)
        seed, step = int(rng.integers(0, 2**63)), int(rng.integers(0, 2**31))
        exact = _poisoned((v,), np.float32)
        drawn = _screened_draw(h, head, temperature, top_k, seed, step, exact, top_p)
        assert drawn == _float_head_draw(h, head, temperature, top_k, seed, step, top_p)
        logits = _core.linear_rows(to_tensor(h), to_tensor(head)).numpy()[0]
        got = exact.numpy()
        candidates = got != -np.inf
        np.testing.assert_array_equal(got[candidates], logits[candidates])
        assert candidates[reference.sampling_kept(logits, top_k, top_p, temperature)].all()
        if k >= 1000 and scale == 1.0:
            assert candidates.sum() <= v // 4, candidates.sum()


def _row_draws(h, head, settings, starts, offset, top_p, exact=None):
    """(the screened draws of rows of h, each with its own settings (temperature, top_k, top_p),
    seed and key row, at steps starts + offset; sample_rows' draws from linear_rows' logits)."""
    v = head.shape[0]
    params = sampling_rows(
        [sampling_params(t, k, seed, v, p) for t, k, p, seed in settings],
        rng.permutation(len(settings)),  # key rows other than the rows' indices
    )
    q, meta = screening_tables(head)
    start = to_tensor(np.asarray(starts, np.int32))
    args = (to_tensor(params), start, offset)
    drawn = _core.screened_sample(
        to_tensor(h), to_tensor(head), to_tensor(q), to_tensor(meta), *args, None, exact, top_p
    ).numpy()
    logits = _core.linear_rows(to_tensor(h), to_tensor(head))
    return drawn, _core.sample_rows(logits, *args, None, top_p).numpy()


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("m,v,k", [(2, 7, 60), (3, 1000, 16), (9, 4097, 2560), (37, 2100, 1028)])
def test_screened_sample_of_several_rows(dtype, m, v, k):
    """Rows of x (a batch's decode step, a verify step's tokens), each with its own temperature,
    top_k, seed, key row and step, get the draws sample_rows makes from linear_rows' logits, bit
    for bit; each row's candidates' logits are linear_rows' and the screening prunes each row."""
    head = rng.standard_normal((v, k)).astype(dtype)
    h = rng.standard_normal((m, k)).astype(np.float32)
    h[m // 2] *= 300.0  # rows of different scales
    settings = [
        (*SAMPLINGS[i % len(SAMPLINGS)], None, int(rng.integers(0, 2**63))) for i in range(m)
    ]
    starts = rng.integers(0, 2**20, m)
    exact = _poisoned((m, v), np.float32)
    with bg.profile(bg.default_device()) as profile:
        drawn, expected = _row_draws(h, head, settings, starts, 3, False, exact)
    names = [name for name, _ in profile.timings]
    assert "head_screen_matmul" in names, names
    np.testing.assert_array_equal(drawn, expected)
    logits = _core.linear_rows(to_tensor(h), to_tensor(head)).numpy()
    got = exact.numpy()
    candidates = got != -np.inf
    np.testing.assert_array_equal(got[candidates], logits[candidates])
    assert candidates[np.arange(m), drawn].all()
    for row, (_, top_k, _, _) in enumerate(settings):
        if top_k is not None and top_k < v:  # every kept logit is a candidate
            assert candidates[row, reference.sampling_kept(logits[row], top_k)].all()
    if v >= 1000:
        assert (candidates.sum(axis=1) <= v // 4).all(), candidates.sum(axis=1)
    # Every row's parameters and step alike ([6] and [1]): each row keyed by its index.
    params = sampling_params(0.8, None, 5, v)
    q, meta = screening_tables(head)
    one = (to_tensor(params), to_tensor(np.array([7], np.int32)), 2)
    screened = _core.screened_sample(
        to_tensor(h), to_tensor(head), to_tensor(q), to_tensor(meta), *one
    )
    float_head = _core.sample_rows(_core.linear_rows(to_tensor(h), to_tensor(head)), *one)
    np.testing.assert_array_equal(screened.numpy(), float_head.numpy())


@needs_int64_atomics
@pytest.mark.parametrize("m,v,k,scale", [(5, 4097, 2560, 1.0), (4, 4097, 2560, 0.02)])
def test_screened_top_p_of_several_rows(m, v, k, scale):
    """Top-p over several rows, each with its own settings (with and without top_k): the float
    head's draws bit for bit, every row the nucleus keeps a candidate."""
    head = (rng.standard_normal((v, k)) * scale).astype(np.float16)
    h = rng.standard_normal((m, k)).astype(np.float32)
    settings = [
        (*NUCLEUS_SAMPLINGS[i % len(NUCLEUS_SAMPLINGS)], int(rng.integers(0, 2**63)))
        for i in range(m)
    ]
    exact = _poisoned((m, v), np.float32)
    drawn, expected = _row_draws(h, head, settings, rng.integers(0, 2**20, m), 0, True, exact)
    np.testing.assert_array_equal(drawn, expected)
    logits = _core.linear_rows(to_tensor(h), to_tensor(head)).numpy()
    candidates = exact.numpy() != -np.inf
    for row, (t, top_k, top_p, _) in enumerate(settings):
        assert candidates[row, reference.sampling_kept(logits[row], top_k, top_p, t)].all()


def test_screened_sample_keys_one_row_by_its_key_row():
    """One row with its own parameters ([1, 8]) is keyed by the key row they name, as sample_rows
    keys it (a sequence of a batch drawn alone)."""
    k, v = 256, 3000
    head = (rng.standard_normal((v, k)) * 0.02).astype(np.float32)  # the noise decides
    for key_row in (0, 5, 63):
        h = rng.standard_normal((1, k)).astype(np.float32)
        params = sampling_rows([sampling_params(1.0, None, 11, v)], [key_row])
        args = (to_tensor(params), to_tensor(np.array([4], np.int32)), 0)
        q, meta = screening_tables(head)
        screened = _core.screened_sample(
            to_tensor(h), to_tensor(head), to_tensor(q), to_tensor(meta), *args
        ).numpy()
        float_head = _core.sample_rows(_core.linear_rows(to_tensor(h), to_tensor(head)), *args)
        np.testing.assert_array_equal(screened, float_head.numpy())


def test_screened_sample_of_several_rows_rejects_bad_input():
    """Several rows: a row holding NaN raises as sample_rows does (every head row its candidate),
    parameters or steps of the wrong count raise, and the device stays usable."""
    k, v, m = 64, 500, 3
    head = rng.standard_normal((v, k)).astype(np.float32)
    q, meta = screening_tables(head)
    tables = (to_tensor(head), to_tensor(q), to_tensor(meta))
    h = rng.standard_normal((m, k)).astype(np.float32)
    params = sampling_rows([sampling_params(0.9, 5, 3, v)] * m, range(m))
    starts = to_tensor(np.arange(m, dtype=np.int32))
    bad = h.copy()
    bad[1, 7] = np.nan
    with pytest.raises(bg.ArgumentError, match=f"{v} NaN values"):
        _core.screened_sample(to_tensor(bad), *tables, to_tensor(params), starts, 0)
    with pytest.raises(bg.DTypeError, match="params"):
        _core.screened_sample(to_tensor(h), *tables, to_tensor(params[:2]), starts, 0)
    with pytest.raises(bg.DTypeError, match="start"):
        _core.screened_sample(
            to_tensor(h), *tables, to_tensor(params), to_tensor(np.zeros(2, np.int32)), 0
        )
    with pytest.raises(bg.ShapeError, match="exact"):
        _core.screened_sample(
            to_tensor(h), *tables, to_tensor(params), starts, 0, None, _poisoned((v,), np.float32)
        )
    drawn = _core.screened_sample(to_tensor(h), *tables, to_tensor(params), starts, 0).numpy()
    logits = _core.linear_rows(to_tensor(h), tables[0])
    expected = _core.sample_rows(logits, to_tensor(params), starts, 0).numpy()
    np.testing.assert_array_equal(drawn, expected)


def test_screened_sample_near_ties_and_special_values():
    """Duplicated and near-duplicated rows, rows with a huge value, h with outliers: the same draws
    as the float head's; NaN in h makes every row a candidate and raises as sample_rows does."""
    k, v = 256, 3000
    head = _coarse_head(v, k)
    for trial in range(8):
        h = _hidden_with_outliers(k, trial % 2)
        temperature, top_k = SAMPLINGS[trial % len(SAMPLINGS)]
        assert _screened_draw(h, head, temperature, top_k, trial, 9) == _float_head_draw(
            h, head, temperature, top_k, trial, 9
        )
    for value in (0.0, 1e-25):
        h = np.full((1, k), value, np.float32)
        assert _screened_draw(h, head, 0.8, 5, 1, 2) == _float_head_draw(h, head, 0.8, 5, 1, 2)
    h = rng.standard_normal((1, k)).astype(np.float32)
    h[0, 3] = np.nan
    with pytest.raises(bg.ArgumentError, match=f"{v} NaN values"):
        _screened_draw(h, head, 0.8, None, 1, 2)
    with pytest.raises(bg.DTypeError, match="params"):
        q, meta = screening_tables(head)
        _core.screened_sample(
            to_tensor(h),
            to_tensor(head),
            to_tensor(q),
            to_tensor(meta),
            to_tensor(np.zeros(4, np.uint32)),
            to_tensor(np.zeros(1, np.int32)),
            0,
        )
    h[0, 3] = 1.0
    assert _screened_draw(h, head, 0.8, 5, 1, 2) == _float_head_draw(
        h, head, 0.8, 5, 1, 2
    )  # still usable


def test_screened_argmax_rejects_bad_input():
    head = rng.standard_normal((10, 8)).astype(np.float16)
    q, meta = screening_tables(head)
    h = rng.standard_normal((1, 8)).astype(np.float32)
    with pytest.raises(bg.DTypeError):
        _core.screened_argmax(
            to_tensor(h.astype(np.float16)), to_tensor(head), to_tensor(q), to_tensor(meta)
        )
    with pytest.raises(bg.DTypeError):
        _core.screened_argmax(
            to_tensor(h), to_tensor(head), to_tensor(q.view(np.uint8)), to_tensor(meta)
        )
    with pytest.raises(bg.ShapeError, match=r"x \[M, K\]"):
        _core.screened_argmax(to_tensor(h[0]), to_tensor(head), to_tensor(q), to_tensor(meta))
    two_rows = [to_tensor(np.vstack([h, h])), to_tensor(head), to_tensor(q), to_tensor(meta)]
    with pytest.raises(bg.ShapeError, match="out"):  # two rows: out [2], high [2, V]
        _core.screened_argmax(*two_rows, _poisoned((1,), np.int32))
    with pytest.raises(bg.ShapeError, match="high"):
        _core.screened_argmax(*two_rows, None, _poisoned((10,), np.float32))
    with pytest.raises(bg.ShapeError, match="head_q"):
        _core.screened_argmax(
            to_tensor(h), to_tensor(head), to_tensor(q[:, :8].copy()), to_tensor(meta)
        )
    odd = rng.standard_normal((10, 7)).astype(np.float16)
    q7, meta7 = screening_tables(odd)
    with pytest.raises(bg.ArgumentError, match="K % 4 == 0"):
        _core.screened_argmax(to_tensor(h[:, :7]), to_tensor(odd), to_tensor(q7), to_tensor(meta7))
    assert not _core.screened_argmax_fits(bg.default_device(), 7)
    assert not _core.screened_argmax_fits(bg.default_device(), 1 << 20)
    assert _core.screened_argmax_fits(bg.default_device(), 8, rows=64)
    assert not _core.screened_argmax_fits(bg.default_device(), 8, rows=0)
    with pytest.raises(bg.ShapeError):
        screening_tables(np.zeros((3, 4), np.int8))
    assert _screened(h, head).numpy()[0] == _float_head_argmax(h, head)  # still usable


def test_screening_tables_bound_the_int8_error():
    head = (rng.standard_normal((300, 100)) * rng.uniform(1e-3, 1e3, (300, 1))).astype(np.float32)
    head[7, :] = 0.0
    head[9, 4] = np.inf
    q, meta = screening_tables(head)
    assert q.shape == (300, 112) and q.dtype == np.int8 and not q[:, 100:].any()
    assert np.abs(q).max() <= 127
    e = head.astype(np.float64)
    error = np.linalg.norm(e - meta[:, :1].astype(np.float64) * q[:, :100], axis=1)
    finite = np.isfinite(e).all(axis=1)
    assert (meta[finite, 1] >= error[finite]).all() and (
        meta[finite, 1] <= 1.01 * error[finite] + 1e-30
    ).all()
    assert (meta[finite, 2] >= np.linalg.norm(e[finite], axis=1)).all()
    assert meta[7, 0] == 0 and meta[7, 1] == 0 and np.isinf(meta[9, 1:3]).all()
    q7, meta7 = screening_tables(head, chunk_rows=7)  # 43 chunks over the threads: the same tables
    np.testing.assert_array_equal(q7, q)
    np.testing.assert_array_equal(meta7, meta)
