#version 450
//! variant f32
//! variant f64 FLOAT64
// One round of one-sided (Hestenes) Jacobi: the n vectors of length len in the rows of x
// [B, n, len] (view vx) are made pairwise orthogonal by plane rotations applied to x and to the
// rows of vt [B, n, n] (view vv), which accumulates them. A round takes n' / 2 disjoint pairs of
// the round-robin schedule (n' = n rounded up to even; pair k of round r: (n' - 1, r) for k = 0,
// else ((r + k) mod (n' - 1), (r - k) mod (n' - 1)); n' - 1 rounds meet every pair once), one
// workgroup a (pair, matrix). With a = x_p . x_p, b = x_q . x_q and g = x_p . x_q, a pair rotates
// where |g| > tol sqrt(a b): zeta = (b - a) / (2 g), t = sign(zeta) / (|zeta| + sqrt(1 + zeta^2)),
// c = 1 / sqrt(1 + t^2), s = c t; x_p' = c x_p - s x_q, x_q' = s x_p + c x_q (and so vt's rows),
// and counts itself in rotations[b] (a sweep without rotations has converged). With
// p.check_previous (sweeps recorded in a Graph, which the host cannot stop), a matrix whose sweep
// before rotated nothing (previous[b] == 0) has converged and is left alone.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "linalg_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer X { SCALAR x[]; };
layout(std430, binding = 1) buffer VT { SCALAR vt[]; };
layout(std430, binding = 2) buffer Rotations { uint rotations[]; };
layout(std430, binding = 3) readonly buffer Previous { uint previous[]; };
layout(push_constant) uniform Push {
  uint n; uint len; uint round; float tol; View vx; View vv; uint check_previous;
} p;

shared SCALAR s_part[64][3];
shared SCALAR s_sum[3];

void main() {
  const uint k = gl_WorkGroupID.x, b = gl_WorkGroupID.y, t = gl_LocalInvocationID.x;
  const uint players = p.n + (p.n & 1u), last = players - 1;
  const uint i = k == 0 ? last : (p.round + k) % last;
  const uint j = k == 0 ? p.round : (p.round + last - k) % last;
  if (i >= p.n || j >= p.n) return;  // the phantom player of an odd n
  if (p.check_previous != 0 && previous[b] == 0) return;  // converged a sweep ago
  SCALAR a = 0, bb = 0, g = 0;
  for (uint e = t; e < p.len; e += 256) {
    const SCALAR xi = x[at(p.vx, b, i, e)], xj = x[at(p.vx, b, j, e)];
    a += xi * xi;
    bb += xj * xj;
    g += xi * xj;
  }
  a = subgroupAdd(a);
  bb = subgroupAdd(bb);
  g = subgroupAdd(g);
  if (subgroupElect()) {
    s_part[gl_SubgroupID][0] = a;
    s_part[gl_SubgroupID][1] = bb;
    s_part[gl_SubgroupID][2] = g;
  }
  barrier();
  if (t < 3) {
    SCALAR total = 0;
    for (uint s = 0; s < gl_NumSubgroups; ++s) total += s_part[s][t];
    s_sum[t] = total;
  }
  barrier();
  a = s_sum[0];
  bb = s_sum[1];
  g = s_sum[2];
  if (!(abs(g) > SCALAR(p.tol) * sqrt(a * bb))) return;  // orthogonal enough (or zero)
  const SCALAR zeta = (bb - a) / (SCALAR(2) * g);
  SCALAR tt = SCALAR(1);  // zeta = 0: a quarter turn
  if (abs(zeta) > SCALAR(1e15)) tt = SCALAR(0.5) / zeta;  // sqrt(1 + zeta^2) would overflow
  else if (zeta != SCALAR(0)) tt = sign(zeta) / (abs(zeta) + sqrt(SCALAR(1) + zeta * zeta));
  const SCALAR c = SCALAR(1) / sqrt(SCALAR(1) + tt * tt), s = c * tt;
  for (uint e = t; e < p.len; e += 256) {
    const uint ui = at(p.vx, b, i, e), uj = at(p.vx, b, j, e);
    const SCALAR xi = x[ui], xj = x[uj];
    x[ui] = c * xi - s * xj;
    x[uj] = s * xi + c * xj;
  }
  for (uint e = t; e < p.n; e += 256) {
    const uint ui = at(p.vv, b, i, e), uj = at(p.vv, b, j, e);
    const SCALAR vi = vt[ui], vj = vt[uj];
    vt[ui] = c * vi - s * vj;
    vt[uj] = s * vi + c * vj;
  }
  if (t == 0) atomicAdd(rotations[b], 1u);
}
