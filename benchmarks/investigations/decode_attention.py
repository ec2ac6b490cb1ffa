"""Where a decode step's attention time goes: chains of 100 dependent decode_attention calls at the
2B4T shape (20 query / 5 KV heads x 128), by context, cache rows (the cache a model allocates
against one just large enough) and keys a workgroup, against an empty dispatch's floor. With
--batches, the same for several sequences a call instead (one new token each, float32 and float16
caches of 1032 rows, at contexts 256 and 1024, --keys keys a workgroup), with the rate at which
the K and V rows are read.

    python3 benchmarks/investigations/decode_attention.py [--batches 8,64] [--keys 16,32,64]
        [--json FILE]
"""

from __future__ import annotations

import os
import sys

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu import decoder_ops as ops

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import arguments, timed_chain, torch_cuda, busy_gpu, write_results


def attention_link(state, k1, cos, sin, start, caches, split):
    """One link of a chain: decode attention of state["q"], its output the next link's q."""

    def link():
        state["q"] = ops.decode_attention(
            state["q"], k1, k1, cos, sin, start, caches[0], caches[1], split
        )

    return link


def case(name, record, context, batch=1, item=4):
    """A timed chain's case: its name, a link's recording, the context (None: no cache read), the
    sequences a call and the bytes of a K or V value."""
    return {"name": name, "record": record, "context": context, "batch": batch, "item": item}


def batch_cases(rng, args, state, hkv, d):
    """The cases (case()) of several sequences a call."""
    rows = 40 if args.tiny else 1032
    keys = [int(k) for k in args.keys.split(",")]
    cases = []
    for batch in [int(b) for b in args.batches.split(",") if b]:
        k1 = bg.Tensor.from_numpy(rng.standard_normal((batch, hkv, d)).astype(np.float32))
        cos, sin = (bg.Tensor.from_numpy(t) for t in bg.rope_tables(np.arange(rows), d, 5e5))
        for dtype in (np.float32, np.float16):
            caches = [
                bg.Tensor.from_numpy(rng.standard_normal((batch, rows, hkv, d)).astype(dtype))
                for _ in range(2)
            ]
            for context in (24,) if args.tiny else (256, 1024):
                start = bg.Tensor.from_numpy(np.full(batch, context - 1, np.int32))
                for split in keys:
                    link = attention_link(state, k1, cos, sin, start, caches, split)
                    name = (
                        f"{batch} sequences, context {context}, {np.dtype(dtype).name} cache, "
                        f"{split} keys a workgroup"
                    )
                    cases.append(case(name, link, context, batch, np.dtype(dtype).itemsize))
    return cases


def main():
    def extra(parser):
        parser.add_argument("--batches", default="", help="sequences a call, comma-separated")
        parser.add_argument("--keys", default="16,32,64", help="keys a workgroup (--batches)")

    args = arguments(__doc__, extra)
    if args.tiny:  # both kinds of case, so that each runs in CI
        args.batches, args.keys = "2", "32,64"
    device = bg.default_device()
    torch = torch_cuda()
    rng = np.random.default_rng(0)
    chain = 4 if args.tiny else 100
    hq, hkv, d = (4, 2, 16) if args.tiny else (20, 5, 128)
    results = {"device": device.name, "chain": chain, "rows": []}
    axpy = bg.builtin_kernel("axpy", device, {0: 256})
    small = [bg.Tensor.from_numpy(np.ones(256, np.float32)) for _ in range(2)]
    push = np.array([256], np.uint32).tobytes() + np.float32(0.5).tobytes()
    cases = [case("floor: axpy on 256 floats", lambda: axpy.dispatch(1, small, push), None)]
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
    for context, rows in sizes if args.tiny or not args.batches else []:
        caches = [
            bg.Tensor.from_numpy(rng.standard_normal((1, rows, hkv, d)).astype(np.float32))
            for _ in range(2)
        ]
        cos, sin = (bg.Tensor.from_numpy(t) for t in bg.rope_tables(np.arange(rows), d, 5e5))
        start = bg.Tensor.from_numpy(np.array([context - 1], np.int32))
        for split in (16, 32, 64):
            link = attention_link(state, k1, cos, sin, start, caches, split)
            name = f"context {context}, cache rows {rows}, {split} keys a workgroup"
            cases.append(case(name, link, context))
    cases += batch_cases(rng, args, state, hkv, d)
    for timed in cases:
        batch, context = timed["batch"], timed["context"]
        state["q"] = bg.Tensor.from_numpy(rng.standard_normal((batch, hq, d)).astype(np.float32))
        if torch is not None:
            busy_gpu(torch)
        seconds, _ = timed_chain(bg, device, timed["record"], chain, args.repeats)
        row = {
            "case": timed["name"],
            "context": context,
            "batch": batch,
            "us_per_op": seconds * 1e6,
        }
        if context:  # K and V rows read
            row["gbps"] = 2 * batch * context * hkv * d * timed["item"] / seconds / 1e9
        results["rows"].append(row)
        extra = f"  {row['gbps']:7.1f} GB/s" if context else ""
        print(f"{timed['name']:64s} {seconds * 1e6:8.2f} us/op{extra}", flush=True)
    write_results(args.json, results)


if __name__ == "__main__":
    main()
