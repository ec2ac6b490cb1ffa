"""Where a decode-sized BitLinear's time goes: the activation pre-pass and the matvec timed alone
and
back to back, in steady state (100 dispatches in one sequence between two timestamps), beside
their per-op timestamps inside one bitlinear call, and the wall time of a submit-and-wait.

    python3 benchmarks/investigations/decode.py [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

import bitnet_gpu as bg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import median_wall, write_results  # benchmarks/common.py

SHAPES = [(2560, 6912), (16384, 16384)]


def steady(device, record, count=100):
    """GPU microseconds per repetition of record() over `count` repetitions in one sequence."""

    def run():
        with device.sequence(timings="total") as s:
            for _ in range(count):
                record()
        return s.timings()[0][1] / count * 1e6

    run()
    return statistics.median(run() for _ in range(5))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = bg.default_device()
    hardware = device.info.features["integer_dot_product_accelerated"]
    rng = np.random.default_rng(0)
    results = {"device": device.name, "rows": []}
    empty = bg.builtin_kernel("empty", device)
    results["empty_dispatch_us"] = steady(device, lambda: empty.dispatch(1, []))
    results["submit_and_wait_wall_us"] = median_wall(lambda: empty.dispatch(1, []), 200) * 1e6
    for k, n in SHAPES:
        kp = -(-k // 16) * 16
        x = bg.Tensor.from_numpy(rng.standard_normal((1, k), dtype=np.float32))
        q = bg.quantize_weights(rng.standard_normal((n, k), dtype=np.float32))
        xq = device.empty((1, kp), np.uint8)
        scales, sums = device.empty((1,), np.float32), device.empty((1,), np.int32)
        counter = device.empty((1,), np.uint32)
        y, acc = device.empty((1, n), np.float32), device.empty((1, n), np.int32)
        prepare = bg.builtin_kernel("bitlinear_prepare_f32", device)
        words = kp // 16
        rows, subgroups = 2, max(1, 256 // device.info.subgroup_size)
        matvec = bg.builtin_kernel(
            "bitlinear_matvec_" + ("dot" if hardware else "int"),
            device,
            {0: 1, 1: rows, 2: False, 3: False, 4: words % 4 == 0, 5: 1},
        )
        w = q.packed_tensor
        gamma = q.scale_tensor

        def record_prepare():
            # Bindings 6 and 7 (norm weight, up) are read only by the fused variants.
            prepare.dispatch(
                1,
                [x, x, xq, scales, sums, counter, x, x],
                np.array([1, k, kp], np.uint32).tobytes() + np.float32(0).tobytes(),
            )

        def record_matvec():
            matvec.dispatch(
                -(-n // (rows * subgroups)),
                [w, w, xq, sums, scales, gamma, gamma, y, acc],
                np.array([n, words, rows * subgroups], np.uint32),
            )

        record_prepare()
        record_matvec()
        with bg.profile(device) as p:
            bg.bitlinear(x, q)
        row = {
            "shape": [1, k, n],
            "prepare_alone_us": steady(device, record_prepare),
            "matvec_alone_us": steady(device, record_matvec),
            "prepare_then_matvec_us": steady(device, lambda: (record_prepare(), record_matvec())),
            "bitlinear_per_op_us": {label: t * 1e6 for label, t in p.timings},
            "bitlinear_wall_us": median_wall(lambda: bg.bitlinear(x, q), 200) * 1e6,
        }
        results["rows"].append(row)
        print(row, flush=True)
    print(
        f"empty dispatch {results['empty_dispatch_us']:.2f} us GPU in a sequence; "
        f"submit and wait {results['submit_and_wait_wall_us']:.1f} us wall"
    )
    write_results(args.json, results)


if __name__ == "__main__":
    main()
