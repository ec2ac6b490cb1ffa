"""Where decode attention's time goes inside its dispatch: chains of decode_attention at the 2B4T
shape (20 query / 5 KV heads x 128, a 2056-row cache), its K/V caches hot in L2 (one pair) or cold
(120 pairs cycling, as in a decode step whose weights evict them). First the op itself, then the
same shader compiled with device-clock reads (GL_EXT_shader_realtime_clock, the device feature
"device_clock") after each phase, checked bit for bit against the op: per link, medians over links
and workgroups, in µs from each workgroup's start.

    python3 benchmarks/investigations/dispatch_timeline.py [--json FILE] [--repeats N]

Needs glslangValidator. NVIDIA's clock reads come in steps of 0.256 µs.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu import _core

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import (
    arguments,
    busy_gpu,
    compile_glsl,
    glslang,
    timed_chain,
    torch_cuda,
    write_results,
)

HQ, HKV, D, G = 20, 5, 128, 4
SLOTS = 8  # clock reads a workgroup: start, five phases, the merge's end
PHASES = ["q roped", "scores", "softmax", "value sums", "counted"]


def probe_source():
    """decode_attention.comp with a clock read at the start, after each phase's barrier and at the
    end of the merging workgroup, into binding 14 (slot (link, workgroup, read))."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "shaders", "ops")
    src = open(os.path.join(path, "decode_attention.comp")).read()

    def sub(old, new):
        nonlocal src
        assert src.count(old) == 1, f"decode_attention.comp changed: {old!r}"
        src = src.replace(old, new)

    read = "  if (lane == 0) timeline[tslot + {}] = clockRealtime2x32EXT();\n"
    sub("#version 450\n", "#version 450\n#extension GL_EXT_shader_realtime_clock : require\n")
    sub(
        "layout(push_constant) uniform Push {",
        "layout(std430, binding = 14) buffer Timeline { uvec2 timeline[]; };\n"
        "layout(push_constant) uniform Push {",
    )
    sub("  uint start_stride;", "  uint link;\n  uint start_stride;")
    sub("void main() {\n", "void main() {\n  const uvec2 t_start = clockRealtime2x32EXT();\n")
    sub(
        "  if (split >= live) return;  // the whole workgroup: no keys here (nor counted)\n",
        "  if (split >= live) return;  // the whole workgroup: no keys here (nor counted)\n"
        "  const uvec3 n = gl_NumWorkGroups;\n"
        f"  const uint tslot = ((p.link * n.z + b) * n.y + split) * n.x * {SLOTS} + g * {SLOTS};\n"
        "  if (lane == 0) timeline[tslot] = t_start;\n",
    )
    sub("  barrier();\n\n  // Scores:", "  barrier();\n" + read.format(1) + "\n  // Scores:")
    sub(
        "  barrier();\n  // Softmax weights",
        "  barrier();\n" + read.format(2) + "  // Softmax weights",
    )
    sub("  barrier();\n  // Value sums:", "  barrier();\n" + read.format(3) + "  // Value sums:")
    sub(
        "  barrier();\n  for (uint index = lane; index < G * d; index += 256) {",
        "  barrier();\n"
        + read.format(4)
        + "  for (uint index = lane; index < G * d; index += 256) {",
    )
    sub(
        "  barrier();\n  if (!s_last) return;",
        "  barrier();\n" + read.format(5) + "  if (!s_last) return;",
    )
    src = src.rstrip()
    assert src.endswith("}")
    return src[:-1] + "  barrier();\n" + read.format(6) + "}\n", os.path.abspath(path)


def main():
    args = arguments(__doc__)
    device = bg.default_device()
    if not device.info.features["device_clock"] or glslang() is None:
        sys.exit(f"{device.name}: needs the device clock and glslangValidator")
    torch = torch_cuda()
    gpu = device.info.type != "cpu"
    rows, chain, cold = (2056, 120, 120) if gpu else (72, 4, 2)
    cases = [(128, 16), (128, 32), (2048, 64), (2048, 32)] if gpu else [(40, 16), (70, 32)]
    rng = np.random.default_rng(0)
    cos, sin = (bg.Tensor.from_numpy(t) for t in bg.rope_tables(np.arange(rows), D, 5e5))
    k1 = bg.Tensor.from_numpy(rng.standard_normal((1, HKV, D)).astype(np.float32))
    pairs = [
        [
            bg.Tensor.from_numpy(rng.standard_normal((1, rows, HKV, D)).astype(np.float32))
            for _ in "kv"
        ]
        for _ in range(cold)
    ]
    source, include = probe_source()
    spirv = compile_glsl(source, target="vulkan1.3", include_dir=include)
    results = {"device": device.name, "chain": chain, "rows": []}
    for context, split in cases:
        start = bg.Tensor.from_numpy(np.array([context - 1], np.int32))
        kernel = bg.Kernel(device, spirv, specialization={0: G, 1: split, 2: D}, name="timeline")
        splits, live = -(-rows // split), -(-context // split)
        partial = device.empty((1, HQ, splits, D + 4), np.float32)
        counter = bg.Tensor.from_numpy(np.zeros(HKV, np.uint32), device)
        qs = [
            bg.Tensor.from_numpy(rng.standard_normal((1, HQ, D)).astype(np.float32)) for _ in "ab"
        ]

        def push(link):
            return (
                np.array([HQ, HKV, rows, rows, splits], np.uint32).tobytes()
                + np.float32(1 / np.sqrt(D)).tobytes()
                + np.array([link, 0], np.uint32).tobytes()
            )

        def bindings(q, out, kc, vc, timeline):
            return [
                q,
                k1,
                k1,
                cos,
                sin,
                kc,
                vc,
                kc,
                start,
                partial,
                counter,
                out,
                vc,
                partial,
                timeline,
            ]

        # The probe against the op, on copies of one cache pair (both append the new key).
        copies = [[bg.Tensor.from_numpy(np.array(t)) for t in pairs[0]] for _ in "ab"]
        probe_out = device.empty((1, HQ, D), np.float32)
        scratch_timeline = device.empty((splits * HKV * SLOTS, 2), np.uint32)
        kernel.dispatch(
            (HKV, splits, 1), bindings(qs[0], probe_out, *copies[0], scratch_timeline), push(0)
        )
        expected = _core.decode_attention(qs[0], k1, k1, cos, sin, start, *copies[1], split)
        exact = bool(np.array_equal(probe_out.numpy(), expected.numpy()))
        for npairs in (1, cold):
            row = {
                "context": context,
                "split_keys": split,
                "caches": "hot" if npairs == 1 else "cold",
            }
            state = {"q": qs[0], "i": 0}

            def link(state=state, npairs=npairs, start=start, split=split):
                kc, vc = pairs[state["i"] % npairs]
                state["i"] += 1
                state["q"] = _core.decode_attention(
                    state["q"], k1, k1, cos, sin, start, kc, vc, split
                )

            if torch is not None:
                busy_gpu(torch)
            row["op_us"] = timed_chain(bg, device, link, chain, args.repeats)[0] * 1e6
            timeline = bg.Tensor.from_numpy(
                np.zeros((chain * splits * HKV * SLOTS, 2), np.uint32), device
            )
            graph = bg.Graph(device, timings="total")
            with graph:
                for i in range(chain):
                    kc, vc = pairs[i % npairs]
                    kernel.dispatch(
                        (HKV, splits, 1),
                        bindings(qs[i % 2], qs[(i + 1) % 2], kc, vc, timeline),
                        push(i),
                    )
            graph.run()
            if torch is not None:
                busy_gpu(torch)
            graph.run()
            row["probe_us"] = graph.timings()[0][1] / chain * 1e6
            t = np.asarray(timeline).reshape(chain, splits * HKV, SLOTS, 2).astype(np.uint64)
            t = ((t[..., 1] << np.uint64(32)) | t[..., 0]).astype(np.float64)[:, : live * HKV]
            links = []
            for i in range(1, chain):
                w = t[i]
                first = w[:, 0].min()
                merging = w[w[:, 6] > 0]
                links.append(
                    [first - t[i - 1][:, 6].max()]
                    + [np.median(w[:, s + 1] - w[:, s]) for s in range(5)]
                    + [np.median(merging[:, 6] - merging[:, 5]), w[:, 6].max() - first]
                )
            m = np.median(np.array(links), axis=0) / 1000  # ns to µs
            row.update({"launch_gap_us": m[0], "merge_us": m[6], "end_us": m[7], "exact": exact})
            row.update({f"{phase}_us": m[1 + i] for i, phase in enumerate(PHASES)})
            results["rows"].append(row)
            print(
                f"context {context:5d}, {split:2d} keys a workgroup, {row['caches']}: "
                f"op {row['op_us']:.2f} µs, probe {row['probe_us']:.2f}"
                f"{'' if exact else ' (DIFFERS from the op)'}; gap {m[0]:.2f}, "
                + ", ".join(f"{phase} {m[1 + i]:.2f}" for i, phase in enumerate(PHASES))
                + f", merge {m[6]:.2f}; end {m[7]:.2f} after the first start",
                flush=True,
            )
    write_results(args.json, results)


if __name__ == "__main__":
    main()
