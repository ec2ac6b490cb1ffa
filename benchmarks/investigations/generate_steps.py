"""Wall time of each step of model.generate() in one fresh process, as the command line runs it:
the first calls record their graphs (kernels built on first use) and may run at the idle clock.

    python3 benchmarks/investigations/generate_steps.py [--config 2b4t] [--tokens 64] [--json FILE]

Times the load, the head's screening copy, then generations of --tokens tokens from one prompt:
screened head and float16 head (the model's screened_head switched), each with the model's
decode_chunk greedy steps a graph replay and with one step a replay, twice over. For each: the time
to the first token, the time between tokens (a chunk's tokens arrive together), the decode rate
and the rate after the first decode replay (which records the graph).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from bitnet_gpu.models import BitNetConfig, BitNetModel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import arguments, write_results


def main():
    args = arguments(
        __doc__,
        lambda p: (
            p.add_argument("--config", default="2b4t"),
            p.add_argument("--tokens", type=int, default=64),
        ),
    )
    results = {"config": args.config, "tokens": args.tokens, "runs": []}
    start = time.perf_counter()
    model = BitNetModel.random(
        BitNetConfig.preset(args.config), seed=0, max_tokens=args.tokens + 16
    )
    results["load_s"] = time.perf_counter() - start
    start = time.perf_counter()
    model.prepare_screened_head()
    results["screening_copy_s"] = time.perf_counter() - start
    chunk = model.decode_chunk
    print(
        f"load {results['load_s']:.1f} s, screening copy {results['screening_copy_s']:.1f} s, "
        f"decode_chunk {chunk}"
    )
    prompt = np.arange(8)
    for screened, steps in [(True, chunk), (True, 1), (False, chunk), (False, 1)] * 2:
        model.screened_head, model.decode_chunk = screened, steps
        times = []
        begin = time.perf_counter()
        model.generate(
            prompt, args.tokens, callback=lambda step, ids: times.append(time.perf_counter())
        )
        gaps_ms = list(np.diff(times) * 1e3)
        first = min(steps, len(times) - 1)  # tokens of the first decode replay
        run = {
            "screened_head": screened,
            "decode_chunk": steps,
            "first_token_ms": (times[0] - begin) * 1e3,
            "gaps_ms": gaps_ms,
            "first_replay_ms": (times[first] - times[0]) * 1e3,
            "tokens_per_s": (len(times) - 1) / (times[-1] - times[0]),
            "after_first_replay_tokens_per_s": (len(times) - 1 - first)
            / (times[-1] - times[first]),
        }
        results["runs"].append(run)
        print(
            f"{'screened' if screened else 'float16 '} head, {steps} steps a replay: first token "
            f"{run['first_token_ms']:.1f} ms, first replay {run['first_replay_ms']:.1f} ms, "
            f"{run['tokens_per_s']:.1f} tokens/s ({run['after_first_replay_tokens_per_s']:.1f} "
            f"after the first "
            f"replay); gaps {' '.join(f'{t:.2f}' for t in gaps_ms[:10])} ... ms"
        )
    model.decode_chunk = chunk
    write_results(args.json, results)


if __name__ == "__main__":
    main()
