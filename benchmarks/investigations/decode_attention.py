"""Where a decode step's attention time goes: chains of 100 dependent decode_attention calls at the
2B4T shape (20 query / 5 KV heads x 128), by context, cache rows (the cache a model allocates
against one just large enough) and keys a workgroup, against an empty dispatch's floor.

    python3 benchmarks/investigations/decode_attention.py [--json FILE]
"""

from __future__ import annotations

import os
import sys

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu import decoder_ops as ops

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import arguments, timed_chain, torch_cuda, busy_gpu, write_results


def main():
    args = arguments(__doc__)
    device = bg.default_device()
    torch = torch_cuda()
    rng = np.random.default_rng(0)
    chain = 4 if args.tiny else 100
    hq, hkv, d = (4, 2, 16) if args.tiny else (20, 5, 128)
    results = {"device": device.name, "chain": chain, "rows": []}
    axpy = bg.builtin_kernel("axpy", device, {0: 256})
    small = [bg.Tensor.from_numpy(np.ones(256, np.float32)) for _ in range(2)]
    push = np.array([256], np.uint32).tobytes() + np.float32(0.5).tobytes()
    cases = [("floor: axpy on 256 floats", lambda: axpy.dispatch(1, small, push), None)]
    state = {}
    k1 = bg.Tensor.from_numpy(rng.standard_normal((1, hkv, d)).astype(np.float32))
    sizes = (
        [(8, 16), (24, 40)]
        if args.tiny
        else [
            (128, 136),
            *((c, 2056) for c in (128, 256, 512, 768, 1024, 1536, 2048)),
            (4096, 4104),
        ]
    )
    for context, rows in sizes:
        caches = [
            bg.Tensor.from_numpy(rng.standard_normal((1, rows, hkv, d)).astype(np.float32))
            for _ in range(2)
        ]
        cos, sin = (bg.Tensor.from_numpy(t) for t in bg.rope_tables(np.arange(rows), d, 5e5))
        start = bg.Tensor.from_numpy(np.array([context - 1], np.int32))
        for split in (16, 32, 64):

            def link(caches=caches, cos=cos, sin=sin, start=start, split=split):
                state["q"] = ops.decode_attention(
                    state["q"], k1, k1, cos, sin, start, caches[0], caches[1], split
                )

            name = f"context {context}, cache rows {rows}, {split} keys a workgroup"
            cases.append((name, link, context))
    for name, record, context in cases:
        state["q"] = bg.Tensor.from_numpy(rng.standard_normal((1, hq, d)).astype(np.float32))
        if torch is not None:
            busy_gpu(torch)
        seconds, _ = timed_chain(bg, device, record, chain, args.repeats)
        row = {"case": name, "context": context, "us_per_op": seconds * 1e6}
        if context:  # K and V rows read, float32
            row["gbps"] = 2 * context * hkv * d * 4 / seconds / 1e9
        results["rows"].append(row)
        extra = f"  {row['gbps']:7.1f} GB/s" if context else ""
        print(f"{name:60s} {seconds * 1e6:8.2f} us/op{extra}", flush=True)
    write_results(args.json, results)


if __name__ == "__main__":
    main()
