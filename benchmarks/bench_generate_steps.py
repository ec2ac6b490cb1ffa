"""Wall time of each step of model.generate() in one fresh process, as the command line runs it:
the first calls record their graphs (kernels built on first use) and may run at the idle clock.

    python3 benchmarks/bench_generate_steps.py [--config 2b4t] [--tokens 64] [--json FILE]

Times the load, the head's screening copy, then four generations of --tokens tokens from one
prompt: screened head, float16 head, screened, float16 (the model's screened_head switched).
For each: the time to the first token, the first steps and the median step, in milliseconds.
"""

from __future__ import annotations

import time

import numpy as np

from bitnet_gpu.models import BitNetConfig, BitNetModel
from common import arguments, write_results


def main():
    args = arguments(__doc__, lambda p: (p.add_argument("--config", default="2b4t"),
                                         p.add_argument("--tokens", type=int, default=64)))
    results = {"config": args.config, "tokens": args.tokens, "runs": []}
    start = time.perf_counter()
    model = BitNetModel.random(BitNetConfig.preset(args.config), seed=0, max_tokens=args.tokens + 16)
    results["load_s"] = time.perf_counter() - start
    start = time.perf_counter()
    model.prepare_screened_head()
    results["screening_copy_s"] = time.perf_counter() - start
    print(f"load {results['load_s']:.1f} s, screening copy {results['screening_copy_s']:.1f} s")
    prompt = np.arange(8)
    for screened in (True, False, True, False):
        model.screened_head = screened
        times = []
        begin = time.perf_counter()
        model.generate(prompt, args.tokens, callback=lambda step, ids: times.append(time.perf_counter()))
        steps_ms = list(np.diff(times) * 1e3)
        run = {"screened_head": screened, "first_token_ms": (times[0] - begin) * 1e3, "steps_ms": steps_ms,
               "median_step_ms": float(np.median(steps_ms))}
        results["runs"].append(run)
        print(f"{'screened' if screened else 'float16 '} head: first token {run['first_token_ms']:.1f} ms, "
              f"steps {' '.join(f'{t:.2f}' for t in steps_ms[:6])} ... ms, median {run['median_step_ms']:.3f} ms")
    write_results(args.json, results)


if __name__ == "__main__":
    main()
