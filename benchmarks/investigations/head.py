"""The greedy decode step's language-model head: the next token id from the final hidden state,
through the float16 head (linear_rows + argmax_rows) and through its int8 screening copy
(screened_argmax), beside PyTorch (argmax of F.linear in float16) in the same run.

    python3 benchmarks/investigations/head.py [--vocab 128256] [--hidden 2560] [--states 4]
    [--json FILE]

A float16 head of N(0, 1) values (the 2B4T shape: the random model's tied embedding) and
`states` hidden states h (N(0, 1) times norm weights near one, as the final RMSNorm gives). Each
path is recorded as a graph and timed as a whole (one timestamp pair), then profiled per kernel.
Bytes read: 2 V K for the float head; V Kp + 16 V for the screening copy and its row data, plus
the candidates' float16 rows. Candidates: the rows whose bracket reaches the largest lower end,
counted from reference.screening_bracket (float64; the GPU's float32 brackets may differ by a row
at the edge). Every path's id is checked against the float64 argmax.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu import decoder_ops as ops
from bitnet_gpu import reference
from bitnet_gpu.models import screening_tables

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import (
    arguments,
    by_kernel,
    profiled,
    timed_graph,
    torch_copy_gbps,
    torch_cuda,
    torch_time,
    write_results,
)


def candidates(q, meta, h):
    """Rows whose bracket (reference.screening_bracket) reaches the largest lower end."""
    low, high = reference.screening_bracket(h, q, meta)
    return int((high >= low.max()).sum())


def main():
    args = arguments(
        __doc__,
        lambda p: (
            p.add_argument("--vocab", type=int, default=128256),
            p.add_argument("--hidden", type=int, default=2560),
            p.add_argument("--states", type=int, default=4),
        ),
    )
    device = bg.default_device()
    torch = torch_cuda()
    v, k = (384, 64) if args.tiny else (args.vocab, args.hidden)
    rng = np.random.default_rng(0)
    head_np = rng.standard_normal((v, k), np.float32).astype(np.float16)
    start = time.perf_counter()
    q_np, meta_np = screening_tables(head_np)
    build_s = time.perf_counter() - start
    head, head_q, head_meta = (bg.Tensor.from_numpy(a, device) for a in (head_np, q_np, meta_np))
    results = {
        "device": device.name,
        "vocab": v,
        "hidden": k,
        "tables_seconds": build_s,
        "float_head_bytes": head.nbytes,
        "screening_bytes": head_q.nbytes + head_meta.nbytes,
        "rows": [],
    }
    copy_gbps = torch_copy_gbps(torch, args.repeats) if torch else None
    results["copy_gbps"] = copy_gbps
    print(
        f"device {device.name}; head {v} x {k} float16 ({head.nbytes / 1e9:.3f} GB), screening "
        f"copy "
        f"{(head_q.nbytes + head_meta.nbytes) / 1e9:.3f} GB built in {build_s:.1f} s"
        + (f"; copy bandwidth {copy_gbps:.0f} GB/s" if copy_gbps else "")
    )
    if torch:
        head_t = torch.from_numpy(head_np).cuda()
    for state in range(1 if args.tiny else args.states):
        h_np = (
            rng.standard_normal((1, k), np.float32) * (1 + 0.1 * rng.standard_normal(k, np.float32))
        ).astype(np.float32)
        h = bg.Tensor.from_numpy(h_np, device)
        exact = int(np.argmax(h_np.astype(np.float64) @ head_np.astype(np.float64).T))

        def screened():
            return ops.screened_argmax(h, head, head_q, head_meta)

        def float_head():
            return ops.argmax_rows(ops.linear_rows(h, head))

        row = {"state": state, "exact_id": exact, "candidates": candidates(q_np, meta_np, h_np[0])}
        for name, fn in (("screened", screened), ("float_head", float_head)):
            row[name + "_id"] = int(fn().numpy()[0])
            seconds, _ = timed_graph(bg, device, fn, args.repeats)
            _, timings = profiled(bg, device, fn, 3)
            row[name + "_gpu_s"] = seconds
            row[name + "_kernels_s"] = by_kernel(timings)
        screened_bytes = head_q.nbytes + head_meta.nbytes + 4 * v + row["candidates"] * 2 * k
        row["screened_bytes"] = screened_bytes
        row["speedup"] = row["float_head_gpu_s"] / row["screened_gpu_s"]
        if copy_gbps:
            row["screened_of_copy"] = screened_bytes / row["screened_gpu_s"] / 1e9 / copy_gbps
            row["float_head_of_copy"] = head.nbytes / row["float_head_gpu_s"] / 1e9 / copy_gbps
        if torch:
            h_t = torch.from_numpy(h_np).cuda().half()
            row["torch_id"] = int(torch.argmax(torch.nn.functional.linear(h_t, head_t)).item())
            row["torch_s"] = torch_time(
                torch, lambda: torch.argmax(torch.nn.functional.linear(h_t, head_t)), args.repeats
            )
            row["speedup_vs_torch"] = row["torch_s"] / row["screened_gpu_s"]
        results["rows"].append(row)
        kernels = " + ".join(
            f"{name} {s * 1e6:.1f}" for name, s in row["screened_kernels_s"].items()
        )
        print(
            f"state {state}: screened {row['screened_gpu_s'] * 1e6:.1f} us ({kernels}; "
            f"{row['candidates']} "
            f"candidates) against the float16 head {row['float_head_gpu_s'] * 1e6:.1f} us: "
            f"{row['speedup']:.2f}x"
            + (
                f"; of copy {100 * row['screened_of_copy']:.0f}% / "
                f"{100 * row['float_head_of_copy']:.0f}%"
                if copy_gbps
                else ""
            )
            + (
                f"; PyTorch float16 {row['torch_s'] * 1e6:.1f} us ({row['speedup_vs_torch']:.2f}x)"
                if torch
                else ""
            )
            + f"; ids {row['screened_id']} / {row['float_head_id']} / exact {exact}"
            + (f" / PyTorch {row['torch_id']}" if torch else "")
            + ("" if row["screened_id"] == row["float_head_id"] == exact else "  MISMATCH")
        )
    write_results(args.json, results)


if __name__ == "__main__":
    main()
