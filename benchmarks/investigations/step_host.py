"""Where a decode step's wall time goes beyond its GPU time: the 2B4T decode step (random weights,
batch 1) timed whole and in parts, median wall microseconds over many steps:

    python3 benchmarks/investigations/step_host.py [--json FILE] [--repeats N] [--context 128]

- step: model._replay(...)["next"].numpy(), what generate() does per token;
- inputs: copying the token id and the position into the graph's input tensors;
- replay: the graph's submission and the wait for its fence alone;
- read: the next id from its host-memory tensor;
- empty: a submit-and-wait of one empty kernel;
- gpu: the graph's GPU time from its two timestamps.

BITNET_GPU_SPIN_WAIT_US (read when the device is created) sets how long a wait polls the fence
before it sleeps; run the script under different values to see what sleeping costs.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import bitnet_gpu as bg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from bench_model import (
    DECODE_TOKEN,
    decode_step,
    fill_cache,
    gpu_seconds,
)  # benchmarks/bench_model.py
from bitnet_gpu.models import BitNetConfig, BitNetModel
from common import arguments, keep_running, median_wall, write_results


def main():
    args = arguments(
        __doc__,
        lambda p: (
            p.add_argument("--context", type=int, default=128),
            p.add_argument("--config", default="2b4t"),
        ),
    )
    repeats = max(args.repeats, 200)
    device = bg.default_device()
    config = BitNetConfig.preset(args.config)
    model = BitNetModel.random(config, seed=0, max_tokens=args.context + 8)
    fill_cache(model, args.context)
    ids, start = DECODE_TOKEN.reshape(-1), np.array([args.context], np.int32)
    step = decode_step(model, args.context)
    keep_running(step)
    model._replay(DECODE_TOKEN, args.context, "last")
    graph = model._latest_graph
    inputs = graph._inputs
    empty = bg.builtin_kernel("empty", device)

    def median_us(fn):
        return median_wall(fn, repeats) * 1e6

    parts = {
        "step": median_us(step),
        "inputs": median_us(
            lambda: (inputs["ids"].copy_from(ids), inputs["start"].copy_from(start))
        ),
        "replay": median_us(graph._core.replay),
        "read": median_us(lambda: graph._outputs["next"].numpy()),
        "empty": median_us(lambda: empty.dispatch(1, [])),
        "gpu": gpu_seconds(model, step, 50) * 1e6,
    }
    spin = os.environ.get("BITNET_GPU_SPIN_WAIT_US", "default")
    print(f"{device.name}, context {args.context}, BITNET_GPU_SPIN_WAIT_US={spin}: median us")
    for name, us in parts.items():
        print(f"  {name:8s} {us:9.1f}")
    write_results(
        args.json,
        {"device": device.name, "context": args.context, "spin_wait_us": spin, "median_us": parts},
    )


if __name__ == "__main__":
    main()
