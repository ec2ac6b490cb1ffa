#version 450
//! variant f32
//! variant f64 FLOAT64
// Cholesky of matrices of at most 32 x 32, one workgroup a matrix, from a [B, n, n] (its lower
// triangle read) to out [B, n, n] in one pass: the block factored in shared memory
// (cholesky_block.glsl), then L (or with UPPER, L^T) written with zeros in the other triangle.
// info[b] as in potrf_trsm.comp.
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#include "linalg_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool UPPER = false;
layout(std430, binding = 0) readonly buffer A { SCALAR a[]; };
layout(std430, binding = 1) writeonly buffer Out { SCALAR o[]; };
layout(std430, binding = 2) writeonly buffer Info { int info[]; };
layout(push_constant) uniform Push { uint n; } p;

const uint LD = 33;
shared SCALAR s[32 * LD];
#include "cholesky_block.glsl"

void main() {
  const uint b = gl_WorkGroupID.x, t = gl_LocalInvocationID.x, n = p.n, base = b * n * n;
  for (uint e = t; e < n * n; e += 256) {
    const uint i = e / n, j = e % n;
    if (j <= i) s[i * LD + j] = a[base + e];
  }
  barrier();
  const uint failed = factor_block(n);
  if (failed != 0) {  // the same in every invocation: the whole workgroup leaves
    if (t == 0) info[b] = int(failed);
    return;
  }
  for (uint e = t; e < n * n; e += 256) {
    const uint i = e / n, j = e % n;
    const bool kept = UPPER ? i <= j : j <= i;
    o[base + e] = kept ? (UPPER ? s[j * LD + i] : s[i * LD + j]) : SCALAR(0);
  }
}
