"""Activation and row-op benchmark: GPU time (Vulkan timestamps) of bitnet_gpu's element-wise
ops on 2^26 float32 values, softmax / rms_norm / layer_norm on [8192, 4096], and attention (decode
over a 4096-token cache with 20 query and 5 KV heads of 128, and 512- and 2048-token causal
prefills), beside the
same PyTorch CUDA op in the same run (CUDA events), as bandwidth over the minimum bytes (inputs read
once, output written once), fraction of the measured copy bandwidth and ratio to PyTorch.

    python3 benchmarks/bench_ops.py [--json FILE] [--repeats N]
"""

from __future__ import annotations

import time

import numpy as np

import bitnet_gpu as bg
from common import (
    arguments,
    profiled,
    torch_copy_gbps,
    torch_cuda,
    torch_softmax_backward,
    torch_time,
    write_results,
)  # benchmarks/common.py


def main():
    args = arguments(__doc__)
    device = bg.default_device()
    torch = torch_cuda()
    small = device.info.type == "cpu"
    n = 2**20 if small else 2**26
    rows, k = (256, 4096) if small else (8192, 4096)
    rng = np.random.default_rng(0)
    x = bg.Tensor.from_numpy(rng.standard_normal(n, dtype=np.float32))
    up = bg.Tensor.from_numpy(rng.standard_normal(n, dtype=np.float32))
    y = device.empty((n,), np.float32)
    m = bg.Tensor.from_numpy(rng.standard_normal((rows, k), dtype=np.float32))
    my = device.empty((rows, k), np.float32)
    mg = bg.Tensor.from_numpy(
        rng.standard_normal((rows, k), dtype=np.float32)
    )  # a separate gradient
    w = bg.Tensor.from_numpy(np.ones(k, np.float32))
    b = bg.Tensor.from_numpy(np.zeros(k, np.float32))
    results = {
        "device": device.name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rows": [],
        "torch": None if torch is None else torch.__version__,
    }
    if torch is not None:
        results["copy_GBps"] = torch_copy_gbps(torch, args.repeats)
        tx, tup = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        tm = torch.randn(rows, k, device="cuda")
        tg = torch.randn(rows, k, device="cuda")
        tw, tb = torch.ones(k, device="cuda"), torch.zeros(k, device="cuda")
        F = torch.nn.functional
    # Decode attention over a 4096-token cache: 20 query heads, 5 KV heads, head dim 128.
    ctx, hq, hkv, hd = (512, 20, 5, 128) if small else (4096, 20, 5, 128)
    aq = bg.Tensor.from_numpy(rng.standard_normal((1, hq, hd), dtype=np.float32))
    ak = bg.Tensor.from_numpy(rng.standard_normal((ctx, hkv, hd), dtype=np.float32))
    av = bg.Tensor.from_numpy(rng.standard_normal((ctx, hkv, hd), dtype=np.float32))
    ao = device.empty((1, hq, hd), np.float32)
    pq = bg.Tensor.from_numpy(rng.standard_normal((512, hq, hd), dtype=np.float32))
    pk = bg.Tensor.from_numpy(rng.standard_normal((512, hkv, hd), dtype=np.float32))
    po = device.empty((512, hq, hd), np.float32)
    lq = bg.Tensor.from_numpy(rng.standard_normal((2048, hq, hd), dtype=np.float32))
    lk = bg.Tensor.from_numpy(rng.standard_normal((2048, hkv, hd), dtype=np.float32))
    lo = device.empty((2048, hq, hd), np.float32)
    if torch is not None:
        tq_ = torch.randn(1, hq, 1, hd, device="cuda")
        tk_ = torch.randn(1, hkv, ctx, hd, device="cuda")
        tv_ = torch.randn(1, hkv, ctx, hd, device="cuda")
        pq_ = torch.randn(1, hq, 512, hd, device="cuda")
        pk_ = torch.randn(1, hkv, 512, hd, device="cuda")
        lq_ = torch.randn(1, hq, 2048, hd, device="cuda")
        lk_ = torch.randn(1, hkv, 2048, hd, device="cuda")
        ta_, tb_ = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    mm = 256 if small else 4096
    ma = bg.Tensor.from_numpy(rng.standard_normal((mm, mm), dtype=np.float32))
    mc = device.empty((mm, mm), np.float32)
    mt = device.empty((k, rows), np.float32)
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False  # the same float32 arithmetic as ours
        ta_mm = torch.randn(mm, mm, device="cuda")
        tmr = tm.clone().requires_grad_(True)
        out_r = F.rms_norm(tmr, (k,), tw, 1e-6)

        def rms_backward():
            return torch.autograd.grad(out_r, tmr, tg, retain_graph=True)

    rt = 256 if small else 4096  # rope over a 4096-token prefill's queries
    rx = bg.Tensor.from_numpy(rng.standard_normal((rt, hq, hd), dtype=np.float32))
    ry = device.empty((rt, hq, hd), np.float32)
    rpos = np.arange(rt)
    if torch is not None:
        tl, tw2, tb2 = (t.clone().requires_grad_(True) for t in (tm, tw, tb))
        out_l = F.layer_norm(tl, (k,), tw2, tb2, 1e-5)
        trx = torch.randn(rt, hq, hd, device="cuda")
        cos_, sin_ = (torch.from_numpy(t).cuda()[:, None, :] for t in bg.rope_tables(rpos, hd))

        def layer_backward():
            return torch.autograd.grad(out_l, [tl, tw2, tb2], tg, retain_graph=True)

        def torch_rope():
            a_, b_ = trx[..., : hd // 2], trx[..., hd // 2 :]
            return torch.cat([a_ * cos_ - b_ * sin_, a_ * sin_ + b_ * cos_], -1)

    cases = [
        ("add", (n,), 12 * n, lambda: bg.add(x, up, out=y), lambda: ta_ + tb_),
        (
            "attention decode",
            (1, ctx, hq, hkv, hd),
            2 * ctx * hkv * hd * 4,
            lambda: bg.attention(aq, ak, av, out=ao),
            lambda: F.scaled_dot_product_attention(tq_, tk_, tv_, enable_gqa=True),
        ),
        (
            "attention prefill",
            (512, 512, hq, hkv, hd),
            4 * (2 * 512 * hq * hd + 2 * 512 * hkv * hd),
            lambda: bg.attention(pq, pk, pk, out=po),
            lambda: F.scaled_dot_product_attention(pq_, pk_, pk_, is_causal=True, enable_gqa=True),
        ),
        (
            "attention prefill",
            (2048, 2048, hq, hkv, hd),
            4 * (2 * 2048 * hq * hd + 2 * 2048 * hkv * hd),
            lambda: bg.attention(lq, lk, lk, out=lo),
            lambda: F.scaled_dot_product_attention(lq_, lk_, lk_, is_causal=True, enable_gqa=True),
        ),
        ("sum over rows", (rows, k), 4 * rows * k, lambda: bg.sum(m, axis=1), lambda: tm.sum(-1)),
        ("max over rows", (rows, k), 4 * rows * k, lambda: bg.max(m, axis=1), lambda: tm.amax(-1)),
        (
            "transpose",
            (rows, k),
            8 * rows * k,
            lambda: bg.transpose(m, out=mt),
            lambda: tm.t().contiguous(),
        ),
        (
            "matmul fp32 (TF32 off)",
            (mm, mm, mm),
            12 * mm * mm,
            lambda: bg.matmul(ma, ma, out=mc),
            lambda: ta_mm @ ta_mm,
        ),
        (
            "rms_norm backward",
            (rows, k),
            12 * rows * k,
            lambda: bg.rms_norm_backward(mg, m, w),
            lambda: rms_backward(),
        ),
        (
            "softmax backward",
            (rows, k),
            12 * rows * k,
            lambda: bg.softmax_backward(mg, m, out=my),
            lambda: torch_softmax_backward(torch, tg, tm, -1),
        ),
        (
            "layer_norm backward",
            (rows, k),
            12 * rows * k,
            lambda: bg.layer_norm_backward(mg, m, w),
            lambda: layer_backward(),
        ),
        (
            "rope",
            (rt, hq, hd),
            8 * rt * hq * hd,
            lambda: bg.rope(rx, rpos, out=ry),
            lambda: torch_rope(),
        ),
        ("relu", (n,), 8 * n, lambda: bg.relu(x, out=y), lambda: F.relu(tx)),
        ("gelu", (n,), 8 * n, lambda: bg.gelu(x, out=y), lambda: F.gelu(tx)),
        (
            "gelu tanh",
            (n,),
            8 * n,
            lambda: bg.gelu(x, "tanh", out=y),
            lambda: F.gelu(tx, approximate="tanh"),
        ),
        ("silu", (n,), 8 * n, lambda: bg.silu(x, out=y), lambda: F.silu(tx)),
        (
            "silu backward",
            (n,),
            12 * n,
            lambda: bg.silu_backward(up, x, out=y),
            lambda: torch.ops.aten.silu_backward(tup, tx),
        ),
        ("silu_mul", (n,), 12 * n, lambda: bg.silu_mul(x, up, out=y), lambda: F.silu(tx) * tup),
        (
            "relu2_mul",
            (n,),
            12 * n,
            lambda: bg.relu2_mul(x, up, out=y),
            lambda: torch.square(F.relu(tx)) * tup,
        ),
        (
            "relu_dropout p=0.1",
            (n,),
            8 * n,
            lambda: bg.relu_dropout(x, 0.1, seed=1, out=y),
            lambda: F.dropout(F.relu(tx), 0.1),
        ),
        (
            "softmax",
            (rows, k),
            8 * rows * k,
            lambda: bg.softmax(m, out=my),
            lambda: torch.softmax(tm, -1),
        ),
        (
            "rms_norm",
            (rows, k),
            8 * rows * k,
            lambda: bg.rms_norm(m, w, out=my),
            lambda: F.rms_norm(tm, (k,), tw, 1e-6),
        ),
        (
            "layer_norm",
            (rows, k),
            8 * rows * k,
            lambda: bg.layer_norm(m, w, b, out=my),
            lambda: F.layer_norm(tm, (k,), tw, tb, 1e-5),
        ),
    ]
    if small:  # a 512-token prefill takes seconds on a CPU device
        cases = [c for c in cases if c[0] != "attention prefill"]
    for name, shape, nbytes, ours, theirs in cases:
        t = profiled(bg, device, ours, args.repeats)[0]
        row = {"op": name, "shape": list(shape), "gpu_s": t, "GBps": nbytes / t / 1e9}
        if torch is not None:
            row["fraction_of_copy"] = row["GBps"] / results["copy_GBps"]
            row["torch_s"] = torch_time(torch, theirs, args.repeats)
            row["speedup_vs_torch"] = row["torch_s"] / t
        results["rows"].append(row)
    print(
        f"\n{device.name}: GPU time (Vulkan timestamps)"
        + (
            f" vs torch {results['torch']} (CUDA events); copy {results['copy_GBps']:.0f} GB/s"
            if torch
            else ""
        )
    )
    print(
        f"{'op':>20s} {'shape':>26s} {'GPU us':>9s} {'GB/s':>8s} {'of copy':>8s} {'torch us':>9s} "
        f"{'ratio':>7s}"
    )
    for r in results["rows"]:
        print(
            f"{r['op']:>20s} {str(tuple(r['shape'])):>26s} {r['gpu_s'] * 1e6:9.1f} "
            f"{r['GBps']:8.0f} "
            f"{r.get('fraction_of_copy', float('nan')):8.1%} "
            f"{r.get('torch_s', float('nan')) * 1e6:9.1f} "
            f"{r.get('speedup_vs_torch', float('nan')):6.2f}x"
        )
    write_results(args.json, results)


if __name__ == "__main__":
    main()
