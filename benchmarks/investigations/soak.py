"""Soak and thread checks: many kernel calls and tensor create/free cycles in one process with
memory_stats() and the process RSS before and after, and Python threads calling kernels on one
device at once with every result checked. Prints the figures and writes JSON.

    python3 benchmarks/investigations/soak.py [--calls 100000] [--cycles 10000] [--threads 8]
                                              [--seconds 30] [--json FILE] [--tiny]

tests_py/test_reliability.py runs shortened versions of both.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np

import bitnet_gpu as bg

SIZES = [(1,), (7,), (33, 5), (4097,), (64, 64), (3, 1000)]


def rss_bytes():
    """The process's resident set size, from /proc (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def soak(calls, cycles, device=None):
    """Runs `calls` kernel calls (bitlinear and quantize_activations, alternating) and `cycles`
    tensor create/free cycles; returns memory_stats() and RSS before and after, and the time."""
    device = device or bg.default_device()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    q = bg.quantize_weights(rng.standard_normal((32, 64)).astype(np.float32), device=device)
    expected_y, expected_q = bg.bitlinear(x, q), bg.quantize_activations(x, device=device)[0]

    def one_round(i):
        if i % 2:
            assert np.array_equal(bg.bitlinear(x, q), expected_y)
        else:
            assert np.array_equal(bg.quantize_activations(x, device=device)[0], expected_q)

    def one_cycle(i):
        shape = SIZES[i % len(SIZES)]
        t = device.empty(shape, np.float32, memory="host" if i % 3 == 0 else "device")
        t2 = bg.Tensor.from_numpy(np.full(shape, i, np.float32), device)
        assert t2.numpy().flat[0] == i and t.shape == shape

    for i in range(200):  # warm up: every pool size class and pipeline exists
        one_round(i)
        one_cycle(i)
    before, rss_before = device.memory_stats(), rss_bytes()
    start = time.perf_counter()
    for i in range(calls):
        one_round(i)
    for i in range(cycles):
        one_cycle(i)
    elapsed = time.perf_counter() - start
    after, rss_after = device.memory_stats(), rss_bytes()
    return {
        "calls": calls,
        "cycles": cycles,
        "seconds": elapsed,
        "memory_stats_before": before,
        "memory_stats_after": after,
        "rss_before": rss_before,
        "rss_after": rss_after,
    }


def threads(count, seconds, device=None):
    """`count` Python threads call kernels on one device for `seconds`; returns the calls made
    and every error seen (a wrong result is an error). Raises if a thread does not finish."""
    device = device or bg.default_device()
    errors, calls = [], [0] * count
    stop = time.monotonic() + seconds

    def work(index):
        try:
            rng = np.random.default_rng(index)
            x = rng.standard_normal((index % 3 + 1, 96)).astype(np.float32)
            q = bg.quantize_weights(rng.standard_normal((40, 96)).astype(np.float32), device=device)
            y = bg.bitlinear(x, q)
            xq = bg.quantize_activations(x, device=device)[0]
            while time.monotonic() < stop:
                if not np.array_equal(bg.bitlinear(x, q), y):
                    errors.append(f"thread {index}: bitlinear result changed")
                if not np.array_equal(bg.quantize_activations(x, device=device)[0], xq):
                    errors.append(f"thread {index}: quantize_activations result changed")
                with device.sequence():  # a recorded sequence per thread, too
                    bg.builtin_kernel("empty", device).dispatch(1, [])
                calls[index] += 3
        except Exception as e:  # noqa: BLE001 - reported to the caller
            errors.append(f"thread {index}: {type(e).__name__}: {e}")

    pool = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(count)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=seconds + 120)
    stuck = [i for i, t in enumerate(pool) if t.is_alive()]
    if stuck:
        raise RuntimeError(f"threads {stuck} did not finish: deadlock")
    return {"threads": count, "seconds": seconds, "calls": sum(calls), "errors": errors}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--cycles", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--json", default=None)
    parser.add_argument("--tiny", action="store_true", help="a few calls and seconds (CI)")
    args = parser.parse_args()
    if args.tiny:
        args.calls, args.cycles, args.threads, args.seconds = 200, 200, 2, 1.0
    device = bg.default_device()
    s = soak(args.calls, args.cycles, device)
    b, a = s["memory_stats_before"], s["memory_stats_after"]
    print(
        f"{device.name}: {s['calls']} kernel calls + {s['cycles']} tensor create/free cycles "
        f"in {s['seconds']:.1f} s"
    )
    for key in ("in_use_bytes", "allocated_bytes", "pooled_bytes", "live_blocks", "pool_misses"):
        if key in b:
            print(f"  {key:>16s}: {b[key]} -> {a[key]}")
    print(f"  {'RSS':>16s}: {s['rss_before'] / 2**20:.1f} MiB -> {s['rss_after'] / 2**20:.1f} MiB")
    t = threads(args.threads, args.seconds, device)
    print(
        f"{t['threads']} threads for {t['seconds']} s: {t['calls']} calls, "
        f"{len(t['errors'])} errors {t['errors'][:3]}"
    )
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"device": device.name, "soak": s, "threads": t}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
