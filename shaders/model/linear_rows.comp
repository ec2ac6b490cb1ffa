#version 450
//! variant f32
//! variant f16 INPUT_F16
// A float linear layer for few rows (a language-model head): y[m, n] = sum_k x[m, k] w[n, k],
// x float32 [M, K], w [N, K] float32 or float16, y float32 [M, N]. A team of 32 invocations
// takes one row of w (coalesced reads, four values at a time with VEC4, IN_FLIGHT of those
// requested together) against MB rows of x,
// then sums its lanes in shared memory in a fixed order (the same input gives the same output).
// precise: no contraction, so head_verify.comp, which repeats this arithmetic for one row of x,
// gets the same bits for a row.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "../ops/ops_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool VEC4 = false;  // K % 4 == 0
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) readonly buffer W { ELEMENT w[]; };
layout(std430, binding = 3) readonly buffer W4 { ELEMENT4 w4[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint m; uint n; uint k; } p;

const uint TEAM = 32, TEAMS = 8, MB = 4;
layout(constant_id = 1) const uint IN_FLIGHT = 2;  // VEC4: vectors of a row a lane requests at once
shared float partial[MB][256];

void main() {
  const uint id = gl_LocalInvocationID.x, lane = id % TEAM;
  const uint row = gl_WorkGroupID.x * TEAMS + id / TEAM;
  const uint m0 = gl_WorkGroupID.y * MB;
  precise float acc[MB];
  for (uint r = 0; r < MB; ++r) acc[r] = 0.0;
  if (row < p.n) {
    if (VEC4) {
      // IN_FLIGHT vectors of w requested at once, then added in the same order as one at a time.
      const uint k4 = p.k / 4;
      for (uint c0 = lane; c0 < k4; c0 += TEAM * IN_FLIGHT) {
        vec4 wv[IN_FLIGHT];
        [[unroll]] for (uint u = 0; u < IN_FLIGHT; ++u) {
          const uint c = c0 + u * TEAM;
          wv[u] = c < k4 ? vec4(w4[row * k4 + c]) : vec4(0.0);
        }
        [[unroll]] for (uint u = 0; u < IN_FLIGHT; ++u) {
          const uint c = c0 + u * TEAM;
          if (c < k4)
            for (uint r = 0; r < MB; ++r)
              if (m0 + r < p.m) acc[r] = acc[r] + dot(wv[u], x4[(m0 + r) * k4 + c]);
        }
      }
    } else {
      for (uint c = lane; c < p.k; c += TEAM) {
        const float wv = float(w[row * p.k + c]);
        for (uint r = 0; r < MB; ++r)
          if (m0 + r < p.m) acc[r] += wv * x[(m0 + r) * p.k + c];
      }
    }
  }
  for (uint r = 0; r < MB; ++r) partial[r][id] = acc[r];
  barrier();
  for (uint s = TEAM / 2; s > 0; s >>= 1) {
    if (lane < s)
      for (uint r = 0; r < MB; ++r) partial[r][id] += partial[r][id + s];
    barrier();
  }
  if (lane == 0 && row < p.n)
    for (uint r = 0; r < MB; ++r)
      if (m0 + r < p.m) y[(m0 + r) * p.n + row] = partial[r][id];
}
