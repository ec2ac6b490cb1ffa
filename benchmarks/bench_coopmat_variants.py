"""Restructurings of the BitLinear tensor-core kernel tried before they are built in: variants of
shaders/bitlinear/bitlinear_coopmat.comp made by text edits here (each edit's text must be found),
compiled with glslangValidator, and run at (2048, 4096, 4096) with the 128 x 128 tile of K steps of
64 and 2 x 4 subgroups, beside the built-in kernel: registers (Kernel.statistics), whether y is
bit for bit the built-in kernel's, and GPU time. The question they answer: can the kernel keep two
K steps in flight within the 128 registers that let two workgroups share a multiprocessor
(benchmarks/bench_ceilings.py shows the staging of one step at a time is what bounds it)?

    python3 benchmarks/bench_coopmat_variants.py [--json FILE] [--repeats N]
"""

from __future__ import annotations

import time

import numpy as np

import bitnet_gpu as bg
from bench_ceilings import coopmat_operands, coopmat_source, edited_coopmat, gpu_seconds
from common import arguments, busy_gpu, torch_cuda, write_results

# The K loop's multiplies holding a subgroup's C_COLS B fragments and loading its C_ROWS A
# fragments one at a time (fewer fragment registers live: C_COLS + 1 instead of C_ROWS + 1).
B_HELD = r"""  #define MULTIPLY_STEP()                                                                    \
    [[unroll]] for (uint step = 0; step < BLOCKS; step += 2) {  /* 32 values per multiply */ \
      icoopmatNV<8, gl_ScopeSubgroup, 32, 16> mat_b[C_COLS];                                 \
      [[unroll]] for (uint j = 0; j < C_COLS; ++j) {                                         \
        const uint col = 16 * (C_COLS * sub_col + j);                                        \
        coopMatLoadNV(mat_b[j], tiles, B_TILE + col * STRIDE + step, STRIDE, true);          \
      }                                                                                      \
      [[unroll]] for (uint i = 0; i < C_ROWS; ++i) {                                         \
        icoopmatNV<8, gl_ScopeSubgroup, 16, 32> mat_a;                                       \
        const uint row = 16 * (C_ROWS * sub_row + i);                                        \
        coopMatLoadNV(mat_a, tiles, row * STRIDE + step, STRIDE, false);                     \
        [[unroll]] for (uint j = 0; j < C_COLS; ++j)                                         \
          result[i][j] = coopMatMulAddNV(mat_a, mat_b[j], result[i][j]);                     \
      }                                                                                      \
    }
"""

# Loads whose indices are a per-invocation base plus a multiple of a row stride, computed once
# (the built-in kernel divides the element index by BLOCKS for every load).
LOAD_BASES = [
    ("  #define LOAD_STEP(first, A, W, B)",
     "  const uint load_row = thread / BLOCKS, load_block = thread % BLOCKS;\n"
     "  const uint a_base = (m0 + load_row) * p.blocks + load_block, w_base = (n0 + load_row) * p.blocks + load_block;\n"
     "  const uint ROWS_A_LOAD = 256 / BLOCKS;\n"
     "  #define LOAD_STEP(first, A, W, B)"),
    ("      A[l] = m0 + row < p.m && block < p.blocks ? a[(m0 + row) * p.blocks + block] : uvec4(0); \\",
     "      A[l] = m0 + row < p.m && block < p.blocks ? a[a_base + (first) + l * ROWS_A_LOAD * p.blocks] : uvec4(0); \\"),
    ("      if (TERNARY) W[l] = inside ? w[(n0 + row) * p.blocks + block] : 0x55555555u;           \\",
     "      if (TERNARY) W[l] = inside ? w[w_base + (first) + l * ROWS_A_LOAD * p.blocks] : 0x55555555u; \\"),
]


def multiply_edit(source):
    start = source.index("  #define MULTIPLY_STEP()")
    end = source.index("\n\n  LOAD_STEP(0, a0, w0, b0)")
    return [(source[start:end + 1], B_HELD)]


# (label, steps loaded ahead, edits)
VARIANTS = [
    ("built-in, 1 step ahead", 1, None),
    ("built-in, 2 steps ahead", 2, None),
    ("source compiled here, 1 step ahead", 1, lambda s: []),
    ("B fragments held, A streamed, 1 step ahead", 1, multiply_edit),
    ("B fragments held, A streamed, 2 steps ahead", 2, multiply_edit),
    ("load indices from bases, 2 steps ahead", 2, lambda s: LOAD_BASES),
    ("B held and load bases, 2 steps ahead", 2, lambda s: multiply_edit(s) + LOAD_BASES),
]


def main():
    args = arguments(__doc__)
    device = bg.default_device()
    results = {"device": device.name, "driver": device.info.driver_info,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "variants": []}
    if not device.info.features.get("cooperative_matrix_int8", False):
        print("no int8 cooperative matrices on this device: nothing to run")
        write_results(args.json, results)
        return
    torch = torch_cuda()
    source = coopmat_source()
    m, k, n = 2048, 4096, 4096
    inputs, push = coopmat_operands(device, 5, m, k, n)
    reference = None
    if torch is not None:
        busy_gpu(torch)
    for label, depth, edits in VARIANTS:
        spec = {0: True, 1: False, 2: True, 3: False, 4: 128, 5: 128, 6: 4, 7: 2, 8: depth, 9: False}
        kernel = (bg.builtin_kernel("bitlinear_coopmat", device, spec) if edits is None
                  else edited_coopmat(device, source, edits(source), spec, "coopmat variant"))
        y = device.empty((m, n), np.float32)
        y.copy_from(np.full((m, n), np.nan, np.float32))  # poisoned: every value must be written

        def run():
            kernel.dispatch((n // 128, m // 128, 1), inputs + [y, y], push)

        run()
        out = y.numpy().copy()
        if reference is None:
            reference = out
        exact = bool(np.array_equal(out, reference))
        seconds = gpu_seconds(device, run, args.repeats)
        registers = kernel.statistics.get("Register Count")
        row = {"variant": label, "depth": depth, "registers": registers, "exact": exact,
               "gpu_s": seconds, "TOPS": 2 * m * k * n / seconds / 1e12}
        results["variants"].append(row)
        print(f"{label:48s} registers {registers!s:>4s}  exact {exact!s:5s}  {seconds * 1e6:8.1f} us  "
              f"{row['TOPS']:6.0f} T ops/s", flush=True)
    write_results(args.json, results)


if __name__ == "__main__":
    main()
