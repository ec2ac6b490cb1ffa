"""BitLinear benchmark: GPU time of bitnet_gpu.bitlinear (Vulkan timestamps, all its kernels) beside
torch.nn.functional.linear in float16 (cuBLAS) and PyTorch's int8 matmul
(common.torch_int8_matmul) on the same GPU in the same run (CUDA events). Also sweeps the tuning
knobs (matvec rows per subgroup, cooperative-matrix tile) and breaks down the wall time of a
NumPy-in NumPy-out call. Prints tables and writes JSON.

    python3 benchmarks/bench_bitlinear.py [--json FILE] [--repeats N]
"""

from __future__ import annotations

import time

import numpy as np

import bitnet_gpu as bg
from common import (
    arguments,
    by_kernel,
    graph_seconds,
    median_wall,
    profiled,
    torch_copy_gbps,
    torch_cuda,
    torch_int8_matmul,
    torch_time,
    with_settings,
    write_results,
)  # benchmarks/common.py

SHAPES = [
    (1, 2560, 6912),
    (1, 6912, 2560),
    (1, 4096, 4096),
    (1, 8192, 8192),
    (1, 16384, 16384),
    (8, 4096, 4096),
    (512, 4096, 4096),
    (2048, 4096, 4096),
    (2048, 2560, 6912),
    (2048, 6912, 2560),
    (2048, 2560, 3840),
]
SMALL = [(1, 2560, 6912), (8, 1024, 1024), (64, 512, 512)]
# (M, K, N, group_size): weights with one scale per group along K, on their own kernel.
GROUPED = [
    (1, 2560, 6912, 128),
    (1, 16384, 16384, 128),
    (8, 4096, 4096, 128),
    (512, 4096, 4096, 128),
]
GROUPED_SMALL = [(1, 2560, 6912, 128), (8, 1024, 1024, 64)]
MATVEC_SETTINGS = [
    ("2", "1"),
    ("4", "1"),
    ("8", "1"),
    ("2", "2"),
    ("4", "2"),
    ("2", "4"),
    ("4", "4"),
]
COOPMAT_TILES = [
    "64x128",
    "128x128",
    "128x256",
    "256x128",
    "64x128x128",
    "128x128x128",
    "64x256x128",
    "160x128x128",
    "128x96x128",
]
# The cooperative-matrix-2 kernel's tiles: activation rows x weight rows x K step.
COOPMAT2_TILES = ["256x128x64", "64x64x64", "128x128x64", "64x128x64"]


def gpu_time(device, fn, repeats):
    """Median GPU seconds of fn()'s ops timed as a whole (a graph with one timestamp pair, so the
    ops run as in a plain call), and the per-kernel times of a profiled run (a timestamp after each
    op, which adds to each op's time; the pre-pass's two phases share a label and are added)."""
    return graph_seconds(bg, device, fn, repeats), by_kernel(profiled(bg, device, fn, repeats)[1])


def parity(x, q, algorithm=None):
    """(relative error of y, accumulators bit-identical) over the first rows, against the
    reference."""
    rows = min(x.shape[0], 8)  # rows are independent; the int64 reference is slow for M = 2048
    y, acc = bg.bitlinear(x, q, return_accumulator=True, algorithm=algorithm)
    xs = x.numpy()[:rows]  # the reference quantizes with the GPU's scale (docs/NUMERICS.md)
    ry, racc = bg.reference.bitlinear(xs, q.unpack(), q.scale, scale=bg.quantize_activations(xs)[1])
    return (
        float(np.linalg.norm(y.numpy()[:rows] - ry) / np.linalg.norm(ry)),
        bool(np.array_equal(acc.numpy()[:rows], racc)),
    )


def main():
    args = arguments(__doc__)
    device = bg.default_device()
    torch = torch_cuda()
    shapes = SMALL if device.info.type == "cpu" else SHAPES
    tensor_cores = device.info.features.get("cooperative_matrix_int8", False)
    khr_tensor_cores = device.info.features.get("cooperative_matrix_khr_int8", False)
    coopmat2 = device.info.features.get("cooperative_matrix2_int8", False)
    rng = np.random.default_rng(0)
    results = {
        "device": device.name,
        "driver": device.info.driver_info,
        "torch": None if torch is None else torch.__version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rows": [],
    }
    if torch is not None:
        results["copy_GBps"] = torch_copy_gbps(torch, args.repeats)
    for m, k, n in shapes:
        q = bg.quantize_weights(rng.standard_normal((n, k), dtype=np.float32))
        x = bg.Tensor.from_numpy(rng.standard_normal((m, k), dtype=np.float32))
        t, kernels = gpu_time(device, lambda: bg.bitlinear(x, q), args.repeats)
        rel, exact = parity(x, q)
        packed = q.packed_tensor.nbytes
        row = {
            "shape": [m, k, n],
            "gpu_s": t,
            "kernels": kernels,
            "parity_rel": rel,
            "accumulators_exact": exact,
            "weight_GBps": packed / t / 1e9,
            "variants": {},
        }
        if m <= 8:
            # the pre-passes before the strided matvec, and the strided matvec's two local sizes
            settings = {
                f"pre-pass split={split:d}": {"prepare_split": split, "matvec_strided": 0}
                for split in (False, True)
            }
            settings.update({f"strided {size}": {"matvec_strided": size} for size in (512, 1024)})
            for name, setting in settings.items():
                row["variants"][name] = with_settings(
                    setting, lambda: gpu_time(device, lambda: bg.bitlinear(x, q), args.repeats)[0]
                )
            for rows, unroll in MATVEC_SETTINGS:
                row["variants"][f"matvec rows={rows} unroll={unroll}"] = with_settings(
                    {"matvec_rows": rows, "matvec_unroll": unroll},
                    lambda: gpu_time(
                        device, lambda: bg.bitlinear(x, q, algorithm="matvec"), args.repeats
                    )[0],
                )
        else:
            if m <= 512 or device.info.type == "cpu":
                row["variants"]["tiled"] = gpu_time(
                    device, lambda: bg.bitlinear(x, q, algorithm="tiled"), args.repeats
                )[0]
            if tensor_cores:
                for tile in COOPMAT_TILES:

                    def run():
                        rel_t, exact_t = parity(x, q, "coopmat")
                        row.setdefault("coopmat_parity", {})[tile] = [rel_t, exact_t]
                        return gpu_time(
                            device, lambda: bg.bitlinear(x, q, algorithm="coopmat"), args.repeats
                        )[0]

                    row["variants"][f"coopmat {tile}"] = with_settings({"coopmat_tile": tile}, run)
            if khr_tensor_cores:  # the same kernel through VK_KHR_cooperative_matrix
                row["coopmat_khr_parity"] = {"default": parity(x, q, "coopmat_khr")}
                row["variants"]["coopmat_khr"] = gpu_time(
                    device, lambda: bg.bitlinear(x, q, algorithm="coopmat_khr"), args.repeats
                )[0]
            if coopmat2:
                for tile in COOPMAT2_TILES:

                    def run2():
                        row.setdefault("coopmat2_parity", {})[tile] = parity(x, q, "coopmat2")
                        return gpu_time(
                            device, lambda: bg.bitlinear(x, q, algorithm="coopmat2"), args.repeats
                        )[0]

                    try:
                        row["variants"][f"coopmat2 {tile}"] = with_settings(
                            {"coopmat2_tile": tile}, run2
                        )
                    except bg.Error as error:  # a tile the driver cannot build
                        row.setdefault("coopmat2_errors", {})[tile] = str(error)
        if "copy_GBps" in results:
            row["fraction_of_copy"] = row["weight_GBps"] / results["copy_GBps"]
        if torch is not None:
            xh = torch.randn(m, k, device="cuda", dtype=torch.float16)
            wh = torch.randn(n, k, device="cuda", dtype=torch.float16)
            row["cublas_fp16_s"] = torch_time(
                torch, lambda: torch.nn.functional.linear(xh, wh), args.repeats
            )
            row["speedup_vs_fp16"] = row["cublas_fp16_s"] / t
            if m >= 17:  # PyTorch's int8 matmul needs M > 16
                xi = torch.randint(-128, 127, (m, k), device="cuda", dtype=torch.int8)
                # [K, N] column-major (a transposed [N, K]), the layout cuBLASLt's int8
                # kernels take: row-major [K, N] ran 5-7x slower at M = 2048.
                wi = torch.randint(-128, 127, (n, k), device="cuda", dtype=torch.int8).t()
                row["torch_int_mm_s"] = torch_time(
                    torch, lambda: torch_int8_matmul(torch, xi, wi), args.repeats
                )
            del xh, wh
        results["rows"].append(row)
        print(
            f"  {(m, k, n)}: {t * 1e6:.1f} us  "
            + "  ".join(f"{name}: {v * 1e6:.1f}" for name, v in row["variants"].items()),
            flush=True,
        )

    # Weights with one scale per group along K: beside the same shape with one scale per tensor.
    results["grouped"] = []
    for m, k, n, g in GROUPED_SMALL if device.info.type == "cpu" else GROUPED:
        w = rng.standard_normal((n, k), dtype=np.float32)
        q, q_tensor = bg.quantize_weights(w, group_size=g), bg.quantize_weights(w)
        x = bg.Tensor.from_numpy(rng.standard_normal((m, k), dtype=np.float32))
        t, kernels = gpu_time(device, lambda: bg.bitlinear(x, q), args.repeats)
        t_tensor = gpu_time(device, lambda: bg.bitlinear(x, q_tensor), args.repeats)[0]
        rows = min(m, 8)
        y, acc = bg.bitlinear(x, q, return_accumulator=True)
        xs = x.numpy()[:rows]
        ry, racc = bg.reference.bitlinear(
            xs, q.unpack(), q.scale, scale=bg.quantize_activations(xs)[1]
        )
        row = {
            "shape": [m, k, n],
            "group_size": g,
            "gpu_s": t,
            "kernels": kernels,
            "per_tensor_scale_gpu_s": t_tensor,
            "weight_GBps": q.packed_tensor.nbytes / t / 1e9,
            "parity_rel": float(np.linalg.norm(y.numpy()[:rows] - ry) / np.linalg.norm(ry)),
            "accumulators_exact": bool(np.array_equal(acc.numpy()[:rows], racc)),
        }
        if "copy_GBps" in results:
            row["fraction_of_copy"] = row["weight_GBps"] / results["copy_GBps"]
        results["grouped"].append(row)

    # A NumPy-in NumPy-out layer call, and what it is made of.
    layer = bg.nn.BitLinear(2560, 6912, bias=True, seed=0)
    xv = rng.standard_normal((1, 2560)).astype(np.float32)
    layer(xv)
    xt = bg.Tensor.from_numpy(xv)
    yt = layer(xt)
    parts = {
        "whole call": median_wall(lambda: layer(xv), 200),
        "upload x (Tensor.from_numpy)": median_wall(lambda: bg.Tensor.from_numpy(xv), 200),
        "bitlinear on Tensors (record, submit, wait)": median_wall(lambda: layer(xt), 200),
        "download y (Tensor.numpy)": median_wall(lambda: yt.numpy(), 200),
        "GPU time of its kernels": gpu_time(device, lambda: layer(xt), 50)[0],
    }
    results["numpy_call_wall_s_1x2560x6912"] = parts["whole call"]
    results["numpy_call_parts_s"] = parts

    print(
        f"\n{device.name}: bitlinear GPU time (Vulkan timestamps, pre-pass + matmul)"
        + (f" vs torch {results['torch']} (CUDA events)" if torch else "")
    )
    print(
        f"{'(M, K, N)':>20s} {'kernel':>18s} {'GPU us':>9s} {'W GB/s':>8s} {'of copy':>8s} "
        f"{'fp16 us':>9s} {'speedup':>8s} {'int_mm us':>9s} {'parity':>8s} {'acc':>5s}"
    )
    for r in results["rows"]:
        main_kernel = max(r["kernels"], key=r["kernels"].get) if r["kernels"] else "?"
        print(
            f"{str(tuple(r['shape'])):>20s} {main_kernel[:18]:>18s} {r['gpu_s'] * 1e6:9.1f} "
            f"{r['weight_GBps']:8.0f} {r.get('fraction_of_copy', float('nan')):8.1%} "
            f"{r.get('cublas_fp16_s', float('nan')) * 1e6:9.1f} "
            f"{r.get('speedup_vs_fp16', float('nan')):7.2f}x "
            f"{r.get('torch_int_mm_s', float('nan')) * 1e6:9.1f} {r['parity_rel']:8.1e} "
            f"{'exact' if r['accumulators_exact'] else 'DIFF':>5s}"
        )
    for r in results["rows"]:
        for kind in ("coopmat", "coopmat_khr", "coopmat2"):
            for tile, (rel, exact) in r.get(f"{kind}_parity", {}).items():
                print(
                    f"  {kind} parity {tuple(r['shape'])} tile {tile}: y rel {rel:.1e}, "
                    f"accumulators {'bit-identical' if exact else 'DIFFER'}"
                )
        for tile, error in r.get("coopmat2_errors", {}).items():
            print(f"  coopmat2 {tuple(r['shape'])} tile {tile}: {error}")
    print("\nWeights with one scale per group (bitlinear_grouped), beside one scale per tensor:")
    for r in results["grouped"]:
        of_copy = f", {100 * r['fraction_of_copy']:.1f}% of copy" if "fraction_of_copy" in r else ""
        print(
            f"{str(tuple(r['shape'])):>20s} group {r['group_size']:5d}: {r['gpu_s'] * 1e6:9.1f} us "
            f"({r['weight_GBps']:6.0f} GB/s{of_copy}); "
            f"one scale {r['per_tensor_scale_gpu_s'] * 1e6:9.1f} us; y rel {r['parity_rel']:.1e}, "
            f"accumulators {'exact' if r['accumulators_exact'] else 'DIFFER'}"
        )
    print("NumPy-in NumPy-out BitLinear(2560 -> 6912, bias), M = 1, median wall:")
    for name, s in parts.items():
        print(f"  {name:>45s}: {s * 1e6:7.1f} us")
    write_results(args.json, results)


if __name__ == "__main__":
    main()
