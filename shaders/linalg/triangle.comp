#version 450
//! variant f32
//! variant f64 FLOAT64
// The Cholesky factor out of a blocked factorization: out[b, i, j] (n x n) is L's value, from
// diag [B, n, 32] (row i, column j % 32) where i and j share a 32-block, else from x (the panels
// below the diagonal blocks), zeros above the diagonal; with UPPER its transpose (L^T).
#extension GL_GOOGLE_include_directive : require
#include "linalg_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool UPPER = false;
layout(std430, binding = 0) readonly buffer X { SCALAR x[]; };
layout(std430, binding = 1) readonly buffer Diag { SCALAR diag[]; };
layout(std430, binding = 2) writeonly buffer Out { SCALAR o[]; };
layout(push_constant) uniform Push { uint n; uint total; } p;

SCALAR lower(uint b, uint i, uint j) {  // L[b, i, j], i >= j
  return i / 32 == j / 32 ? diag[(b * p.n + i) * 32 + j % 32] : x[(b * p.n + i) * p.n + j];
}

void main() {
  for (uint e = gl_GlobalInvocationID.x; e < p.total; e += gl_NumWorkGroups.x * 256) {
    const uint nn = p.n * p.n, b = e / nn, i = (e % nn) / p.n, j = e % p.n;
    o[e] = UPPER ? (i <= j ? lower(b, j, i) : SCALAR(0)) : (j <= i ? lower(b, i, j) : SCALAR(0));
  }
}
