"""Where the fused BitLinear matvec's time goes, and restructurings of it tried before they are
built in: variants of shaders/bitlinear/bitlinear_matvec.comp made by text edits here (each edit's
text must be found), compiled with glslangValidator (FUSED, with the packed int8 dot product where
the device has it) and run on the grid ops/bitlinear.cpp picks for the shape (float32 x without a norm, one weight:
the strided grid, one round of workgroups, for one or two rows of 6912 to 16384 values, else the
ordinary fused grid), beside the built-in kernel: registers (Kernel.statistics), whether y is bit for bit the
built-in kernel's, and GPU time (a graph of the one dispatch, after 0.3 s of replays).

Diagnostic variants (their y is wrong, "exact" is not reported) cut a part out: the quantization
of x (the rows' sums and scales then 0 and 1, shared memory left as it is), the weight loop (the
loop's bound made 0 at run time, so the quantization still runs and is kept), or the dot products
(each weight word xor-ed into the sum instead, so every load stays).

    python3 benchmarks/bench_matvec_variants.py [--json FILE] [--repeats N] [--shapes 1x16384x16384]
"""
from __future__ import annotations

import os
import time

import numpy as np

import bitnet_gpu as bg
from bench_ceilings import edited_shader, run_variant
from common import arguments, busy_gpu, torch_cuda, write_results

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shaders", "bitlinear",
                      "bitlinear_matvec.comp")

NO_QUANTIZATION = [("  quantize_rows(sink);\n#endif",
                    "  for (uint m = 0; m < M; ++m) { row_sums[m] = 0; row_scales[m] = 1.0; }\n#endif")]
NO_WEIGHTS = [("for (uint first = subgroup_first; first < group_end; first += subgroup_step) {",
               "for (uint first = subgroup_first; first < (p.k == 1u ? group_end : 0u); first += subgroup_step) {")]
NO_DOTS = [("                if (MASKED_CODES) {\n", "                if (false) {\n"),
           ("acc[m * ROWS + r] += dot16(xv, wv[u][r][j]);", "acc[m * ROWS + r] += int(xv.x ^ wv[u][r][j]);")]
# The max and the rows' integer sums over the subgroups reduced by subgroup operations in any
# workgroup, or by a loop in every invocation over every subgroup's value in any (the kernel takes
# the first above 16 subgroups).
REDUCTIONS = {flag: [("bool subgroup_reductions() { return gl_NumSubgroups > 16; }",
                      f"bool subgroup_reductions() {{ return {flag}; }}")]
              for flag in ("true", "false")}



def l2_touch(iterations):
    """Before quantizing x, each subgroup requests one word of every 32-byte sector of the weights
    its first `iterations` passes over its first rows will read (so that they come into the L2
    cache while the workgroup quantizes), and uses the words only after the quantization (a store
    that never happens), so that nothing waits for them before."""
    return [("  quantize_rows(sink);\n#endif", f"""  const uint TOUCH = {iterations};
  uint touched[TOUCH * ROWS];
  [[unroll]] for (uint t = 0; t < TOUCH; ++t)
    [[unroll]] for (uint r = 0; r < ROWS; ++r) {{
      const uint c = lane + t * width, row = subgroup_first + r;
      touched[t * ROWS + r] = (lane & 1u) == 0 && c < words / 4 && row < group_end ? W(which, (row * (words / 4) + c) * 4) : 0u;
    }}
  quantize_rows(sink);
  uint touched_all = 0;
  [[unroll]] for (uint i = 0; i < TOUCH * ROWS; ++i) touched_all ^= touched[i];
  if (p.k == 0u && touched_all == 0x9E3779B9u) s_sink[gl_LocalInvocationID.x] = touched_all;
#endif""")]


# Each subgroup's first pass's weights requested into registers (as PREFETCH does) right after the
# first row of x is requested, inside the pre-pass, and awaited only where the first pass multiplies
# them (nothing made of them is stored before the pre-pass's barriers, unlike PREFETCH's sink).
PREFETCH_AFTER_INPUT = [
    ("void quantize_rows(uint sink) {",
     "uvec4 early_after[UNROLL][ROWS];\nuint early_which, early_first, early_end;\n"
     "void load_weights(out uvec4 wv[UNROLL][ROWS], uint which, uint first, uint c0, uint vectors, uint group_end);\n"
     "void quantize_rows(uint sink) {"),
    ("    if (PREFETCH && m == 0) s_sink[lane] = sink;",
     "    if (VECTORS && m == 0) load_weights(early_after, early_which, early_first, gl_SubgroupInvocationID,"
     " p.words_per_row / 4, early_end);"),
    ("  quantize_rows(sink);\n#endif",
     "  early_which = which; early_first = subgroup_first; early_end = group_end;\n  quantize_rows(sink);\n"
     "  [[unroll]] for (uint u = 0; u < UNROLL; ++u)\n    [[unroll]] for (uint r = 0; r < ROWS; ++r) early[u][r] = early_after[u][r];\n"
     "  prefetched = VECTORS;\n#endif"),
]

# (label, edits or None for the built-in kernel, whether y is computed, extra specialization)
VARIANTS = [
    ("built in", None, True, {}),
    ("compiled here", [], True, {}),
    ("codes masked in place (MASKED_CODES on)", [], True, {16: True}),
    ("codes shifted down (MASKED_CODES off)", [], True, {16: False}),
    ("first pass's weights requested before quantizing", l2_touch(1), True, {}),
    ("first 2 passes' weights requested before quantizing", l2_touch(2), True, {}),
    ("first 4 passes' weights requested before quantizing", l2_touch(4), True, {}),
    ("first pass's weights into registers before quantizing (PREFETCH)", [], True, {13: True}),
    ("first pass's weights into registers after x's loads", PREFETCH_AFTER_INPUT, True, {}),
    ("max and integer sums by subgroup operations", REDUCTIONS["true"], True, {}),
    ("max and integer sums by a loop over the subgroups", REDUCTIONS["false"], True, {}),
    ("diagnostic: no quantization (weights only)", NO_QUANTIZATION, False, {}),
    ("diagnostic: quantization only (no weights)", NO_WEIGHTS, False, {}),
    ("diagnostic: no dot products", NO_DOTS, False, {}),
    ("diagnostic: no quantization, no dot products", NO_QUANTIZATION + NO_DOTS, False, {}),
]


def grid(device, m, k, n):
    """(local size, workgroups, strided, rows a subgroup, vectors a lane at once, prefetch) as
    ops/bitlinear.cpp picks them for a float32 x without a norm: the strided grid for one or two rows
    of 6912 to 16384 values (1024 invocations and one workgroup a multiprocessor from 12288, 512 and
    two below), else the ordinary fused grid (256 invocations, a run of rows a workgroup)."""
    padded = -(-k // 16) * 16
    words = padded // 16
    subgroup = max(device.info.subgroup_size, 1)
    rows = 4 if k >= 8192 and m <= 4 else 2
    if m <= 2 and 6912 <= padded <= 16384:
        local_size, per_multiprocessor = (1024, 1) if padded >= 12288 else (512, 2)
        per_round = rows * local_size // subgroup
        groups = min(max(device.info.multiprocessors, 4) * per_multiprocessor, -(-n // per_round))
        return local_size, groups, True, rows, 1, False
    prefetch = k <= 4096 and words % 4 == 0
    unroll = min(max(-(-(words // 4) // subgroup), 1), 4) if prefetch else 1
    return 256, -(-n // (rows * 256 // subgroup)), False, rows, unroll, prefetch


def specialization(m, k, local_size, strided, rows, unroll, prefetch):
    padded = -(-k // 16) * 16
    vectors = padded // 4
    return {0: m, 1: rows, 2: False, 3: False, 4: (padded // 16) % 4 == 0, 5: unroll, 6: False, 7: False,
            8: False, 9: m * padded // 4, 10: min(16, -(-vectors // local_size)), 11: 1, 12: False, 13: prefetch,
            14: local_size, 15: strided, 16: m == 1}


def operands(device, seed, m, k, n, rows_per_group, groups):
    """Bindings 0..17 as record_matvec_fused binds them for one weight (y at 7 and 8), and the
    push constants."""
    words = -(-k // 16)
    rng = np.random.default_rng(seed)
    w = bg.Tensor.from_numpy(rng.integers(0, 2**32, (n, words), dtype=np.uint32) & np.uint32(0xAAAAAAAA))
    x = bg.Tensor.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
    gamma = bg.Tensor.from_numpy(np.full(1, 0.75, np.float32))
    y = device.empty((m, n), np.float32)
    counter = bg.Tensor.from_numpy(np.zeros(4, np.uint32))
    bindings = [w, w, x, x, x, gamma, gamma, y, y, counter, w, w, gamma, y, w, w, gamma, y]
    push = np.zeros(10, np.uint32)
    push[:4] = [n, words, rows_per_group, k]
    push[4:6] = np.array([1e-6, 1e-5], np.float32).view(np.uint32)
    push[8] = groups
    return bindings, push, y


def main():
    args = arguments(__doc__, lambda parser: parser.add_argument(
        "--shapes", default="1x16384x16384,1x12288x12288,1x8192x8192,1x6912x2560,1x2560x6912,1x4096x4096"))
    device = bg.default_device()
    hardware = device.info.features.get("integer_dot_product_accelerated", False)
    defines = ["FUSED"] + (["HW_DOT"] if hardware else [])
    builtin_name = "bitlinear_matvec_dot_fused" if hardware else "bitlinear_matvec_int_fused"
    results = {"device": device.name, "driver": device.info.driver_info,
               "multiprocessors": device.info.multiprocessors,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "variants": []}
    torch = torch_cuda()
    if torch is not None:
        busy_gpu(torch)
    with open(SOURCE) as f:
        source = f.read()
    for shape in args.shapes.split(","):
        m, k, n = (int(v) for v in shape.split("x"))
        local_size, groups, strided, rows, unroll, prefetch = grid(device, m, k, n)
        rows_per_group = rows * local_size // max(device.info.subgroup_size, 1)
        bindings, push, y = operands(device, 7, m, k, n, rows_per_group, groups)
        reference = None
        for label, edits, computes_y, settings in VARIANTS:
            spec = {**specialization(m, k, local_size, strided, rows, unroll, prefetch), **settings}
            try:
                kernel = (bg.builtin_kernel(builtin_name, device, spec) if edits is None
                          else edited_shader(device, SOURCE, source, edits, spec, label, defines))
            except Exception as error:  # reported, not fatal
                results["variants"].append({"shape": [m, k, n], "variant": label, "error": str(error)})
                print(f"{shape} {label:48s} failed: {error}", flush=True)
                continue
            y.copy_from(np.full((m, n), np.nan, np.float32))  # poisoned: every value must be written

            def run():
                kernel.dispatch((groups, 1, 1), bindings, push)

            reference, row = run_variant(device, kernel, run, y, reference, computes_y, args.repeats, label,
                                         {"shape": [m, k, n], "local_size": local_size, "workgroups": groups,
                                          "strided": strided},
                                         ("weight_GBps", "GB/s", n * (-(-k // 16)) * 4 / 1e9), f"{shape} {label}")
            results["variants"].append(row)
    write_results(args.json, results)


if __name__ == "__main__":
    main()
