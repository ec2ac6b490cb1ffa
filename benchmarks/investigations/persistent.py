"""What a dependent op costs inside one persistent dispatch, against one dispatch an op: chains of
square ternary matvecs (the decode step's o_proj shape, 2560 x 2560) x <- scale * W_i x, each link
reading the output of the one before, over NW distinct weight matrices (more bytes than the L2).

- "a dispatch a link": the current design, one dispatch per link, a barrier between each pair.
- "persistent": one dispatch of R workgroups (R <= what the GPU holds resident at once) runs every
  link; each workgroup owns a block of rows, requests its weights of the link (PREFETCH: before it
  waits), waits until all R workgroups have published the previous link (one device-scope counter a
  link, acquire), reads x, writes its rows and publishes them (release). Without SYNC it does not
  wait (wrong results: the floor of the loop without the grid-wide dependency).
Each case's final x is checked against NumPy (float64 over the same decoded weights). Every wait is
bounded: a workgroup that polls 2^22 times sets an error flag and goes on, so the probe never hangs
(the case then reports the timeout instead of a time). The probe multiplies float x by decoded
weights, slower than BitLinear's int8 dot products: compare its cases with one another (what the
wait costs against a dispatch boundary), not with BitLinear's times.

    python3 benchmarks/investigations/persistent.py [--json FILE] [--repeats N]
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu import reference as ref

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import arguments, busy_gpu, compile_glsl, timed_chain, torch_cuda, write_results

PROBE = r"""
#version 450
#pragma use_vulkan_memory_model
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint LINKS = 1;
layout(constant_id = 1) const bool SYNC = true;
layout(constant_id = 2) const bool PREFETCH = true;
layout(constant_id = 3) const uint ROWS = 1;     // rows a subgroup owns: s, s + 8, ...
layout(constant_id = 4) const uint VECTORS = 40;  // 64-weight vectors of a row (K / 64)
const uint LANE_VECTORS = (VECTORS + 31) / 32;
const uint STRIDE = 32;  // words between counters: one 128-byte line each
layout(std430, binding = 0) readonly buffer Weights { uvec4 w4[]; };
layout(std430, binding = 1) coherent buffer X4 { vec4 x4[]; };  // two halves of N values
layout(std430, binding = 2) coherent buffer X { float x[]; };   // the same tensor
layout(std430, binding = 3) coherent buffer Sync { uint counters[]; };
layout(push_constant) uniform Push { uint n; uint first_link; uint matrices; uint per_group;
                                      float scale; } p;
// x as 16 rows of VECTORS: value group (j, q) of every 64-weight vector c at (4 j + q) VECTORS + c,
// so that a subgroup's lanes (consecutive c) read consecutive vec4 without bank conflicts.
shared vec4 s_x[VECTORS * 16];

void load(uint link, out uvec4 wv[ROWS][LANE_VECTORS]) {
  const uint m = (p.first_link + link) % p.matrices;
  const uint first = gl_WorkGroupID.x * p.per_group;
  const uint end = min(p.n, first + p.per_group);
  [[unroll]] for (uint r = 0; r < ROWS; ++r) {
    const uint row = first + gl_SubgroupID + 8 * r;
    [[unroll]] for (uint v = 0; v < LANE_VECTORS; ++v) {
      const uint c = gl_SubgroupInvocationID + 32 * v;
      wv[r][v] = row < end && c < VECTORS ? w4[(m * p.n + row) * VECTORS + c] : uvec4(0x55555555u);
    }
  }
}

void main() {
  const uint lane = gl_SubgroupInvocationID, groups = gl_NumWorkGroups.x;
  const uint first = gl_WorkGroupID.x * p.per_group, end = min(p.n, first + p.per_group);
  for (uint link = 0; link < LINKS; ++link) {
    uvec4 wv[ROWS][LANE_VECTORS];
    if (PREFETCH) load(link, wv);
    if (SYNC && link > 0) {
      if (gl_LocalInvocationIndex == 0) {
        uint polls = 0;
        while (atomicLoad(counters[(link - 1) * STRIDE], gl_ScopeDevice,
                          gl_StorageSemanticsBuffer, gl_SemanticsAcquire) < groups) {
          if (++polls == (1u << 22)) {
            atomicOr(counters[(LINKS + 1) * STRIDE], 1u);
            break;
          }
        }
      }
      controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                     gl_SemanticsAcquireRelease);
    }
    if (!PREFETCH) load(link, wv);
    const uint source = ((p.first_link + link) % 2) * p.n, target = p.n - source;
    for (uint i = gl_LocalInvocationIndex; i < VECTORS * 16; i += 256)
      s_x[(i % 16) * VECTORS + i / 16] = x4[source / 4 + i];
    barrier();
    [[unroll]] for (uint r = 0; r < ROWS; ++r) {
      float acc = 0.0;
      [[unroll]] for (uint v = 0; v < LANE_VECTORS; ++v) {
        const uint c = lane + 32 * v;
        if (c < VECTORS)
          [[unroll]] for (uint j = 0; j < 4; ++j) {
            const uint word = wv[r][v][j];
            [[unroll]] for (uint e = 0; e < 16; e += 4) {
              const vec4 codes = vec4((uvec4(word) >> uvec4(2 * e, 2 * e + 2, 2 * e + 4, 2 * e + 6))
                                      & 3u) - 1.0;
              acc += dot(codes, s_x[(j * 4 + e / 4) * VECTORS + c]);
            }
          }
      }
      acc = subgroupAdd(acc);
      const uint row = first + gl_SubgroupID + 8 * r;
      if (lane == 0 && row < end) x[target + row] = acc * p.scale;
    }
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                   gl_SemanticsAcquireRelease);
    if (SYNC && gl_LocalInvocationIndex == 0)
      atomicAdd(counters[link * STRIDE], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                gl_SemanticsRelease);
  }
  // The last workgroup out zeroes the counters for the next dispatch.
  if (SYNC && LINKS > 1 && gl_LocalInvocationIndex == 0) {
    const uint done = atomicAdd(counters[LINKS * STRIDE], 1u, gl_ScopeDevice,
                                gl_StorageSemanticsBuffer, gl_SemanticsAcquireRelease);
    if (done == groups - 1) {
      for (uint i = 0; i <= LINKS; ++i) atomicStore(counters[i * STRIDE], 0u, gl_ScopeDevice, 0, 0);
    }
  }
}
"""


def main():
    def extra(parser):
        parser.add_argument("--links", type=int, default=100)
        parser.add_argument("--size", type=int, default=0, help="N = K (0: 2560, 256 on a CPU)")

    args = arguments(__doc__, extra)
    device = bg.default_device()
    torch = torch_cuda()
    cpu = device.info.multiprocessors == 0
    n = args.size or (256 if cpu else 2560)
    links = min(args.links, 8) if cpu else args.links
    matrices = 4 if cpu else 48  # 48 x 1.6 MB: more than the H100's 50 MB L2
    sms = device.info.multiprocessors or 1
    rng = np.random.default_rng(0)
    values = rng.integers(-1, 2, (matrices * n, n), dtype=np.int8)
    w = values.reshape(matrices, n, n).astype(np.float64)
    # BitLinear's packing (docs/NUMERICS.md): 16 codes a little-endian word, low bits first.
    weights = bg.Tensor.from_numpy(ref.pack_ternary(values).view(np.uint32).reshape(-1))
    scale = 1.0 / math.sqrt(n * 2 / 3)  # ternary weights: E[w^2] = 2/3, so |x| stays near 1
    x0 = rng.standard_normal(n).astype(np.float32)
    results = {"device": device.name, "n": n, "links": links, "matrices": matrices, "rows": []}
    kernels = {}

    def kernel(links_, sync, prefetch, rows):
        key = (links_, sync, prefetch, rows)
        if key not in kernels:
            spirv = compile_glsl(PROBE, target="vulkan1.3")
            spec = {0: links_, 1: sync, 2: prefetch, 3: rows, 4: n // 64}
            kernels[key] = bg.Kernel(device, spirv, specialization=spec, name="persistent")
        return kernels[key]

    def push(first_link, per_group):
        return (
            np.array([n, first_link, matrices, per_group], np.uint32).tobytes()
            + np.float32(scale).tobytes()
        )

    def expected(count):
        x = x0.astype(np.float64)
        for i in range(count):
            x = scale * (w[i % matrices] @ x)
        return x

    # (name, workgroups a multiprocessor or None for a dispatch a link, SYNC, PREFETCH)
    cases = [("a dispatch a link (barrier between)", None, False, True)]
    for per_sm in (1, 2) if not cpu else (1,):
        cases.append(
            (f"persistent, {per_sm}/SM, wait, weights before the wait", per_sm, True, True)
        )
    cases.append(("persistent, 1/SM, wait, weights after the wait", 1, True, False))
    cases.append(("persistent, 1/SM, no wait (wrong results: the floor)", 1, False, True))
    for name, per_sm, sync, prefetch in cases:
        groups = sms * per_sm if per_sm else (n + 8 * 2 - 1) // (8 * 2)
        per_group = (n + groups - 1) // groups
        rows = (per_group + 7) // 8
        x = bg.Tensor.from_numpy(np.concatenate([x0, np.zeros(n, np.float32)]))
        counters = bg.Tensor.from_numpy(np.zeros(32 * (links + 2), np.uint32))
        if per_sm is None:
            links_per_dispatch, dispatches = 1, links
            k = kernel(1, sync, prefetch, rows)
        else:
            links_per_dispatch, dispatches = links, 1
            k = kernel(links, sync, prefetch, rows)
        state = {"i": 0}

        def record(k=k, groups=groups, per_group=per_group, x=x, counters=counters):
            k.dispatch(groups, [weights, x, x, counters], push(state["i"], per_group))
            state["i"] += links_per_dispatch

        # Correctness: one run of the chain from x0.
        state["i"] = 0
        for _ in range(dispatches):
            record()
        got = x.numpy()[(links % 2) * n :][:n].astype(np.float64)
        want = expected(links)
        error = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        timeouts = int(counters.numpy()[32 * (links + 1)])
        if torch is not None:
            busy_gpu(torch)
        state["i"] = 0
        seconds, _ = timed_chain(bg, device, record, dispatches, args.repeats)
        per_link = seconds * dispatches / links
        timeouts = timeouts or int(counters.numpy()[32 * (links + 1)])
        row = {
            "case": name,
            "workgroups": groups,
            "us_per_link": per_link * 1e6,
            "relative_error": error,
            "timed_out": bool(timeouts),
        }
        results["rows"].append(row)
        flag = "  TIMED OUT" if timeouts else ""
        print(
            f"{name:58s} {groups:5d} groups {per_link * 1e6:8.2f} us/link  error {error:.1e}{flag}"
        )
    write_results(args.json, results)


if __name__ == "__main__":
    main()
