"""Device telemetry: every field None or a number of the right kind; NVML matched by UUID and
hwmon by PCI address (both read through stand-ins here, and NVML for real on an NVIDIA GPU);
sampling during a profile that leaves no thread behind; heap budgets in memory_stats()."""

import threading
import time
import types

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import telemetry as _telemetry

NUMBERS = [
    "temperature_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "memory_clock_mhz",
    "utilization",
]


def check_kinds(reading):
    assert set(reading) >= set(_telemetry.FIELDS) | {"source"}
    for field in NUMBERS:
        assert reading[field] is None or isinstance(reading[field], float), field
    reasons = reading["throttle_reasons"]
    assert reasons is None or all(isinstance(r, str) for r in reasons)
    assert reading["source"] in (None, "nvml", "sysfs")


def test_a_reading_has_every_field(device):
    reading = device.telemetry()
    check_kinds(reading)
    if device.info.type == "cpu":
        assert reading == dict.fromkeys(_telemetry.FIELDS) | {"source": None}


def telemetry_threads():
    return [t for t in threading.enumerate() if t.name == "bitnet_gpu telemetry"]


def test_profile_samples_during_the_block_and_leaves_no_thread(device, rng):
    x = rng.standard_normal((64, 256)).astype(np.float32)
    with bg.profile(device, telemetry=True, interval=0.002) as p:
        for _ in range(20):
            bg.relu(x)
        time.sleep(0.02)
    assert len(p.samples) >= 2 and p.timings
    times = [t for t, _ in p.samples]
    assert times == sorted(times) and times[0] >= 0
    for _, reading in p.samples:
        check_kinds(reading)
    assert not telemetry_threads()
    with pytest.raises(RuntimeError, match="inside"):
        with bg.profile(device, telemetry=True) as p:
            raise RuntimeError("inside")
    assert not telemetry_threads() and p.samples
    with pytest.raises(ValueError, match="interval"):
        bg.profile(device, telemetry=True, interval=0)
    with bg.profile(device) as p:
        bg.relu(x)
    assert p.samples == []


def test_heap_budgets(device):
    heaps = device.memory_stats()["heaps"]
    assert len(heaps) == len(device.info.memory_heaps) >= 1
    for heap, described in zip(heaps, device.info.memory_heaps):
        assert (
            heap["size"] == described["size"] and heap["device_local"] == described["device_local"]
        )
        if device.info.features["memory_budget"]:
            assert 0 <= heap["usage"] <= heap["size"] and 0 < heap["budget"] <= heap["size"]
        else:
            assert heap["budget"] is None and heap["usage"] is None


def test_device_identity(device):
    info = device.info
    assert len(info.uuid) == 32 and int(info.uuid, 16) >= 0
    if info.pci_address:
        domain, bus, rest = info.pci_address.split(":")
        slot, function = rest.split(".")
        assert len(domain) == 4 and len(bus) == 2 and len(slot) == 2 and len(function) == 1


def test_hwmon_readings_by_pci_address(tmp_path):
    """amdgpu's and i915's hwmon files in a stand-in sysfs tree: units converted, missing ones
    None."""
    gpu = tmp_path / "0000:03:00.0"
    hwmon = gpu / "hwmon" / "hwmon4"
    hwmon.mkdir(parents=True)
    files = {
        "temp1_input": "61000",  # millidegrees
        "power1_average": "151500000",  # microwatts
        "power1_cap": "300000000",
        "freq1_input": "2100000000",  # hertz
        "freq2_input": "1000000000",
    }
    for name, value in files.items():
        (hwmon / name).write_text(value + "\n")
    (gpu / "gpu_busy_percent").write_text("37\n")
    reading = _telemetry._sysfs_reading("0000:03:00.0", str(tmp_path))
    check_kinds(reading)
    assert reading["source"] == "sysfs"
    assert (reading["temperature_c"], reading["power_w"], reading["power_limit_w"]) == (
        61.0,
        151.5,
        300.0,
    )
    assert (reading["sm_clock_mhz"], reading["memory_clock_mhz"], reading["utilization"]) == (
        2100.0,
        1000.0,
        0.37,
    )
    assert reading["throttle_reasons"] is None
    (hwmon / "power1_average").unlink()
    (hwmon / "power1_input").write_text("90000000\n")  # i915 reports the instantaneous power
    (gpu / "gpu_busy_percent").unlink()
    reading = _telemetry._sysfs_reading("0000:03:00.0", str(tmp_path))
    assert reading["power_w"] == 90.0 and reading["utilization"] is None
    assert _telemetry._sysfs_reading("0000:04:00.0", str(tmp_path)) is None
    assert _telemetry._sysfs_reading("", str(tmp_path)) is None


def fake_nvml(uuids):
    """A stand-in for pynvml knowing the GPUs of `uuids` (their NVML UUID strings)."""

    def handle(uuid):
        if uuid not in uuids:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return uuid

    return types.SimpleNamespace(
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        nvmlDeviceGetHandleByUUID=handle,
        nvmlDeviceGetTemperature=lambda h, sensor: 55,
        nvmlDeviceGetPowerUsage=lambda h: 123456,  # mW
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700000,
        nvmlDeviceGetClockInfo=lambda h, clock: {1: 1980, 2: 2619}[clock],
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87),
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x4 | 0x20,
    )


def test_nvml_is_matched_by_uuid(monkeypatch):
    uuid = "5c1a9f0e0b1d4c2e8f3a6b7c8d9e0f1a"
    monkeypatch.setattr(
        _telemetry._Nvml, "_module", fake_nvml({"GPU-5c1a9f0e-0b1d-4c2e-8f3a-6b7c8d9e0f1a"})
    )
    reading = _telemetry._nvml_reading(uuid)
    check_kinds(reading)
    assert reading["source"] == "nvml" and reading["uuid"] == uuid
    assert (reading["temperature_c"], reading["power_w"], reading["power_limit_w"]) == (
        55.0,
        123.456,
        700.0,
    )
    assert (reading["sm_clock_mhz"], reading["memory_clock_mhz"], reading["utilization"]) == (
        1980.0,
        2619.0,
        0.87,
    )
    assert reading["throttle_reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]
    assert _telemetry._nvml_reading("00" * 16) is None  # another GPU: no reading, not the wrong one
    assert _telemetry._nvml_reading("") is None


def test_an_nvidia_gpu_reports_through_nvml(device, rng):
    """On an NVIDIA GPU with nvidia-ml-py: plausible readings from the GPU whose UUID and PCI
    address are the Vulkan device's, and a kernel loop that raises the SM clock."""
    if device.info.vendor_id != _telemetry.NVIDIA or device.info.type == "cpu":
        pytest.skip("not an NVIDIA GPU")
    pynvml = pytest.importorskip("pynvml")
    reading = device.telemetry()
    assert reading["source"] == "nvml"
    check_kinds(reading)
    assert 5 <= reading["temperature_c"] <= 110
    assert 10 <= reading["power_w"] <= reading["power_limit_w"] * 1.2
    handle = _telemetry._Nvml.handle(device.info.uuid)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    assert uuid.replace("GPU-", "").replace("-", "") == device.info.uuid
    bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
    bus = (bus.decode() if isinstance(bus, bytes) else bus).lower()
    assert bus.endswith(device.info.pci_address[5:])  # NVML writes an 8-digit domain
    # A graph of 20 matmuls replayed back to back keeps the GPU busy (an idle H100 sits at 345 MHz,
    # and its clock takes a moment to rise): 1 to 5 s, until readings show the clock up and work.
    w = bg.quantize_weights(rng.standard_normal((4096, 4096)).astype(np.float32))
    graph = device.graph()
    with graph:
        x = graph.input("x", (2048, 4096))
        for _ in range(20):
            bg.bitlinear(x, w)
    graph.run(x=rng.standard_normal((2048, 4096)).astype(np.float32))
    idle = device.telemetry()["sm_clock_mhz"]
    sampler = bg._telemetry.TelemetrySampler(device, 0.01)
    sampler.start()
    start = time.perf_counter()
    while time.perf_counter() < start + 5:
        graph.run()
        readings = [r for _, r in list(sampler.samples)]
        if (
            time.perf_counter() > start + 1
            and any((r["sm_clock_mhz"] or 0) >= 1000 for r in readings)
            and any((r["utilization"] or 0) > 0 for r in readings)
        ):
            break
    samples = sampler.stop()
    clocks = [r["sm_clock_mhz"] for _, r in samples if r["sm_clock_mhz"] is not None]
    assert max(clocks) >= max(1000, idle), (idle, clocks)
    assert max(r["utilization"] for _, r in samples) > 0
