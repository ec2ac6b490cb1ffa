import threading

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import reference


def axpy_push(n, a):
    return np.array([n], np.uint32).tobytes() + np.float32(a).tobytes()


@pytest.fixture
def axpy(device):
    return bg.builtin_kernel("axpy", device, {0: 64})


def test_hundred_dependent_kernels_in_one_sequence(device, rng, axpy):
    n = 4097
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    tx, ty = bg.Tensor.from_numpy(x, device), bg.Tensor.from_numpy(y, device)
    with device.sequence() as seq:
        for _ in range(100):
            axpy.dispatch(-(-n // 64), [tx, ty], axpy_push(n, 0.5))
        assert np.array_equal(ty.numpy(), y)  # recorded, not yet run
    assert seq.op_count == 100 and seq.barrier_count == 99 and seq.submitted
    expected = y
    for _ in range(100):
        expected = reference.axpy(0.5, x, expected)
    assert np.array_equal(ty.numpy(), expected)
    if device.info.features["timestamps"]:
        timings = seq.timings()
        assert len(timings) == 100
        assert all(label == "axpy" and seconds >= 0 for label, seconds in timings)


def test_independent_ops_get_no_barrier(device, rng, axpy):
    tensors = [
        bg.Tensor.from_numpy(rng.standard_normal(64).astype(np.float32), device) for _ in range(8)
    ]
    with device.sequence(timings=False) as seq:
        for i in range(0, 8, 2):
            seq.dispatch(axpy, 1, [tensors[i], tensors[i + 1]], axpy_push(64, 1))
        assert seq.barrier_count == 0
        seq.copy(tensors[1], tensors[2])  # reads a written tensor, writes a read one
        assert seq.barrier_count == 1


def test_copy_and_fill(device, rng):
    a = rng.standard_normal(1000).astype(np.float32)
    src = bg.Tensor.from_numpy(a, device)
    mid, dst = device.empty(1000), device.empty(1000, memory="host")
    with device.sequence() as seq:
        seq.fill(mid, 0xFFFFFFFF)
        seq.copy(src, mid)
        seq.copy(mid, dst)
    assert np.array_equal(dst.numpy(), a)
    with device.sequence() as seq:
        seq.fill(dst, 0)
    assert (dst.numpy() == 0).all()
    with pytest.raises(bg.ShapeError):
        with device.sequence() as seq:
            seq.copy(src, device.empty(10))


def test_submit_returns_a_handle(device, rng, axpy):
    y = rng.standard_normal(256).astype(np.float32)
    ty = bg.Tensor.from_numpy(y, device)
    tx = bg.Tensor.from_numpy(np.ones(256, np.float32), device)
    with device.sequence() as seq:
        axpy.dispatch(4, [tx, ty], axpy_push(256, 2))
        handle = seq.submit()
        with pytest.raises(bg.ArgumentError, match="already submitted"):
            axpy.dispatch(4, [tx, ty], axpy_push(256, 2))
    handle.wait()
    assert handle.done()
    assert np.array_equal(ty.numpy(), y + 2)  # ran exactly once


def test_an_exception_discards_the_sequence(device, rng, axpy):
    y = rng.standard_normal(64).astype(np.float32)
    ty = bg.Tensor.from_numpy(y, device)
    with pytest.raises(RuntimeError, match="stop"):
        with device.sequence() as seq:
            axpy.dispatch(1, [ty, ty], axpy_push(64, 1))
            raise RuntimeError("stop")
    assert np.array_equal(ty.numpy(), y)
    with pytest.raises(bg.ArgumentError):
        seq.copy(ty, ty)
    axpy.dispatch(1, [ty, ty], axpy_push(64, 1))  # outside a sequence: runs now
    assert np.array_equal(ty.numpy(), 2 * y)


def test_sequences_are_per_thread(device, axpy):
    t = bg.Tensor.from_numpy(np.ones(64, np.float32), device)
    done = threading.Event()

    def other_thread():
        axpy.dispatch(1, [t, t], axpy_push(64, 1))  # not inside this thread's sequence
        done.set()

    with device.sequence() as seq:
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join(30)
        assert done.is_set() and seq.op_count == 0
    assert (t.numpy() == 2).all()


def test_total_timing_measures_the_whole_sequence(device, axpy):
    if not device.info.features["timestamps"]:
        pytest.skip("device has no timestamps")
    t = device.empty(64)
    with device.sequence(timings="total") as seq:
        for _ in range(10):
            seq.fill(t, 0)
    ((label, seconds),) = seq.timings()
    assert label == "sequence of 10 ops" and seconds >= 0
    with pytest.raises(bg.ArgumentError, match="timings"):
        device.sequence(timings="each")


def test_timings_need_timestamps(device, axpy):
    t = device.empty(64)
    with device.sequence(timings=False) as seq:
        seq.fill(t, 0)
    with pytest.raises(bg.UnsupportedError, match="without timings"):
        seq.timings()


def test_threads_share_a_device(device, axpy):
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(20):
                x = rng.standard_normal(1000).astype(np.float32)
                y = rng.standard_normal(1000).astype(np.float32)
                ty = bg.Tensor.from_numpy(y, device)
                axpy.dispatch(16, [bg.Tensor.from_numpy(x, device), ty], axpy_push(1000, 3))
                if not np.array_equal(ty.numpy(), reference.axpy(3, x, y)):
                    errors.append("wrong result")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads)
