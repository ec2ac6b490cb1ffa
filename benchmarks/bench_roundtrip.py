"""NumPy in, NumPy out: the wall time of one call as a notebook makes it (its arrays uploaded, the
op, the result downloaded), beside PyTorch (torch.from_numpy(x).cuda() -> op -> .cpu().numpy())
and CuPy (cp.asarray -> op -> cp.asnumpy) on the same GPU, and NumPy on the CPU, in one run.

    python3 benchmarks/bench_roundtrip.py [--repeats 200] [--json FILE] [--tiny]

Rows {"op", "size", "bitnet_gpu_s", "bitnet_gpu_eager_s", "torch_s", "cupy_s", "numpy_s"}: median
wall seconds of one call at a time (each call waits for its result), after warm-up calls.
bitnet_gpu_s is the call repeated, as a loop makes it: small calls replay a command buffer recorded
on their second call (the `recorded_calls` knob); bitnet_gpu_eager_s is the same call with that
knob off, each call recording its own dispatch, as a call with a new shape does. bitlinear's peers
run a float16 linear (cuBLAS) of the same shape. A 1-element relu is a call's fixed cost. The
session row is a decode step of a 2B4T-shaped model returning its 128,256 float32 logits
(DecodeSession.step) against the step's GPU time plus the copy of the logits, in a process of its
own (bitnet_gpu_s) and in this one after PyTorch and CuPy ran here (bitnet_gpu_beside_peers_s):
CuPy's CUDA context in the process slowed every step's host side (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu.models import BitNetConfig, BitNetModel
from common import arguments, torch_cuda, write_results


def cupy_module():
    """CuPy where it can run on a CUDA GPU here, else None."""
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
        return cp
    except Exception:  # not installed, or no CUDA device
        return None


def median_call(fn, repeats):
    """Median wall seconds of fn() over `repeats` calls, after 10 warm-up calls."""
    for _ in range(10):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def eager_call(fn, repeats):
    """median_call with every call recording its own dispatch (the `recorded_calls` knob off)."""
    with bg.tuning(recorded_calls=False):
        return median_call(fn, repeats)


def softmax_numpy(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def cases(rng, tiny):
    """(op, size, bitnet_gpu call, torch call or None, cupy call or None, numpy call or None),
    each call building its inputs from NumPy and returning NumPy."""
    torch, cp = torch_cuda(), cupy_module()
    sizes = (1, 1000, 100_000) if tiny else (1, 1000, 100_000, 10_000_000)
    rows = []
    for n in sizes:
        x = rng.standard_normal(n).astype(np.float32)
        rows.append(
            (
                "relu",
                n,
                lambda x=x: bg.relu(x),
                (lambda x=x: torch.relu(torch.from_numpy(x).cuda()).cpu().numpy())
                if torch
                else None,
                (lambda x=x: cp.asnumpy(cp.maximum(cp.asarray(x), 0))) if cp else None,
                lambda x=x: np.maximum(x, 0),
            )
        )
    k, n = (64, 176) if tiny else (2560, 6912)
    w = rng.standard_normal((n, k)).astype(np.float32)
    q = bg.quantize_weights(w)
    w16_torch = torch.from_numpy(w).cuda().half() if torch else None
    w16_cupy = cp.asarray(w).astype(cp.float16) if cp else None
    for m in (1, 8) if tiny else (1, 8, 512):
        x = rng.standard_normal((m, k)).astype(np.float32)
        rows.append(
            (
                f"bitlinear {k} -> {n}",
                m,
                lambda x=x: bg.bitlinear(x, q),
                (
                    lambda x=x: (
                        torch.nn.functional.linear(torch.from_numpy(x).cuda().half(), w16_torch)
                        .float()
                        .cpu()
                        .numpy()
                    )
                )
                if torch
                else None,
                (
                    lambda x=x: cp.asnumpy(
                        (cp.asarray(x).astype(cp.float16) @ w16_cupy.T).astype(cp.float32)
                    )
                )
                if cp
                else None,
                None,
            )
        )
    shape = (2, 1000) if tiny else (8, 32000)
    x = rng.standard_normal(shape).astype(np.float32)
    rows.append(
        (
            "softmax",
            int(np.prod(shape)),
            lambda: bg.softmax(x),
            (lambda: torch.softmax(torch.from_numpy(x).cuda(), -1).cpu().numpy())
            if torch
            else None,
            (lambda: cp.asnumpy(_cupy_softmax(cp, cp.asarray(x)))) if cp else None,
            lambda: softmax_numpy(x),
        )
    )
    return rows


def _cupy_softmax(cp, x):
    e = cp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def session_row(tiny, repeats):
    """A decode step returning every logit (DecodeSession.step) step after step: wall time against
    the step's GPU time plus the copy of its logits."""
    config = BitNetConfig.preset("tiny" if tiny else "2b4t")
    model = BitNetModel.random(config, seed=0, max_tokens=512)
    session = model.session()
    session.step(np.arange(16))
    ids = iter(np.random.default_rng(0).integers(0, config.vocab_size, 10 * repeats + 100))

    def step():
        if session.lengths[0] >= model.max_tokens - 1:
            session.reset()
            session.step(np.arange(16))
        return session.step([next(ids)])

    wall = median_call(step, repeats)
    model.timings = "total"
    session.reset()
    session.step(np.arange(16))
    gpu = []
    for _ in range(20):
        step()
        gpu.append(model.last_step.timings()[0][1])
    logits = np.empty(config.vocab_size, np.float32)
    copy = median_call(lambda: logits.copy(), repeats)
    return {
        "op": "session.step (all logits)",
        "size": config.vocab_size,
        "bitnet_gpu_s": wall,
        "gpu_s": statistics.median(gpu),
        "host_copy_s": copy,
        "wall_over_gpu_and_copy": wall / (statistics.median(gpu) + copy),
    }


def session_row_alone(tiny, repeats):
    """session_row in a child process, where no other GPU runtime has run."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import json, sys; sys.path.insert(0, {here!r}); from bench_roundtrip import session_row; "
        f"print(json.dumps(session_row({tiny!r}, {repeats})))"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


def main():
    args = arguments(__doc__)
    # --tiny takes --repeats as given (lavapipe's fixed cost: --tiny --repeats 300).
    repeats = args.repeats if args.tiny else max(args.repeats, 200)
    device = bg.default_device()
    rng = np.random.default_rng(0)
    results = {"device": device.name, "rows": []}
    print(f"{device.name}: median wall time of one call, NumPy in and NumPy out (µs)")
    print(
        f"{'op':28s} {'size':>10s} {'bitnet_gpu':>11s} {'eager':>9s} {'PyTorch':>9s} {'CuPy':>9s} "
        f"{'NumPy':>9s}"
    )
    for op, size, ours, torch_call, cupy_call, numpy_call in cases(rng, args.tiny):
        row = {
            "op": op,
            "size": size,
            "bitnet_gpu_s": median_call(ours, repeats),
            "bitnet_gpu_eager_s": eager_call(ours, repeats),
            "torch_s": median_call(torch_call, repeats) if torch_call else None,
            "cupy_s": median_call(cupy_call, repeats) if cupy_call else None,
            "numpy_s": median_call(numpy_call, repeats) if numpy_call else None,
        }
        if row["torch_s"]:
            row["over_torch"] = row["bitnet_gpu_s"] / row["torch_s"]
        results["rows"].append(row)

        def us(value):
            return f"{value * 1e6:9.1f}" if value is not None else f"{'-':>9s}"

        print(
            f"{op:28s} {size:10d} {row['bitnet_gpu_s'] * 1e6:11.1f} "
            f"{us(row['bitnet_gpu_eager_s'])} {us(row['torch_s'])} "
            f"{us(row['cupy_s'])} {us(row['numpy_s'])}",
            flush=True,
        )
    steps = 20 if args.tiny else 200
    row = session_row_alone(args.tiny, steps)
    beside = session_row(args.tiny, steps)
    row["bitnet_gpu_beside_peers_s"] = beside["bitnet_gpu_s"]
    row["beside_peers_over_gpu_and_copy"] = beside["wall_over_gpu_and_copy"]
    results["rows"].append(row)
    for where, values in [("alone", row), ("in this process, after the rows above", beside)]:
        print(
            f"{row['op']}, {where}: {values['bitnet_gpu_s'] * 1e6:.0f} µs wall a step, against "
            f"{values['gpu_s'] * 1e6:.0f} µs GPU + {values['host_copy_s'] * 1e6:.1f} µs to copy "
            f"the logits ({values['wall_over_gpu_and_copy']:.2f}x)"
        )
    write_results(args.json, results)


if __name__ == "__main__":
    main()
