#version 450
//! variant f32
//! variant f64 FLOAT64
// One panel of a blocked Householder QR, one workgroup a matrix: columns j0 .. j0 + w - 1 (w <=
// 32) of the matrix at view va, rows j0 .. m - 1. For each column c (top row r = j0 + c), with x
// the column from row r down: sigma = ||x[1:]||^2; where sigma = 0, tau = 0 (no reflection);
// otherwise beta = -sign(x_0) sqrt(x_0^2 + sigma), tau = (beta - x_0) / beta, v = x / (x_0 - beta)
// with v_0 = 1 (LAPACK's dlarfg). beta goes to the diagonal, v below it and into the panel's V
// (view vv, row 0 = matrix row j0, zeros above each v's 1), tau into tau; the panel's later
// columns then take H = I - tau v v^T. Sums over rows in a fixed order: per invocation, then
// subgroups (or row groups), then those in order.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "linalg_common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint THREADS = 256;  // a multiple of 32, at most 1024
layout(std430, binding = 0) buffer A { SCALAR a[]; };
layout(std430, binding = 1) writeonly buffer V { SCALAR v[]; };
layout(std430, binding = 2) writeonly buffer Tau { SCALAR tau_out[]; };
layout(push_constant) uniform Push {
  uint m; uint w; uint j0; uint tau_offset; uint tau_batch; View va; View vv;
} p;

shared SCALAR s_part[256];  // per subgroup partial sums (subgroups of at least 4 invocations)
const uint GROUPS = THREADS / 32;
shared SCALAR s_dots[GROUPS][32];  // per row group, the dot of v with each panel column
shared SCALAR s_sigma;

void main() {
  const uint b = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
  // The column sweeps run as GROUPS row groups x 32 lanes, lane j on panel column j: a row's 32
  // panel values are neighbours in memory, so each row group reads whole rows.
  const uint lane = t % 32, group = t / 32;
  for (uint c = 0; c < p.w; ++c) {
    const uint col = p.j0 + c, top = p.j0 + c;
    SCALAR sum = 0;
    for (uint r = top + 1 + t; r < p.m; r += THREADS) {
      const SCALAR x = a[at(p.va, b, r, col)];
      sum += x * x;
    }
    sum = subgroupAdd(sum);
    if (subgroupElect()) s_part[gl_SubgroupID] = sum;
    barrier();
    if (t == 0) {
      SCALAR total = 0;
      for (uint g = 0; g < gl_NumSubgroups; ++g) total += s_part[g];
      s_sigma = total;
    }
    barrier();
    const SCALAR sigma = s_sigma;
    const SCALAR alpha = a[at(p.va, b, top, col)];
    SCALAR tau, beta, scale;
    reflector(alpha, sigma, beta, tau, scale);
    barrier();  // every invocation has read alpha
    for (uint r = top + 1 + t; r < p.m; r += THREADS) {
      const uint from = at(p.va, b, r, col);
      const SCALAR x = a[from] * scale;
      a[from] = x;
      v[at(p.vv, b, r - p.j0, c)] = x;
    }
    if (t == 0) {
      a[at(p.va, b, top, col)] = beta;
      tau_out[p.tau_offset + b * p.tau_batch + c] = tau;
    }
    if (t <= c) v[at(p.vv, b, t, c)] = t == c ? SCALAR(1) : SCALAR(0);
    memoryBarrierBuffer();
    barrier();
    // The later columns j of the panel: a_j -= tau v (v^T a_j), lane j's sums over its group's
    // rows, then the groups' in order.
    if (c + 1 == p.w) continue;
    const bool later = lane > c && lane < p.w;
    SCALAR dot = 0;
    for (uint r = top + group; r < p.m; r += GROUPS) {
      const SCALAR vr = r == top ? SCALAR(1) : a[at(p.va, b, r, col)];
      if (later) dot += vr * a[at(p.va, b, r, p.j0 + lane)];
    }
    s_dots[group][lane] = dot;
    barrier();
    SCALAR total = 0;
    for (uint g = 0; g < GROUPS; ++g) total += s_dots[g][lane];
    for (uint r = top + group; r < p.m; r += GROUPS) {
      const SCALAR vr = r == top ? SCALAR(1) : a[at(p.va, b, r, col)];
      if (later) a[at(p.va, b, r, p.j0 + lane)] -= tau * vr * total;
    }
    memoryBarrierBuffer();
    barrier();
  }
}
