"""Typed user code: mypy checks it against bitnet_gpu's stubs (tests_py/test_typing.py)."""

from __future__ import annotations

import numpy as np

import bitnet_gpu as bg


def first_rows(device: bg.Device, rows: int) -> np.ndarray:
    """A host-visible tensor shared with NumPy through DLPack, and back."""
    t: bg.Tensor = bg.Tensor.from_numpy(np.ones((rows, 4), np.float32), device, memory="host")
    view = np.from_dlpack(t)
    again: bg.Tensor = bg.from_dlpack(view, device=device, copy=None)
    shape: tuple[int, ...] = again.shape
    assert shape == (rows, 4)
    return view


def describe() -> str:
    device = bg.default_device()
    info: bg.DeviceInfo = device.info
    features: dict[str, bool] = info.features
    with bg.tuning(matvec_rows=4):
        knobs: dict = bg.get_tuning()
    graph = device.graph(timings=False)
    return f"{info.name}: {len(features)} features, {len(knobs)} knobs, {graph.op_count} ops"


if __name__ == "__main__":
    print(describe(), first_rows(bg.default_device(), 3).shape)
