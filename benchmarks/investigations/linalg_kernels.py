"""Where bitnet_gpu.linalg's time goes: per-kernel GPU time (Vulkan timestamps after every op) of a
Cholesky and a QR of one big float32 matrix.

    python3 benchmarks/investigations/linalg_kernels.py [--n 4096] [--json FILE]
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import bitnet_gpu as bg  # noqa: E402
from common import arguments, by_kernel, profiled, write_results  # noqa: E402


def main():
    args = arguments(__doc__, lambda p: p.add_argument("--n", type=int, default=4096))
    device = bg.default_device()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.n, args.n), dtype=np.float32)
    a = bg.Tensor.from_numpy(
        (x @ x.T / args.n + np.eye(args.n, dtype=np.float32)).astype(np.float32)
    )
    results = {"device": device.name, "n": args.n, "ops": {}}
    for name, fn in [("cholesky", lambda: bg.linalg.cholesky(a)), ("qr", lambda: bg.linalg.qr(a))]:
        total, timings = profiled(bg, device, fn, 2)
        kernels = by_kernel(timings)
        results["ops"][name] = {"total_s": total, "kernels_s": kernels}
        print(f"{name}: {total * 1e3:.2f} ms over {len(timings)} ops")
        for kernel, seconds in sorted(kernels.items(), key=lambda kv: -kv[1]):
            print(f"    {kernel:30s} {seconds * 1e3:9.3f} ms")
    write_results(args.json, results)


if __name__ == "__main__":
    main()
