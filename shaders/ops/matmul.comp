#version 450
//! variant f32
//! variant f16 INPUT_F16
// C [M, N] = A [M, K] B [K, N], float32 accumulation: a 64 x 64 tile per workgroup, 4 x 4 outputs
// per invocation, K in steps of 16 through shared memory.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "ops_common.glsl"
#include "../runtime/strided_loop.glsl"
layout(local_size_x = 16, local_size_y = 16) in;
layout(std430, binding = 0) readonly buffer A { ELEMENT a[]; };
layout(std430, binding = 1) readonly buffer B { ELEMENT b[]; };
layout(std430, binding = 2) writeonly buffer C { ELEMENT c[]; };
layout(push_constant) uniform Push { uint m; uint n; uint k; } p;

shared float tile_a[16][65];  // [k][m]
shared float tile_b[16][65];  // [k][n]

void main() {
  const uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y, thread = ty * 16 + tx;
  const uint m0 = gl_WorkGroupID.y * 64, n0 = gl_WorkGroupID.x * 64;
  float acc[4][4];
  [[unroll]] for (uint i = 0; i < 4; ++i)
    [[unroll]] for (uint j = 0; j < 4; ++j) acc[i][j] = 0.0;
  // Every loop but the one over K has a fixed trip count and is unrolled (see strided_loop.glsl).
  FOR_STRIDED(k0, 0, p.k, 16) {
    [[unroll]] for (uint r = 0; r < 4; ++r) {
      const uint e = thread + 256 * r;
      const uint row = e / 16, kk = e % 16;  // A: 64 rows x 16 k
      tile_a[kk][row] =
          m0 + row < p.m && k0 + kk < p.k ? float(a[(m0 + row) * p.k + k0 + kk]) : 0.0;
      const uint kb = e / 64, col = e % 64;  // B: 16 k x 64 columns, coalesced along N
      tile_b[kb][col] =
          k0 + kb < p.k && n0 + col < p.n ? float(b[(k0 + kb) * p.n + n0 + col]) : 0.0;
    }
    barrier();
    [[unroll]] for (uint kk = 0; kk < 16; ++kk) {
      float av[4], bv[4];
      [[unroll]] for (uint i = 0; i < 4; ++i) av[i] = tile_a[kk][ty + 16 * i];
      [[unroll]] for (uint j = 0; j < 4; ++j) bv[j] = tile_b[kk][tx + 16 * j];
      [[unroll]] for (uint i = 0; i < 4; ++i)
        [[unroll]] for (uint j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
    }
    barrier();
  }
  for (uint i = 0; i < 4; ++i)
    for (uint j = 0; j < 4; ++j) {
      const uint m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m < p.m && n < p.n) c[m * p.n + n] = ELEMENT(acc[i][j]);
    }
}
