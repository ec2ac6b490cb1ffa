"""bitnet_gpu.sample_logits (shaders/sampling/sample_rows.comp, sample_nucleus.comp for top-p):
parity with reference.sample_rows, the distribution it draws from, and its errors."""

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import _core, reference
from bitnet_gpu.graph import Graph
from bitnet_gpu.sampling import sampling_params, sampling_rows
from conftest import check_draws


def _poisoned(shape):
    return bg.Tensor.from_numpy(np.full(shape, -7, np.int32))


@pytest.mark.parametrize("n", [1, 7, 33, 1000, 4097])
@pytest.mark.parametrize("top_k", [None, 1, 3, 50])
@pytest.mark.parametrize("temperature", [0.0, 0.3, 1.0, 4.0])
def test_draws_are_the_references(rng, n, top_k, temperature):
    logits = (rng.standard_normal((5, n)) * rng.uniform(0.5, 8)).astype(np.float32)
    seed, step = int(rng.integers(0, 2**64, dtype=np.uint64)), int(rng.integers(0, 2**32))
    out = _poisoned((5,))
    bg.sample_logits(
        bg.Tensor.from_numpy(logits), temperature, top_k, seed=seed, step=step, out=out
    )
    assert check_draws(logits, out.numpy(), temperature, top_k, seed, step) <= 1
    if temperature == 0 or top_k == 1:
        np.testing.assert_array_equal(out.numpy(), logits.argmax(axis=1))


@pytest.mark.parametrize("top_k", [None, 50])
def test_draws_over_a_large_vocabulary_and_many_rows(rng, top_k):
    """128256 values (the 2B4T vocabulary: 126 chunks a row); 130 rows, which the op takes in
    blocks of 64 (each row keyed by its index in the whole array)."""
    wide = (rng.standard_normal((3, 128256)) * 3).astype(np.float32)
    drawn = bg.sample_logits(wide, 0.8, top_k, seed=11, step=3)
    assert check_draws(wide, drawn, 0.8, top_k, 11, 3) <= 1
    drawn = bg.sample_logits(wide, 0.8, top_k, 0.9, seed=11, step=3)
    assert check_draws(wide, drawn, 0.8, top_k, 11, 3, 0.9) <= 1
    many = rng.standard_normal((130, 33)).astype(np.float32)
    drawn = bg.sample_logits(many, 1.5, top_k and 5, seed=12, step=4)
    assert drawn.shape == (130,) and drawn.dtype == np.int32
    assert check_draws(many, drawn, 1.5, top_k and 5, 12, 4) <= 1


def test_draws_without_top_k_take_many_rows_at_once(rng):
    """Without top_k (and top_p) the draw alone runs, up to 65472 rows a dispatch: 65600 rows of 5
    values cross a block, and each row is keyed by its index in the whole array."""
    x = rng.standard_normal((65600, 5)).astype(np.float32)
    assert check_draws(x, bg.sample_logits(x, 1.3, seed=21, step=2), 1.3, None, 21, 2) <= 3


def test_draws_follow_the_softmax_of_the_kept_values(rng):
    """20000 rows of one logit vector (each row keyed apart) and 20000 steps of one row: each
    index's frequency within 5.5 binomial standard deviations of softmax(x / t) over the values at
    least the 4th largest (two values tie there: both kept), none of the others ever drawn, and
    consecutive steps drawn independently (the pair frequencies)."""
    x = np.array([2.0, -np.inf, 0.5, 1.0, 1.0, -3.0, 0.8, 1.7], np.float32)
    t, k = 0.7, 4  # kept: 2.0, 1.7, 1.0, 1.0
    kept = x >= 1.0
    p = np.where(kept, np.exp((x.astype(np.float64) - 2.0) / t), 0.0)
    p /= p.sum()
    seed = int(rng.integers(0, 2**63))
    by_row = bg.sample_logits(np.tile(x, (20000, 1)), t, k, seed=seed, step=5)
    by_step = np.concatenate(
        [bg.sample_logits(np.tile(x, (1, 1)), t, k, seed=seed, step=s) for s in range(400)]
    )
    for draws in (by_row, by_step):
        counts = np.bincount(draws, minlength=x.size)
        assert counts[~kept].sum() == 0
        sigma = np.sqrt(draws.size * p * (1 - p))
        assert np.all(np.abs(counts - draws.size * p) <= 5.5 * sigma + 1e-9), (
            counts,
            draws.size * p,
        )
    # independence of consecutive steps of one row, over 4000 steps
    steps = np.concatenate(
        [
            bg.sample_logits(np.tile(x, (10, 1)), t, k, seed=seed + 1, step=s)[None]
            for s in range(400)
        ]
    ).T.reshape(-1)
    first = steps[:-1] == 0
    both = np.mean(first & (steps[1:] == 0))
    assert abs(both - p[0] ** 2) <= 5.5 * np.sqrt(p[0] ** 2 * (1 - p[0] ** 2) / first.size)


def test_ties_infinities_and_the_first_largest():
    x = np.array(
        [
            [5, 5, 5, 1],  # top_k 1 keeps the three tied values
            [-np.inf, 3, np.inf, np.inf],  # +inf wins: the first of them
            [-np.inf, -np.inf, -np.inf, -np.inf],  # every kept value -inf: the first
            [-np.inf, 0, -np.inf, -0.0],
        ],
        np.float32,
    )  # -inf never drawn; -0 and 0 tie
    draws = np.stack([bg.sample_logits(x, 2.0, 1, step=s) for s in range(64)])
    assert set(draws[:, 0]) == {0, 1, 2}
    assert set(draws[:, 1]) == {2} and set(draws[:, 2]) == {0} and set(draws[:, 3]) == {1, 3}
    for top_k in (None, 2):
        np.testing.assert_array_equal(bg.sample_logits(x, 0.0, top_k), [0, 2, 0, 1])
    # as large as float32 goes, and temperatures far apart
    big = np.array([[3e38, -3e38, 1e-45, 0.0]], np.float32)
    assert bg.sample_logits(big, 1e37, step=1).shape == (1,)
    assert int(bg.sample_logits(big, 1e-30)[0]) == 0


def test_shapes_tensors_out_and_graphs(device, rng):
    x = rng.standard_normal((2, 3, 17)).astype(np.float32)
    drawn = bg.sample_logits(x, 1.0, 5, seed=3, step=8)
    assert drawn.shape == (2, 3) and drawn.dtype == np.int32
    assert check_draws(x, drawn, 1.0, 5, 3, 8) <= 1
    one = bg.sample_logits(x[0, 0], 1.0, 5, seed=3, step=8)
    assert one.shape == () and int(one) == drawn[0, 0]
    t = bg.sample_logits(bg.Tensor.from_numpy(x), 1.0, 5, seed=3, step=8)
    assert isinstance(t, bg.Tensor)
    np.testing.assert_array_equal(t.numpy(), drawn)
    target = np.full((2, 3), -9, np.int32)
    assert bg.sample_logits(x, 1.0, 5, seed=3, step=8, out=target) is target
    np.testing.assert_array_equal(target, drawn)
    with pytest.raises(bg.ShapeError):
        bg.sample_logits(x, 1.0, out=np.zeros(6, np.int32))
    with pytest.raises(bg.ShapeError, match=r"expected shape \(2, 3\)"):
        bg.sample_logits(x, 1.0, out=bg.Tensor.from_numpy(np.zeros(6, np.int32)))
    tensor_target = bg.Tensor.from_numpy(np.zeros((2, 3), np.int32))
    assert bg.sample_logits(x, 1.0, 5, seed=3, step=8, out=tensor_target) is tensor_target
    np.testing.assert_array_equal(tensor_target.numpy(), drawn)
    with pytest.raises(bg.DTypeError):
        bg.sample_logits(x, 1.0, out=np.zeros((2, 3), np.int64))
    # In a graph: the parameters and the step are inputs, a replay draws with new ones.
    logits = rng.standard_normal((4, 300)).astype(np.float32)
    graph = Graph(device)
    with graph:
        x_in = graph.input("x", logits.shape)
        params = graph.input("params", (6,), np.uint32)
        start = graph.input("start", (1,), np.int32)
        graph.output("ids", _core.sample_rows(x_in, params, start, 2))
    for temperature, top_k, seed, step in [
        (1.0, 10, 1, 0),
        (0.5, None, 2**40 + 3, 77),
        (3.0, 1, 9, 5),
    ]:
        got = graph.run(
            x=logits,
            params=sampling_params(temperature, top_k, seed, 300),
            start=np.array([step], np.int32),
            numpy=True,
        )["ids"]
        assert check_draws(logits, got, temperature, top_k, seed, step + 2) <= 1


def test_errors_leave_the_device_usable(rng):
    x = rng.standard_normal((3, 40)).astype(np.float32)
    x[1, 7] = np.nan
    x[1, 9] = np.nan
    out = _poisoned((3,))
    with pytest.raises(bg.ArgumentError, match="2 NaN values"):
        bg.sample_logits(bg.Tensor.from_numpy(x), 1.0, 5, out=out)
    assert out.numpy()[1] == -1  # the row holding them; the others drawn
    assert check_draws(x, out.numpy(), 1.0, 5, 0, 0) <= 1
    target = np.full(3, -9, np.int32)
    with pytest.raises(bg.ArgumentError, match="NaN"):
        bg.sample_logits(x, 1.0, out=target)
    np.testing.assert_array_equal(target, -9)  # a NumPy target is left as it was
    good = np.nan_to_num(x)
    for bad, error in [
        (good.astype(np.float64), bg.DTypeError),
        (good.astype(np.float16), bg.DTypeError),
        (np.zeros((2, 0), np.float32), bg.ShapeError),
        (np.float32(1.0), bg.ShapeError),
    ]:
        with pytest.raises(error):
            bg.sample_logits(bad, 1.0)
    assert bg.sample_logits(np.zeros((0, 5), np.float32), 1.0).shape == (0,)
    for kwargs, error in [
        ({"temperature": -1.0}, bg.ArgumentError),
        ({"temperature": float("nan")}, bg.ArgumentError),
        ({"temperature": float("inf")}, bg.ArgumentError),
        ({"temperature": 1e38}, bg.ArgumentError),
        ({"temperature": "1"}, TypeError),
        ({"top_k": 0}, bg.ArgumentError),
        ({"top_k": 2.5}, TypeError),
        ({"seed": -1}, bg.ArgumentError),
        ({"step": 2**32}, bg.ArgumentError),
        ({"step": -1}, bg.ArgumentError),
        ({"top_p": 0}, bg.ArgumentError),
        ({"top_p": -0.5}, bg.ArgumentError),
        ({"top_p": 1.5}, bg.ArgumentError),
        ({"top_p": float("nan")}, bg.ArgumentError),
        ({"top_p": "0.5"}, TypeError),
        ({"top_p": True}, TypeError),
    ]:
        with pytest.raises(error):
            bg.sample_logits(good, **{"temperature": 1.0, **kwargs})
    assert check_draws(good, bg.sample_logits(good, 1.0, 5, seed=4), 1.0, 5, 4, 0) <= 1


needs_int64_atomics = pytest.mark.skipif(
    not bg.default_device().info.features["int64_atomics"],
    reason="top-p needs 64-bit integer atomics",
)


@needs_int64_atomics
@pytest.mark.parametrize("n", [1, 7, 33, 1000, 4097])
@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_draws_are_the_references(rng, n, top_p):
    for temperature, top_k in [
        (0.3, None),
        (1.0, 50),
        (4.0, 3),
        (float(rng.uniform(0.1, 3)), None),
    ]:
        logits = (rng.standard_normal((5, n)) * rng.uniform(0.5, 8)).astype(np.float32)
        seed, step = int(rng.integers(0, 2**64, dtype=np.uint64)), int(rng.integers(0, 2**32))
        out = _poisoned((5,))
        bg.sample_logits(
            bg.Tensor.from_numpy(logits), temperature, top_k, top_p, seed=seed, step=step, out=out
        )
        assert check_draws(logits, out.numpy(), temperature, top_k, seed, step, top_p) <= 1


def _nucleus_by_sorting(row, top_k, top_p, temperature):
    """The kept mask by the definition, in float64 without fixed point: sort the top_k values from
    the largest; keep each whose larger values (strictly larger: ties go together) hold less than
    top_p of softmax(row / t) over them. Also how close the rule came (relative to top_p)."""
    x = row.astype(np.float64)
    kept = reference.sampling_kept(row, top_k)  # top_k alone
    weights = np.where(kept, np.exp((x - x[kept].max()) / temperature), 0.0)
    share = np.array([weights[kept & (x > v)].sum() for v in x]) / weights.sum()
    inside = kept & (share < top_p)
    closeness = np.abs(share[kept] - top_p).min() / top_p
    return inside, closeness


@pytest.mark.parametrize("trial", range(6))
def test_top_p_reference_keeps_the_nucleus(rng, trial):
    """reference.sampling_kept's top-p (fixed-point weights, exact integer rule) keeps what the
    rule written plainly in float64 keeps, away from its boundary; with repeated values, ties go
    together."""
    n = [5, 40, 300][trial % 3]
    row = (rng.standard_normal(n) * rng.uniform(0.5, 5)).astype(np.float32)
    if trial >= 3:
        row = np.round(row)  # many ties
    for top_p, top_k, t in [(0.3, None, 1.0), (0.8, 20, 0.5), (0.95, None, 2.0), (0.999, 7, 1.3)]:
        want, closeness = _nucleus_by_sorting(row, top_k, top_p, t)
        if closeness < 1e-4:
            continue
        got = reference.sampling_kept(row, top_k, top_p, t)
        np.testing.assert_array_equal(got, want)
        assert got[row.argmax()]
        for v in row[got]:
            assert got[row == v].all()


@needs_int64_atomics
def test_top_p_draws_follow_the_renormalized_softmax(rng):
    """20000 rows of one logit vector: top-p 0.8 at t = 0.8 keeps 2.0, 1.7 and both 1.0 (the
    share above the tied 1.0s is 0.73, above -0.5 it is 0.97), whose frequencies lie within 5.5
    binomial standard deviations of softmax(x / t) renormalized over them; no other is drawn."""
    x = np.array([2.0, -np.inf, -0.5, 1.0, 1.0, -3.0, -1.2, 1.7], np.float32)
    t, top_p = 0.8, 0.8
    kept = x >= 1.0
    np.testing.assert_array_equal(reference.sampling_kept(x, None, top_p, t), kept)
    p = np.where(kept, np.exp((x.astype(np.float64) - 2.0) / t), 0.0)
    p /= p.sum()
    draws = bg.sample_logits(
        np.tile(x, (20000, 1)), t, None, top_p, seed=int(rng.integers(0, 2**63)), step=1
    )
    counts = np.bincount(draws, minlength=x.size)
    assert counts[~kept].sum() == 0
    sigma = np.sqrt(draws.size * p * (1 - p))
    assert np.all(np.abs(counts - draws.size * p) <= 5.5 * sigma + 1e-9), (counts, draws.size * p)


@needs_int64_atomics
def test_top_p_edges(device, rng):
    x = np.array(
        [
            [5, 5, 1, 0],  # the tied largest values kept together
            [-np.inf, 3, np.inf, np.inf],  # an infinite largest value: top-p keeps all
            [-np.inf, -np.inf, -np.inf, -np.inf],
            [-np.inf, 0, -np.inf, -0.0],
        ],
        np.float32,
    )
    draws = np.stack([bg.sample_logits(x, 1.0, None, 1e-6, step=s) for s in range(64)])
    assert set(draws[:, 0]) == {0, 1}
    assert set(draws[:, 1]) == {2} and set(draws[:, 2]) == {0} and set(draws[:, 3]) == {1, 3}
    np.testing.assert_array_equal(bg.sample_logits(x, 0.0, None, 0.5), [0, 2, 0, 1])  # argmax
    logits = (rng.standard_normal((6, 500)) * 2).astype(np.float32)
    # top_p 1 is no top-p; top_k 1 leaves nothing for top-p to drop; a tiny top_p keeps the largest
    np.testing.assert_array_equal(
        bg.sample_logits(logits, 1.3, 9, 1.0, seed=2, step=4),
        bg.sample_logits(logits, 1.3, 9, None, seed=2, step=4),
    )
    np.testing.assert_array_equal(
        bg.sample_logits(logits, 3.0, 1, 0.9, seed=2), logits.argmax(axis=1)
    )
    np.testing.assert_array_equal(
        bg.sample_logits(logits, 3.0, None, 1e-9, seed=2), logits.argmax(axis=1)
    )
    # large values and extreme temperatures: weights underflow to 0, never overflow
    big = np.array([[3e38, -3e38, 1e-45, 0.0, 3e38]], np.float32)
    assert int(bg.sample_logits(big, 1e37, None, 0.5, step=1)[0]) in (0, 4)
    assert set(bg.sample_logits(np.tile(big, (50, 1)), 1e-30, None, 0.99)) <= {0, 4}
    # equal values: all of them kept together, whatever top_p
    flat = np.full((1, 300), 2.5, np.float32)
    assert len(set(int(bg.sample_logits(flat, 1.0, None, 0.01, step=s)[0]) for s in range(40))) > 20
    # a NumPy float32 top_p, Tensors in and out
    target = _poisoned((6,))
    assert (
        bg.sample_logits(
            bg.Tensor.from_numpy(logits), 1.0, None, np.float32(0.5), seed=6, out=target
        )
        is target
    )
    assert check_draws(logits, target.numpy(), 1.0, None, 6, 0, float(np.float32(0.5))) <= 1
    # NaN raises (its row gets -1, the others their draws); the device stays usable
    bad = logits.copy()
    bad[2, 3] = np.nan
    target = _poisoned((6,))
    with pytest.raises(bg.ArgumentError, match="1 NaN value"):
        bg.sample_logits(bg.Tensor.from_numpy(bad), 1.0, None, 0.9, seed=3, out=target)
    assert target.numpy()[2] == -1
    assert check_draws(bad, target.numpy(), 1.0, None, 3, 0, 0.9) <= 1
    assert (
        check_draws(logits, bg.sample_logits(logits, 1.0, None, 0.9, seed=3), 1.0, None, 3, 0, 0.9)
        <= 1
    )


@needs_int64_atomics
def test_top_p_in_a_graph(device, rng):
    """One graph recorded with the nucleus passes replays with new temperatures, top_k, top_p (0:
    none) and steps: every replay starts from the scratch the one before reset."""
    logits = rng.standard_normal((3, 2000)).astype(np.float32) * 3
    graph = Graph(device)
    with graph:
        x_in = graph.input("x", logits.shape)
        params = graph.input("params", (6,), np.uint32)
        start = graph.input("start", (1,), np.int32)
        graph.output("ids", _core.sample_rows(x_in, params, start, 1, None, True))
    for temperature, top_k, top_p, step in [
        (1.0, None, 0.9, 0),
        (0.5, 100, 0.3, 7),
        (2.0, None, None, 3),
        (1.0, None, 0.9, 0),
        (0.0, None, 0.5, 2),
        (4.0, 10, 0.999, 9),
    ]:
        got = graph.run(
            x=logits,
            params=sampling_params(temperature, top_k, 5, 2000, top_p),
            start=np.array([step], np.int32),
            numpy=True,
        )["ids"]
        assert check_draws(logits, got, temperature, top_k, 5, step + 1, top_p) <= 1


@pytest.mark.parametrize("rows", [1, 5, 70])
def test_each_row_its_own_parameters(device, rng, rows):
    """params [M, 8] (sampling.sampling_rows): each row drawn with its own temperature (0 among
    them: the argmax), top_k, top_p, seed and key row, as that row alone would be drawn with those
    (reference.sample_rows keyed by its key row), in one call; across blocks of 64 rows too."""
    if not device.info.features["int64_atomics"]:
        pytest.skip("top-p needs 64-bit integer atomics")
    n = 777
    logits = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    settings = []
    for r in range(rows):
        temperature = [0.0, 0.4, 1.0, 2.5][r % 4]
        top_k = [None, 5, None, 40][(r // 2) % 4]
        top_p = [None, 0.9, 0.5][r % 3]
        seed, key = int(rng.integers(0, 2**63)), int(rng.integers(0, 8))
        settings.append((temperature, top_k, top_p, seed, key))
    params = sampling_rows(
        [sampling_params(t, k, s, n, p) for t, k, p, s, _ in settings], [c[4] for c in settings]
    )
    start = bg.Tensor.from_numpy(np.full(rows, 9, np.int32))
    drawn = _core.sample_rows(
        bg.Tensor.from_numpy(logits), bg.Tensor.from_numpy(params), start, 0, None, True, True
    ).numpy()
    differed = 0
    for r, (t, k, p, s, key) in enumerate(settings):
        # Its asserts: the reference's draw, or a near tie of two kept scores (a kept index).
        differed += check_draws(logits[r : r + 1], drawn[r : r + 1], t, k, s, 9, p, key)
        if t == 0:
            assert drawn[r] == logits[r].argmax()
    assert differed <= max(1, rows // 20)


def test_eager_draws_share_scratch_that_stays_zero(device, rng):
    """An eager draw's self-resetting counters (the top-k bins, tickets, the nucleus's masses) come
    from the device's scratch pool, zero since it was made, so a call records no fill: the same
    draws call after call, across shapes, after calls that raised on NaN, and from two threads at
    once (each draw holding its own block)."""
    import concurrent.futures

    cases = []
    for rows, n in [(3, 40), (7, 1000), (2, 4097), (5, 33)]:
        logits = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
        cases.append((logits, 0.7, 5, 0.9, int(rng.integers(0, 2**32))))
        cases.append((logits, 1.2, 20, None, int(rng.integers(0, 2**32))))

    def draw(case):
        logits, temperature, top_k, top_p, seed = case
        return bg.sample_logits(logits, temperature, top_k, top_p, seed=seed, step=1)

    first = [draw(case) for case in cases]
    for (logits, temperature, top_k, top_p, seed), drawn in zip(cases, first):
        assert check_draws(logits, drawn, temperature, top_k, seed, 1, top_p) <= 1
    bad = cases[2][0].copy()
    bad[1, 5] = np.nan
    for _ in range(2):
        with pytest.raises(bg.ArgumentError, match="NaN"):
            bg.sample_logits(bad, 0.7, 5, 0.9, seed=3, step=1)
        for case, drawn in zip(cases, first):
            np.testing.assert_array_equal(draw(case), drawn)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for i, drawn in enumerate(pool.map(draw, cases * 6)):
            np.testing.assert_array_equal(drawn, first[i % len(cases)])
    with bg.profile(device) as profile:
        draw(cases[0])
    labels = [label for label, _ in profile.timings]
    assert "fill" not in labels and any("sample" in label for label in labels), labels
