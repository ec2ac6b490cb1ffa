"""Recorded graphs: ops recorded once, replayed with new inputs in one submission."""

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import reference


def _poison(t):
    t.copy_from(
        np.full(t.shape, np.nan, t.dtype)
        if np.dtype(t.dtype).kind == "f"
        else np.full(t.shape, -7, t.dtype)
    )


def _norm_linear_graph(rng, device, m, k, n):
    w = rng.standard_normal((n, k)).astype(np.float32)
    weights = bg.quantize_weights(w, device=device)
    norm_w = rng.uniform(0.5, 1.5, k).astype(np.float32)
    g = device.graph()
    with g:
        x = g.input("x", (m, k))
        h = bg.rms_norm(x, norm_w, 1e-5)
        y = bg.bitlinear(h, weights)
        z = bg.add(y, 1.5)
        g.output("y", y)
        g.output("z", z)
    return g, weights, norm_w


@pytest.mark.parametrize("m,k,n", [(1, 7, 33), (3, 64, 17), (8, 4097, 5)])
def test_replay_with_new_inputs_matches_reference(m, k, n, rng):
    device = bg.default_device()
    g, weights, norm_w = _norm_linear_graph(rng, device, m, k, n)
    q, gamma = weights.unpack(), float(np.asarray(weights.scale).reshape(-1)[0])
    for _ in range(3):  # every run takes fresh data and overwrites poisoned outputs
        x = rng.standard_normal((m, k)).astype(np.float32) * 3
        for t in g.outputs.values():
            _poison(t)
        out = g.run(x=x, numpy=True)
        # A replay computes exactly what the same ops compute when run one by one ...
        h = bg.rms_norm(x, norm_w, 1e-5)
        np.testing.assert_array_equal(out["y"], bg.bitlinear(h, weights))
        np.testing.assert_array_equal(out["z"], bg.add(bg.bitlinear(h, weights), 1.5))
        # ... which is the reference's.
        np.testing.assert_allclose(h, reference.rms_norm(x, norm_w, 1e-5), rtol=1e-5, atol=1e-6)
        y_ref, _ = reference.bitlinear(h, q, gamma)
        assert np.linalg.norm(out["y"] - y_ref) <= 1e-5 * np.linalg.norm(y_ref) + 1e-6


def test_graph_outputs_are_tensors_and_inputs_keep_their_last_value():
    device = bg.default_device()
    g = bg.Graph(device)
    with g:
        a = g.input("a", (5,), value=np.arange(5, dtype=np.float32))
        b = g.input("b", 5)
        y = bg.mul(a, b)
        assert isinstance(y, bg.Tensor)  # values exist only once the graph runs
        g.output("y", y)
    out = g.run(b=np.full(5, 2, np.float32))
    assert isinstance(out["y"], bg.Tensor)
    np.testing.assert_array_equal(out["y"].numpy(), np.arange(5) * 2)
    out = g.run({"b": np.full(5, 3, np.float32)})  # a keeps its value
    np.testing.assert_array_equal(out["y"].numpy(), np.arange(5) * 3)
    g.run(a=bg.Tensor.from_numpy(np.ones(5, np.float32)))  # a Tensor input is copied on the device
    np.testing.assert_array_equal(g.outputs["y"].numpy(), np.full(5, 3))


def test_numpy_operands_are_captured_when_recorded():
    device = bg.default_device()
    g = device.graph()
    constant = np.arange(4, dtype=np.float32)
    with g:
        x = g.input("x", (4,))
        y = bg.add(x, constant)
        g.output("y", y)
    constant[:] = 100  # recorded as it was
    out = g.run(x=np.ones(4, np.float32), numpy=True)
    np.testing.assert_array_equal(out["y"], np.arange(4) + 1)


def test_one_graph_records_many_ops_and_user_kernels(rng):
    device = bg.default_device()
    kernel = bg.builtin_kernel("axpy", device)
    g = bg.Graph(device, timings=device.info.timestamp_period_ns > 0)
    with g:
        x = g.input("x", (1000,))
        y = g.input("y", (1000,))
        kernel.dispatch(
            (4, 1, 1),
            [x, y],
            np.array([1000, 0], np.uint32).tobytes()[:4] + np.array([2.0], np.float32).tobytes(),
        )
        z = bg.relu(y)
        g.output("z", z)
    assert g.op_count == 2
    xs = rng.standard_normal(1000).astype(np.float32)
    ys = rng.standard_normal(1000).astype(np.float32)
    out = g.run(x=xs, y=ys, numpy=True)
    np.testing.assert_allclose(out["z"], np.maximum(reference.axpy(2.0, xs, ys), 0), rtol=1e-6)
    if device.info.timestamp_period_ns > 0:
        labels = [label for label, _ in g.timings()]
        assert len(labels) == 2 and all(t >= 0 for _, t in g.timings())


def test_checks_run_after_every_replay(rng):
    device = bg.default_device()
    weights = bg.quantize_weights(rng.standard_normal((9, 33)).astype(np.float32), device=device)
    g = device.graph()
    with g:
        x = g.input("x", (2, 33))
        g.output("y", bg.bitlinear(x, weights))
    bad = np.ones((2, 33), np.float32)
    bad[1, 3] = np.nan
    with pytest.raises(bg.ArgumentError, match="NaN or Inf"):
        g.run(x=bad)
    good = rng.standard_normal((2, 33)).astype(np.float32)
    y = g.run(x=good, numpy=True)["y"]  # the counter was zeroed again
    np.testing.assert_allclose(y, bg.bitlinear(good, weights), rtol=1e-6)


def test_bad_runs_raise_and_leave_the_graph_usable():
    device = bg.default_device()
    g = device.graph()
    with g:
        x = g.input("x", (3,))
        g.output("y", bg.relu(x))
        with pytest.raises(bg.ArgumentError, match="still recording"):
            g.run(x=np.ones(3, np.float32))
    with pytest.raises(bg.ArgumentError, match="unknown input 'q'"):
        g.run(q=np.ones(3, np.float32))
    with pytest.raises(bg.DTypeError):
        g.run(x=np.ones(3, np.float64))
    with pytest.raises(bg.ShapeError):
        g.run(x=np.ones(4, np.float32))
    with pytest.raises(bg.ArgumentError):
        g.input("x", (3,))
    with pytest.raises(bg.ArgumentError):
        with g:
            pass
    out = g.run(x=np.array([-1, 0, 2], np.float32), numpy=True)
    np.testing.assert_array_equal(out["y"], [0, 0, 2])


def test_an_error_while_recording_spoils_only_that_graph():
    device = bg.default_device()
    g = device.graph()
    with pytest.raises(bg.ShapeError):
        with g:
            x = g.input("x", (4, 8))
            bg.relu(x)
            bg.add(x, np.ones(3, np.float32))  # not broadcastable
    with pytest.raises(bg.ArgumentError, match="cannot run"):
        g.run(x=np.ones((4, 8), np.float32))
    # Nothing records any more: ops on this thread run at once again.
    np.testing.assert_array_equal(bg.relu(np.array([-1.0, 1.0], np.float32)), [0, 1])


def test_numpy_out_targets_are_refused_inside_a_graph():
    device = bg.default_device()
    g = device.graph()
    target = np.zeros(3, np.float32)
    with pytest.raises(bg.ArgumentError, match="Tensors"):
        with g:
            x = g.input("x", (3,))
            bg.relu(x, out=target)
    assert (target == 0).all()


def test_graphs_record_per_thread():
    import threading

    device = bg.default_device()
    g = device.graph()
    results = {}
    with g:
        x = g.input("x", (2,))
        g.output("y", bg.relu(x))

        def other():  # another thread runs ops at once while this one records
            results["y"] = bg.relu(np.array([-2.0, 3.0], np.float32))

        t = threading.Thread(target=other)
        t.start()
        t.join(30)
    np.testing.assert_array_equal(results["y"], [0, 3])
    np.testing.assert_array_equal(
        g.run(x=np.array([4.0, -4.0], np.float32), numpy=True)["y"], [4, 0]
    )


def test_tensor_reshape_and_copy_from():
    t = bg.Tensor.from_numpy(np.arange(12, dtype=np.float32))
    v = t.reshape(3, -1)
    assert v.shape == (3, 4)
    v.copy_from(np.full((3, 4), 5, np.float32))
    np.testing.assert_array_equal(t.numpy(), np.full(12, 5))  # one memory
    assert t.reshape((2, 6)).shape == (2, 6)
    with pytest.raises(bg.ShapeError):
        t.reshape(5, 3)
    with pytest.raises(bg.ShapeError):
        t.reshape(-1, -1)
    for bad in [("a",), "ab", (1.5, 8)]:  # was pybind11's RuntimeError
        with pytest.raises(bg.ShapeError, match="a sequence of ints"):
            t.reshape(bad)
    assert t.reshape([4, -1]).shape == (4, 3) and t.reshape(12).shape == (12,)
    with pytest.raises(bg.ShapeError):
        t.copy_from(np.zeros(11, np.float32))
    with pytest.raises(bg.DTypeError):
        t.copy_from(np.zeros(12, np.int32))
    source = np.arange(24, dtype=np.float32)[::2]  # not contiguous: copied first
    t.copy_from(source)
    np.testing.assert_array_equal(t.numpy(), source)
    other = bg.Tensor.from_numpy(np.ones(12, np.float32))
    t.copy_from(other)
    np.testing.assert_array_equal(t.numpy(), np.ones(12))


def test_a_recorded_copy_waits_for_its_source_after_other_readers(device, rng):
    """A copy into host memory of a result that a later dispatch already read (its barrier then
    made for dispatches) still waits for the result's writer: the validation layer (synchronization
    validation) and the values say so."""
    x = rng.standard_normal(1000).astype(np.float32)
    g = device.graph()
    with g:
        t = g.input("x", (1000,))
        y = bg.relu(t)
        z = bg.add(y, 1.0)  # reads y: a compute-to-compute barrier
        host = device.empty((1000,), np.float32, memory="host")
        host.copy_from(y)  # a transfer read of y
        g.output("y", host)
        g.output("z", z)
    out = g.run(x=x, numpy=True)
    np.testing.assert_array_equal(out["y"], np.maximum(x, 0))
    np.testing.assert_array_equal(out["z"], np.maximum(x, 0) + 1)


@pytest.mark.parametrize("reuse", [False, True])
def test_reuse_memory_gives_dropped_intermediates_to_later_ops(device, reuse, rng):
    """A chain of ops with large intermediates (1 MiB each) recorded with reuse_memory: the
    intermediates nothing holds any more lend their memory to the later ops' results, so the graph
    holds a few of them instead of all; the outputs are those of the same graph without it, every
    replay, and inputs and tensors the caller holds are never reused."""
    n = 1 << 18
    weights = [
        bg.Tensor.from_numpy(rng.uniform(0.5, 1.5, n).astype(np.float32), device) for _ in range(8)
    ]
    kept = bg.Tensor.from_numpy(rng.standard_normal(n).astype(np.float32), device)
    before = device.memory_stats()["in_use_bytes"]
    g = bg.Graph(device, reuse_memory=reuse)
    with g:
        x = g.input("x", (n,))
        h = x
        for w in weights:
            h = bg.add(bg.mul(h, w), kept)  # two fresh intermediates a step, the first dropped
        g.output("y", h)
    held = device.memory_stats()["in_use_bytes"] - before
    for _ in range(3):
        value = rng.standard_normal(n).astype(np.float32)
        want = value.copy()
        for w in weights:
            want = want * w.numpy() + kept.numpy()
        np.testing.assert_allclose(g.run(x=value, numpy=True)["y"], want, rtol=1e-6)
    intermediates = 2 * len(weights) * 4 * n
    if reuse:
        assert held < intermediates / 2, held
    else:
        assert held >= intermediates, held
