"""Where a small dispatch's time goes: chains of 100 dependent one-workgroup dispatches (a barrier
between every pair, timed as a whole by Vulkan timestamps), each reading COUNT 16-byte vectors an
invocation, against the floor (one value an invocation) and against the BitLinear pre-pass
kernel itself at K = 1024 ... 16384, with PyTorch's CUDA graph of the same reduction beside it.
Probe shaders are compiled here with glslangValidator (on the PATH, or $GLSLANG_VALIDATOR).
nvidia-smi, where present, samples the SM clock through every case.

    python3 benchmarks/investigations/latency.py [--json FILE] [--repeats N]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import threading

import numpy as np

import bitnet_gpu as bg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import (
    arguments,
    compile_glsl,
    glslang,
    keep_running,
    timed_chain,
    torch_cuda,
    write_results,
)

CHAIN = 100

# One workgroup of 256 invocations: invocation t reads vectors t, t + 256, ... of the workgroup's
# COUNT * 256 (GUARDED: each behind a bounds test, as the pre-passes do), takes max|x| of them
# (REDUCE: over the workgroup, through a subgroup max and one barrier, as the pre-passes do), and
# adds it to its value of `state`, which the previous link wrote (the dependency).
PROBE = r"""
#version 450
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint SPEC_COUNT = 1;
#ifndef COUNT
#define COUNT SPEC_COUNT
#endif
layout(std430, binding = 0) readonly buffer Input { vec4 x4[]; };
layout(std430, binding = 1) buffer State { float state[]; };
layout(push_constant) uniform Push { uint vectors; } p;
shared float s_part[32];
void main() {
  const uint lane = gl_LocalInvocationID.x;
  const uint base = gl_WorkGroupID.x * COUNT * 256;
  vec4 cache[COUNT];
  [[unroll]] for (uint c = 0; c < COUNT; ++c) {
    const uint v = base + lane + c * 256;
#ifdef GUARDED
    cache[c] = v < p.vectors ? x4[v] : vec4(0.0);
#else
    cache[c] = x4[v];
#endif
  }
  float m = 0.0;
  [[unroll]] for (uint c = 0; c < COUNT; ++c) {
    const vec4 a = abs(cache[c]);
    m = max(m, max(max(a.x, a.y), max(a.z, a.w)));
  }
#ifdef REDUCE
  m = subgroupMax(m);
  if (subgroupElect()) s_part[gl_SubgroupID] = m;
  barrier();
  for (uint s = 0; s < gl_NumSubgroups; ++s) m = max(m, s_part[s]);
#endif
  state[gl_GlobalInvocationID.x] = state[gl_GlobalInvocationID.x] * 0.5 + m;
}
"""


class ClockSampler:
    """nvidia-smi's SM clock (MHz) sampled every 20 ms while the `with` block runs; empty where
    there is no nvidia-smi."""

    def __init__(self):
        self.samples, self._process = [], None

    def __enter__(self):
        if shutil.which("nvidia-smi"):
            self._process = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=clocks.sm",
                    "--format=csv,noheader,nounits",
                    "-lms",
                    "20",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return self

    def _read(self):
        for line in self._process.stdout:
            try:
                self.samples.append(int(line.strip()))
            except ValueError:
                pass

    def __exit__(self, *exc):
        if self._process:
            self._process.terminate()
            self._process.wait()
            self._reader.join(timeout=1)

    def summary(self):
        return (
            {
                "min": min(self.samples),
                "median": statistics.median(self.samples),
                "max": max(self.samples),
            }
            if self.samples
            else None
        )


def per_link(device, record, repeats):
    """GPU microseconds per op of a graph of CHAIN dependent ops recorded by record(), after the
    clocks are up, and the SM clocks seen meanwhile."""
    with ClockSampler() as clocks:  # sampled while the chain runs for 0.3 s, then timed
        seconds, _ = timed_chain(
            bg,
            device,
            record,
            CHAIN,
            repeats,
            before_timing=lambda graph: keep_running(graph.run, 0.3),
        )
    return seconds * 1e6, clocks.summary()


def torch_reduction_chain(torch, k, repeats):
    """Microseconds per torch.amax of a k-vector, CHAIN of them captured in a CUDA graph."""
    x = torch.randn(k, device="cuda")
    out = torch.empty((), device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            torch.amax(x.abs(), dim=0, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CHAIN):
            torch.amax(x, dim=0, out=out)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / CHAIN)
    return statistics.median(times)


def main():
    args = arguments(__doc__)
    device = bg.default_device()
    rng = np.random.default_rng(0)
    results = {"device": device.name, "chain": CHAIN, "rows": []}

    def report(name, us, clocks):
        results["rows"].append({"case": name, "us_per_op": us, "sm_clock_mhz": clocks})
        clock = f"  SM {clocks['min']}-{clocks['max']} MHz" if clocks else ""
        print(f"{name:64s} {us:8.2f} us/op{clock}", flush=True)

    axpy = bg.builtin_kernel("axpy", device, {0: 256})
    small_x = bg.Tensor.from_numpy(np.ones(256, np.float32))
    small_y = bg.Tensor.from_numpy(np.zeros(256, np.float32))
    push = np.array([256], np.uint32).tobytes() + np.float32(0.5).tobytes()
    report(
        "axpy, one workgroup (floor)",
        *per_link(device, lambda: axpy.dispatch(1, [small_x, small_y], push), args.repeats),
    )

    groups_wide = 132
    x = bg.Tensor.from_numpy(rng.standard_normal((groups_wide * 16 * 256 * 4,)).astype(np.float32))
    state = bg.Tensor.from_numpy(np.zeros(groups_wide * 256, np.float32))
    if glslang() is None:
        print("no glslangValidator: probe kernels skipped")
    else:
        cases = [(f"{c}", [f"COUNT={c}"], {}, 1) for c in (1, 2, 4, 8, 16)]
        cases += [
            ("16 guarded", ["COUNT=16", "GUARDED"], {}, 1),
            ("16 guarded, reduced", ["COUNT=16", "GUARDED", "REDUCE"], {}, 1),
            ("16 from a specialization constant", [], {0: 16}, 1),
            (f"16, {groups_wide} workgroups", ["COUNT=16"], {}, groups_wide),
            (f"1, {groups_wide} workgroups", ["COUNT=1"], {}, groups_wide),
        ]
        for name, defines, specialization, groups in cases:
            kernel = bg.Kernel(
                device,
                compile_glsl(PROBE, defines, target="vulkan1.1"),
                specialization=specialization or None,
                name="probe",
            )
            vectors = np.array([groups * 16 * 256], np.uint32)
            us, clocks = per_link(
                device, lambda: kernel.dispatch(groups, [x, state], vectors), args.repeats
            )
            report(f"probe, vectors an invocation: {name}", us, clocks)

    # The BitLinear pre-pass kernel alone, one workgroup for one row of K values.
    for k in (1024, 4096, 16384):
        cached = -(-k // 4 // 256)
        prepare = bg.builtin_kernel("bitlinear_prepare_f32", device, {3: cached})
        row = bg.Tensor.from_numpy(rng.standard_normal((1, k)).astype(np.float32))
        xq = device.empty((k // 4,), np.uint32)
        scales = device.empty((1,), np.float32)
        sums = device.empty((1,), np.int32)
        counter = bg.Tensor.from_numpy(np.zeros(1, np.uint32))
        push_prepare = np.array([1, k, k], np.uint32).tobytes() + np.float32(1e-5).tobytes()
        us, clocks = per_link(
            device,
            lambda: prepare.dispatch(
                1, [row, row, xq, scales, sums, counter, row, row], push_prepare
            ),
            args.repeats,
        )
        report(f"bitlinear_prepare, one row of K={k} (CACHED={cached})", us, clocks)

    # The pre-pass reading a row that is no longer in the L2 cache, as in a BitLinear call whose
    # previous call streamed the weights: each link first copies 64 MiB (more than the H100's 50 MB
    # of L2) into the buffer whose
    # first K values the pre-pass then reads (so a barrier separates them), against the copies
    # alone.
    flush_vectors = 2**22 if device.info.type != "cpu" else 2**16  # 64 MiB of vec4 (1 MiB on a CPU)
    source = device.empty((flush_vectors * 4,), np.float32)
    target = device.empty((flush_vectors * 4,), np.float32)
    source.copy_from(rng.standard_normal(flush_vectors * 4).astype(np.float32))
    copy = bg.builtin_kernel("copy_vec4", device, {0: 256})
    copy_push = np.array([flush_vectors], np.uint32)
    copy_groups = min(-(-flush_vectors // 256), 65535)

    def flush():
        copy.dispatch(copy_groups, [source, target], copy_push)

    flush_us, _ = per_link(device, flush, args.repeats)
    report(f"copy of {flush_vectors * 16 >> 20} MiB (the cache flush below, alone)", flush_us, None)
    k = 16384
    xq = device.empty((k // 4,), np.uint32)
    scales = device.empty((1,), np.float32)
    sums = device.empty((1,), np.int32)
    counter = bg.Tensor.from_numpy(np.zeros(1, np.uint32))
    prepare = bg.builtin_kernel("bitlinear_prepare_f32", device, {3: 16})
    push_prepare = np.array([1, k, k], np.uint32).tobytes() + np.float32(1e-5).tobytes()
    chunks = k // 2048
    partial = device.empty((chunks,), np.float32)
    phases = [
        bg.builtin_kernel("bitlinear_prepare_split_f32", device, {1: phase}) for phase in (0, 1)
    ]
    push_split = np.array([1, k, k, chunks], np.uint32)

    def one_workgroup():
        flush()
        prepare.dispatch(
            1, [target, target, xq, scales, sums, counter, target, target], push_prepare
        )

    def split():
        flush()
        for phase in phases:
            phase.dispatch((chunks, 1, 1), [target, partial, xq, scales, sums, counter], push_split)

    for name, record in [
        ("one workgroup", one_workgroup),
        (f"split over {chunks} chunks, two dispatches", split),
    ]:
        us, clocks = per_link(device, record, args.repeats)
        report(
            f"bitlinear pre-pass of K={k} after the copy ({name}), beyond the copy",
            us - flush_us,
            clocks,
        )

    torch = torch_cuda()
    if torch is not None:
        for k in (1024, 16384):
            report(
                f"PyTorch CUDA graph: torch.amax of {k} values",
                torch_reduction_chain(torch, k, args.repeats),
                None,
            )
    write_results(args.json, results)


if __name__ == "__main__":
    main()
