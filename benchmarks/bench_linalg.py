"""bitnet_gpu.linalg beside torch.linalg on CUDA (cuSOLVER) and NumPy on the CPU, in the same run:
one big matrix (Cholesky, QR and solve of 4096 x 4096, SVD and eigh of 1024 x 1024) and batches
of 10,000 small ones (8, 16 and 32 square), float32, each after the GPU was kept busy (its clocks
up). bitnet_gpu's GPU time: Vulkan timestamps of the op recorded as a graph (cholesky, qr,
solve), or the sum of its ops' timestamps (svd and eigh, whose Jacobi sweeps may be separate
submissions the host checks); wall time beside it. PyTorch: CUDA events. NumPy: wall time (its
LAPACK on this machine's CPU).

    python3 benchmarks/bench_linalg.py [--json FILE] [--repeats N]
"""

from __future__ import annotations

import time

import numpy as np

import bitnet_gpu as bg
from common import (
    arguments,
    busy_gpu,
    median_wall,
    profiled,
    timed_graph,
    torch_cuda,
    torch_time,
    write_results,
)  # benchmarks/common.py


def spd(rng, batch, n):
    x = rng.standard_normal((batch, n, n), dtype=np.float32)
    return (x @ np.swapaxes(x, -1, -2) / n + np.eye(n, dtype=np.float32)).astype(np.float32)


def main():
    args = arguments(__doc__)
    device = bg.default_device()
    torch = torch_cuda()
    small = device.info.type == "cpu"
    big, medium, batch = (256, 128, 500) if small else (4096, 1024, 10000)
    rng = np.random.default_rng(0)
    linalg = bg.linalg
    cases = []
    for n in (big, medium):
        a = spd(rng, 1, n)
        cases += [
            ("cholesky", a, lambda t: linalg.cholesky(t), "cholesky"),
            ("qr", a, lambda t: linalg.qr(t), "qr"),
        ]
    cases.append(("solve", spd(rng, 1, big), None, "solve"))
    for n in (8, 16, 32):
        a = spd(rng, batch, n)
        cases += [
            ("cholesky", a, lambda t: linalg.cholesky(t), "cholesky"),
            ("qr", a, lambda t: linalg.qr(t), "qr"),
            ("svd", a, None, "svd"),
            ("eigh", a, None, "eigh"),
        ]
    a = spd(rng, 1, medium)
    cases += [("svd", a, None, "svd"), ("eigh", a, None, "eigh")]

    rows = []
    print(
        f"{'op':9s} {'shape':>17s} {'GPU ms':>9s} {'wall ms':>9s} {'torch ms':>9s} {'ratio':>6s} "
        f"{'numpy ms':>9s}"
    )
    for name, host, record, torch_name in cases:
        shape = host.shape if host.shape[0] > 1 else host.shape[1:]
        t = bg.Tensor.from_numpy(host.reshape(shape))
        repeats = max(2, args.repeats // 10)
        if torch is not None:
            busy_gpu(torch)  # the clocks up: an idle H100 starts a timing at a fraction of them
        if name == "solve":
            rhs = bg.Tensor.from_numpy(np.ones(shape[:-1] + (1,), np.float32))
            record = lambda t=t, rhs=rhs: linalg.solve(t, rhs)  # noqa: E731
        if record is not None:
            call = lambda record=record, t=t: record(t)  # noqa: E731
            call()
            gpu, _ = timed_graph(bg, device, call, repeats)
        else:
            op = getattr(linalg, name)
            call = lambda op=op, t=t: op(t)  # noqa: E731
            gpu, _ = profiled(bg, device, call, repeats)
        wall = median_wall(lambda call=call: (call(), device.synchronize()), repeats)
        row = {"op": name, "shape": list(shape), "gpu_s": gpu, "wall_s": wall}
        if torch is not None:
            x = torch.from_numpy(host.reshape(shape)).cuda()
            b = torch.ones(shape[:-1] + (1,), device="cuda")
            fn = {
                "cholesky": lambda x=x: torch.linalg.cholesky(x),
                "qr": lambda x=x: torch.linalg.qr(x),
                "solve": lambda x=x, b=b: torch.linalg.solve(x, b),
                "svd": lambda x=x: torch.linalg.svd(x),
                "eigh": lambda x=x: torch.linalg.eigh(x),
            }[torch_name]
            row["torch_s"] = torch_time(torch, fn, repeats)
            row["torch_over_bitnet_gpu"] = row["torch_s"] / gpu
        numpy_fn = {
            "cholesky": np.linalg.cholesky,
            "qr": np.linalg.qr,
            "solve": lambda a: np.linalg.solve(a, np.ones(a.shape[:-1] + (1,), np.float32)),
            "svd": np.linalg.svd,
            "eigh": np.linalg.eigh,
        }[name]
        start = time.perf_counter()
        numpy_fn(host.reshape(shape))
        row["numpy_s"] = time.perf_counter() - start
        rows.append(row)
        torch_text = (
            f"{row['torch_s'] * 1e3:9.2f} {row['torch_over_bitnet_gpu']:6.2f}" if torch else ""
        )
        print(
            f"{name:9s} {str(tuple(shape)):>17s} {gpu * 1e3:9.2f} {wall * 1e3:9.2f} "
            f"{torch_text or ' ' * 16} {row['numpy_s'] * 1e3:9.2f}",
            flush=True,
        )
    write_results(args.json, {"device": device.name, "dtype": "float32", "rows": rows})


if __name__ == "__main__":
    main()
