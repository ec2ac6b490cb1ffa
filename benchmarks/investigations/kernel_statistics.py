"""What the driver's compiler reports for the main kernels, specialized as the ops specialize them
for the shapes named (Kernel.statistics, VK_KHR_pipeline_executable_properties): registers,
shared and spilled memory, and whatever else the driver names. Prints a table and writes JSON.

    python3 benchmarks/investigations/kernel_statistics.py [--json FILE]
"""

from __future__ import annotations

import os
import sys

import bitnet_gpu as bg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import arguments, write_results


def coopmat(tile_m, tile_n, k_step, subgroup_rows, depth):
    return (
        "bitlinear_coopmat",
        {
            0: True,
            1: False,
            2: True,
            3: False,
            4: tile_m,
            5: tile_n,
            6: k_step // 16,
            7: subgroup_rows,
            8: depth,
            10: True,
            11: True,
        },
    )


# (label, shader, specialization), as ops/bitlinear.cpp specializes them.
KERNELS = [
    # the four tiles ops/bitlinear.cpp chooses among (subgroups rows x columns, K steps ahead)
    ("coopmat 256x128x64, 4x2 subgroups, depth 2", *coopmat(256, 128, 64, 4, 2)),
    ("coopmat 128x128x128, 4x2 subgroups, depth 2", *coopmat(128, 128, 128, 4, 2)),
    ("coopmat 64x128x128, 2x4 subgroups, depth 2", *coopmat(64, 128, 128, 2, 2)),
    ("coopmat 128x128x64, 2x4 subgroups, depth 1", *coopmat(128, 128, 64, 2, 1)),
    # variants measured beside them
    ("coopmat 256x128x64, 4x2 subgroups, depth 1", *coopmat(256, 128, 64, 4, 1)),
    ("coopmat 128x128x64, 4x2 subgroups, depth 2", *coopmat(128, 128, 64, 4, 2)),
    ("coopmat 128x128x64, 4x2 subgroups, depth 1", *coopmat(128, 128, 64, 4, 1)),
    ("coopmat 128x128x128, 2x4 subgroups, depth 1", *coopmat(128, 128, 128, 2, 1)),
    ("matvec (dot), 1 row, 4 rows a subgroup", "bitlinear_matvec_dot", {0: 1, 1: 4, 4: True}),
    (
        "matvec fused (dot), norm, K=2560, prefetch",
        "bitlinear_matvec_dot_fused",
        {0: 1, 1: 2, 4: True, 5: 2, 7: True, 9: 640, 10: 3, 13: True},
    ),
    ("pre-pass, K=16384 in registers", "bitlinear_prepare_f32", {3: 16}),
    # decode attention of the 2B4T shape (4 query heads a KV head, D = 128) by keys a workgroup
    ("decode_attention, 64 keys", "decode_attention_f32", {0: 4, 1: 64, 2: 128}),
    ("decode_attention, 16 keys", "decode_attention_f32", {0: 4, 1: 16, 2: 128}),
    (
        "decode_attention, float16 cache, 64 keys",
        "decode_attention_f32_kv16",
        {0: 4, 1: 64, 2: 128},
    ),
    # prefill attention (causal, from a cache), D = 128: tiles of 32 and 16 keys, 2 rows a row group
    (
        "attention_tiled, 32 keys a tile",
        "attention_tiled_f32",
        {0: True, 1: True, 2: 32, 3: 32, 6: 2},
    ),
    ("attention_tiled, 16 keys a tile", "attention_tiled_f32", {0: True, 1: True, 2: 16, 3: 32}),
    # D = 256: one row a row group (blocks of 16 queries), 16-key tiles
    (
        "attention_tiled, D = 256, 16 keys a tile",
        "attention_tiled_f32",
        {0: True, 1: True, 2: 16, 3: 64, 6: 1},
    ),
]


def main():
    args = arguments(__doc__)
    device = bg.default_device()
    results = {"device": device.name, "driver": device.info.driver_info, "kernels": []}
    if not device.info.features.get("pipeline_statistics"):
        print(f"{device.name}: the driver reports no pipeline statistics")
    for label, shader, specialization in KERNELS:
        if shader == "bitlinear_coopmat" and not device.info.features.get(
            "cooperative_matrix_int8"
        ):
            continue
        stats = bg.builtin_kernel(shader, device, specialization).statistics
        results["kernels"].append(
            {
                "kernel": label,
                "shader": shader,
                "specialization": {str(k): v for k, v in specialization.items()},
                "statistics": stats,
            }
        )
        print(f"{label}:")
        for name, value in stats.items():
            print(f"    {name:40s} {value}")
    write_results(args.json, results)


if __name__ == "__main__":
    main()
