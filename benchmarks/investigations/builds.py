"""Two or more builds of bitnet_gpu side by side: the GPU time of the same decode steps and verify
step in each, in alternating processes, with the ids they pick (a change that keeps the numerics
picks the same ones). How every A/B in docs/PERFORMANCE.md's "two builds" rows is measured:

    python3 benchmarks/investigations/builds.py --builds old=/tmp/old,new=/tmp/new
        [--rounds 2] [--batches 8,16,32] [--context 256] [--verify 8] [--cores 2-3]
        [--repeats 10] [--json FILE]

Each build is a folder that `pip install --target` made (it goes first on PYTHONPATH; without
--builds, the bitnet_gpu this Python imports is the one build), optionally under tuning knobs set
through their environment variables: `new2=/tmp/new@coopmat_splits=2` (`@` before each
knob; no folder before the first `@`: the bitnet_gpu this Python imports). A round runs every build
once, each in a fresh process pinned to --cores (where the OS lets it) over the 2B4T with random
weights: 300 warm-up steps first (an idle H200 runs at 345 MHz, and the first setting timed would
pay for the clock's climb), then per batch the decode step at --context (`bench_model.decode_step`,
the graph timed whole, the median of --repeats replays), then a verify step of --verify tokens
against a one-token step (`model_phases.verify_rows`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/
from common import arguments, write_results  # noqa: E402


def measure(args):
    """One build's figures (this process imports it): {label: microseconds, label_ids: ids}."""
    import numpy as np

    import bench_model
    import bitnet_gpu as bg
    import model_phases
    from bitnet_gpu.models import BitNetConfig, BitNetModel

    config = BitNetConfig.preset("tiny" if args.tiny else "2b4t")
    model = BitNetModel.random(config, seed=0, max_tokens=args.context + 64)
    bench_model.fill_cache(model, args.context + 44)
    model.reset_graphs()
    batches = [int(b) for b in args.batches.split(",") if b]
    warm = bench_model.decode_step(model, args.context, batches[0] if batches else 1)
    for _ in range(args.warmup):
        warm()
    # The knobs this process runs under (those its build's settings gave).
    out = {"knobs": {name: value for name, value in bg.get_tuning().items() if value is not None}}
    for batch in batches:
        run = bench_model.decode_step(model, args.context, batch)
        ids = np.asarray(run()).reshape(-1)
        out[f"B{batch}"] = bench_model.gpu_seconds(model, run, args.repeats) * 1e6
        out[f"B{batch}_ids"] = [int(i) for i in ids[:4]]
        model.runner.release_shared(batch)
    if args.verify:
        (row,) = model_phases.verify_rows(model, [args.verify], args.repeats, bench_model)
        out[f"verify{args.verify}"] = row["gpu_s"] * 1e6
        out["one_token"] = row["one_token_gpu_s"] * 1e6
    return out


def child(args, build):
    """Runs this script in a fresh process importing the build `build` names: a folder (empty: as
    is), then "@knob=value" settings."""
    folder, *settings = build.split("@") if build else [None]
    env = dict(os.environ)
    for setting in settings:
        knob, value = setting.split("=", 1)
        env[f"BITNET_GPU_{knob.upper()}"] = value
    if folder:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, env.get("PYTHONPATH")]))
    command = [sys.executable, os.path.abspath(__file__), "--measure"]
    for name in ("batches", "context", "verify", "warmup", "repeats"):
        command += [f"--{name}", str(getattr(args, name))]
    if args.tiny:
        command.append("--tiny")
    cores = [int(c) for c in args.cores.split("-")] if args.cores else None

    def pin():
        if cores and hasattr(os, "sched_setaffinity"):
            available = os.sched_getaffinity(0)
            wanted = set(range(cores[0], cores[-1] + 1)) & available
            os.sched_setaffinity(0, wanted or available)

    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=900, preexec_fn=pin
    )
    if done.returncode != 0:
        raise SystemExit(f"build {build or '(this one)'} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    args = arguments(
        __doc__,
        lambda p: (
            p.add_argument("--builds", default="", help="name=folder,name=folder"),
            p.add_argument("--rounds", type=int, default=2),
            p.add_argument("--batches", default="8,16,32"),
            p.add_argument("--context", type=int, default=256),
            p.add_argument("--verify", type=int, default=8, help="tokens (0: none)"),
            p.add_argument("--warmup", type=int, default=300),
            p.add_argument("--cores", default="2-3", help="first-last (empty: not pinned)"),
            p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS),
        ),
    )
    if args.tiny:
        args.batches, args.context, args.verify = "2", 16, 2
        args.warmup, args.repeats, args.rounds = 2, 2, 1
    if args.measure:
        print(json.dumps(measure(args)))
        return
    builds = [b.split("=", 1) for b in args.builds.split(",") if b] or [("this", None)]
    rows = []
    for round_number in range(args.rounds):
        for name, folder in builds:
            figures = child(args, folder)
            rows.append({"build": name, "round": round_number, **figures})
            times = "  ".join(
                f"{key} {value:8.1f}" for key, value in figures.items() if isinstance(value, float)
            )
            picks = " ".join(
                f"{key}={value}" for key, value in figures.items() if key.endswith("_ids")
            )
            print(f"round {round_number} {name:8s} {times} us  {picks}", flush=True)
    write_results(args.json, {"context": args.context, "rows": rows})


if __name__ == "__main__":
    main()
