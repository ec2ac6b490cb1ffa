"""Tuning sweeps: GPU time (Vulkan timestamps) of M = 1 BitLinear shapes and of a 2B4T decode step
under settings of the tuning knobs (docs/TUNING.md), everything recorded afresh for each setting.

    python3 benchmarks/investigations/knobs.py [--json FILE] [--repeats N]
        [--settings "default;matvec_rows=4;matvec_rows=4,matvec_unroll=2"]
        [--shapes 1x2560x6912,1x16384x16384] [--contexts 128,2048] [--config 2b4t] [--batch B]

Settings are separated by ";", the variables of one setting by ","; "default" is the build's
defaults. A BitLinear row's time is the whole call recorded as a graph and timed with one
timestamp pair, followed by each kernel's time from a profiled run (a timestamp after every op); a
decode row's is the step's graph the same way, followed by the mean time of every kernel of a layer.

Isolated calls leave the GPU idle between them, and an idle H100 drops its SM clock to 345 MHz
(nvidia-smi, measured): where PyTorch has CUDA, each BitLinear timing follows 50 ms of queued
PyTorch work (common.busy_gpu) so that it runs at the clock a busy GPU keeps, as the other
benchmarks' runs beside PyTorch do.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import bitnet_gpu as bg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from bench_model import decode_step, fill_cache, gpu_seconds, per_op  # benchmarks/bench_model.py
from bitnet_gpu.models import BitNetConfig, BitNetModel
from common import (
    arguments,
    busy_gpu,
    graph_seconds,
    keep_running,
    label,
    parse_settings,
    profiled,
    torch_cuda,
    with_settings,
    write_results,
)


def per_kernel_of_a_layer(timings, layers):
    """{"position: kernel": mean microseconds over the layers} of the ops a layer repeats, found
    as the longest period (up to 20 ops) of the op labels that repeats `layers` times."""
    names = [name for name, _ in timings]
    for period in range(20, 0, -1):
        for first in range(0, 11):
            end = first + layers * period
            if end <= len(names) and all(
                names[i] == names[i + period] for i in range(first, end - period)
            ):
                return {
                    f"{j}: {names[first + j]}": sum(
                        timings[first + j + period * layer][1] for layer in range(layers)
                    )
                    / layers
                    * 1e6
                    for j in range(period)
                }
    return {}


def main():
    args = arguments(
        __doc__,
        lambda p: (
            p.add_argument("--settings", default="default"),
            p.add_argument(
                "--shapes", default="1x2560x6912,1x6912x2560,1x4096x4096,1x8192x8192,1x16384x16384"
            ),
            p.add_argument("--contexts", default="128,2048"),
            p.add_argument("--config", default="2b4t"),
            p.add_argument("--batch", type=int, default=1, help="sequences of the decode step"),
        ),
    )
    if args.tiny:
        args.shapes, args.contexts, args.config = "1x64x176,3x176x64", "8", "tiny"
    settings = parse_settings(args.settings)
    device = bg.default_device()
    torch = torch_cuda()

    def busy():  # the GPU at its working clock before a timing (see the docstring)
        if torch is not None:
            busy_gpu(torch, 0.05)

    rng = np.random.default_rng(0)
    results = {
        "device": device.name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "settings": [label(s) for s in settings],
        "bitlinear": [],
        "decode": [],
    }
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    for m, k, n in shapes:
        q = bg.quantize_weights(rng.standard_normal((n, k), dtype=np.float32))
        x = bg.Tensor.from_numpy(rng.standard_normal((m, k), dtype=np.float32))
        reference = bg.bitlinear(x, q, return_accumulator=True)[1].numpy()
        for setting in settings:

            def run():
                exact = np.array_equal(
                    bg.bitlinear(x, q, return_accumulator=True)[1].numpy(), reference
                )
                busy()
                t = graph_seconds(bg, device, lambda: bg.bitlinear(x, q), args.repeats)
                timings = profiled(bg, device, lambda: bg.bitlinear(x, q), args.repeats)[1]
                return t, [(name, seconds * 1e6) for name, seconds in timings], exact

            try:
                t, kernels, exact = with_settings(setting, run)
            except bg.Error as error:  # a setting this device cannot take (shared memory, ...)
                print(
                    f"bitlinear {(m, k, n)} {label(setting):50s} {type(error).__name__}: {error}",
                    flush=True,
                )
                results["bitlinear"].append(
                    {"shape": [m, k, n], "setting": label(setting), "error": str(error)}
                )
                continue
            row = {
                "shape": [m, k, n],
                "setting": label(setting),
                "gpu_us": t * 1e6,
                "kernels_us": kernels,
                "accumulators_equal_default": exact,
            }
            results["bitlinear"].append(row)
            print(
                f"bitlinear {(m, k, n)} {label(setting):50s} {t * 1e6:8.2f} us  "
                + " + ".join(f"{name} {us:.2f}" for name, us in kernels)
                + ("" if exact else "  ACCUMULATORS DIFFER"),
                flush=True,
            )

    contexts = [int(c) for c in args.contexts.split(",") if c]
    if contexts:
        config = BitNetConfig.preset(args.config)
        model = BitNetModel.random(config, seed=0, max_tokens=max(contexts) + 8)
        fill_cache(model, max(contexts))
        for context in contexts:
            step = decode_step(model, context, args.batch)
            keep_running(step)  # clocks up before the first setting
            reference = step()
            for setting in settings:

                def measure():
                    busy()
                    model.reset_graphs()
                    same = bool(np.array_equal(step(), reference))
                    gpu = gpu_seconds(model, step, args.repeats)
                    return (
                        gpu,
                        per_kernel_of_a_layer(per_op(model, step), config.num_hidden_layers),
                        same,
                    )

                gpu, kernels, same = with_settings(setting, measure)
                row = {
                    "context": context,
                    "batch": args.batch,
                    "setting": label(setting),
                    "gpu_us": gpu * 1e6,
                    "layer_kernels_us": kernels,
                    "same_token": same,
                }
                results["decode"].append(row)
                print(
                    f"decode ctx {context} B {args.batch} {label(setting):46s} {gpu * 1e6:8.1f} us "
                    + "  ".join(f"{name} {us:.2f}" for name, us in kernels.items())
                    + ("" if same else "  TOKEN DIFFERS"),
                    flush=True,
                )
            model.reset_graphs()
    write_results(args.json, results)


if __name__ == "__main__":
    main()
