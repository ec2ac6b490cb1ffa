"""What the GPU does at best through Vulkan, beside PyTorch on the same GPU: the ceilings that the
BitLinear kernels' times are measured against, each with the kernel it bounds, in one run.

- Read bandwidth: probe kernels that only stream a buffer (16-byte loads, several in flight an
  invocation, a grid-stride loop; nothing written), over the 67 MB of packed weights of a
  (16384, 16384) BitLinear and over 1 GiB; beside PyTorch's device copy (bytes read + written) and
  a read-only reduction (torch.sum), and the BitLinear call of that shape, whole and its matvec.
- Tensor-core throughput: probe kernels whose subgroups multiply-accumulate 16 x 16 cooperative
  matrices (VK_NV_cooperative_matrix; int8 x int8 -> int32, 16 x 16 x 32, as bitlinear_coopmat.comp
  does, and float16 16 x 16 x 16 with float32 and float16 sums) with no memory traffic: operands
  held in registers, or loaded from shared memory before every multiply in the layout and amounts
  the BitLinear kernel's K loop uses; beside cuBLAS float16 (torch.matmul) and int8
  (torch._int_mm) at large sizes and at (2048, 4096, 4096), and the BitLinear call of that shape.

GPU times are Vulkan timestamps around a graph of the probe dispatch, after the clocks are up.
Probe shaders are compiled here with glslangValidator (the PATH's, or $GLSLANG_VALIDATOR). Where
the device lacks a feature its rows are skipped. Prints a table and writes JSON; asserts nothing.

    python3 benchmarks/investigations/ceilings.py [--json FILE] [--repeats N] [--sections
    read,tensor-cores]
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import bitnet_gpu as bg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import (
    arguments,
    busy_gpu,
    by_kernel,
    compile_glsl,
    glslang,
    keep_running,
    profiled,
    timed_chain,
    torch_copy_gbps,
    torch_cuda,
    torch_time,
    write_results,
)

# Streams `vectors` 16-byte vectors: workgroup g's invocations read IN_FLIGHT vectors at once,
# 256 apart, then step by the whole grid. The XOR of what an invocation read is written only if it
# equals p.never (all ones: for random data, a 2**-32 chance), so the loads stay and, in practice,
# nothing is written.
READ = r"""
#version 450
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint IN_FLIGHT = 4;
layout(std430, binding = 0) readonly buffer Data { uvec4 data[]; };
layout(std430, binding = 1) writeonly buffer Sink { uint sink[]; };
layout(push_constant) uniform Push { uint vectors; uint never; } p;
void main() {
  const uint stride = gl_NumWorkGroups.x * 256 * IN_FLIGHT;
  uvec4 sum = uvec4(0);
  for (uint base = gl_WorkGroupID.x * 256 * IN_FLIGHT + gl_LocalInvocationID.x; base < p.vectors;
       base += stride) {
    uvec4 v[IN_FLIGHT];
    [[unroll]] for (uint f = 0; f < IN_FLIGHT; ++f) {
      const uint i = base + f * 256;
      v[f] = i < p.vectors ? data[i] : uvec4(0);
    }
    [[unroll]] for (uint f = 0; f < IN_FLIGHT; ++f) sum ^= v[f];
  }
  const uint r = sum.x ^ sum.y ^ sum.z ^ sum.w;
  if (r == p.never) sink[gl_GlobalInvocationID.x] = r;
}
"""

# A workgroup of 8 subgroups, as bitlinear_coopmat.comp's: 2 x 4 subgroups, each owning ROWS x
# COLS 16 x 16 results (4 x 2: the BitLinear kernel's 128 x 128 tile). The operands come from a
# shared tile laid out as that kernel's (rows of 4 + 1 uvec4), loaded once (registers) or, with
# RELOAD, before every multiply from alternating halves of the K step, as its MULTIPLY_STEP does.
# Results are written only if p.write_out is set (0 when timed).
COOPMAT = r"""
#version 450
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int32 : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#ifdef INT8
#extension GL_NV_integer_cooperative_matrix : require
#define A_MATRIX icoopmatNV<8, gl_ScopeSubgroup, 16, 32>
#define B_MATRIX icoopmatNV<8, gl_ScopeSubgroup, 32, 16>
#define C_MATRIX icoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define C_ZERO C_MATRIX(0)
#define C_STRIDE 4
#else
#define A_MATRIX fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define B_MATRIX fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define C_MATRIX fcoopmatNV<SUM_BITS, gl_ScopeSubgroup, 16, 16>
#define C_ZERO C_MATRIX(0.0)
#define C_STRIDE (SUM_BITS / 8)
#endif
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint ITERATIONS = 1024;
const uint STRIDE = 5, B_TILE = 128 * STRIDE;
layout(std430, binding = 0) readonly buffer Source { uvec4 source[]; };
layout(std430, binding = 1) writeonly buffer Sink { uvec4 sink[]; };
layout(push_constant) uniform Push { uint write_out; } p;
shared uvec4 tiles[256 * STRIDE];
void main() {
  for (uint i = gl_LocalInvocationID.x; i < 256 * STRIDE; i += 256) tiles[i] = source[i];
  barrier();
  const uint sub_row = gl_SubgroupID / 4, sub_col = gl_SubgroupID % 4;
  C_MATRIX sums[ROWS][COLS];
  [[unroll]] for (uint i = 0; i < ROWS; ++i)
    [[unroll]] for (uint j = 0; j < COLS; ++j) sums[i][j] = C_ZERO;
  A_MATRIX a[ROWS];
  B_MATRIX b[COLS];
  #define LOAD(step)                                                                          \
    [[unroll]] for (uint i = 0; i < ROWS; ++i)                                                \
      coopMatLoadNV(a[i], tiles, ((16 * (ROWS * sub_row + i)) % 128) * STRIDE + (step), STRIDE,
      false); \
    [[unroll]] for (uint j = 0; j < COLS; ++j)                                                \
      coopMatLoadNV(b[j], tiles, B_TILE + ((16 * (COLS * sub_col + j)) % 128) * STRIDE + (step),
      STRIDE, true);
  LOAD(0)
  for (uint it = 0; it < ITERATIONS; ++it) {
#ifdef RELOAD
    LOAD((it & 1u) * 2u)
#endif
    [[unroll]] for (uint i = 0; i < ROWS; ++i)
      [[unroll]] for (uint j = 0; j < COLS; ++j) sums[i][j] = coopMatMulAddNV(a[i], b[j],
      sums[i][j]);
  }
  if (p.write_out != 0) {
    const uint first = (gl_WorkGroupID.x * 8 + gl_SubgroupID) * ROWS * COLS;
    [[unroll]] for (uint i = 0; i < ROWS; ++i)
      [[unroll]] for (uint j = 0; j < COLS; ++j)
        coopMatStoreNV(sums[i][j], sink, (first + i * COLS + j) * 16 * C_STRIDE, C_STRIDE, false);
  }
}
"""

# (name, defines, multiply-adds a 16 x 16 multiply: 16 * 16 * K)
COOPMAT_CASES = [
    (
        "int8, 4 x 2 results a subgroup, operands in registers",
        ["INT8", "ROWS=4", "COLS=2"],
        16 * 16 * 32,
    ),
    (
        "int8, 4 x 4 results a subgroup, operands in registers",
        ["INT8", "ROWS=4", "COLS=4"],
        16 * 16 * 32,
    ),
    (
        "int8, 4 x 2, loaded from shared memory for every multiply (bitlinear_coopmat's K loop)",
        ["INT8", "ROWS=4", "COLS=2", "RELOAD"],
        16 * 16 * 32,
    ),
    (
        "int8, 4 x 4, loaded from shared memory for every multiply",
        ["INT8", "ROWS=4", "COLS=4", "RELOAD"],
        16 * 16 * 32,
    ),
    (
        "float16, float32 sums, 4 x 2, operands in registers",
        ["SUM_BITS=32", "ROWS=4", "COLS=2"],
        16 * 16 * 16,
    ),
    (
        "float16, float16 sums, 4 x 2, operands in registers",
        ["SUM_BITS=16", "ROWS=4", "COLS=2"],
        16 * 16 * 16,
    ),
]


def gpu_seconds(device, record, repeats):
    """Median GPU seconds of record()'s ops as one graph, after 0.3 s of replays (the clocks up)."""
    return timed_chain(
        bg, device, record, 1, repeats, before_timing=lambda graph: keep_running(graph.run, 0.3)
    )[0]


def whole_and_kernels(device, fn, repeats):
    """(GPU seconds of fn()'s ops as one graph, {kernel: seconds} from a profiled run)."""
    return gpu_seconds(device, fn, repeats), by_kernel(profiled(bg, device, fn, repeats)[1])


def read_ceiling(device, results, repeats, torch):
    """Read-only streaming over 67 MB and 1 GiB, beside PyTorch's copy and sum."""
    cpu = device.info.type == "cpu"
    sizes = (
        [("16 MiB", 2**24)]
        if cpu
        else [("packed (16384, 16384) weights", 16384 * 16384 // 4), ("1 GiB", 2**30)]
    )
    slots = max(device.info.multiprocessors, 1)
    rows = results["read"] = []
    for name, nbytes in sizes:
        vectors = nbytes // 16
        data = device.empty((vectors * 4,), np.uint32)
        data.copy_from(np.random.default_rng(0).integers(0, 2**32, vectors * 4, dtype=np.uint32))
        best = None
        for in_flight in (4, 8):
            kernel = bg.Kernel(
                device, compile_glsl(READ), specialization={0: in_flight}, name="read probe"
            )
            for per_multiprocessor in (1,) if cpu else (2, 4, 8, 16):
                groups = min(slots * per_multiprocessor, -(-vectors // (256 * in_flight)))
                sink = device.empty((groups * 256,), np.uint32)
                push = np.array([vectors, 0xFFFFFFFF], np.uint32)  # a 2**-32 chance a word, no more
                seconds = gpu_seconds(
                    device, lambda: kernel.dispatch(groups, [data, sink], push), repeats
                )
                row = {
                    "bytes": nbytes,
                    "what": name,
                    "in_flight": in_flight,
                    "workgroups": groups,
                    "gpu_s": seconds,
                    "GBps": nbytes / seconds / 1e9,
                }
                rows.append(row)
                print(
                    f"read {name:32s} {in_flight} in flight, {groups:5d} workgroups: "
                    f"{seconds * 1e6:9.1f} us  {row['GBps']:8.1f} GB/s",
                    flush=True,
                )
                if best is None or seconds < best["gpu_s"]:
                    best = row
        best["best_for_size"] = True
        data = None  # frees the buffer before the next size
    if torch is not None:
        results["torch_copy_GBps"] = torch_copy_gbps(torch, repeats)
        for nbytes in (16384 * 16384 // 4, 2**30):
            a = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
            busy_gpu(torch)
            seconds = torch_time(torch, lambda: a.sum(), repeats)
            results.setdefault("torch_sum_GBps", {})[str(nbytes)] = nbytes / seconds / 1e9
            print(
                f"torch.sum of {nbytes / 1e6:.0f} MB of float32: {seconds * 1e6:.1f} us, "
                f"{nbytes / seconds / 1e9:.0f} GB/s",
                flush=True,
            )
            del a
        print(
            f"torch device copy: {results['torch_copy_GBps']:.0f} GB/s (read + written)", flush=True
        )
    # The BitLinear call that streams the 67 MB: whole (one graph) and its kernels (profiled).
    if not cpu:
        rng = np.random.default_rng(1)
        q = bg.quantize_weights(rng.standard_normal((16384, 16384), dtype=np.float32))
        x = bg.Tensor.from_numpy(rng.standard_normal((1, 16384), dtype=np.float32))
        seconds, kernels = whole_and_kernels(device, lambda: bg.bitlinear(x, q), repeats)
        results["bitlinear_1x16384x16384"] = {
            "gpu_s": seconds,
            "kernels": kernels,
            "packed_bytes": q.packed_tensor.nbytes,
        }
        print(
            f"bitlinear (1, 16384, 16384): {seconds * 1e6:.1f} us whole; "
            + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in kernels.items()),
            flush=True,
        )


def coopmat_probes(device, results, repeats, cases):
    """Multiply-add throughput of each probe case, 8 workgroups a multiprocessor."""
    rows = results.setdefault("coopmat", [])
    groups = max(device.info.multiprocessors, 1) * 8
    source = bg.Tensor.from_numpy(
        np.random.default_rng(2).integers(-1, 2, 256 * 5 * 16, dtype=np.int8).view(np.uint32)
    )
    for name, defines, macs in cases:
        iterations = 2048
        try:
            kernel = bg.Kernel(
                device,
                compile_glsl(COOPMAT, defines),
                specialization={0: iterations},
                name="coopmat probe",
            )
        except (RuntimeError, bg.Error) as error:
            print(f"coopmat {name}: not run ({error})")
            rows.append({"case": name, "error": str(error)})
            continue
        per_subgroup = 1
        for d in defines:
            if d.startswith(("ROWS=", "COLS=")):
                per_subgroup *= int(d.split("=")[1])
        sink = device.empty((groups * 8 * per_subgroup * 256,), np.uint32)
        push = np.array([0], np.uint32)
        seconds = gpu_seconds(
            device, lambda: kernel.dispatch(groups, [source, sink], push), repeats
        )
        ops = 2 * macs * per_subgroup * iterations * groups * 8
        row = {
            "case": name,
            "workgroups": groups,
            "iterations": iterations,
            "gpu_s": seconds,
            "TOPS": ops / seconds / 1e12,
        }
        rows.append(row)
        print(f"coopmat {name:86s} {row['TOPS']:7.1f} T ops/s", flush=True)


def tensor_core_ceiling(device, results, repeats, torch):
    """int8 cooperative-matrix multiply-add throughput, beside the BitLinear call and cuBLAS."""
    if not device.info.features.get("cooperative_matrix_int8", False):
        print("no int8 cooperative matrices on this device: tensor-core probes skipped")
    else:
        coopmat_probes(device, results, repeats, [c for c in COOPMAT_CASES if "INT8" in c[1]])
        rng = np.random.default_rng(3)
        m, k, n = 2048, 4096, 4096
        q = bg.quantize_weights(rng.standard_normal((n, k), dtype=np.float32))
        x = bg.Tensor.from_numpy(rng.standard_normal((m, k), dtype=np.float32))
        seconds, kernels = whole_and_kernels(device, lambda: bg.bitlinear(x, q), repeats)
        results["bitlinear_2048x4096x4096"] = {
            "gpu_s": seconds,
            "kernels": kernels,
            "TOPS": 2 * m * k * n / seconds / 1e12,
        }
        print(
            f"bitlinear (2048, 4096, 4096): {seconds * 1e6:.1f} us whole "
            f"({2 * m * k * n / seconds / 1e12:.0f} T ops/s); "
            + ", ".join(f"{name} {v * 1e6:.1f} us" for name, v in kernels.items()),
            flush=True,
        )
    if torch is not None:
        peers = results["torch"] = []
        for m, k, n in ((2048, 4096, 4096), (8192, 8192, 8192)):
            a = torch.randn(m, k, device="cuda", dtype=torch.float16)
            b = torch.randn(n, k, device="cuda", dtype=torch.float16)
            busy_gpu(torch)
            fp16 = torch_time(torch, lambda: torch.nn.functional.linear(a, b), repeats)
            ai = torch.randint(-128, 127, (m, k), device="cuda", dtype=torch.int8)
            bi = torch.randint(-128, 127, (k, n), device="cuda", dtype=torch.int8)
            int8 = torch_time(torch, lambda: torch._int_mm(ai, bi), repeats)
            ops = 2 * m * k * n
            peers.append(
                {
                    "shape": [m, k, n],
                    "cublas_fp16_s": fp16,
                    "cublas_fp16_TFLOPS": ops / fp16 / 1e12,
                    "int_mm_s": int8,
                    "int_mm_TOPS": ops / int8 / 1e12,
                }
            )
            print(
                f"torch ({m}, {k}, {n}): float16 linear {fp16 * 1e6:.1f} us "
                f"({ops / fp16 / 1e12:.0f} TFLOP/s), "
                f"_int_mm {int8 * 1e6:.1f} us ({ops / int8 / 1e12:.0f} T ops/s)",
                flush=True,
            )
            del a, b, ai, bi


SECTIONS = ("read", "tensor-cores")


def main():
    args = arguments(
        __doc__,
        lambda parser: parser.add_argument(
            "--sections",
            default=",".join(SECTIONS),
            help=f"comma-separated, of {', '.join(SECTIONS)}",
        ),
    )
    sections = args.sections.split(",")
    if not set(sections) <= set(SECTIONS):
        raise SystemExit(f"--sections: expected some of {', '.join(SECTIONS)}")
    device = bg.default_device()
    torch = torch_cuda()
    results = {
        "device": device.name,
        "driver": device.info.driver_info,
        "multiprocessors": device.info.multiprocessors,
        "torch": None if torch is None else torch.__version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if glslang() is None:
        print("no glslangValidator: the probe kernels cannot be compiled here")
        return
    if torch is not None:
        busy_gpu(torch)
    if "read" in sections:
        read_ceiling(device, results, args.repeats, torch)
        write_results(args.json, results)
    if "tensor-cores" in sections:
        tensor_core_ceiling(device, results, args.repeats, torch)
        write_results(args.json, results)
    # float16 last: 16 x 16 x 16 is the shape the NV extension's float16 multiply is known by, but
    # this device's list of shapes is not checked here.
    if (
        "tensor-cores" in sections
        and device.info.features.get("cooperative_matrix_nv", False)
        and device.info.features.get("float16", False)
    ):
        coopmat_probes(
            device, results, args.repeats, [c for c in COOPMAT_CASES if "INT8" not in c[1]]
        )
        write_results(args.json, results)


if __name__ == "__main__":
    main()
