"""What one dependent dispatch costs inside a recorded graph: chains of 100 ops (4 with --tiny),
each reading what the previous one wrote (so a barrier separates every pair), timed as a whole by
Vulkan timestamps. The floor is a tiny kernel; the others are a decode step's ops at 2B4T sizes.

    python3 benchmarks/investigations/links.py [--json FILE]
"""

from __future__ import annotations

import os
import sys

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu import decoder_ops as ops

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import arguments, timed_chain, write_results


def per_link(device, record, chain, repeats):
    """GPU microseconds per op of a graph of `chain` dependent ops recorded by record()."""
    seconds, graph = timed_chain(bg, device, record, chain, repeats)
    return seconds * 1e6, graph.barrier_count


def main():
    args = arguments(__doc__)
    device = bg.default_device()
    rng = np.random.default_rng(0)
    chain = 4 if args.tiny else 100
    results = {"device": device.name, "chain": chain, "rows": []}
    h, i, heads, kv, d, rows = (
        (64, 176, 4, 2, 16, 40) if args.tiny else (2560, 6912, 20, 5, 128, 2056)
    )
    contexts = (8, 32) if args.tiny else (128, 2048)

    axpy = bg.builtin_kernel("axpy", device, {0: 256})
    small_x = device.empty((256,), np.float32)
    small_x.copy_from(np.ones(256, np.float32))
    small_y = device.empty((256,), np.float32)
    small_y.copy_from(np.zeros(256, np.float32))
    push = np.array([256], np.uint32).tobytes() + np.float32(0.5).tobytes()

    x = bg.Tensor.from_numpy(rng.standard_normal((1, h)).astype(np.float32))
    norm = bg.Tensor.from_numpy(np.ones(h, np.float32))
    w_h = bg.quantize_weights(rng.standard_normal((h, h)).astype(np.float32))
    w_i = bg.quantize_weights(rng.standard_normal((i, h)).astype(np.float32))
    start = bg.Tensor.from_numpy(np.array([128], np.int32))
    q = bg.Tensor.from_numpy(rng.standard_normal((1, heads, d)).astype(np.float32))
    k1 = bg.Tensor.from_numpy(rng.standard_normal((1, kv, d)).astype(np.float32))
    kc = bg.Tensor.from_numpy(rng.standard_normal((1, rows, kv, d)).astype(np.float32))
    vc = bg.Tensor.from_numpy(rng.standard_normal((1, rows, kv, d)).astype(np.float32))
    cos, sin = bg.rope_tables(np.arange(rows), d, 500000.0)
    cos, sin = bg.Tensor.from_numpy(cos), bg.Tensor.from_numpy(sin)
    state = {"x": x, "q": q}

    def chain_norm_matvec_h():  # prepare (fused norm) + matvec 2560 x 2560, residual: two links
        (state["x"],) = ops.bitlinear_group(
            state["x"], None, norm, 1e-5, [w_h.handle], [state["x"]]
        )

    def chain_norm_matvec_i():  # the same into 6912 outputs, then back (two ops of two links)
        (y,) = ops.bitlinear_group(state["x"], None, norm, 1e-5, [w_i.handle], [None])
        (state["x"],) = ops.bitlinear_group(y, y, None, 1e-5, [down], [state["x"]])

    down = bg.quantize_weights(rng.standard_normal((h, i)).astype(np.float32)).handle

    def chain_attention():
        state["q"] = ops.attention_cached(state["q"], kc, vc, start, True)

    def chain_decode_attention():
        state["q"] = ops.decode_attention(state["q"], k1, k1, cos, sin, start, kc, vc)

    w_q = bg.quantize_weights(rng.standard_normal((h, h)).astype(np.float32)).handle
    w_kv = bg.quantize_weights(rng.standard_normal((kv * d, h)).astype(np.float32)).handle

    def chain_qkv():  # norm + q, k, v (2560 + 640 + 640 outputs) in one dispatch
        state["x"] = ops.bitlinear_group(
            state["x"], None, norm, 1e-5, [w_q, w_kv, w_kv], [None] * 3
        )[0]

    def chain_rope_append():
        state["q"] = ops.rope_append(state["q"], k1, k1, cos, sin, start, kc, vc)

    # (name, record, cached keys: start is read by each replay, so it is set just before timing)
    cases = [
        ("axpy on 256 floats (floor)", lambda: axpy.dispatch(1, [small_x, small_y], push)),
        (f"norm + int8 pre-pass + matvec {h}x{h} + residual", chain_norm_matvec_h),
        (f"pre-pass + matvec {h}->{i}, gated pre-pass + {i}->{h}", chain_norm_matvec_i),
        (f"norm + q, k, v matvecs {h} -> {h + 2 * kv * d} (one dispatch)", chain_qkv),
        ("rope + KV append", chain_rope_append),
    ]
    for context in contexts:
        cases.append(
            (f"attention over {context} cached keys (split + merge)", chain_attention, context)
        )
        cases.append(
            (
                f"rope + append + attention over {context} keys (one dispatch)",
                chain_decode_attention,
                context,
            )
        )
    for name, record, *context in cases:
        start.copy_from(np.array([context[0] if context else contexts[0]], np.int32))
        us, barriers = per_link(device, record, chain, args.repeats)
        row = {"chain": name, "us_per_op": us, "barriers": barriers}
        results["rows"].append(row)
        print(f"{name:70s} {us:8.2f} us/op  ({barriers} barriers in {chain} ops)", flush=True)
    write_results(args.json, results)


if __name__ == "__main__":
    main()
