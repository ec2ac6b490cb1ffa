"""Host time of recording the decoder's graphs, where the memory of their intermediates comes from.

    python3 benchmarks/investigations/record.py [--config 2b4t] [--json FILE]
    BITNET_GPU_MEMORY_SLABS=0 python3 benchmarks/investigations/record.py   # a VkDeviceMemory per
    block

Records (after one warm-up recording of each, so kernels are built) a greedy decode step, a chunk
of decode steps (BitNetModel.decode_chunk) and a 128-token prefill, several times each, and
reports the median seconds and the memory pool's counters for one recording: blocks created
(pool misses), and the bytes of the slabs the small ones share.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

from bitnet_gpu.models import BitNetConfig, BitNetModel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import arguments, write_results


def main():
    args = arguments(__doc__, lambda p: p.add_argument("--config", default="2b4t"))
    model = BitNetModel.random(BitNetConfig.preset(args.config), seed=0, max_tokens=256)
    model.prepare_screened_head()
    device = model.device
    slabs = os.environ.get("BITNET_GPU_MEMORY_SLABS", "1") != "0"
    results = {"device": device.name, "config": args.config, "slabs": slabs, "rows": []}
    split = model._split_keys(1, 0)
    cases = [
        ("decode step", (1, 1, "next", split, 1)),
        (f"decode chunk of {model.decode_chunk}", (1, 1, "next", split, model.decode_chunk)),
        ("prefill of 128 tokens", (1, 128, "last", 0, 1)),
    ]
    model.generate(np.arange(8), 4)  # caches and kernels
    for label, key in cases:
        caches = model._context(1).caches
        model._record(caches, *key)  # its kernels built
        device.trim()
        graphs = []
        before = device.memory_stats()
        times = []
        for _ in range(max(3, args.repeats // 10)):
            start = time.perf_counter()
            graphs.append(model._record(caches, *key))
            times.append(time.perf_counter() - start)
        after = device.memory_stats()
        recordings = len(times)
        row = {
            "graph": label,
            "record_s": statistics.median(times),
            "ops": graphs[0].op_count,
            "blocks_created": (after["pool_misses"] - before["pool_misses"]) / recordings,
            "slab_bytes": after["slab_bytes"] - before["slab_bytes"],
        }
        graphs.clear()
        results["rows"].append(row)
        print(
            f"{label:28s} {row['record_s'] * 1e3:8.2f} ms to record, {row['ops']} ops, "
            f"{row['blocks_created']:.0f} blocks a recording, slabs "
            f"{row['slab_bytes'] / 2**20:.0f} MiB "
            f"for {recordings} ({'slabs' if slabs else 'a VkDeviceMemory a block'})",
            flush=True,
        )
    write_results(args.json, results)


if __name__ == "__main__":
    main()
