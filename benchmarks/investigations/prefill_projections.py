"""A prefill layer's projections, one at a time: GPU time (Vulkan timestamps, each call recorded as
a graph and timed as a whole) of `_core.bitlinear_group` as the decoder calls it for T new tokens
of the 2B4T shape (q/k/v from the normalized input; o and down adding the residual; gate/up;
down from relu(gate)^2 * up), under settings of the tuning knobs (docs/TUNING.md), and the
registers of the tensor-core tiles with and without the residual epilogue (Kernel.statistics).

    python3 benchmarks/investigations/prefill_projections.py [--json FILE] [--repeats N] [--tokens
    512]
        [--settings "default;coopmat_tile=128x128x64"]
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu import _core

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import label, parse_settings, arguments, torch_cuda, warm_graph_seconds, write_results

HIDDEN, FFN, KV = 2560, 6912, 640


def main():
    args = arguments(
        __doc__,
        lambda p: (
            p.add_argument("--tokens", type=int, default=512),
            p.add_argument("--settings", default="default"),
        ),
    )
    device = bg.default_device()
    rows = min(args.tokens, 64) if device.info.type == "cpu" else args.tokens
    rng = np.random.default_rng(0)

    def tensor(*shape):
        return bg.Tensor.from_numpy(rng.standard_normal(shape).astype(np.float32))

    def weights(n, k):
        return bg.quantize_weights(rng.standard_normal((n, k)).astype(np.float32))._core

    x, a, g, u = tensor(rows, HIDDEN), tensor(rows, HIDDEN), tensor(rows, FFN), tensor(rows, FFN)
    norm_h, norm_f = (bg.Tensor.from_numpy(np.ones(n, np.float32)) for n in (HIDDEN, FFN))
    wq, wk, wv, wo = (
        weights(HIDDEN, HIDDEN),
        weights(KV, HIDDEN),
        weights(KV, HIDDEN),
        weights(HIDDEN, HIDDEN),
    )
    wg, wu, wd = weights(FFN, HIDDEN), weights(FFN, HIDDEN), weights(HIDDEN, FFN)
    calls = {
        "q/k/v": lambda: _core.bitlinear_group(x, None, norm_h, 1e-5, [wq, wk, wv], [None] * 3),
        "o + residual": lambda: _core.bitlinear_group(a, None, norm_h, 1e-5, [wo], [x]),
        "o": lambda: _core.bitlinear_group(a, None, norm_h, 1e-5, [wo], [None]),
        "gate/up": lambda: _core.bitlinear_group(x, None, norm_h, 1e-5, [wg, wu], [None, None]),
        "down + residual": lambda: _core.bitlinear_group(g, u, norm_f, 1e-5, [wd], [x]),
        "down": lambda: _core.bitlinear_group(g, u, norm_f, 1e-5, [wd], [None]),
    }
    results = {
        "device": device.name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "tokens": rows,
        "settings": {},
        "statistics": {},
    }
    torch = torch_cuda()
    for setting in parse_settings(args.settings):
        times = {}
        for name, call in calls.items():
            times[name] = warm_graph_seconds(bg, device, torch, setting, call, args.repeats)
        results["settings"][label(setting)] = times
    if device.info.features.get("cooperative_matrix_int8"):
        for tile, spec in {
            "128x128x128 (4x2, depth 2)": {4: 128, 5: 128, 6: 8, 7: 4, 8: 2},
            "128x128x64 (2x4, depth 1)": {4: 128, 5: 128, 6: 4, 7: 2, 8: 1},
            "256x128x64 (4x2, depth 2)": {4: 256, 5: 128, 6: 4, 7: 4, 8: 2},
            "64x128x64 (2x4, depth 1)": {4: 64, 5: 128, 6: 4, 7: 2, 8: 1},
            "64x128x64 (2x4, depth 2)": {4: 64, 5: 128, 6: 4, 7: 2, 8: 2},
            "64x128x128 (2x4, depth 1)": {4: 64, 5: 128, 6: 8, 7: 2, 8: 1},
            "64x64x64 (2x4, depth 1)": {4: 64, 5: 64, 6: 4, 7: 2, 8: 1},
            "160x128x128 (2x4, depth 2)": {4: 160, 5: 128, 6: 8, 7: 2, 8: 2},
            "128x96x128 (4x2, depth 2)": {4: 128, 5: 96, 6: 8, 7: 4, 8: 2},
        }.items():
            for residual in (False, True):
                kernel = bg.builtin_kernel(
                    "bitlinear_coopmat",
                    device,
                    {
                        0: True,
                        1: residual,
                        2: True,
                        3: False,
                        9: residual,
                        10: True,
                        11: True,
                        **spec,
                    },
                )
                results["statistics"][f"{tile}{' residual' if residual else ''}"] = (
                    kernel.statistics
                )
    print(f"\n{device.name}: a prefill layer's projections, {rows} tokens, GPU us (graph-timed)")
    names = list(calls)
    print(f"{'setting':>36s} " + " ".join(f"{n:>16s}" for n in names))
    for setting, times in results["settings"].items():
        print(f"{setting:>36s} " + " ".join(f"{times[n] * 1e6:16.1f}" for n in names))
    for tile, stats in results["statistics"].items():
        print(
            f"{tile:>36s}: {stats.get('Register Count')} registers, stack {stats.get('Stack Size')}"
        )
    write_results(args.json, results)


if __name__ == "__main__":
    main()
