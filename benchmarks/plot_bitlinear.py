"""Plots a bench_bitlinear.py JSON: GPU time per shape for bitnet_gpu, cuBLAS float16 and
PyTorch int8 (log scale), with bitnet_gpu's speedup over float16 above each group.

    python3 benchmarks/plot_bitlinear.py benchmarks/results/bitlinear-h100.json
    benchmarks/bitlinear-h100.png

Needs matplotlib (pip install ".[bench]").
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main(source, target):
    with open(source) as f:
        results = json.load(f)
    rows = results["rows"]
    labels = [f"M={m}\nK={k}\nN={n}" for m, k, n in (r["shape"] for r in rows)]
    series = [
        ("bitnet_gpu (ternary x int8, Vulkan)", "gpu_s", "#1f77b4"),
        ("cuBLAS float16 (torch linear)", "cublas_fp16_s", "#ff7f0e"),
        ("cuBLASLt int8 (torch int8 matmul)", "torch_int_mm_s", "#2ca02c"),
    ]
    x = np.arange(len(rows))
    width = 0.27
    fig, ax = plt.subplots(figsize=(12, 5.5))
    for i, (name, key, color) in enumerate(series):
        values = [r.get(key, np.nan) * 1e6 for r in rows]
        ax.bar(x + (i - 1) * width, values, width, label=name, color=color)
    for xi, r in zip(x, rows):
        if "speedup_vs_fp16" in r:
            top = max(r["gpu_s"], r.get("cublas_fp16_s", 0), r.get("torch_int_mm_s", 0)) * 1e6
            ax.text(xi, top * 1.15, f"{r['speedup_vs_fp16']:.1f}x", ha="center", fontsize=9)
    ax.set_yscale("log")
    ax.set_ylabel("GPU time per call (us, log scale)")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_title(
        f"BitLinear on {results['device']}: GPU time (Vulkan timestamps vs CUDA events); "
        "label = speedup over cuBLAS float16",
        fontsize=10,
    )
    ax.legend(fontsize=9, loc="upper left")
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    print(f"wrote {target}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
