#version 450
//! variant f32
//! variant f64 FLOAT64
// One step of a tall panel's Householder factorization (geqr2.comp's formulas) spread over
// workgroups: columns j0 .. j0 + w - 1 (w <= 32) of the matrix at view va, workgroup g of matrix b
// on panel rows j0 + g ROWS .. + ROWS - 1, one dispatch a step, so no workgroup waits on another.
// Step s > 0 finishes column c = s - 1 (top row r = j0 + c): from the sums of step c-1's dispatch,
// sigma = sum_{i > r} a_ic^2 and d_k = sum_{i > r} a_ic a_ik, and the top row a_rk, it forms beta,
// tau and v (v_r = 1, v_i = a_ic / (a_rc - beta)) and applies H = I - tau v v^T to the later
// columns, v^T a_k = a_rk + d_k / (a_rc - beta). Step s < w then sums column s's products with the
// panel's columns over the workgroup's rows below row j0 + s (in a fixed order: a row group's rows,
// then the 8 row groups), and the workgroup holding that row publishes it, updated. The sums of
// step s go to slot s % 2 of sums ([B, 2, groups + 1, 32], the top row last), which step s + 1
// reads while writing the other slot.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "linalg_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint ROWS = 64;  // panel rows a workgroup, a multiple of 8
layout(std430, binding = 0) buffer A { SCALAR a[]; };
layout(std430, binding = 1) writeonly buffer V { SCALAR v[]; };
layout(std430, binding = 2) writeonly buffer Tau { SCALAR tau_out[]; };
layout(std430, binding = 3) buffer Sums { SCALAR sums[]; };
layout(push_constant) uniform Push {
  uint m; uint w; uint j0; uint step; uint tau_offset; uint tau_batch; View va; View vv;
} p;

const uint PER = ROWS / 8;  // rows an invocation
shared SCALAR s_col[ROWS];  // the workgroup's rows of the column being reflected
shared SCALAR s_dots[8][32];

void main() {
  const uint b = gl_WorkGroupID.y, g = gl_WorkGroupID.x, groups = gl_NumWorkGroups.x;
  const uint t = gl_LocalInvocationID.x, lane = t % 32, group = t / 32;
  const uint first = p.j0 + g * ROWS + group;  // the invocation's rows: first + 8 q
  const bool in_panel = lane < p.w;
  // Lane k holds panel column k of its rows (a row group reads whole rows of the panel).
  SCALAR x[PER];
  [[unroll]] for (uint q = 0; q < PER; ++q) {
    const uint i = first + 8 * q;
    x[q] = i < p.m && in_panel ? a[at(p.va, b, i, p.j0 + lane)] : SCALAR(0);
  }
  const uint slot_size = (groups + 1) * 32;
  if (p.step > 0) {
    const uint c = p.step - 1, top = p.j0 + c;
    const uint from = (b * 2 + c % 2) * slot_size;
    SCALAR d = 0;
    for (uint h = group; h < groups; h += 8) d += sums[from + h * 32 + lane];
    s_dots[group][lane] = d;
    if (lane == c) [[unroll]] for (uint q = 0; q < PER; ++q) s_col[group + 8 * q] = x[q];
    barrier();
    SCALAR dk = 0, sigma = 0;
    [[unroll]] for (uint h = 0; h < 8; ++h) {
      dk += s_dots[h][lane];
      sigma += s_dots[h][c];
    }
    const SCALAR alpha = sums[from + groups * 32 + c], top_k = sums[from + groups * 32 + lane];
    SCALAR tau, beta, scale;
    reflector(alpha, sigma, beta, tau, scale);
    const SCALAR vta = top_k + scale * dk;  // v^T a_k, for lanes k > c
    const bool later = lane > c && in_panel;
    [[unroll]] for (uint q = 0; q < PER; ++q) {
      const uint i = first + 8 * q;
      if (i >= p.m || i < top) continue;
      const SCALAR vi = i == top ? SCALAR(1) : scale * s_col[group + 8 * q];
      if (lane == c) x[q] = i == top ? beta : vi;
      if (later) x[q] -= tau * vi * vta;
    }
    if (lane == c)
      [[unroll]] for (uint q = 0; q < PER; ++q) {
        const uint i = first + 8 * q;
        if (i < p.m) v[at(p.vv, b, i - p.j0, c)] = i > top ? x[q] : SCALAR(i == top ? 1 : 0);
      }
    if (g == 0 && t == 0) tau_out[p.tau_offset + b * p.tau_batch + c] = tau;
    barrier();  // s_col and s_dots are read before they are written again
  }
  if (p.step < p.w) {
    const uint c = p.step, top = p.j0 + c;
    const uint to = (b * 2 + c % 2) * slot_size;
    if (lane == c) [[unroll]] for (uint q = 0; q < PER; ++q) s_col[group + 8 * q] = x[q];
    barrier();
    SCALAR d = 0;
    [[unroll]] for (uint q = 0; q < PER; ++q) {
      const uint i = first + 8 * q;
      if (i > top && i < p.m) d += s_col[group + 8 * q] * x[q];
    }
    s_dots[group][lane] = d;
    [[unroll]] for (uint q = 0; q < PER; ++q)
      if (first + 8 * q == top) sums[to + groups * 32 + lane] = x[q];
    barrier();
    if (group == 0) {
      SCALAR total = 0;
      [[unroll]] for (uint h = 0; h < 8; ++h) total += s_dots[h][lane];
      sums[to + g * 32 + lane] = total;
    }
  }
  if (p.step > 0 && in_panel)
    [[unroll]] for (uint q = 0; q < PER; ++q) {
      const uint i = first + 8 * q;
      if (i < p.m) a[at(p.va, b, i, p.j0 + lane)] = x[q];
    }
}
