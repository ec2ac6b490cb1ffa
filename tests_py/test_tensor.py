import gc
import os

import numpy as np
import pytest
from conftest import ALL_DTYPES, AWKWARD_SHAPES, random_array

import bitnet_gpu as bg


def copy_kernel(device):
    return bg.builtin_kernel("copy_vec4", device, {0: 64})


def gpu_copy(device, source, destination):
    """Copies source into destination on the GPU (16-byte words)."""
    words = source.nbytes // 16
    copy_kernel(device).dispatch(max(1, -(-words // 64)), [source, destination], np.uint32(words))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("memory", ["auto", "device", "host"])
def test_round_trip_every_dtype_and_placement(device, rng, dtype, memory):
    for shape in AWKWARD_SHAPES:
        a = random_array(rng, shape, dtype)
        t = bg.Tensor.from_numpy(a, device, memory=memory)
        assert t.shape == a.shape and t.dtype == a.dtype and t.nbytes == a.nbytes
        assert t.size == a.size and t.ndim == a.ndim and t.device is device
        assert t.memory == ("device" if memory == "auto" else memory)
        back = t.numpy()
        assert back.dtype == a.dtype and np.array_equal(back, a, equal_nan=True)
        assert np.array_equal(np.asarray(t), a)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_round_trip_through_staging(unmapped_device, rng, dtype):
    for shape in [(1,), (33, 3), (4097,), (0,)]:
        a = random_array(rng, shape, dtype)
        t = bg.Tensor.from_numpy(a, unmapped_device, memory="device")
        assert not t.host_visible
        assert np.array_equal(t.numpy(), a)
        assert np.array_equal(np.asarray(t), a)


def test_empty_tensors_have_the_requested_shape(device):
    t = device.empty((3, 4), np.int8)
    assert t.shape == (3, 4) and t.dtype == np.int8 and t.nbytes == 12
    assert device.empty(5).shape == (5,) and device.empty(5).dtype == np.float32
    assert device.empty((0, 7), "float16").numpy().shape == (0, 7)


def test_asarray_is_a_zero_copy_view_that_the_gpu_sees(device, rng):
    a = rng.integers(0, 2**32, size=(64, 4), dtype=np.uint32)
    t = bg.Tensor.from_numpy(a, device)
    view = np.asarray(t)
    assert view.ctypes.data == np.asarray(t).ctypes.data  # same memory every time
    view[:] = 7
    out = device.empty(a.shape, np.uint32)
    gpu_copy(device, t, out)
    assert (out.numpy() == 7).all()
    gpu_copy(device, bg.Tensor.from_numpy(a, device), t)  # GPU writes show in the view
    assert np.array_equal(view, a)
    m = memoryview(t)
    assert m.format == "I" and m.shape == (64, 4) and not m.readonly


def test_copies_do_not_share_memory(device, rng):
    a = rng.standard_normal(100).astype(np.float32)
    t = bg.Tensor.from_numpy(a, device)
    a[:] = 0
    assert not np.array_equal(t.numpy(), a)
    copy = t.numpy()
    copy[:] = 1
    assert not (np.asarray(t) == 1).any()
    assert not np.shares_memory(np.asarray(t, copy=True), np.asarray(t))


def test_array_protocol_follows_numpy_2(device, unmapped_device, rng):
    a = rng.standard_normal((5, 3)).astype(np.float32)
    t = bg.Tensor.from_numpy(a, device)
    view = np.asarray(t, copy=False)
    view[0, 0] = 42
    assert t.numpy()[0, 0] == 42
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError):
        np.asarray(t, dtype=np.float64, copy=False)
    assert np.array(t).base is None or not np.shares_memory(np.array(t), view)

    hidden = bg.Tensor.from_numpy(a, unmapped_device)
    with pytest.raises(ValueError, match="device-only memory"):
        np.asarray(hidden, copy=False)
    assert np.array_equal(np.asarray(hidden), a)
    with pytest.raises(BufferError):
        memoryview(hidden)


def test_views_keep_the_tensor_alive(device, rng):
    a = rng.standard_normal(1000).astype(np.float32)
    t = bg.Tensor.from_numpy(a, device)
    view = np.asarray(t)
    del t
    gc.collect()
    for _ in range(10):  # reuse the pool: the view's memory must not be handed out again
        device.empty(1000, np.float32)
    assert np.array_equal(view, a)


def test_tensors_keep_their_device_alive(rng):
    a = rng.standard_normal(100).astype(np.float32)
    device = bg.Device()
    t = bg.Tensor.from_numpy(a, device)
    del device
    gc.collect()
    assert np.array_equal(t.numpy(), a)
    assert t.device.name


def test_non_contiguous_input_is_copied_once(device, rng):
    a = rng.standard_normal((20, 30)).astype(np.float32)
    t = bg.Tensor.from_numpy(a[::2, 5:25:3], device)
    assert np.array_equal(t.numpy(), a[::2, 5:25:3])
    t = bg.Tensor.from_numpy(a.T, device)
    assert np.array_equal(t.numpy(), a.T)


def test_zero_copy_import_shares_the_arrays_memory(device, rng):
    if not device.info.features["external_memory_host"]:
        with pytest.raises(bg.UnsupportedError):
            bg.Tensor.from_numpy(bg.aligned_empty(16, np.float32), device, zero_copy=True)
        return
    a = bg.aligned_empty((33, 17), np.float32, device)
    a[:] = rng.standard_normal(a.shape)
    t = bg.Tensor.from_numpy(a, device, zero_copy=True)
    assert t.memory == "imported"
    assert np.asarray(t).ctypes.data == a.ctypes.data
    y = bg.Tensor.from_numpy(np.ones(a.shape, np.float32), device)
    axpy = bg.builtin_kernel("axpy", device)
    push = np.array([a.size], np.uint32).tobytes() + np.float32(0).tobytes()
    a[:] = 3.0  # host writes after import are what the GPU reads
    axpy.dispatch(
        -(-a.size // 64), [y, t], np.array([a.size], np.uint32).tobytes() + np.float32(2).tobytes()
    )
    assert np.array_equal(a, np.full(a.shape, 5.0, np.float32))  # GPU writes land in `a`
    del push
    ref = a.copy()
    del a
    gc.collect()
    assert np.array_equal(t.numpy(), ref)  # the tensor keeps the array's memory alive


def test_zero_copy_refuses_what_it_cannot_import(device):
    if not device.info.features["external_memory_host"]:
        pytest.skip("device has no VK_EXT_external_memory_host")
    align = device.info.host_import_alignment
    base = bg.aligned_empty(4 * align, np.uint8, device)
    with pytest.raises(bg.ArgumentError, match="aligned"):
        bg.Tensor.from_numpy(base[1 : 1 + align], device, zero_copy=True)
    with pytest.raises(bg.ArgumentError, match="C-contiguous"):
        bg.Tensor.from_numpy(
            bg.aligned_empty((64, 64), np.float32, device)[:, ::2], device, zero_copy=True
        )
    readonly = bg.aligned_empty(64, np.float32, device)
    readonly.flags.writeable = False
    with pytest.raises(bg.ArgumentError, match="writeable"):
        bg.Tensor.from_numpy(readonly, device, zero_copy=True)
    with pytest.raises(bg.ArgumentError, match="non-empty"):
        bg.Tensor.from_numpy(bg.aligned_empty(0, np.float32, device), device, zero_copy=True)


def test_aligned_empty_is_aligned(device):
    align = device.info.host_import_alignment or 4096
    for shape in [1, (7, 3), (4097,), (0,)]:
        a = bg.aligned_empty(shape, np.float16, device)
        assert a.dtype == np.float16 and (a.size == 0 or a.ctypes.data % align == 0)
        assert a.shape == ((shape,) if isinstance(shape, int) else shape)


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.bool_, np.complex64, object, ">f4"])
def test_unsupported_dtypes_raise(device, dtype):
    a = np.zeros(4, dtype=dtype)
    with pytest.raises(bg.DTypeError, match="expected one of"):
        bg.Tensor.from_numpy(a, device)
    with pytest.raises(TypeError):
        device.empty(4, dtype)


def test_bad_arguments_raise_and_leave_the_device_usable(device, rng):
    with pytest.raises(bg.ShapeError, match="negative"):
        device.empty((-1, 3))
    with pytest.raises(bg.ShapeError):
        device.empty("not a shape")
    with pytest.raises(bg.ArgumentError, match="memory"):
        device.empty(3, memory="gpu")
    with pytest.raises(bg.DTypeError):
        device.empty(3, "not a dtype")
    with pytest.raises(bg.OutOfMemory) as info:
        device.empty(2**48, np.uint8)
    assert isinstance(info.value, MemoryError) and "cannot allocate" in str(info.value)
    with pytest.raises(bg.ShapeError):
        device.empty((2**40, 2**40))
    a = rng.standard_normal(10).astype(np.float32)
    assert np.array_equal(bg.Tensor.from_numpy(a, device).numpy(), a)


def test_len_and_repr(device):
    t = device.empty((3, 2), np.int32)
    assert len(t) == 3 and "shape=(3, 2)" in repr(t) and "int32" in repr(t)
    with pytest.raises(TypeError):
        len(device.empty((), np.int32))
    assert os.environ.get("BITNET_GPU_DEBUG_UNMAPPED_DEVICE_MEMORY") is None


def test_numpy_out_argument(device, unmapped_device, rng):
    a = rng.standard_normal((7, 9)).astype(np.float32)
    for dev in (device, unmapped_device):
        t = bg.Tensor.from_numpy(a, dev)
        out = np.full_like(a, np.nan)
        assert t.numpy(out=out) is out and np.array_equal(out, a)
    with pytest.raises(bg.DTypeError):
        t.numpy(out=np.empty((7, 9), np.float64))
    with pytest.raises(bg.ShapeError):
        t.numpy(out=np.empty((9, 7), np.float32))
    with pytest.raises(bg.ArgumentError):
        t.numpy(out=np.empty((7, 18), np.float32)[:, ::2])


def test_numpy_results_are_views_of_host_memory_that_outlive_later_calls(device, rng):
    """A NumPy-in call's result is the GPU's own host-memory output, handed back as a view (no
    copy): it keeps its values while later calls run and their results are freed and reused, never
    shares memory with another result, and is writeable. Sizes below and above the 4 MiB that the
    path was limited to before."""
    q = bg.quantize_weights(rng.standard_normal((300, 70)).astype(np.float32))
    cases = [
        (lambda a: bg.relu(a), lambda a: np.maximum(a, 0), (1, 1 << 21)),
        (lambda a: bg.softmax(a), None, (5, 8, 1 << 19)),
        (lambda a: bg.bitlinear(a.reshape(-1, 70), q), None, (70 * 3, 70 * 4000)),
    ]
    for op, expected, sizes in cases:
        for size in sizes:
            a = rng.standard_normal(size).astype(np.float32)
            first = op(a)
            kept = first.copy()
            assert isinstance(first, np.ndarray) and first.flags.writeable
            assert first.flags.c_contiguous and not first.flags.owndata
            if expected is not None:
                np.testing.assert_array_equal(first, expected(a))
            for _ in range(3):  # results made and freed while `first` lives
                other = op(-a)
                assert not np.shares_memory(first, other)
                del other
                gc.collect()
            np.testing.assert_array_equal(first, kept)
            first[...] = 7.0  # the user's memory now: writing it changes nothing else
            np.testing.assert_array_equal(op(a), kept)
