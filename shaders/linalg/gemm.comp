#version 450
//! variant f32
//! variant f64 FLOAT64
// C = beta C + alpha A B for matrices A [M, K], B [K, N] and C [M, N] given as strided views
// (linalg_common.glsl), one matrix of a batch per gl_WorkGroupID.z. A workgroup of 16 x 16
// invocations takes a 64 x 64 tile of C, each invocation 4 x 4 of it, K in steps of 16 through
// shared memory. LOWER: only tiles that reach C's lower triangle (row >= column) are computed, and
// only its lower triangle is written (the trailing update of a blocked Cholesky).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "linalg_common.glsl"
layout(local_size_x = 16, local_size_y = 16) in;
layout(constant_id = 0) const bool LOWER = false;
layout(std430, binding = 0) readonly buffer A { SCALAR a[]; };
layout(std430, binding = 1) readonly buffer B { SCALAR b[]; };
layout(std430, binding = 2) buffer C { SCALAR c[]; };
layout(push_constant) uniform Push {
  uint m; uint n; uint k; float alpha; float beta; View va; View vb; View vc;
} p;

shared SCALAR s_a[16][65];
shared SCALAR s_b[16][65];

void main() {
  const uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
  const uint batch = gl_WorkGroupID.z;
  const uint row0 = gl_WorkGroupID.y * 64, col0 = gl_WorkGroupID.x * 64;
  if (LOWER && col0 > row0 + 63) return;  // the whole tile lies above the diagonal
  const uint thread = ty * 16 + tx;
  SCALAR acc[4][4];
  [[unroll]] for (uint i = 0; i < 4; ++i) [[unroll]] for (uint j = 0; j < 4; ++j) acc[i][j] = 0;
  for (uint k0 = 0; k0 < p.k; k0 += 16) {
    // 64 x 16 of A and 16 x 64 of B, four elements an invocation each, neighbouring invocations
    // on neighbouring addresses: along k where it is contiguous in memory (stride 1), else along
    // the rows of A and the columns of B.
    [[unroll]] for (uint t = 0; t < 4; ++t) {
      const uint e = thread + 256 * t;
      const bool a_along_k = p.va.cols == 1;
      const uint ar = a_along_k ? e / 16 : e % 64, ak = a_along_k ? e % 16 : e / 64;
      const uint row = row0 + ar, kk = k0 + ak;
      s_a[ak][ar] = row < p.m && kk < p.k ? a[at(p.va, batch, row, kk)] : SCALAR(0);
      const bool b_along_k = p.vb.rows == 1 && p.vb.cols != 1;
      const uint bk = b_along_k ? e % 16 : e / 64, bc = b_along_k ? e / 16 : e % 64;
      const uint col = col0 + bc, kb = k0 + bk;
      s_b[bk][bc] = col < p.n && kb < p.k ? b[at(p.vb, batch, kb, col)] : SCALAR(0);
    }
    barrier();
    [[unroll]] for (uint kk = 0; kk < 16; ++kk) {
      SCALAR x[4], y[4];
      [[unroll]] for (uint i = 0; i < 4; ++i) x[i] = s_a[kk][ty + 16 * i];
      [[unroll]] for (uint j = 0; j < 4; ++j) y[j] = s_b[kk][tx + 16 * j];
      [[unroll]] for (uint i = 0; i < 4; ++i) [[unroll]] for (uint j = 0; j < 4; ++j)
        acc[i][j] += x[i] * y[j];
    }
    barrier();
  }
  const SCALAR alpha = SCALAR(p.alpha), beta = SCALAR(p.beta);
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    const uint row = row0 + ty + 16 * i;
    [[unroll]] for (uint j = 0; j < 4; ++j) {
      const uint col = col0 + tx + 16 * j;
      if (row < p.m && col < p.n && (!LOWER || col <= row)) {
        const uint to = at(p.vc, batch, row, col);
        c[to] = (beta == SCALAR(0) ? SCALAR(0) : beta * c[to]) + alpha * acc[i][j];
      }
    }
  }
}
