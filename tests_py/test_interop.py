"""DLPack both ways: tensors shared with NumPy (and PyTorch where installed) without copies, their
lifetimes, device-only memory, dtypes and strides, read-only producers, and copy= each way."""

import gc

import numpy as np
import pytest

import bitnet_gpu as bg
from conftest import random_array

DTYPES = [np.float32, np.float16, np.int8, np.uint8, np.int32, np.uint32, np.float64]


def gpu_add_one(t):
    """t += 1, computed and written by the GPU (a device-side copy of t + 1 into t)."""
    t.copy_from(bg.add(t, 1.0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("memory", ["host", "device"])
def test_numpy_shares_a_host_visible_tensor(device, rng, dtype, memory):
    a = random_array(rng, (3, 7, 5), dtype)
    t = bg.Tensor.from_numpy(a, device, memory=memory)
    if not t.host_visible:
        pytest.skip("this device's 'device' placement is not host-visible")
    assert t.__dlpack_device__() == (1, 0)
    v = np.from_dlpack(t)
    assert v.dtype == a.dtype and v.shape == a.shape and v.flags.c_contiguous
    np.testing.assert_array_equal(v, a)
    assert np.shares_memory(v, np.asarray(t))  # one buffer, no copy
    v[1, 2, 3] = a.dtype.type(7)  # a write through the consumer is the tensor's
    assert t.numpy()[1, 2, 3] == a.dtype.type(7)


def test_the_consumer_sees_the_gpus_writes(device, rng):
    t = bg.Tensor.from_numpy(rng.standard_normal(1000).astype(np.float32), device, memory="host")
    v = np.from_dlpack(t)
    before = v.copy()
    gpu_add_one(t)
    np.testing.assert_array_equal(v, before + np.float32(1))


def test_the_consumer_keeps_the_tensor_alive(device, rng):
    a = rng.standard_normal((64, 33)).astype(np.float32)
    t = bg.Tensor.from_numpy(a, device, memory="host")
    v = np.from_dlpack(t)
    gc.collect()  # earlier tests' garbage freed now, not while the consumer's hold is checked
    before = device.memory_stats()["in_use_bytes"]
    del t
    gc.collect()
    assert device.memory_stats()["in_use_bytes"] == before  # still held by the consumer
    np.testing.assert_array_equal(v, a)
    del v
    gc.collect()
    assert device.memory_stats()["in_use_bytes"] < before


def test_the_tensor_outlives_its_consumer(device, rng):
    a = rng.standard_normal(100).astype(np.float32)
    t = bg.Tensor.from_numpy(a, device, memory="host")
    v = np.from_dlpack(t)
    del v
    gc.collect()
    np.testing.assert_array_equal(t.numpy(), a)


def test_device_only_memory_needs_copy_true(unmapped_device, rng):
    a = rng.standard_normal((5, 9)).astype(np.float32)
    t = bg.Tensor.from_numpy(a, unmapped_device, memory="device")
    assert not t.host_visible
    with pytest.raises(BufferError, match="device-only memory.*copy=True"):
        np.from_dlpack(t)
    with pytest.raises(BufferError, match="device-only memory"):
        t.__dlpack__(copy=False)
    copied = np.from_dlpack(t, copy=True)
    np.testing.assert_array_equal(copied, a)
    assert not np.shares_memory(copied, a)
    np.testing.assert_array_equal(t.numpy(), a)  # the device stays usable


def test_copy_true_gives_a_separate_copy(device, rng):
    a = rng.standard_normal(10).astype(np.float32)
    t = bg.Tensor.from_numpy(a, device, memory="host")
    c = np.from_dlpack(t, copy=True)
    c[0] = 99
    assert t.numpy()[0] == a[0]


def test_export_refuses_streams_and_other_devices(device):
    t = device.empty((4,), np.float32, memory="host")
    with pytest.raises(BufferError, match="stream"):
        t.__dlpack__(stream=1)
    with pytest.raises(BufferError, match="dl_device"):
        t.__dlpack__(dl_device=(2, 0))
    assert t.__dlpack__(dl_device=(1, 0)) is not None
    assert t.__dlpack__(max_version=(1, 0)) is not None


@pytest.mark.parametrize("dtype", DTYPES)
def test_from_dlpack_imports_aligned_memory_without_a_copy(device, rng, dtype):
    if not device.info.features["external_memory_host"]:
        pytest.skip("device has no VK_EXT_external_memory_host")
    a = bg.aligned_empty((17, 3), dtype, device)
    a[...] = random_array(rng, a.shape, dtype)
    for copy in (None, False):
        t = bg.from_dlpack(a, device=device, copy=copy)
        assert t.memory == "imported" and t.shape == (17, 3) and np.dtype(t.dtype) == a.dtype
        np.testing.assert_array_equal(t.numpy(), a)
        a[0, 0] = dtype(5)  # the producer's writes are the tensor's
        assert t.numpy()[0, 0] == dtype(5)


def test_from_dlpack_shares_with_the_gpu_both_ways(device, rng):
    if not device.info.features["external_memory_host"]:
        pytest.skip("device has no VK_EXT_external_memory_host")
    a = bg.aligned_empty(300, np.float32, device)
    a[:] = rng.standard_normal(300).astype(np.float32)
    before = a.copy()
    t = bg.from_dlpack(a)
    gpu_add_one(t)
    np.testing.assert_array_equal(a, before + np.float32(1))


def test_the_tensor_keeps_the_producer_alive(device):
    if not device.info.features["external_memory_host"]:
        pytest.skip("device has no VK_EXT_external_memory_host")
    a = bg.aligned_empty(1024, np.float32, device)
    a[:] = np.arange(1024, dtype=np.float32)
    t = bg.from_dlpack(a)
    del a
    gc.collect()
    np.testing.assert_array_equal(t.numpy(), np.arange(1024, dtype=np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_from_dlpack_copies_what_it_cannot_share(device, rng, dtype):
    base = random_array(rng, (9, 10), dtype)
    strided = base[::2, 1::3]  # not contiguous
    t = bg.from_dlpack(strided, device=device)
    assert t.memory != "imported" and t.shape == strided.shape
    np.testing.assert_array_equal(t.numpy(), strided)
    with pytest.raises(BufferError, match="copy=False.*C-contiguous"):
        bg.from_dlpack(strided, device=device, copy=False)
    original = base[0, 0].copy()
    t = bg.from_dlpack(base, device=device, copy=True)  # always a copy
    assert t.memory != "imported"
    base[0, 0] = dtype(3) if original != dtype(3) else dtype(4)
    assert t.numpy()[0, 0] == original


def test_from_dlpack_takes_an_ops_result(device, rng):
    """An op's result for NumPy input is a view of host memory the device itself mapped: with
    copy=None it comes back as a tensor of its values, imported where the driver takes it, copied
    where it does not; a graph or op reading it sees those values."""
    x = rng.standard_normal(1 << 16).astype(np.float32)
    y = bg.relu(x)
    t = bg.from_dlpack(y, device=device)
    assert t.memory in ("imported", "device")
    np.testing.assert_array_equal(t.numpy(), np.maximum(x, 0))
    np.testing.assert_array_equal(bg.relu(t).numpy(), np.maximum(x, 0))
    if t.memory == "imported":  # shared: the GPU's writes are the view's
        gpu_add_one(t)
        np.testing.assert_array_equal(y, np.maximum(x, 0) + 1)


def test_a_read_only_producer_is_copied_never_written(device, rng):
    a = bg.aligned_empty(64, np.float32, device)
    a[:] = rng.standard_normal(64).astype(np.float32)
    a.flags.writeable = False
    expected = a.copy()
    t = bg.from_dlpack(a, device=device)
    assert t.memory != "imported"
    gpu_add_one(t)
    np.testing.assert_array_equal(a, expected)
    with pytest.raises(BufferError, match="writeable"):
        bg.from_dlpack(a, device=device, copy=False)


def test_from_dlpack_of_a_tensor(device, rng):
    t = bg.Tensor.from_numpy(rng.standard_normal(8).astype(np.float32), device)
    assert bg.from_dlpack(t) is t
    c = bg.from_dlpack(t, copy=True)
    assert c is not t
    np.testing.assert_array_equal(c.numpy(), t.numpy())


def test_from_dlpack_rejects_what_it_cannot_take(device):
    with pytest.raises(TypeError, match="not a DLPack producer"):
        bg.from_dlpack([1.0, 2.0])
    with pytest.raises(TypeError, match="copy"):
        bg.from_dlpack(np.ones(3, np.float32), copy="yes")
    with pytest.raises(TypeError, match="device"):
        bg.from_dlpack(np.ones(3, np.float32), device=0)

    class OnAnotherDevice:
        def __dlpack__(self, **kwargs):
            raise AssertionError("not to be called")

        def __dlpack_device__(self):
            return (2, 0)  # CUDA

    with pytest.raises(BufferError, match="not the CPU"):
        bg.from_dlpack(OnAnotherDevice())
    with pytest.raises(bg.DTypeError):
        bg.from_dlpack(np.ones(3, np.int64))
    assert bg.from_dlpack(np.ones(3, np.float32)).numpy().tolist() == [1.0, 1.0, 1.0]


def test_pytorch_shares_both_ways(device, rng):
    torch = pytest.importorskip("torch")
    a = rng.standard_normal((4, 6)).astype(np.float32)
    t = bg.Tensor.from_numpy(a, device, memory="host")
    pt = torch.from_dlpack(t)
    assert tuple(pt.shape) == (4, 6) and pt.dtype == torch.float32
    np.testing.assert_array_equal(pt.numpy(), a)
    gpu_add_one(t)
    np.testing.assert_array_equal(pt.numpy(), a + np.float32(1))  # one buffer
    for dtype in (torch.float16, torch.int8, torch.uint8, torch.int32):
        src = torch.arange(12, dtype=dtype).reshape(3, 4)
        back = bg.from_dlpack(src, device=device)
        np.testing.assert_array_equal(back.numpy(), src.numpy())
    strided = torch.arange(40, dtype=torch.float32).reshape(5, 8)[:, ::2]
    np.testing.assert_array_equal(bg.from_dlpack(strided, device=device).numpy(), strided.numpy())
