"""Whether warming the L2 cache with the coming projections' weights pays: a probe kernel that reads
a weight's packed bytes and keeps nothing, recorded without a barrier beside a latency-bound op so
that the two run together and the next op finds its weights in L2.

1. Chains at 2B4T sizes: o_proj (2560 x 2560) links, and FFN links (gate/up with the gated
   output, then down), over one weight (hot in L2), over distinct weights (48 o, 10 FFN sets:
   more than the L2), and over distinct weights with the next link's weights read beside each op
   (the probe's grid in workgroups).
2. The 2B4T decode step (random weights) with the probe recorded after some of its ops (`after
   attention: o` reads o_proj's weights beside decode attention, ...): bitnet_gpu's own decode
   graph, with _core's bitlinear_group and decode_attention wrapped while it is recorded.

    python3 benchmarks/investigations/l2_prefetch.py [--json FILE] [--repeats N]
"""

from __future__ import annotations

import os
import sys

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu import _core
from bitnet_gpu.models import BitNetConfig, BitNetModel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import bench_model
from common import arguments, busy_gpu, compile_glsl, timed_chain, torch_cuda, write_results

# Reads p.vectors 16-byte vectors, UNROLL requests in flight an invocation; the sink is written only
# where the vectors' XOR equals p.never, so the loads cannot be dropped.
PROBE = r"""
#version 450
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
const uint UNROLL = 8;
layout(std430, binding = 0) readonly buffer Source { uvec4 source[]; };
layout(std430, binding = 1) writeonly buffer Sink { uint sink[]; };
layout(push_constant) uniform Push { uint vectors; uint never; } p;
void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  uvec4 mixed = uvec4(0);
  for (uint first = gl_GlobalInvocationID.x; first < p.vectors; first += stride * UNROLL) {
    uvec4 loaded[UNROLL];
    [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
      const uint i = first + u * stride;
      loaded[u] = i < p.vectors ? source[i] : uvec4(0);
    }
    [[unroll]] for (uint u = 0; u < UNROLL; ++u) mixed ^= loaded[u];
  }
  const uint folded = mixed.x ^ mixed.y ^ mixed.z ^ mixed.w;
  if (folded == p.never) sink[0] = folded;
}
"""


class Prefetcher:
    """Records the probe over weights' packed tensors, each into a sink of its own (a barrier would
    follow a shared one)."""

    def __init__(self, device, groups):
        self.kernel = bg.Kernel(device, compile_glsl(PROBE), name="l2_prefetch")
        self.sinks = [device.empty((4,), np.uint32) for _ in range(8)]
        self.groups, self.used = groups, 0

    def __call__(self, *weights):
        for w in weights:
            tensor = w.packed_tensor
            vectors = tensor.nbytes // 16
            groups = min(self.groups, -(-vectors // 2048))
            push = np.array([vectors, 0x9E3779B9], np.uint32).tobytes()
            self.kernel.dispatch(groups, [tensor, self.sinks[self.used % 8]], push)
            self.used += 1


def chains(device, torch, rng, repeats, cpu):
    h, i = (256, 512) if cpu else (2560, 6912)
    count, sets = (4, 3) if cpu else (48, 10)

    def weights(n, k):
        return bg.quantize_weights(rng.standard_normal((n, k)).astype(np.float32))

    o = [weights(h, h) for _ in range(count)]
    ffn = [(weights(i, h), weights(i, h), weights(h, i)) for _ in range(sets)]
    norm_h = bg.Tensor.from_numpy(np.ones(h, np.float32))
    norm_i = bg.Tensor.from_numpy(np.ones(i, np.float32))
    state = {}

    def o_link(distinct, prefetch):
        def record():
            n = state["n"]
            state["n"] += 1
            w = o[n % count] if distinct else o[0]
            (state["x"],) = _core.bitlinear_group(
                state["x"], None, norm_h, 1e-5, [w._core], [state["x"]]
            )
            if prefetch:
                prefetch(o[(n + 1) % count])

        return record

    def ffn_link(distinct, prefetch):
        def record():
            n = state["n"]
            state["n"] += 1
            gate, up, down = ffn[n % sets] if distinct else ffn[0]
            (f,) = _core.bitlinear_group(
                state["x"], None, norm_h, 1e-5, [gate._core, up._core], [None, None], True
            )
            if prefetch:
                prefetch(down)
            (state["x"],) = _core.bitlinear_group(f, None, norm_i, 1e-5, [down._core], [state["x"]])
            if prefetch:
                prefetch(*ffn[(n + 1) % sets][:2])

        return record

    cases = [("o, one weight (hot)", o_link(False, None), 96)]
    cases.append(("o, distinct weights", o_link(True, None), 96))
    for groups in (132, 264, 528):
        name = f"o, distinct, the next read beside ({groups} groups)"
        cases.append((name, o_link(True, Prefetcher(device, groups)), 96))
    cases += [("ffn, one set (hot)", ffn_link(False, None), 40)]
    cases.append(("ffn, distinct sets", ffn_link(True, None), 40))
    for groups in (132, 264, 528):
        name = f"ffn, distinct, the next read beside ({groups} groups)"
        cases.append((name, ffn_link(True, Prefetcher(device, groups)), 40))
    rows = []
    for name, record, links in cases:
        state["x"] = bg.Tensor.from_numpy(rng.standard_normal((1, h)).astype(np.float32))
        state["n"] = 0
        if torch is not None:
            busy_gpu(torch)
        seconds, graph = timed_chain(bg, device, record, links, repeats)
        rows.append({"case": name, "us_per_link": seconds * 1e6, "barriers": graph.barrier_count})
        print(f"{name:52s} {seconds * 1e6:8.2f} us/link  barriers {graph.barrier_count}")
    return rows


def decode_steps(device, torch, repeats, cpu):
    config = BitNetConfig.preset("tiny" if cpu else "2b4t")
    model = BitNetModel.random(config, seed=0, max_tokens=2056)
    contexts = (128,) if cpu else (128, 2048)
    bench_model.fill_cache(model, max(contexts))
    layer_of = {
        id(w._core): (li, name)
        for li, layer in enumerate(model.layers)
        for name, w in layer.proj.items()
    }
    prefetch = Prefetcher(device, 264)
    state = {"layer": 0, "mode": set()}
    group, attention = _core.bitlinear_group, _core.decode_attention

    def wrapped_group(*args):
        out = group(*args)
        li, name = layer_of[id(args[4][0])]
        proj, mode = model.layers[li].proj, state["mode"]
        state["layer"] = li
        if name == "gate" and "gate/up: down" in mode:
            prefetch(proj["down"])
        if name == "o" and "o: gate/up" in mode:
            prefetch(proj["gate"], proj["up"])
        if name == "down" and "down: next q/k/v" in mode and li + 1 < len(model.layers):
            after = model.layers[li + 1].proj
            prefetch(after["q"], after["k"], after["v"])
        return out

    def wrapped_attention(*args):
        out = attention(*args)
        proj, mode = model.layers[state["layer"]].proj, state["mode"]
        if "attention: o" in mode:
            prefetch(proj["o"])
        if "attention: gate/up" in mode:
            prefetch(proj["gate"], proj["up"])
        return out

    variants = [
        set(),
        {"attention: o"},
        {"attention: o", "attention: gate/up"},
        {"attention: o", "attention: gate/up", "gate/up: down"},
        {"attention: o", "o: gate/up", "gate/up: down"},
        {"attention: o", "attention: gate/up", "gate/up: down", "down: next q/k/v"},
    ]
    rows = []
    _core.bitlinear_group, _core.decode_attention = wrapped_group, wrapped_attention
    try:
        for context in contexts:
            for mode in variants:
                state["mode"] = mode
                model.reset_graphs()
                step = bench_model.decode_step(model, context)
                step()
                if torch is not None:
                    busy_gpu(torch)
                seconds = bench_model.gpu_seconds(model, step, repeats)
                name = "read beside " + ("; ".join(sorted(mode)) or "nothing")
                rows.append({"context": context, "case": name, "gpu_us": seconds * 1e6})
                print(f"decode step, context {context:4d}, {name:80s} {seconds * 1e6:8.1f} us")
    finally:
        _core.bitlinear_group, _core.decode_attention = group, attention
    return rows


def main():
    args = arguments(__doc__)
    device = bg.default_device()
    torch = torch_cuda()
    cpu = device.info.multiprocessors == 0
    rng = np.random.default_rng(0)
    repeats = min(args.repeats, 2) if cpu else args.repeats
    results = {"device": device.name, "chains": chains(device, torch, rng, repeats, cpu)}
    results["decode_steps"] = decode_steps(device, torch, max(repeats, 3), cpu)
    write_results(args.json, results)


if __name__ == "__main__":
    main()
