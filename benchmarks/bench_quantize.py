"""Quantization benchmark: absmean ternary weights and per-token int8 activations.

GPU time of bitnet_gpu's kernels from Vulkan timestamps (bg.profile); beside it, when PyTorch with
CUDA is importable, the same formulas in PyTorch eager mode on the same GPU (CUDA events), and
PyTorch's device copy as the bandwidth ceiling. Prints a table and writes JSON.

    python3 benchmarks/bench_quantize.py [--small] [--json FILE]
"""

from __future__ import annotations

import time

import numpy as np

import bitnet_gpu as bg
from common import (
    arguments,
    by_kernel,
    profiled,
    torch_copy_gbps,
    torch_cuda,
    torch_time,
    write_results,
)  # benchmarks/common.py


def main():
    args = arguments(
        __doc__,
        lambda parser: parser.add_argument(
            "--small", action="store_true", help="sizes for CPU devices (lavapipe)"
        ),
    )
    device = bg.default_device()
    torch = torch_cuda()
    small = args.small or device.info.type == "cpu"
    weight_sizes = [(1024, 1024), (2048, 2048)] if small else [(4096, 4096), (16384, 16384)]
    act_sizes = [(1024, 1024), (1, 16384)] if small else [(4096, 4096), (1, 16384)]
    rng = np.random.default_rng(0)
    results = {
        "device": device.name,
        "driver": device.info.driver_info,
        "torch": None if torch is None else torch.__version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rows": [],
    }

    copy_gbps = None
    if torch is not None:
        copy_gbps = torch_copy_gbps(torch, args.repeats)
    else:  # the copy kernel, as the ceiling on devices without CUDA PyTorch
        words = 2**22
        src = device.empty((words, 4), np.uint32)
        dst = device.empty((words, 4), np.uint32)
        k = bg.builtin_kernel("copy_vec4", device, {0: 256})
        groups = min(words // 256, device.info.max_workgroup_count[0])
        t, _ = profiled(bg, device, lambda: k.dispatch(groups, [src, dst], np.uint32(words)), 5)
        copy_gbps = 2 * 16 * words / t / 1e9
    results["copy_GBps"] = copy_gbps

    def measure(op, shape, fn, minimum, torch_fn):
        """A result row: GPU time of fn(), GB/s over `minimum` bytes, and torch_fn() when given."""
        t, timings = profiled(bg, device, fn, args.repeats)
        row = {
            "op": op,
            "shape": list(shape),
            "gpu_s": t,
            "kernels": by_kernel(timings),
            "GBps_over_minimum": minimum / t / 1e9,
            "fraction_of_copy": minimum / t / 1e9 / copy_gbps,
        }
        if torch_fn is not None:
            row["torch_s"] = torch_time(torch, torch_fn, args.repeats)
            row["speedup_vs_torch"] = row["torch_s"] / t
        results["rows"].append(row)

    for n, k in weight_sizes:
        w = bg.Tensor.from_numpy(rng.standard_normal((n, k), dtype=np.float32), device)
        tw = None if torch is None else torch.from_numpy(w.numpy()).cuda()

        def torch_weights():
            gamma = tw.abs().mean().clamp(min=1e-5)
            return (tw / gamma).round().clamp(-1, 1).to(torch.int8)

        # The global mean needs a first read of W before any weight can be rounded: two reads of W
        # and one write of the packed weights are the fewest bytes without a grid-wide sync.
        measure(
            "quantize_weights",
            (n, k),
            lambda: bg.quantize_weights(w),
            2 * n * k * 4 + n * k // 4 + 4,
            None if torch is None else torch_weights,
        )

    for n, k in act_sizes:
        x = bg.Tensor.from_numpy(rng.standard_normal((n, k), dtype=np.float32), device)
        tx = None if torch is None else torch.from_numpy(x.numpy()).cuda()

        def torch_activations():
            s = 127.0 / tx.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
            return (tx * s).round().clamp(-128, 127).to(torch.int8), s

        measure(
            "quantize_activations",
            (n, k),
            lambda: bg.quantize_activations(x),
            n * k * 4 + n * k + n * 4,
            None if torch is None else torch_activations,
        )

    print(
        f"\n{device.name}: quantization, GPU time (Vulkan timestamps)"
        + (f" vs torch {results['torch']} eager (CUDA events)" if torch else "")
    )
    print(
        f"copy bandwidth ceiling: {copy_gbps:.0f} GB/s "
        f"({'torch device copy' if torch else 'copy_vec4 kernel'}, read + write)"
    )
    print(
        f"{'op':22s} {'shape':>14s} {'GPU us':>10s} {'GB/s':>8s} {'of copy':>8s} "
        f"{'torch us':>10s} {'speedup':>8s}"
    )
    for r in results["rows"]:
        torch_cols = (
            f"{r['torch_s'] * 1e6:10.1f} {r['speedup_vs_torch']:7.2f}x"
            if "torch_s" in r
            else f"{'-':>10s} {'-':>8s}"
        )
        print(
            f"{r['op']:22s} {str(tuple(r['shape'])):>14s} {r['gpu_s'] * 1e6:10.1f} "
            f"{r['GBps_over_minimum']:8.1f} {r['fraction_of_copy']:8.1%} {torch_cols}"
        )
    write_results(args.json, results)


if __name__ == "__main__":
    main()
