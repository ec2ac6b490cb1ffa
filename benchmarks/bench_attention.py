"""Prefill attention: GPU time (Vulkan timestamps, the call recorded as a graph and timed as a
whole) of causal grouped-query attention over T new tokens (20 query and 5 KV heads of 128, as in
BitNet b1.58 2B4T, or of --head-dim values), float32, under settings of the tuning knobs
(docs/TUNING.md), and with precision="float16" (tensor cores, where the device has float16
cooperative matrices; its error against the reference of the float16-rounded inputs), beside
PyTorch's scaled_dot_product_attention on the same GPU in the same run (float32, and float16
where its flash kernels run). Work is counted as the causal pairs' multiply-adds (2 * pairs * D
each for the scores and the weighted values), so TFLOP/s compare kernels, not peaks. Parity:
relative error of the output against the NumPy reference (float64) for the first setting, on the
heads of the first KV head.

    python3 benchmarks/bench_attention.py [--json FILE] [--repeats N] [--tokens 512,2048]
    [--head-dim 128]
        [--settings "default;attention_tile_keys=16"]
"""

from __future__ import annotations

import time

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu import reference as ref
from common import (
    label,
    parse_settings,
    arguments,
    busy_gpu,
    torch_cuda,
    torch_time,
    warm_graph_seconds,
    write_results,
)

HQ, HKV = 20, 5


def causal_flops(tokens, d):
    pairs = tokens * (tokens + 1) // 2
    return 2 * 2 * pairs * d * HQ  # scores and weighted values, a multiply-add = 2


def main():
    args = arguments(
        __doc__,
        lambda p: (
            p.add_argument("--tokens", default="512,2048"),
            p.add_argument("--head-dim", type=int, default=128),
            p.add_argument("--settings", default="default"),
        ),
    )
    device = bg.default_device()
    torch = torch_cuda()
    small = device.info.type == "cpu"
    token_counts = [int(t) for t in args.tokens.split(",") if t]
    if small:
        token_counts = [min(t, 128) for t in token_counts]
    settings = parse_settings(args.settings)
    rng = np.random.default_rng(0)
    D = args.head_dim
    results = {
        "device": device.name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "head_dim": D,
        "torch": None if torch is None else torch.__version__,
        "rows": [],
    }
    for tokens in token_counts:
        q = rng.standard_normal((tokens, HQ, D), dtype=np.float32)
        k = rng.standard_normal((tokens, HKV, D), dtype=np.float32)
        v = rng.standard_normal((tokens, HKV, D), dtype=np.float32)
        tq, tk, tv = (bg.Tensor.from_numpy(a) for a in (q, k, v))
        out = device.empty((tokens, HQ, D), np.float32)
        row = {"tokens": tokens, "shape": [tokens, tokens, HQ, HKV, D], "settings": {}}
        heads = HQ // HKV
        expected = ref.attention(q[:, :heads], k[:, :1], v[:, :1], True)
        if torch is not None:
            F = torch.nn.functional
            pq, pk, pv = (
                torch.from_numpy(a).cuda().transpose(0, 1).unsqueeze(0) for a in (q, k, v)
            )
            busy_gpu(torch)
            row["torch_fp32_s"] = torch_time(
                torch,
                lambda: F.scaled_dot_product_attention(pq, pk, pv, is_causal=True, enable_gqa=True),
                args.repeats,
            )
            hq_, hk_, hv_ = pq.half(), pk.half(), pv.half()
            row["torch_fp16_s"] = torch_time(
                torch,
                lambda: F.scaled_dot_product_attention(
                    hq_, hk_, hv_, is_causal=True, enable_gqa=True
                ),
                args.repeats,
            )
        for index, setting in enumerate(settings):

            def run():
                bg.attention(tq, tk, tv, True, out=out)

            seconds = warm_graph_seconds(bg, device, torch, setting, run, args.repeats)
            entry = {"gpu_s": seconds, "TFLOPs": causal_flops(tokens, D) / seconds / 1e12}
            if index == 0:
                entry["rel_error"] = float(
                    np.linalg.norm(out.numpy()[:, :heads] - expected) / np.linalg.norm(expected)
                )
            name = label(setting)
            while name in row["settings"]:  # a setting timed again keeps both timings
                name += " (again)"
            row["settings"][name] = entry
        if device.info.features.get("cooperative_matrix_khr_float16") and D in (32, 64, 96, 128):

            def run16():
                bg.attention(tq, tk, tv, True, precision="float16", out=out)

            seconds = warm_graph_seconds(bg, device, torch, {}, run16, args.repeats)
            rounded = [a.astype(np.float16).astype(np.float32) for a in (q, k, v)]
            expected16 = ref.attention(
                rounded[0][:, :heads], rounded[1][:, :1], rounded[2][:, :1], True
            )
            row["settings"]["precision=float16"] = {
                "gpu_s": seconds,
                "TFLOPs": causal_flops(tokens, D) / seconds / 1e12,
                "rel_error": float(
                    np.linalg.norm(out.numpy()[:, :heads] - expected16) / np.linalg.norm(expected16)
                ),
            }
        results["rows"].append(row)
    print(
        f"\n{device.name}: causal prefill attention, {HQ} / {HKV} heads of {D}, float32 inputs"
        + (f"; torch {results['torch']}" if torch else "")
    )
    print(
        f"{'tokens':>7s} {'setting':>28s} {'GPU us':>9s} {'TFLOP/s':>8s} {'rel err':>8s} "
        f"{'torch fp32':>11s} {'torch fp16':>11s}"
    )
    for row in results["rows"]:
        for name, entry in row["settings"].items():
            print(
                f"{row['tokens']:7d} {name:>28s} {entry['gpu_s'] * 1e6:9.1f} "
                f"{entry['TFLOPs']:8.2f} "
                f"{entry.get('rel_error', float('nan')):8.1e} "
                f"{row.get('torch_fp32_s', float('nan')) * 1e6:11.1f} "
                f"{row.get('torch_fp16_s', float('nan')) * 1e6:11.1f}"
            )
    write_results(args.json, results)


if __name__ == "__main__":
    main()
