#version 450
//! variant f32
//! variant f64 FLOAT64
// For eigh, one workgroup a matrix: B = S + shift I with S the symmetric matrix of a's lower
// triangle (view va) and shift = max_i sum_j |s_ij| (1 where S = 0), at least S's spectral radius,
// so that B is positive semidefinite and its singular vectors are S's eigenvectors (jacobi.comp,
// singular.comp: lambda = sigma - shift). Writes B to out [B, n, n] and shift to shift[b].
#extension GL_GOOGLE_include_directive : require
#include "linalg_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer A { SCALAR a[]; };
layout(std430, binding = 1) writeonly buffer Out { SCALAR o[]; };
layout(std430, binding = 2) writeonly buffer Shift { SCALAR shift[]; };
layout(push_constant) uniform Push { uint n; View va; } p;

shared SCALAR s_max[256];

SCALAR lower(uint b, uint i, uint j) {
  return j <= i ? a[at(p.va, b, i, j)] : a[at(p.va, b, j, i)];
}

void main() {
  const uint b = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
  SCALAR most = 0;
  for (uint i = t; i < p.n; i += 256) {
    SCALAR row = 0;
    for (uint j = 0; j < p.n; ++j) row += abs(lower(b, i, j));
    most = max(most, row);
  }
  s_max[t] = most;
  barrier();
  for (uint stride = 128; stride > 0; stride /= 2) {
    if (t < stride) s_max[t] = max(s_max[t], s_max[t + stride]);
    barrier();
  }
  const SCALAR s = s_max[0] > SCALAR(0) ? s_max[0] : SCALAR(1);
  if (t == 0) shift[b] = s;
  for (uint e = t; e < p.n * p.n; e += 256) {
    const uint i = e / p.n, j = e % p.n;
    o[b * p.n * p.n + e] = lower(b, i, j) + (i == j ? s : SCALAR(0));
  }
}
