"""Small NumPy calls repeated with one op, parameters, shapes and dtypes replay a recorded command
buffer _recorded_calls.py: the same values as the eager call, bit for bit, a fresh array for
every call, the same errors, and nothing recorded that a call cannot use."""

import gc
import threading

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import _recorded_calls as recorded_calls


# (name, call, inputs' shapes and dtype): each op that records, with awkward shapes.
CALLS = [
    ("relu", lambda x: bg.relu(x), [(7,)], np.float32),
    ("relu float16", lambda x: bg.relu(x), [(3, 5)], np.float16),
    ("leaky_relu 0.01", lambda x: bg.leaky_relu(x, 0.01), [(33,)], np.float32),
    ("leaky_relu 0.3", lambda x: bg.leaky_relu(x, 0.3), [(33,)], np.float32),
    ("gelu", lambda x: bg.gelu(x), [(2, 3, 7)], np.float32),
    ("gelu tanh", lambda x: bg.gelu(x, approximate="tanh"), [(2, 3, 7)], np.float32),
    ("silu_backward", lambda g, x: bg.silu_backward(g, x), [(9,), (9,)], np.float32),
    ("relu2_mul", lambda g, u: bg.relu2_mul(g, u), [(4, 6), (4, 6)], np.float32),
    ("silu_mul", lambda g, u: bg.silu_mul(g, u), [(4, 6), (4, 6)], np.float16),
    ("softmax_backward", lambda g, x: bg.softmax_backward(g, x), [(3, 11), (3, 11)], np.float32),
    ("relu_dropout seed 1", lambda x: bg.relu_dropout(x, 0.5, seed=1), [(65,)], np.float32),
    ("relu_dropout seed 2", lambda x: bg.relu_dropout(x, 0.5, seed=2), [(65,)], np.float32),
    ("softmax", lambda x: bg.softmax(x), [(3, 17)], np.float32),
    ("rms_norm", lambda x, w: bg.rms_norm(x, w, 1e-5), [(3, 17), (17,)], np.float32),
    ("layer_norm", lambda x, g, b: bg.layer_norm(x, g, b), [(2, 9), (9,), (9,)], np.float32),
]


def eager(call, *arrays):
    """The eager call's results: Tensors in never record."""
    tensors = [bg.Tensor.from_numpy(np.asarray(a)) for a in arrays]
    results = call(*tensors)
    if isinstance(results, tuple):
        return tuple(r.numpy() for r in results)
    return results.numpy()


@pytest.mark.parametrize("name, call, shapes, dtype", CALLS, ids=[c[0] for c in CALLS])
def test_repeated_calls_match_the_eager_call_and_return_fresh_arrays(
    rng, name, call, shapes, dtype
):
    recorded_calls.clear_all()
    results = []
    for _ in range(4):
        arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
        before = [a.copy() for a in arrays]
        y = call(*arrays)
        expected = eager(call, *arrays)
        assert y.dtype == expected.dtype and y.shape == expected.shape
        np.testing.assert_array_equal(y, expected)
        for a, b in zip(arrays, before):
            np.testing.assert_array_equal(a, b)  # the inputs are left alone
        assert y.flags.writeable and y.flags.c_contiguous
        results.append((y, y.copy()))
    for y, copy in results:  # a later call wrote none of the earlier results
        np.testing.assert_array_equal(y, copy)
    assert not any(np.shares_memory(a[0], b[0]) for a in results for b in results if a is not b)
    assert recorded_calls.recorded_count() == 1


def test_the_second_call_records_and_later_ones_replay(rng):
    recorded_calls.clear_all()
    x = rng.standard_normal(13).astype(np.float32)
    bg.relu(x)
    assert recorded_calls.recorded_count() == 0  # the first call of a key runs eagerly
    y = bg.relu(x)
    assert recorded_calls.recorded_count() == 1
    x2 = -x
    z = bg.relu(x2)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(z, np.maximum(x2, 0))
    y[:] = 5  # the caller's own array: the next call is unaffected
    np.testing.assert_array_equal(bg.relu(x), np.maximum(x, 0))
    assert recorded_calls.recorded_count() == 1
    for _ in range(2):
        bg.relu(x[:7].copy())  # another shape: a key of its own
    assert recorded_calls.recorded_count() == 2


def test_a_hot_key_outlives_a_stream_of_other_keys(rng):
    """More keys than the cache holds pass between two calls of a hot key: each call makes it the
    most recently used, so it is never dropped, recorded once and replayed every time."""
    recorded_calls.clear_all()
    x = rng.standard_normal(13).astype(np.float32)
    for n in range(2 * recorded_calls.CAPACITY):
        np.testing.assert_array_equal(bg.relu(x), np.maximum(x, 0))
        bg.relu(rng.standard_normal(n + 20).astype(np.float32))  # a new key each time
    assert recorded_calls.recordings_made() == 1 and recorded_calls.recorded_count() == 1


def test_bitlinear_repeats_match_the_eager_call(rng):
    w = bg.quantize_weights(rng.standard_normal((37, 50)).astype(np.float32))
    recorded_calls.clear_all()
    for _ in range(3):
        x = rng.standard_normal((3, 50)).astype(np.float32)
        bias = rng.standard_normal(37)  # float64: cast to float32 as the eager call casts it
        bias32 = bias.astype(np.float32)
        np.testing.assert_array_equal(bg.bitlinear(x, w), eager(lambda a: bg.bitlinear(a, w), x))
        y, acc = bg.bitlinear(x, w, return_accumulator=True)
        y_e, acc_e = eager(lambda a: bg.bitlinear(a, w, return_accumulator=True), x)
        np.testing.assert_array_equal(y, y_e)
        np.testing.assert_array_equal(acc, acc_e)
        q, gamma = w.unpack(), w.scale
        np.testing.assert_array_equal(acc, bg.reference.bitlinear(x, q, gamma)[1])
        np.testing.assert_array_equal(
            bg.bitlinear(x, w, bias), eager(lambda a, b: bg.bitlinear(a, w, b), x, bias32)
        )
        x16 = x.astype(np.float16)
        np.testing.assert_array_equal(
            bg.bitlinear(x16, w), eager(lambda a: bg.bitlinear(a, w), x16)
        )
    assert recorded_calls.recorded_count() == 4


def test_collected_weights_drop_their_calls_and_never_serve_new_ones(rng):
    recorded_calls.clear_all()
    x = rng.standard_normal((2, 40)).astype(np.float32)
    for _ in range(5):  # new weights of one shape, each called twice: each its own recording
        w = bg.quantize_weights(rng.standard_normal((24, 40)).astype(np.float32))
        for _ in range(2):
            np.testing.assert_array_equal(
                bg.bitlinear(x, w), eager(lambda a, w=w: bg.bitlinear(a, w), x)
            )
        del w
        gc.collect()
    bg.relu(x)  # a call drops what collected weights recorded
    assert recorded_calls.recorded_count() == 0


@pytest.mark.parametrize("make", ["nan", "dtype", "shape"])
def test_errors_are_the_eager_calls_on_every_repeat(rng, make):
    w = bg.quantize_weights(rng.standard_normal((16, 32)).astype(np.float32))
    x = rng.standard_normal((2, 32)).astype(np.float32)
    bg.bitlinear(x, w), bg.bitlinear(x, w)  # recorded
    if make == "nan":
        x[1, 3] = np.nan
        error, match = bg.ArgumentError, "1 NaN or Inf"
    elif make == "dtype":
        x = x.astype(np.float64)
        error, match = bg.DTypeError, "float64"
    else:
        x = x[:, :31].copy()
        error, match = bg.ShapeError, None
    for _ in range(4):
        with pytest.raises(error, match=match):
            bg.bitlinear(x, w)
    good = rng.standard_normal((2, 32)).astype(np.float32)
    np.testing.assert_array_equal(bg.bitlinear(good, w), eager(lambda a: bg.bitlinear(a, w), good))


def test_large_views_and_tensors_are_not_recorded(rng, device):
    recorded_calls.clear_all()
    big = rng.standard_normal(recorded_calls.MOST_BYTES // 4 + 1).astype(np.float32)
    strided = rng.standard_normal(20).astype(np.float32)[::2]
    t = bg.Tensor.from_numpy(strided.copy())
    for _ in range(3):
        np.testing.assert_array_equal(bg.relu(big), np.maximum(big, 0))
        np.testing.assert_array_equal(bg.relu(strided), np.maximum(strided, 0))
        assert isinstance(bg.relu(t), bg.Tensor)
    assert recorded_calls.recorded_count() == 0


def test_inside_a_graph_calls_record_into_it(rng):
    x = rng.standard_normal(6).astype(np.float32)
    bg.relu(x), bg.relu(x)  # recorded outside
    g = bg.Graph()
    with g:
        y = bg.relu(x)
        g.output("y", y)
    assert isinstance(y, bg.Tensor)
    np.testing.assert_array_equal(g.run(numpy=True)["y"], np.maximum(x, 0))


def test_the_knob_off_drops_recorded_calls_and_runs_eagerly(rng, tune):
    x = rng.standard_normal(5).astype(np.float32)
    bg.relu(x), bg.relu(x)
    assert recorded_calls.recorded_count() >= 1
    tune(recorded_calls=False)
    assert recorded_calls.recorded_count() == 0
    for _ in range(3):
        np.testing.assert_array_equal(bg.relu(x), np.maximum(x, 0))
    assert recorded_calls.recorded_count() == 0


def test_threads_calling_one_key_each_get_their_own_results(rng):
    inputs = [rng.standard_normal((8, 9)).astype(np.float32) for _ in range(8)]
    wrong, errors = [], []

    def work(x):
        try:
            for _ in range(25):
                y = bg.relu(x)
                if not np.array_equal(y, np.maximum(x, 0)):
                    wrong.append(1)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(repr(error))

    threads = [threading.Thread(target=work, args=(x,)) for x in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and not wrong and not any(t.is_alive() for t in threads)


def test_parameters_are_part_of_the_key(rng):
    x = rng.standard_normal(40).astype(np.float32)
    for _ in range(3):
        for alpha in (0.01, 0.3):
            np.testing.assert_array_equal(
                bg.leaky_relu(x, alpha), eager(lambda a, alpha=alpha: bg.leaky_relu(a, alpha), x)
            )
        for seed in (1, 2):
            np.testing.assert_array_equal(
                bg.relu_dropout(x, 0.5, seed=seed),
                eager(lambda a, seed=seed: bg.relu_dropout(a, 0.5, seed=seed), x),
            )
        for p in (0.25, 0.75):
            np.testing.assert_array_equal(
                bg.relu_dropout(x, p, seed=1),
                eager(lambda a, p=p: bg.relu_dropout(a, p, seed=1), x),
            )
        np.testing.assert_array_equal(
            bg.gelu(x, approximate="tanh"), eager(lambda a: bg.gelu(a, approximate="tanh"), x)
        )
        np.testing.assert_array_equal(bg.gelu(x), eager(bg.gelu, x))


def test_softmax_over_another_axis_records_its_moved_rows(rng):
    recorded_calls.clear_all()
    for _ in range(3):
        x = rng.standard_normal((5, 4)).astype(np.float16)
        moved = bg.Tensor.from_numpy(np.ascontiguousarray(x.T))
        np.testing.assert_array_equal(bg.softmax(x, axis=0), bg.softmax(moved).numpy().T)
    assert recorded_calls.recorded_count() == 1
