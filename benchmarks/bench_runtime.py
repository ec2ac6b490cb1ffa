"""Runtime benchmark: dispatch overhead, host<->device copies and device copy bandwidth.

GPU times come from Vulkan timestamp queries; beside them, when PyTorch with CUDA is importable,
the same transfers and copies through PyTorch in the same run (CUDA events). Prints a table and
writes JSON. Not a test: nothing here asserts a speed.

    python3 benchmarks/bench_runtime.py [--size-mib 512] [--json FILE]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np

import bitnet_gpu as bg
from common import median_wall, torch_cuda, torch_time, write_results  # benchmarks/common.py


def dispatch_overhead(device, results):
    empty = bg.builtin_kernel("empty", device)
    for _ in range(20):
        empty.dispatch(1, [])
    wall_immediate = median_wall(lambda: empty.dispatch(1, []), 200)
    with device.sequence() as seq:
        empty.dispatch(1, [])
    gpu_immediate = seq.timings()[0][1]

    count = 1000

    def record_and_run(timings):
        with device.sequence(timings=timings) as s:
            for _ in range(count):
                empty.dispatch(1, [])
        return s

    record_and_run(False)
    wall_sequence = median_wall(lambda: record_and_run(False), 5) / count
    # Two timestamps around the whole sequence: per-op timestamps would serialize the dispatches.
    gpu = [record_and_run("total").timings()[0][1] / count for _ in range(5)]
    gpu_timed_each = [sum(t for _, t in record_and_run(True).timings()) / count for _ in range(5)]
    results["dispatch"] = {
        "immediate_wall_us": wall_immediate * 1e6,
        "immediate_gpu_us": gpu_immediate * 1e6,
        "sequence_of_1000_wall_us_per_dispatch": wall_sequence * 1e6,
        "sequence_of_1000_gpu_us_per_dispatch": statistics.median(gpu) * 1e6,
        "sequence_of_1000_gpu_us_per_dispatch_timestamp_each": statistics.median(gpu_timed_each)
        * 1e6,
    }


def transfers(device, nbytes, repeats, results, torch):
    host = np.random.default_rng(0).integers(0, 255, size=nbytes, dtype=np.uint8)
    out = np.empty_like(host)
    rows = {}
    for memory in ("device", "host"):
        t = bg.Tensor.from_numpy(host, device, memory=memory)
        up = median_wall(lambda: bg.Tensor.from_numpy(host, device, memory=memory), repeats)
        down = median_wall(lambda: t.numpy(out=out), repeats)
        assert np.array_equal(out, host)
        rows[f"bitnet_gpu upload ({memory})"] = nbytes / up / 1e9
        rows[f"bitnet_gpu download ({memory})"] = nbytes / down / 1e9
    if device.info.features["external_memory_host"]:
        aligned = bg.aligned_empty(nbytes, np.uint8, device)
        aligned[:] = host
        up = median_wall(lambda: bg.Tensor.from_numpy(aligned, device, zero_copy=True), repeats)
        rows["bitnet_gpu zero-copy import"] = nbytes / up / 1e9
    if torch is not None:
        pageable = torch.from_numpy(host)
        pinned = pageable.pin_memory()
        gpu = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        rows["torch upload (pinned)"] = (
            nbytes / torch_time(torch, lambda: gpu.copy_(pinned, non_blocking=True), repeats) / 1e9
        )
        rows["torch upload (pageable)"] = (
            nbytes / torch_time(torch, lambda: gpu.copy_(pageable), repeats) / 1e9
        )
        rows["torch download (pinned)"] = (
            nbytes / torch_time(torch, lambda: pinned.copy_(gpu, non_blocking=True), repeats) / 1e9
        )
        rows["torch download (pageable)"] = (
            nbytes / torch_time(torch, lambda: pageable.copy_(gpu), repeats) / 1e9
        )
    results["transfers_GBps"] = rows


def device_copy(device, nbytes, repeats, results, torch):
    words = nbytes // 16
    src = bg.Tensor.from_numpy(
        np.random.default_rng(1).integers(0, 2**32, size=(words, 4), dtype=np.uint32), device
    )
    dst = device.empty((words, 4), np.uint32)
    local = 256
    copy = bg.builtin_kernel("copy_vec4", device, {0: local})
    groups = min(-(-words // local), device.info.max_workgroup_count[0])
    with device.sequence() as seq:
        for _ in range(repeats):
            copy.dispatch(groups, [src, dst], np.uint32(words))
            seq.copy(src, dst)
    kernel_times = [t for label, t in seq.timings() if label == "copy_vec4"]
    transfer_times = [t for label, t in seq.timings() if label == "copy"]
    assert np.array_equal(np.asarray(dst), np.asarray(src))
    rows = {
        "copy_vec4 kernel": 2 * nbytes / statistics.median(kernel_times) / 1e9,
        "vkCmdCopyBuffer": 2 * nbytes / statistics.median(transfer_times) / 1e9,
    }
    if torch is not None:
        a = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
        b = torch.empty_like(a)
        rows["torch device-to-device copy"] = (
            2 * nbytes / torch_time(torch, lambda: b.copy_(a), repeats) / 1e9
        )
    results["device_copy_GBps"] = rows  # bytes read plus bytes written


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size-mib",
        type=int,
        default=None,
        help="transfer and copy size (default 512, 64 on CPU devices)",
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", default=None, help="where to write the results")
    args = parser.parse_args()

    device = bg.default_device()
    torch = torch_cuda()
    size_mib = args.size_mib or (64 if device.info.type == "cpu" else 512)
    nbytes = size_mib * 2**20
    results = {
        "device": device.name,
        "device_type": device.info.type,
        "driver": f"{device.info.driver_name} {device.info.driver_info}",
        "vulkan": device.info.vulkan_version,
        "host": platform.node(),
        "size_bytes": nbytes,
        "torch": None if torch is None else f"{torch.__version__} {torch.cuda.get_device_name()}",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    dispatch_overhead(device, results)
    transfers(device, nbytes, max(3, args.repeats // 4), results, torch)
    device_copy(device, nbytes, args.repeats, results, torch)

    print(
        f"\n{device.name} ({results['driver']}), {size_mib} MiB buffers"
        + (f"; peer: torch {results['torch']}" if torch else "; no CUDA PyTorch here")
    )
    print(f"{'dispatch overhead':40s} {'GPU us':>10s} {'wall us':>10s}")
    d = results["dispatch"]
    print(
        f"{'  empty kernel, called immediately':40s} {d['immediate_gpu_us']:10.2f} "
        f"{d['immediate_wall_us']:10.2f}"
    )
    print(
        f"{'  per dispatch, 1000 in one sequence':40s} "
        f"{d['sequence_of_1000_gpu_us_per_dispatch']:10.2f} "
        f"{d['sequence_of_1000_wall_us_per_dispatch']:10.2f}"
    )
    print(
        f"{'  same, with a timestamp after each op':40s} "
        f"{d['sequence_of_1000_gpu_us_per_dispatch_timestamp_each']:10.2f}"
    )
    print(f"{'host <-> device':40s} {'GB/s':>10s}")
    for name, value in results["transfers_GBps"].items():
        print(f"  {name:38s} {value:10.2f}")
    print(f"{'device copy (read + write bytes)':40s} {'GB/s':>10s} {'of torch':>10s}")
    rows = results["device_copy_GBps"]
    peer = rows.get("torch device-to-device copy")
    for name, value in rows.items():
        ratio = f"{value / peer:10.1%}" if peer else f"{'-':>10s}"
        print(f"  {name:38s} {value:10.1f} {ratio}")
    write_results(args.json, results)


if __name__ == "__main__":
    main()
