"""Fault injection (BITNET_GPU_FAULT, cpp/runtime/fault.hpp): each injected Vulkan failure becomes
the documented exception, leaks no memory, leaves the caller's arrays alone, and the next call
works; a device lost mid-sequence raises DeviceError and a new Device works."""

import subprocess
import sys

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import _core
from bitnet_gpu import reference as ref
from conftest import package_env


@pytest.fixture(autouse=True)
def disarmed():
    _core.arm_fault("")
    yield
    _core.arm_fault("")


def fresh_device():
    return bg.Device(bg.default_device().info.index)


def test_failed_allocation_is_out_of_memory_and_leaks_nothing(device, rng):
    x = rng.standard_normal((7, 4099)).astype(np.float32)  # sizes no pooled block has yet
    before = x.copy()
    device.trim()
    in_use = device.memory_stats()["in_use_bytes"]
    # A new slab and its retry after trim() fail, then memory of the block's own and its retry.
    _core.arm_fault("allocation:1:4")
    with pytest.raises(
        bg.OutOfMemory, match="out of memory on device .*VK_ERROR_OUT_OF_DEVICE_MEMORY"
    ):
        bg.quantize_activations(x, device=device)
    assert _core.faults_injected() == 4
    assert device.memory_stats()["in_use_bytes"] == in_use
    assert np.array_equal(x, before)
    _core.arm_fault("")
    q, s = bg.quantize_activations(x, device=device)
    assert np.array_equal(q, ref.quantize_activations(x, scale=s)[0])


def test_one_failed_allocation_is_retried_after_trimming(device, rng):
    _core.arm_fault("allocation:1:1")
    device.trim()
    t = device.empty((1234567,), np.uint8)  # a fresh block: fails once, then trim() and retry
    assert t.nbytes == 1234567 and _core.faults_injected() == 1


@pytest.mark.parametrize("nth", [1, 2, 3])
def test_failed_submission_out_of_memory_keeps_the_device(device, rng, nth):
    x, w = (
        rng.standard_normal((3, 64)).astype(np.float32),
        rng.standard_normal((5, 64)).astype(np.float32),
    )
    q = bg.quantize_weights(w, device=device)
    expected = bg.bitlinear(x, q)
    _core.arm_fault(f"submission:{nth}:1:out_of_host_memory")
    for _ in range(nth - 1):
        bg.bitlinear(x, q)  # these submissions run
    with pytest.raises(bg.OutOfMemory, match="vkQueueSubmit"):
        bg.bitlinear(x, q)
    assert np.array_equal(bg.bitlinear(x, q), expected)


@pytest.mark.parametrize("site", ["submission", "wait"])
def test_lost_device_raises_device_error_and_a_new_device_works(rng, site):
    lost = fresh_device()
    x = rng.standard_normal((2, 96)).astype(np.float32)
    q = bg.quantize_weights(rng.standard_normal((8, 96)).astype(np.float32), device=lost)
    in_use = bg.default_device().memory_stats()["in_use_bytes"]
    _core.arm_fault(f"{site}:1")
    with pytest.raises(bg.DeviceError, match="VK_ERROR_DEVICE_LOST"):
        bg.bitlinear(bg.Tensor.from_numpy(x, lost), q)
    _core.arm_fault("")
    assert lost.lost
    with pytest.raises(bg.DeviceError, match="was lost"):
        bg.quantize_activations(x, device=lost)
    with pytest.raises(bg.DeviceError, match="was lost"):
        lost.empty((4,), np.float32)
    del q, lost
    again = fresh_device()
    q = bg.quantize_weights(rng.standard_normal((8, 96)).astype(np.float32), device=again)
    y, acc = bg.bitlinear(bg.Tensor.from_numpy(x, again), q, return_accumulator=True)
    s = bg.quantize_activations(x)[1]
    assert np.array_equal(acc.numpy(), ref.bitlinear(x, q.unpack(), q.scale, scale=s)[1])
    assert bg.default_device().memory_stats()["in_use_bytes"] == in_use


def test_bad_switch_is_an_argument_error():
    for spec in ["allocation", "alloc:1", "allocation:0", "wait:1:2:nope", "wait:x"]:
        with pytest.raises(bg.ArgumentError, match="BITNET_GPU_FAULT"):
            _core.arm_fault(spec)


def test_environment_switch_gives_a_clean_exception_in_a_new_process(tmp_path):
    script = (
        "import numpy as np, bitnet_gpu as bg\n"
        "try:\n"
        "    bg.Tensor.from_numpy(np.ones(1000, np.float32))\n"
        "except bg.OutOfMemory as e:\n"
        "    print('OutOfMemory:', e)\n"
        "    print(bg.quantize_activations(np.ones((1, 4), np.float32))[0])\n"
    )
    # 4: a new slab and its retry, then memory of the block's own and its retry (MemoryPool).
    env = package_env(BITNET_GPU_FAULT="allocation:1:4")
    run = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert "OutOfMemory: out of memory" in run.stdout and "[[127 127 127 127]]" in run.stdout
