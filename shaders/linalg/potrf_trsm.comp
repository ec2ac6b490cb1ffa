#version 450
//! variant f32
//! variant f64 FLOAT64
// One step of a blocked Cholesky, for the n x n diagonal block (n <= 32, view vd of matrix b) and
// the `rows` rows below it (view vp, the panel). Every workgroup factors the diagonal block in
// shared memory (its lower triangle read): column by column, d = a_jj, l_jj = sqrt(d), l_ij =
// a_ij / l_jj, then a_ik -= l_ij l_kj for j < k <= i. Where d is not positive (or NaN), workgroup 0
// sets info[b] = first + j + 1, the order of the leading minor that fails, and all leave; a matrix
// whose info is already set is left alone. Workgroup 0 writes L to diag (view vl: the block's own
// home, not the matrix, which the other workgroups are still reading). Then each invocation takes
// one panel row and solves x L^T = p by forward substitution, x_c = (p_c - sum_{q < c} l_cq x_q) /
// l_cc, written over the row.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "linalg_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer A { SCALAR a[]; };
layout(std430, binding = 1) writeonly buffer Diag { SCALAR diag[]; };
layout(std430, binding = 2) buffer Info { int info[]; };
layout(push_constant) uniform Push { uint n; uint rows; uint first; View vd; View vp; View vl; } p;

const uint LD = 33;  // shared row stride, one of skew against bank conflicts
shared SCALAR s[32 * LD];

void main() {
  const uint b = gl_WorkGroupID.y, t = gl_LocalInvocationID.x, n = p.n;
  const bool home = gl_WorkGroupID.x == 0;
  if (info[b] != 0) return;  // an earlier block of this matrix failed
  for (uint e = t; e < 32 * 32; e += 256) {
    const uint i = e / 32, j = e % 32;
    s[i * LD + j] = i < n && j <= i ? a[at(p.vd, b, i, j)] : SCALAR(0);
  }
  barrier();
  for (uint j = 0; j < n; ++j) {
    const SCALAR d = s[j * LD + j];
    if (!(d > SCALAR(0))) {  // the same value in every invocation: the whole workgroup leaves
      if (home && t == 0) info[b] = int(p.first + j + 1);
      return;
    }
    const SCALAR r = sqrt(d);
    barrier();  // every invocation has read d
    if (t == 0) s[j * LD + j] = r;
    for (uint i = j + 1 + t; i < n; i += 256) s[i * LD + j] /= r;
    barrier();
    const uint m = n - j - 1;
    for (uint e = t; e < m * m; e += 256) {
      const uint i = j + 1 + e / m, k = j + 1 + e % m;
      if (k <= i) s[i * LD + k] -= s[i * LD + j] * s[k * LD + j];
    }
    barrier();
  }
  if (home)
    for (uint e = t; e < n * n; e += 256) {
      const uint i = e / n, j = e % n;
      diag[at(p.vl, b, i, j)] = j <= i ? s[i * LD + j] : SCALAR(0);
    }
  const uint row = gl_WorkGroupID.x * 256 + t;
  if (row >= p.rows) return;
  SCALAR x[32];
  [[unroll]] for (uint c = 0; c < 32; ++c) x[c] = c < n ? a[at(p.vp, b, row, c)] : SCALAR(0);
  [[unroll]] for (uint c = 0; c < 32; ++c) {
    if (c < n) {
      SCALAR sum = x[c];
      [[unroll]] for (uint q = 0; q < 32; ++q)
        if (q < c) sum -= s[c * LD + q] * x[q];
      x[c] = sum / s[c * LD + c];
    }
  }
  [[unroll]] for (uint c = 0; c < 32; ++c)
    if (c < n) a[at(p.vp, b, row, c)] = x[c];
}
