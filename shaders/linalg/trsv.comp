#version 450
//! variant f32
//! variant f64 FLOAT64
// Back substitution: x = R^-1 y for the upper triangular n x n R (view vr) and one column of y
// (view vy, overwritten with x), one workgroup a (matrix, column): for i from n - 1 down, x_i =
// y_i / r_ii, then y_j -= r_ji x_i for j < i. Where |r_ii| <= tol max_k |r_kk| the matrix is
// singular to working precision: info[b] = i + 1 (written by column 0's workgroup).
#extension GL_GOOGLE_include_directive : require
#include "linalg_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer R { SCALAR r[]; };
layout(std430, binding = 1) buffer Y { SCALAR y[]; };
layout(std430, binding = 2) buffer Info { int info[]; };
layout(push_constant) uniform Push { uint n; float tol; View vr; View vy; } p;

shared SCALAR s_x;
shared SCALAR s_largest;

void main() {
  const uint b = gl_WorkGroupID.y, column = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
  if (t == 0) {
    SCALAR largest = 0;
    for (uint i = 0; i < p.n; ++i) largest = max(largest, abs(r[at(p.vr, b, i, i)]));
    s_largest = largest;
  }
  barrier();
  const SCALAR cutoff = SCALAR(p.tol) * s_largest;
  for (uint step = 0; step < p.n; ++step) {
    const uint i = p.n - 1 - step;
    if (t == 0) {
      const SCALAR d = r[at(p.vr, b, i, i)];
      const uint to = at(p.vy, b, i, column);
      const SCALAR x = y[to] / d;
      y[to] = x;
      s_x = x;
      if (!(abs(d) > cutoff) && column == 0) info[b] = int(i + 1);
    }
    barrier();
    const SCALAR x = s_x;
    for (uint j = t; j < i; j += 256) y[at(p.vy, b, j, column)] -= r[at(p.vr, b, j, i)] * x;
    memoryBarrierBuffer();
    barrier();
  }
}
