"""Where a decode step's wall time goes beyond its GPU time: the 2B4T decode step (random weights,
batch 1) timed whole and in parts, median wall microseconds over many steps:

    python3 benchmarks/investigations/step_host.py [--json FILE] [--repeats N] [--context 128]

- step: a greedy decode step as generate() runs it (bench_model.decode_step: the inputs copied
  in, the replay, the next id read back);
- replay: the step's graph replayed alone (its submission and the wait for its fence);
- read: the next id from its host-memory tensor (StepResult.ids);
- inputs: what is left of the step: its inputs made and copied in, and the Python around them;
- empty: a submit-and-wait of one empty kernel;
- gpu: the graph's GPU time from its two timestamps.

BITNET_GPU_SPIN_WAIT_US (read when the device is created) sets how long a wait polls the fence
before it sleeps; run the script under different values to see what sleeping costs.
"""

from __future__ import annotations

import os
import sys

import bitnet_gpu as bg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from bench_model import (
    DECODE_TOKEN,
    decode_step,
    fill_cache,
    gpu_seconds,
    replay,
)  # benchmarks/bench_model.py
from bitnet_gpu.models import BitNetConfig, BitNetModel, Pick
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
    if args.tiny:
        config, args.context, repeats = BitNetConfig.preset("tiny"), 8, 5
    model = BitNetModel.random(config, seed=0, max_tokens=args.context + 8)
    fill_cache(model, args.context)
    step = decode_step(model, args.context)
    keep_running(step, 0.1 if args.tiny else 2.0)
    result = replay(model, DECODE_TOKEN, args.context, Pick.ARGMAX)
    graph = model.last_step.graph
    empty = bg.builtin_kernel("empty", device)

    def median_us(fn):
        return median_wall(fn, repeats) * 1e6

    parts = {
        "step": median_us(step),
        "replay": median_us(graph.run),
        "read": median_us(result.ids),
        "empty": median_us(lambda: empty.dispatch(1, [])),
        "gpu": gpu_seconds(model, step, 5 if args.tiny else 50) * 1e6,
    }
    parts["inputs"] = parts["step"] - parts["replay"] - parts["read"]
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
