"""The 2B4T decode projections per call: bitnet_gpu.bitlinear (float32 x, its int8 quantization
inside) against Microsoft's W2A8 kernel alone (x already int8) and with x's quantization as a
separate op before it, as Microsoft's decode path runs it (eager PyTorch, and under
torch.compile). Each is 100 calls back to back in one recording (a CUDA graph for PyTorch, a
bitnet_gpu Graph), GPU time per call. Needs the anchors (`bash ../shared/anchors/prepare.sh`, then
on the GPU machine `bash .anchors/run.sh` once to build Microsoft's kernel).

    python3 benchmarks/investigations/projections_vs_w2a8.py [--anchors .anchors] [--json FILE]
"""

from __future__ import annotations

import os
import sys

import numpy as np

import bitnet_gpu as bg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import arguments, timed_chain, torch_cuda, write_results

SHAPES = [("wqkv", 3840, 2560), ("wo", 2560, 2560), ("w13", 13824, 2560), ("w2", 2560, 6912)]
CHAIN = 100


def main():
    args = arguments(
        __doc__, lambda p: p.add_argument("--anchors", default=".anchors", help="the anchors' copy")
    )
    torch = torch_cuda()
    library = os.path.join(args.anchors, "ms_bitnet_kernels", "libbitnet.so")
    if torch is None or not os.path.exists(library):
        sys.exit(f"needs PyTorch on CUDA and {library} (bash .anchors/run.sh builds it)")
    sys.path.insert(0, args.anchors)
    import anchor_decode  # the anchors' kernel wrapper, quantization and CUDA-graph timing

    ms = anchor_decode.Lib(library)
    quant_compiled = torch.compile(anchor_decode.quant, dynamic=False)
    device = bg.default_device()
    rng = np.random.default_rng(0)
    results = {"device": device.name, "torch": torch.__version__, "chain": CHAIN, "rows": []}
    for name, n, k in SHAPES:
        w2 = torch.randint(-128, 127, (n, k // 4), device="cuda", dtype=torch.int8)
        scales = torch.ones(6, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        x8, s = anchor_decode.quant(x)

        def chain(quantize):
            def calls():
                for _ in range(CHAIN):
                    q, qs = (x8, s) if quantize is None else quantize(x)
                    ms.linear(q, w2, qs, scales, out)

            return anchor_decode.time_graph(calls, 5) / CHAIN

        w = bg.quantize_weights(rng.standard_normal((n, k)).astype(np.float32))
        xb = bg.Tensor.from_numpy(rng.standard_normal((1, k)).astype(np.float32), device)
        y = device.empty((1, n), np.float32)
        seconds, _ = timed_chain(
            bg, device, lambda w=w, xb=xb, y=y: bg.bitlinear(xb, w, out=y), CHAIN, 5
        )
        row = {
            "projection": name,
            "shape": [n, k],
            "bitnet_gpu_us": seconds * 1e6,
            "w2a8_us": chain(None),
            "w2a8_eager_quantization_us": chain(anchor_decode.quant),
            "w2a8_compiled_quantization_us": chain(quant_compiled),
        }
        results["rows"].append(row)
    print(f"{device.name}: µs a call, {CHAIN} in a row")
    print(
        f"{'projection':>10s} {'N x K':>12s} {'bitnet_gpu':>11s} {'W2A8':>8s} "
        f"{'+ quant (compiled)':>19s} {'+ quant (eager)':>16s}"
    )
    for r in results["rows"]:
        print(
            f"{r['projection']:>10s} {'%dx%d' % tuple(r['shape']):>12s} {r['bitnet_gpu_us']:11.2f} "
            f"{r['w2a8_us']:8.2f} {r['w2a8_compiled_quantization_us']:19.2f} "
            f"{r['w2a8_eager_quantization_us']:16.2f}"
        )
    write_results(args.json, results)


if __name__ == "__main__":
    main()
