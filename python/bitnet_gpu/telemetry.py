"""Device telemetry: temperature, power, clocks, utilization and throttling, which Vulkan does not
report, read from the platform beside it.

Sources, in order: NVML (``nvidia-ml-py``, an optional dependency) for NVIDIA GPUs, matched to the
Vulkan device by UUID; Linux hwmon/sysfs for AMD and Intel GPUs, matched by PCI address; nothing
for CPU devices. Every field is None where the platform does not say.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from typing import Any

from ._core import Device

__all__ = ["FIELDS", "TelemetrySampler", "summary", "telemetry"]

FIELDS = (
    "temperature_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "memory_clock_mhz",
    "utilization",
    "throttle_reasons",
)
NVIDIA, AMD, INTEL = 0x10DE, 0x1002, 0x8086


def _empty(source: str | None) -> dict[str, Any]:
    reading: dict[str, Any] = dict.fromkeys(FIELDS)
    reading["source"] = source
    return reading


# NVML's clock-event (throttle) reason bits and the names telemetry gives them.
_NVML_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


class _Nvml:
    """NVML, initialized once per process, and handles by Vulkan UUID."""

    _lock = threading.Lock()
    _module: Any = None
    _failed = False

    @classmethod
    def module(cls) -> Any:
        with cls._lock:
            if cls._module is None and not cls._failed:
                try:
                    import pynvml  # type: ignore[import-not-found,unused-ignore]

                    pynvml.nvmlInit()
                    cls._module = pynvml
                except Exception:  # no nvidia-ml-py, or no driver library: no NVML readings
                    cls._failed = True
            return cls._module

    @classmethod
    def handle(cls, uuid: str) -> Any:
        nvml = cls.module()
        if nvml is None or len(uuid) != 32:
            return None
        text = f"GPU-{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:]}"
        try:
            return nvml.nvmlDeviceGetHandleByUUID(text)
        except Exception:  # NVML does not know this device (another driver, a VM's view)
            return None


def _nvml_reading(uuid: str) -> dict[str, Any] | None:
    handle = _Nvml.handle(uuid)
    if handle is None:
        return None
    nvml = _Nvml.module()
    reading = _empty("nvml")

    def ask(field: str, read: Any) -> None:
        try:
            reading[field] = read()
        except Exception:  # a query this GPU or driver does not answer
            reading[field] = None

    ask(
        "temperature_c",
        lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
    )
    ask("power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
    ask("power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)
    ask("sm_clock_mhz", lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
    ask("memory_clock_mhz", lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)))
    ask("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)

    def reasons() -> list[str]:
        ask_bits = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        bits = (ask_bits or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)(handle)
        return [name for bit, name in _NVML_REASONS.items() if bits & bit]

    ask("throttle_reasons", reasons)
    reading["uuid"] = uuid
    return reading


def _read_number(path: str) -> float | None:
    try:
        with open(path) as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _sysfs_reading(pci_address: str, root: str = "/sys/bus/pci/devices") -> dict[str, Any] | None:
    """hwmon's readings of the GPU at `pci_address` (amdgpu and i915/xe expose these files)."""
    folder = os.path.join(root, pci_address)
    if not pci_address or not os.path.isdir(folder):
        return None
    reading = _empty("sysfs")
    hwmons = sorted(glob.glob(os.path.join(folder, "hwmon", "hwmon*")))
    if hwmons:
        hwmon = hwmons[0]
        temperature = _read_number(os.path.join(hwmon, "temp1_input"))  # millidegrees
        reading["temperature_c"] = None if temperature is None else temperature / 1000.0
        for name in ("power1_average", "power1_input"):  # microwatts
            power = _read_number(os.path.join(hwmon, name))
            if power is not None:
                reading["power_w"] = power / 1e6
                break
        cap = _read_number(os.path.join(hwmon, "power1_cap"))
        reading["power_limit_w"] = None if cap is None else cap / 1e6
        sclk = _read_number(os.path.join(hwmon, "freq1_input"))  # hertz (amdgpu: sclk)
        reading["sm_clock_mhz"] = None if sclk is None else sclk / 1e6
        mclk = _read_number(os.path.join(hwmon, "freq2_input"))  # hertz (amdgpu: mclk)
        reading["memory_clock_mhz"] = None if mclk is None else mclk / 1e6
    busy = _read_number(os.path.join(folder, "gpu_busy_percent"))  # amdgpu
    reading["utilization"] = None if busy is None else busy / 100.0
    return reading


def telemetry(device: Device | None = None) -> dict[str, Any]:
    """The device's state now: temperature_c, power_w, power_limit_w, sm_clock_mhz,
    memory_clock_mhz, utilization (0 to 1) and throttle_reasons (a list of names), each None where
    the platform does not say, and `source` ('nvml', 'sysfs' or None)."""
    from ._core import default_device

    info = (device or default_device()).info
    reading = None
    if info.type != "cpu":
        if info.vendor_id == NVIDIA:
            reading = _nvml_reading(info.uuid)
        if reading is None and info.vendor_id in (AMD, INTEL, NVIDIA):
            reading = _sysfs_reading(info.pci_address)
    return reading or _empty(None)


class TelemetrySampler:
    """Reads telemetry(device) every `interval` seconds on a thread of its own, from start() to
    stop(); `samples` holds (seconds since start, reading) pairs."""

    def __init__(self, device: Device, interval: float = 0.01):
        if not interval > 0:
            raise ValueError(f"interval: expected seconds above 0, got {interval!r}")
        self.device = device
        self.interval = float(interval)
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._origin = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="bitnet_gpu telemetry", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.samples.append((time.perf_counter() - self._origin, telemetry(self.device)))
            if self._stop.wait(self.interval):
                break

    def stop(self) -> list[tuple[float, dict[str, Any]]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self.samples


def summary(samples: list[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    """Samples in brief: each numeric field's median and maximum (None where never reported), the
    throttle reasons seen, the source and the count, for a benchmark to print beside its times."""
    readings = [reading for _, reading in samples]
    result: dict[str, Any] = {"samples": len(readings)}
    result["source"] = next((r["source"] for r in readings if r.get("source")), None)
    for field in FIELDS[:-1]:
        values = sorted(r[field] for r in readings if r.get(field) is not None)
        result[field] = (values[len(values) // 2], values[-1]) if values else None
    reasons = sorted({name for r in readings for name in (r.get("throttle_reasons") or [])})
    result["throttle_reasons"] = (
        reasons if any(r.get("throttle_reasons") is not None for r in readings) else None
    )
    return result
