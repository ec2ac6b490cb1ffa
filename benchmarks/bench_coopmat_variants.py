"""Restructurings of the BitLinear tensor-core kernel tried before they are built in: variants of
shaders/bitlinear/bitlinear_coopmat.comp made by text edits here (each edit's text must be found),
compiled with glslangValidator, and run at (2048, 4096, 4096), beside the built-in kernel:
registers (Kernel.statistics), whether y is bit for bit the built-in kernel's, and GPU time. The
question they answer: what keeps the kernel from its K loop's ceiling (benchmarks/bench_ceilings.py)
within the 128 registers that let two workgroups share a multiprocessor? Variants that edited text
the kernel no longer has (load indices from per-invocation bases, loads without bounds tests, row
scales requested early, the 16-byte epilogue before it was built in) are in this script's history
(git log -- benchmarks/bench_coopmat_variants.py) with their results.

    python3 benchmarks/bench_coopmat_variants.py [--json FILE] [--repeats N]
"""
from __future__ import annotations

import time

import numpy as np

import bitnet_gpu as bg
from bench_ceilings import coopmat_operands, coopmat_source, coopmat_specialization, edited_coopmat, run_variant
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

def multiply_edit(source):
    start = source.index("  #define MULTIPLY_STEP()")
    end = source.index("\n\n  LOAD_STEP(0, a0, w0, b0)")
    return [(source[start:end + 1], B_HELD)]


# Workgroups of 512 invocations (16 subgroups) instead of 256: a larger tile a workgroup with the
# same 64 x 32 part a subgroup (fewer bytes from L2 for each multiply), or the same tile with
# 32 x 32 parts, and half the loads an invocation (room for two steps in flight).
INVOCATIONS_512 = [
    ("layout(local_size_x = 256) in;", "layout(local_size_x = 512) in;"),
    ("A_LOADS = TILE_M * BLOCKS / 256, B_LOADS = TILE_N * BLOCKS / 256;",
     "A_LOADS = TILE_M * BLOCKS / 512, B_LOADS = TILE_N * BLOCKS / 512;"),
    ("thread + l * 256", "thread + l * 512"),
    ("const uint SUBGROUP_COLS = 8 / SUBGROUP_ROWS;", "const uint SUBGROUP_COLS = 16 / SUBGROUP_ROWS;"),
]

# Diagnostic (y not computed): the K loop skipped, so the time is the launch and the epilogue.
EPILOGUE_ONLY = [("for (uint first = 0; first < p.blocks; first += BLOCKS) {",
                  "for (uint first = 0; first < 0u; first += BLOCKS) {")]

def two_stages(source):
    """Two copies of the tiles in shared memory, one barrier a K step: the multiplies read one copy
    while the step after is stored into the other (one step in registers, as DEPTH 1)."""
    loop_start = source.index("  if (DEPTH == 1) {\n    for (uint first = 0;")
    loop_end = source.index("  } else {  // two steps a round")
    loop = r"""  #define STORE_AT(OFFSET, A, W, B)                                                          \
    [[unroll]] for (uint l = 0; l < A_LOADS; ++l) {                                          \
      const uint e = thread + l * 256;                                                       \
      tiles[(OFFSET) + (e / BLOCKS) * STRIDE + e % BLOCKS] = A[l];                           \
    }                                                                                        \
    [[unroll]] for (uint l = 0; l < B_LOADS; ++l) {                                          \
      const uint e = thread + l * 256;                                                       \
      tiles[(OFFSET) + B_TILE + (e / BLOCKS) * STRIDE + e % BLOCKS] = TERNARY ? expand(W[l]) : B[l]; \
    }
  #define MULTIPLY_AT(OFFSET)                                                                \
    [[unroll]] for (uint step = 0; step < BLOCKS; step += 2) {                               \
      icoopmatNV<8, gl_ScopeSubgroup, 16, 32> mat_a[C_ROWS];                                 \
      [[unroll]] for (uint i = 0; i < C_ROWS; ++i) {                                         \
        const uint row = 16 * (C_ROWS * sub_row + i);                                        \
        coopMatLoadNV(mat_a[i], tiles, (OFFSET) + row * STRIDE + step, STRIDE, false);       \
      }                                                                                      \
      [[unroll]] for (uint j = 0; j < C_COLS; ++j) {                                         \
        icoopmatNV<8, gl_ScopeSubgroup, 32, 16> mat_b;                                       \
        const uint col = 16 * (C_COLS * sub_col + j);                                        \
        coopMatLoadNV(mat_b, tiles, (OFFSET) + B_TILE + col * STRIDE + step, STRIDE, true);  \
        [[unroll]] for (uint i = 0; i < C_ROWS; ++i)                                         \
          result[i][j] = coopMatMulAddNV(mat_a[i], mat_b, result[i][j]);                     \
      }                                                                                      \
    }
  if (DEPTH == 1) {
    const uint HALF = (TILE_M + TILE_N) * STRIDE;
    STORE_AT(0, a0, w0, b0)
    if (BLOCKS < p.blocks) { LOAD_STEP(BLOCKS, a0, w0, b0) }
    barrier();
    for (uint first = 0; first < p.blocks; first += 2 * BLOCKS) {
      MULTIPLY_AT(0)
      if (first + BLOCKS < p.blocks) {
        STORE_AT(HALF, a0, w0, b0)
        if (first + 2 * BLOCKS < p.blocks) { LOAD_STEP(first + 2 * BLOCKS, a0, w0, b0) }
      }
      barrier();
      if (first + BLOCKS >= p.blocks) break;  // uniform
      MULTIPLY_AT(HALF)
      if (first + 2 * BLOCKS < p.blocks) {
        STORE_AT(0, a0, w0, b0)
        if (first + 3 * BLOCKS < p.blocks) { LOAD_STEP(first + 3 * BLOCKS, a0, w0, b0) }
      }
      barrier();
    }
"""
    return [(source[loop_start:loop_end], loop),
            ("shared uvec4 tiles[(TILE_M + TILE_N) * STRIDE];", "shared uvec4 tiles[2 * (TILE_M + TILE_N) * STRIDE];")]


def direct_store(source):
    """Diagnostic for full tiles only: each int32 result converted to a float matrix, multiplied by
    gamma and divided element by element by its rows' scales (a column-major load of stride 0 from
    shared memory), and stored to y by the subgroup (coopMatStoreNV), instead of staged through
    shared memory and written one value a lane at a time."""
    start = source.index("  barrier();  // every subgroup is done reading the tiles")
    epilogue = r"""  barrier();  // every subgroup is done reading the tiles
  const float gamma_value = gamma[0];
  if (thread < TILE_M) row_scale[thread] = m0 + thread < p.m ? scales[m0 + thread] : 1.0;
  barrier();
  [[unroll]] for (uint i = 0; i < C_ROWS; ++i) {
    const uint row0 = RESULT_ROW0(i);
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> divisor;
    coopMatLoadNV(divisor, row_scale, row0 - m0, 0, true);
    [[unroll]] for (uint j = 0; j < C_COLS; ++j) {
      fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> value = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(result[i][j]);
      value = value * gamma_value;
      value = value / divisor;
      coopMatStoreNV(value, y, row0 * p.n + RESULT_COL0(j), p.n, false);
    }
  }
}
"""
    return [(source[start:], epilogue),
            ("shared uvec4 tiles[(TILE_M + TILE_N) * STRIDE];",
             "shared uvec4 tiles[(TILE_M + TILE_N) * STRIDE];\nshared float row_scale[TILE_M];")]


# (label, tile rows, tile columns, subgroup rows, steps loaded ahead, edits or None for the
# built-in kernel, whether y is computed, specialization constants set otherwise than for the
# shape); 256 invocations unless the edits say otherwise. The shape takes VECTOR_ROWS (10) and
# FULL_TILES (11).
VARIANTS = [
    ("built-in, 1 step ahead", 128, 128, 2, 1, None, True, {}),
    ("built-in, 2 steps ahead", 128, 128, 2, 2, None, True, {}),
    ("built-in, bounds tested (FULL_TILES off)", 128, 128, 2, 1, None, True, {11: False}),
    ("built-in, one value a lane (VECTOR_ROWS off)", 128, 128, 2, 1, None, True, {10: False}),
    ("built-in, both off (partial tiles, N % 4 != 0)", 128, 128, 2, 1, None, True, {10: False, 11: False}),
    ("source compiled here, 1 step ahead", 128, 128, 2, 1, lambda s: [], True, {}),
    ("B fragments held, A streamed, 1 step ahead", 128, 128, 2, 1, multiply_edit, True, {}),
    ("B fragments held, A streamed, 2 steps ahead", 128, 128, 2, 2, multiply_edit, True, {}),
    ("two copies of the tiles, one barrier a step", 128, 128, 2, 1, two_stages, True, {}),
    ("512 invocations, 128 x 256, 1 ahead", 128, 256, 2, 1, lambda s: INVOCATIONS_512, True, {}),
    ("512 invocations, 128 x 256, 2 ahead", 128, 256, 2, 2, lambda s: INVOCATIONS_512, True, {}),
    ("512 invocations, 256 x 128, 1 ahead", 256, 128, 4, 1, lambda s: INVOCATIONS_512, True, {}),
    ("512 invocations, 256 x 128, 2 ahead", 256, 128, 4, 2, lambda s: INVOCATIONS_512, True, {}),
    ("512 invocations, 128 x 128 (32 x 32 parts), 1 ahead", 128, 128, 4, 1, lambda s: INVOCATIONS_512, True, {}),
    ("512 invocations, 128 x 128 (32 x 32 parts), 2 ahead", 128, 128, 4, 2, lambda s: INVOCATIONS_512, True, {}),
    ("diagnostic: results stored by coopMatStoreNV, 1 ahead", 128, 128, 2, 1, direct_store, True, {}),
    ("diagnostic: K loop skipped (launch and epilogue)", 128, 128, 2, 1, lambda s: EPILOGUE_ONLY, False, {}),
    ("diagnostic: K loop skipped, 512 invocations, 128 x 256", 128, 256, 2, 1,
     lambda s: INVOCATIONS_512 + EPILOGUE_ONLY, False, {}),
    ("diagnostic: K loop skipped, one value a lane", 128, 128, 2, 1, lambda s: EPILOGUE_ONLY, False, {10: False}),
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
    for label, tile_m, tile_n, subgroup_rows, depth, edits, computes_y, settings in VARIANTS:
        spec = {**coopmat_specialization(m, k, n, tile_m, tile_n, subgroup_rows, depth), **settings}
        try:
            kernel = (bg.builtin_kernel("bitlinear_coopmat", device, spec) if edits is None
                      else edited_coopmat(device, source, edits(source), spec, "coopmat variant"))
        except Exception as error:  # a variant that does not compile or build is reported, not fatal
            results["variants"].append({"variant": label, "error": str(error)})
            print(f"{label:56s} failed: {error}", flush=True)
            continue
        y = device.empty((m, n), np.float32)
        y.copy_from(np.full((m, n), np.nan, np.float32))  # poisoned: every value must be written

        def run():
            kernel.dispatch((n // tile_n, m // tile_m, 1), inputs + [y, y], push)

        reference, row = run_variant(device, kernel, run, y, reference, computes_y, args.repeats, label,
                                     {"tile": [tile_m, tile_n, 64], "subgroup_rows": subgroup_rows, "depth": depth,
                                      "vector_rows": spec[10], "full_tiles": spec[11]},
                                     ("TOPS", "T ops/s", 2 * m * k * n / 1e12))
        results["variants"].append(row)
    write_results(args.json, results)


if __name__ == "__main__":
    main()
