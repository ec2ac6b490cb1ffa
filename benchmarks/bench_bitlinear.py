"""BitLinear benchmark: GPU time of bitnet_gpu.bitlinear (Vulkan timestamps, all its kernels) beside
torch.nn.functional.linear in float16 (cuBLAS) and torch._int_mm (int8) on the same GPU in the same
run (CUDA events). Prints a table and writes JSON.

    python3 benchmarks/bench_bitlinear.py [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import bitnet_gpu as bg
from common import torch_cuda, torch_time, write_results  # benchmarks/common.py

SHAPES = [(1, 2560, 6912), (1, 6912, 2560), (1, 4096, 4096), (1, 8192, 8192), (1, 16384, 16384),
          (8, 4096, 4096), (512, 4096, 4096), (2048, 4096, 4096), (2048, 2560, 6912)]
SMALL = [(1, 2560, 6912), (8, 1024, 1024), (64, 512, 512)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = bg.default_device()
    torch = torch_cuda()
    shapes = SMALL if device.info.type == "cpu" else SHAPES
    rng = np.random.default_rng(0)
    results = {"device": device.name, "driver": device.info.driver_info,
               "torch": None if torch is None else torch.__version__,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": []}
    if torch is not None:
        a = torch.empty(2**30, dtype=torch.uint8, device="cuda").random_(0, 255)
        b = torch.empty_like(a)
        results["copy_GBps"] = 2 * a.numel() / torch_time(torch, lambda: b.copy_(a), args.repeats) / 1e9
        del a, b
    for m, k, n in shapes:
        w = rng.standard_normal((n, k), dtype=np.float32)
        q = bg.quantize_weights(w)
        x = bg.Tensor.from_numpy(rng.standard_normal((m, k), dtype=np.float32))
        y = bg.bitlinear(x, q)  # parity of this very shape, against the reference
        rows = min(m, 8)  # rows are independent; the int64 reference matmul is slow for M = 2048
        xs = x.numpy()[:rows]  # the reference quantizes with the GPU's scale (docs/NUMERICS.md)
        ry, _ = bg.reference.bitlinear(xs, q.unpack(), q.scale, scale=bg.quantize_activations(xs)[1])
        parity = float(np.linalg.norm(y.numpy()[:rows] - ry) / np.linalg.norm(ry))
        totals, kernels = [], {}
        for _ in range(args.repeats):
            with bg.profile(device) as p:
                bg.bitlinear(x, q)
            totals.append(p.total() - p.total("fill"))
            kernels = {label: s for label, s in p.timings if label != "fill"}
        t = statistics.median(totals)
        packed = q.packed_tensor.nbytes
        row = {"shape": [m, k, n], "gpu_s": t, "kernels": kernels, "parity_rel": parity,
               "weight_GBps": packed / t / 1e9}
        if "copy_GBps" in results:
            row["fraction_of_copy"] = row["weight_GBps"] / results["copy_GBps"]
        if torch is not None:
            xh = torch.randn(m, k, device="cuda", dtype=torch.float16)
            wh = torch.randn(n, k, device="cuda", dtype=torch.float16)
            row["cublas_fp16_s"] = torch_time(torch, lambda: torch.nn.functional.linear(xh, wh),
                                              args.repeats)
            row["speedup_vs_fp16"] = row["cublas_fp16_s"] / t
            if m >= 17:  # torch._int_mm needs M > 16
                xi = torch.randint(-128, 127, (m, k), device="cuda", dtype=torch.int8)
                wi = torch.randint(-128, 127, (k, n), device="cuda", dtype=torch.int8)
                row["torch_int_mm_s"] = torch_time(torch, lambda: torch._int_mm(xi, wi), args.repeats)
            del xh, wh
        results["rows"].append(row)
        print(f"  {(m, k, n)}: {t * 1e6:.1f} us", flush=True)

    wall_layer = bg.nn.BitLinear(2560, 6912, bias=False, seed=0)
    xv = rng.standard_normal((1, 2560)).astype(np.float32)
    wall_layer(xv)
    wall = []
    for _ in range(50):
        start = time.perf_counter()
        wall_layer(xv)
        wall.append(time.perf_counter() - start)
    results["numpy_call_wall_s_1x2560x6912"] = statistics.median(wall)

    print(f"\n{device.name}: bitlinear GPU time (Vulkan timestamps, pre-pass + matmul)"
          + (f" vs torch {results['torch']} (CUDA events)" if torch else ""))
    print(f"{'(M, K, N)':>20s} {'GPU us':>9s} {'W GB/s':>8s} {'of copy':>8s} {'fp16 us':>9s} "
          f"{'speedup':>8s} {'int_mm us':>9s} {'parity':>8s}")
    for r in results["rows"]:
        print(f"{str(tuple(r['shape'])):>20s} {r['gpu_s'] * 1e6:9.1f} {r['weight_GBps']:8.0f} "
              f"{r.get('fraction_of_copy', float('nan')):8.1%} "
              f"{r.get('cublas_fp16_s', float('nan')) * 1e6:9.1f} "
              f"{r.get('speedup_vs_fp16', float('nan')):7.2f}x "
              f"{r.get('torch_int_mm_s', float('nan')) * 1e6:9.1f} {r['parity_rel']:8.1e}")
    print(f"NumPy-in NumPy-out BitLinear(2560 -> 6912), M = 1: "
          f"{results['numpy_call_wall_s_1x2560x6912'] * 1e6:.0f} us wall (median of 50)")
    write_results(args.json, results)


if __name__ == "__main__":
    main()
