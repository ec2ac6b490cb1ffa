#version 450
//! variant f32
//! variant f64 FLOAT64
// The triangular factor T of a panel's compact WY form H_0 H_1 ... H_{w-1} = I - V T V^T (w <=
// 32), one workgroup a matrix, from G = V^T V (view vg) and the panel's tau: T_ii = tau_i, and
// T[0:i, i] = -tau_i T[0:i, 0:i] G[0:i, i] (LAPACK's dlarft, forward, columnwise); zeros below
// the diagonal. Written to view vt.
#extension GL_GOOGLE_include_directive : require
#include "linalg_common.glsl"
layout(local_size_x = 32) in;
layout(std430, binding = 0) readonly buffer G { SCALAR g[]; };
layout(std430, binding = 1) readonly buffer Tau { SCALAR tau[]; };
layout(std430, binding = 2) writeonly buffer T { SCALAR t_out[]; };
layout(push_constant) uniform Push { uint w; uint tau_offset; uint tau_batch; View vg; View vt; } p;

shared SCALAR s_t[32][33];

void main() {
  const uint b = gl_WorkGroupID.x, r = gl_LocalInvocationID.x;
  for (uint i = 0; i < p.w; ++i) {
    const SCALAR tau_i = tau[p.tau_offset + b * p.tau_batch + i];
    SCALAR value = 0;
    if (r < i) {
      for (uint q = r; q < i; ++q) value += s_t[r][q] * g[at(p.vg, b, q, i)];
      value *= -tau_i;
    } else if (r == i) {
      value = tau_i;
    }
    s_t[r][i] = value;  // column i: no invocation reads it in this step
    barrier();
  }
  for (uint i = 0; i < p.w; ++i) t_out[at(p.vt, b, r, i)] = r < p.w && r <= i ? s_t[r][i] : 0;
}
