"""bitnet_gpu.sample_logits (shaders/model/sample_rows.comp): parity with reference.sample_rows,
the distribution it draws from, and its errors."""

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import _core, reference
from bitnet_gpu.graph import Graph
from bitnet_gpu.ops import _sampling_params
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
    bg.sample_logits(bg.Tensor.from_numpy(logits), temperature, top_k, seed=seed, step=step, out=out)
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
    many = rng.standard_normal((130, 33)).astype(np.float32)
    drawn = bg.sample_logits(many, 1.5, top_k and 5, seed=12, step=4)
    assert drawn.shape == (130,) and drawn.dtype == np.int32
    assert check_draws(many, drawn, 1.5, top_k and 5, 12, 4) <= 1


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
    by_step = np.concatenate([bg.sample_logits(np.tile(x, (1, 1)), t, k, seed=seed, step=s) for s in range(400)])
    for draws in (by_row, by_step):
        counts = np.bincount(draws, minlength=x.size)
        assert counts[~kept].sum() == 0
        sigma = np.sqrt(draws.size * p * (1 - p))
        assert np.all(np.abs(counts - draws.size * p) <= 5.5 * sigma + 1e-9), (counts, draws.size * p)
    # independence of consecutive steps of one row, over 4000 steps
    steps = np.concatenate([bg.sample_logits(np.tile(x, (10, 1)), t, k, seed=seed + 1, step=s)[None]
                            for s in range(400)]).T.reshape(-1)
    first = steps[:-1] == 0
    both = np.mean(first & (steps[1:] == 0))
    assert abs(both - p[0] ** 2) <= 5.5 * np.sqrt(p[0] ** 2 * (1 - p[0] ** 2) / first.size)


def test_ties_infinities_and_the_first_largest():
    x = np.array([[5, 5, 5, 1],                     # top_k 1 keeps the three tied values
                  [-np.inf, 3, np.inf, np.inf],      # +inf wins: the first of them
                  [-np.inf, -np.inf, -np.inf, -np.inf],  # every kept value -inf: the first
                  [-np.inf, 0, -np.inf, -0.0]], np.float32)  # -inf never drawn; -0 and 0 tie
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
        params = graph.input("params", (5,), np.uint32)
        start = graph.input("start", (1,), np.int32)
        graph.output("ids", _core.sample_rows(x_in, params, start, 2))
    for temperature, top_k, seed, step in [(1.0, 10, 1, 0), (0.5, None, 2**40 + 3, 77), (3.0, 1, 9, 5)]:
        got = graph.run(x=logits, params=_sampling_params(temperature, top_k, seed, 300),
                        start=np.array([step], np.int32), numpy=True)["ids"]
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
    for bad, error in [(good.astype(np.float64), bg.DTypeError), (good.astype(np.float16), bg.DTypeError),
                       (np.zeros((2, 0), np.float32), bg.ShapeError), (np.float32(1.0), bg.ShapeError)]:
        with pytest.raises(error):
            bg.sample_logits(bad, 1.0)
    assert bg.sample_logits(np.zeros((0, 5), np.float32), 1.0).shape == (0,)
    for kwargs, error in [({"temperature": -1.0}, bg.ArgumentError), ({"temperature": float("nan")}, bg.ArgumentError),
                          ({"temperature": float("inf")}, bg.ArgumentError), ({"temperature": 1e38}, bg.ArgumentError),
                          ({"temperature": "1"}, TypeError), ({"top_k": 0}, bg.ArgumentError),
                          ({"top_k": 2.5}, TypeError), ({"seed": -1}, bg.ArgumentError),
                          ({"step": 2**32}, bg.ArgumentError), ({"step": -1}, bg.ArgumentError)]:
        with pytest.raises(error):
            bg.sample_logits(good, **{"temperature": 1.0, **kwargs})
    assert check_draws(good, bg.sample_logits(good, 1.0, 5, seed=4), 1.0, 5, 4, 0) <= 1
