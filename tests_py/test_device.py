import os
import subprocess
import sys

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import _core

FEATURES = {
    "float16",
    "int8",
    "storage8",
    "storage16",
    "integer_dot_product",
    "cooperative_matrix",
    "external_memory_host",
    "timestamps",
    "device_clock",
    "pipeline_statistics",
    "subgroup_shuffle8",
    "int64_atomics",
}
NVIDIA_PROPRIETARY, MESA_LLVMPIPE = 4, 13  # VkDriverId values (vulkan_core.h)


def run_python(code, **env):
    full_env = dict(os.environ, **env)
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=120
    )


def test_validation_layer_is_on_when_asked():
    if os.environ.get("BITNET_GPU_VALIDATION") == "1":
        assert _core.validation_enabled()


def test_devices_describe_capabilities():
    infos = bg.devices()
    assert infos
    for info in infos:
        assert info.name and info.type in {"discrete", "integrated", "virtual", "cpu", "other"}
        assert info.vulkan_version.count(".") == 2
        assert info.memory_heaps and all(h["size"] > 0 for h in info.memory_heaps)
        assert info.subgroup_size > 0 and info.max_workgroup_invocations >= 128
        assert info.max_storage_buffer_range > 0 and info.max_shared_memory > 0
        # VK_NV_shader_sm_builtins' count where the driver has it (NVIDIA's does), else 0
        assert (
            info.multiprocessors > 0
            if info.driver_id == NVIDIA_PROPRIETARY
            else info.multiprocessors >= 0
        )
        # VkDriverId, which the kernels' choices go by: lavapipe is MESA_LLVMPIPE
        assert (info.driver_id == MESA_LLVMPIPE) == (info.driver_name == "llvmpipe")
        assert FEATURES <= set(info.features)
        assert all(isinstance(v, bool) for v in info.features.values())
        # the tensor cores' multiplies, none without the extensions
        assert all(isinstance(s, str) for s in info.cooperative_matrices)
        assert info.cooperative_matrices or not info.features["cooperative_matrix_int8"]
        assert info.features["cooperative_matrix"] or not info.cooperative_matrices


def test_default_device_is_shared_and_explicit_devices_are_new(device):
    assert bg.default_device() is device
    other = bg.Device(device.info.index)
    assert other is not device and other.name == device.name
    with pytest.raises(bg.ArgumentError, match="out of range"):
        bg.Device(len(bg.devices()) + 5)
    with pytest.raises(ValueError):
        bg.Device(len(bg.devices()) + 5)


def test_environment_chooses_the_device():
    name = bg.devices()[0].name
    out = run_python(
        "import bitnet_gpu as bg; print(bg.default_device().name)",
        BITNET_GPU_DEVICE=name[:5].lower(),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == name
    out = run_python(
        "import bitnet_gpu as bg; bg.default_device()", BITNET_GPU_DEVICE="no such device anywhere"
    )
    assert out.returncode != 0 and "matches no device" in out.stderr


def test_memory_pool_reuses_blocks_and_trims():
    device = bg.Device()
    for _ in range(20):
        t = device.empty((1000, 10), np.float32)
        del t
    stats = device.memory_stats()
    assert stats["pool_misses"] == 1 and stats["pool_hits"] == 19
    assert stats["in_use_bytes"] == 0 and stats["peak_in_use_bytes"] == 40000
    assert stats["pooled_bytes"] > 0
    device.trim()
    stats = device.memory_stats()
    assert stats["allocated_bytes"] == 0 and stats["live_blocks"] == 0


def test_synchronize_and_info_cli(device):
    device.synchronize()
    out = subprocess.run(
        [sys.executable, "-m", "bitnet_gpu", "info"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert device.name in out.stdout and "features:" in out.stdout


def test_demo_passes():
    out = subprocess.run(
        [sys.executable, "-m", "bitnet_gpu", "demo"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "demo passed" in out.stdout and "FAIL" not in out.stdout
    # BitNet, each against NumPy: the layer's ternary weights, BitLinear's exact accumulators and a
    # decoder generating text (tokenizers is in the test extra).
    for line in [
        "PASS  a 2560 -> 6912 layer quantized",
        "PASS  BitLinear",
        "PASS  a small BitNet decoder",
    ]:
        assert line in out.stdout, out.stdout


def test_pipeline_cache_is_saved_and_loaded_by_the_next_process(tmp_path):
    code = (
        "import bitnet_gpu as bg; d = bg.default_device(); "
        "bg.builtin_kernel('axpy', d, {0: 32}); print(d.pipeline_cache_loaded_bytes)"
    )
    first = run_python(code, BITNET_GPU_CACHE_DIR=str(tmp_path))
    assert first.returncode == 0, first.stderr
    files = list(tmp_path.glob("pipelines-*.bin"))
    assert len(files) == 1 and files[0].stat().st_size > 0
    second = run_python(code, BITNET_GPU_CACHE_DIR=str(tmp_path))
    assert second.returncode == 0, second.stderr
    assert int(first.stdout) == 0 and int(second.stdout) > 0


def test_small_blocks_share_slabs_and_keep_their_own_bytes():
    """Blocks of up to 4 MiB are bound to ranges of shared slabs (one vkAllocateMemory for many;
    8 MiB, then each next one twice as large up to 64 MiB): each keeps its own bytes, through host
    views and kernels; a slab goes back with trim() once no live block is bound to it, and not
    before."""
    device = bg.Device()
    rng = np.random.default_rng(5)
    values = [rng.standard_normal(int(n)).astype(np.float32) for n in rng.integers(1, 4000, 300)]
    tensors = [bg.Tensor.from_numpy(v, device) for v in values]
    stats = device.memory_stats()
    assert stats["live_blocks"] == 300 and 0 < stats["slab_bytes"] <= 2 * 8 << 20
    outs = [device.empty(v.shape, np.float32) for v in values[:50]]
    for t, o in zip(tensors, outs):  # kernels writing next to each other's bytes
        np.testing.assert_array_equal(bg.add(t, t, out=o).numpy(), t.numpy() * 2)
    for v, t in zip(values, tensors):
        np.testing.assert_array_equal(t.numpy(), v)
    for v, o in zip(values, outs):
        np.testing.assert_array_equal(o.numpy(), 2 * v)
    del outs, o
    device.trim()  # the live tensors' slabs stay
    assert device.memory_stats()["slab_bytes"] > 0
    for v, t in zip(values, tensors):
        np.testing.assert_array_equal(t.numpy(), v)
    del tensors, t
    device.trim()
    stats = device.memory_stats()
    assert stats["slab_bytes"] == 0 and stats["live_blocks"] == 0 and stats["allocated_bytes"] == 0
    big = device.empty((2 << 20,), np.float32)  # 8 MiB: a block of its own
    assert device.memory_stats()["slab_bytes"] == 0 and big.nbytes == 8 << 20
    mid = [device.empty((3 << 17,), np.float32) for _ in range(20)]  # 1.5 MiB: 5, 10 and 5 a slab
    assert device.memory_stats()["slab_bytes"] == (8 + 16 + 32) << 20
    for i, t in enumerate(mid):
        t.copy_from(np.full(t.shape, i, np.float32))
    assert all((t.numpy() == i).all() for i, t in enumerate(mid))


def test_memory_slabs_can_be_switched_off():
    code = (
        "import bitnet_gpu as bg, numpy as np; d = bg.default_device(); "
        "t = [d.empty((100,), np.float32) for _ in range(5)]; print(d.memory_stats()['slab_bytes'])"
    )
    assert run_python(code, BITNET_GPU_MEMORY_SLABS="0").stdout.split() == ["0"]
    assert int(run_python(code).stdout.split()[0]) > 0
