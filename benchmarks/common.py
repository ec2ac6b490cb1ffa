"""Helpers shared by the benchmark scripts: PyTorch's CUDA events, host wall time, JSON output."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import numpy as np


def torch_cuda():
    """The torch module when it can run on a CUDA GPU here, else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def glslang():
    """The glslangValidator to compile probe shaders with ($GLSLANG_VALIDATOR, else the PATH's),
    or None."""
    return os.environ.get("GLSLANG_VALIDATOR") or shutil.which("glslangValidator")


def compile_glsl(source, defines=(), target="vulkan1.2", include_dir=None):
    """SPIR-V words (uint32) of a GLSL compute shader given as text, with -D definitions and, where
    given, a folder its #include lines are found in."""
    with tempfile.TemporaryDirectory() as folder:
        path, binary = os.path.join(folder, "probe.comp"), os.path.join(folder, "probe.spv")
        with open(path, "w") as f:
            f.write(source)
        command = [glslang(), "-V", "--target-env", target, "-S", "comp", "-o", binary, path]
        command += [f"-D{d}" for d in defines] + ([f"-I{include_dir}"] if include_dir else [])
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"glslangValidator failed:\n{done.stdout}{done.stderr}")
        with open(binary, "rb") as f:
            return np.frombuffer(f.read(), np.uint32).copy()


def torch_int8_matmul(torch, a, b):
    """PyTorch's int8 matmul on cuBLASLt's int8 kernels (a [M, K] int8 with M > 16, b [K, N]
    int8): torch._int_mm, which PyTorch gives no public name; composing it from public ops would
    time something slower than PyTorch's own kernel."""
    return torch._int_mm(a, b)


def torch_softmax_backward(torch, grad, y, dim):
    """The kernel PyTorch's softmax backward runs, given the output y and its gradient:
    torch._softmax_backward_data, which PyTorch gives no public name (autograd around it would
    time its engine too)."""
    return torch._softmax_backward_data(grad, y, dim, y.dtype)


def torch_time(torch, fn, repeats):
    """Median seconds of fn() between CUDA events, after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return statistics.median(times)


def median_wall(fn, repeats):
    """Median host seconds of fn()."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def keep_running(fn, seconds=2.0):
    """Calls fn() for `seconds`: the GPU's clocks up before a timing (an idle H100 sits at 345
    MHz)."""
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()


def busy_gpu(torch, seconds=0.3):
    """Keeps the GPU busy with queued PyTorch work for `seconds`, then waits for it: the clocks at
    their working level before a timing (an idle H100 sits at 345 MHz, and synchronous calls with
    host work between them may not lift it)."""
    a = torch.randn(4096, 4096, device="cuda")
    keep_running(lambda: a @ a, seconds)
    torch.cuda.synchronize()


def knob_settings(setting):
    """{knob: value} from {name: text}: names as knobs (matvec_rows) or variables
    (BITNET_GPU_MATVEC_ROWS), texts of digits as ints, others (a tile, 128x128) as they are."""
    return {
        name.removeprefix("BITNET_GPU_").lower(): int(value) if str(value).isdigit() else value
        for name, value in setting.items()
    }


def with_settings(setting, fn):
    """fn() under the tuning knobs of `setting` ({name: value}, see knob_settings), the knobs
    before it restored afterwards."""
    import bitnet_gpu as bg

    with bg.tuning(**knob_settings(setting)):
        return fn()


def parse_settings(text):
    """[{name: value}] from "default;matvec_rows=4;matvec_rows=4,matvec_unroll=2": settings
    separated by
    ";", the knobs of one by ","; "default" sets none."""
    settings = []
    for item in text.split(";"):
        item = item.strip()
        if not item or item == "default":
            settings.append({})
            continue
        settings.append(dict(pair.split("=", 1) for pair in item.split(",")))
    return settings


def label(setting):
    """A setting as the tables name it."""
    return ",".join(f"{k}={v}" for k, v in knob_settings(setting).items()) or "default"


def write_results(path, results):
    """Writes the results as JSON to `path` (nothing when path is None) and says where."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {path}")


def arguments(doc, extra=None):
    """The benchmark scripts' command line: --repeats, --json, --tiny (the smallest sizes, which CI
    runs on lavapipe so that no script rots), and whatever `extra(parser)` adds."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", default=None)
    parser.add_argument("--tiny", action="store_true", help="the smallest sizes (CI, lavapipe)")
    if extra:
        extra(parser)
    return parser.parse_args()


def timed_graph(bg, device, record, repeats):
    """(median GPU seconds, the graph) of the ops record() makes, recorded once into a graph timed
    as a whole (one timestamp pair) and replayed `repeats` times after one warm-up replay. Unlike a
    profile, which puts a timestamp after every op, this times the ops as a plain call runs them."""
    return timed_chain(bg, device, record, 1, repeats)


def timed_chain(bg, device, record, links, repeats, before_timing=None):
    """(median GPU seconds an op, the graph) of a graph of `links` calls of record(), timed as a
    whole (timed_graph); before_timing(graph), where given, runs between recording and timing."""
    graph = bg.Graph(device, timings="total")
    with graph:
        for _ in range(links):
            record()
    if before_timing:
        before_timing(graph)
    graph.run()
    times = []
    for _ in range(repeats):
        graph.run()
        times.append(graph.timings()[0][1])
    return statistics.median(times) / links, graph


def warm_graph_seconds(bg, device, torch, setting, fn, repeats):
    """graph_seconds of fn() under `setting` (with_settings), after one plain call (the kernels
    built) and, where PyTorch has CUDA, busy_gpu (the clocks up)."""
    with_settings(setting, fn)
    if torch is not None:
        busy_gpu(torch)
    return with_settings(setting, lambda: graph_seconds(bg, device, fn, repeats))


def graph_seconds(bg, device, fn, repeats):
    """Median GPU seconds of fn()'s ops timed as a whole (timed_graph)."""
    return timed_graph(bg, device, fn, repeats)[0]


def profiled(bg, device, fn, repeats):
    """(median GPU seconds of all of fn()'s ops from Vulkan timestamps, the last run's per-op
    timings), after one warm-up call."""
    fn()
    totals, timings = [], []
    for _ in range(repeats):
        with bg.profile(device) as p:
            fn()
        totals.append(p.total())
        timings = p.timings
    return statistics.median(totals), timings


def torch_copy_gbps(torch, repeats, nbytes=2**30):
    """The copy-bandwidth ceiling: PyTorch's device-to-device copy of nbytes, in GB/s of bytes
    read plus bytes written."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    return 2 * nbytes / torch_time(torch, lambda: b.copy_(a), repeats) / 1e9


def by_kernel(timings):
    """{label: seconds} from per-op timings, ops that share a label (one kernel's phases) added."""
    kernels = {}
    for label, seconds in timings:
        kernels[label] = kernels.get(label, 0.0) + seconds
    return kernels
