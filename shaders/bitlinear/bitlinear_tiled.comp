#version 450
//! variant dot HW_DOT
//! variant int
// Tiled int8 GEMM for larger M (prefill): a 64 x 64 output tile per workgroup, 4 x 4 outputs per
// invocation, K in steps of 64 through shared memory. TERNARY: B is packed ternary codes
// (acc = dot(x, c) - rowsum(x), y = acc * gamma / s + bias); otherwise B is int8 in the
// interleaved layout and only the int32 accumulators are produced. RESIDUAL: the bias is an
// [M, N] residual added element by element (a decoder's x + o_proj(...)), instead of [N].
#extension GL_GOOGLE_include_directive : require
#include "bitlinear_common.glsl"
layout(local_size_x = 16, local_size_y = 16) in;
layout(constant_id = 0) const bool TERNARY = true;
layout(constant_id = 1) const bool HAS_BIAS = false;
layout(constant_id = 2) const bool WITH_OUTPUT = true;
layout(constant_id = 3) const bool WITH_ACCUMULATOR = false;
layout(constant_id = 4) const bool RESIDUAL = false;
layout(std430, binding = 0) readonly buffer B { uint b[]; };        // [N, words] or [N, Kp / 4]
layout(std430, binding = 1) readonly buffer A { uint a[]; };        // [M, Kp / 4] interleaved
layout(std430, binding = 2) readonly buffer RowSums { int row_sums[]; };
layout(std430, binding = 3) readonly buffer Scales { float scales[]; };
layout(std430, binding = 4) readonly buffer Gamma { float gamma[]; };
layout(std430, binding = 5) readonly buffer Bias { float bias[]; };
layout(std430, binding = 6) writeonly buffer Output { float y[]; };
layout(std430, binding = 7) writeonly buffer Accumulators { int accumulators[]; };
layout(push_constant) uniform Push { uint m; uint n; uint blocks; } p;  // blocks = Kp / 16

shared uint tile_a[64][17];  // 4 blocks of 16 values = 16 words a row (+1 against bank conflicts)
shared uint tile_b[64][17];  // TERNARY: 4 code words a row, expanded to 16 words of codes

void main() {
  const uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
  const uint thread = ty * 16 + tx;
  const uint m0 = gl_WorkGroupID.y * 64, n0 = gl_WorkGroupID.x * 64;
  int acc[4][4];
  for (uint i = 0; i < 4; ++i)
    for (uint j = 0; j < 4; ++j) acc[i][j] = 0;
  const uint words_a = p.blocks * 4;
  for (uint block = 0; block < p.blocks; block += 4) {
    for (uint e = thread; e < 64 * 16; e += 256) {
      const uint row = e / 16, col = e % 16, word = block * 4 + col;
      tile_a[row][col] = m0 + row < p.m && word < words_a ? a[(m0 + row) * words_a + word] : 0u;
      if (TERNARY) {
        // col = 4 * j + i: codes i of the block's j-th ternary word
        const uint j = col / 4, i = col % 4;
        const uint packed = n0 + row < p.n && block + j < p.blocks
                                ? b[(n0 + row) * p.blocks + block + j]
                                : 0x55555555u;
        tile_b[row][col] = codes(packed, i);
      } else {
        tile_b[row][col] = n0 + row < p.n && word < words_a ? b[(n0 + row) * words_a + word] : 0u;
      }
    }
    barrier();
    for (uint col = 0; col < 16; ++col) {
      uint av[4], bv[4];
      for (uint i = 0; i < 4; ++i) av[i] = tile_a[ty + 16 * i][col];
      for (uint j = 0; j < 4; ++j) bv[j] = tile_b[tx + 16 * j][col];
      for (uint i = 0; i < 4; ++i)
        for (uint j = 0; j < 4; ++j) acc[i][j] += dot4(av[i], bv[j]);
    }
    barrier();
  }
  for (uint i = 0; i < 4; ++i) {
    const uint m = m0 + ty + 16 * i;
    if (m >= p.m) continue;
    for (uint j = 0; j < 4; ++j) {
      const uint n = n0 + tx + 16 * j;
      if (n >= p.n) continue;
      const int value = TERNARY ? acc[i][j] - row_sums[m] : acc[i][j];
      if (WITH_ACCUMULATOR) accumulators[m * p.n + n] = value;
      if (WITH_OUTPUT) {
        precise float out_value = float(value) * gamma[0] / scales[m];  // no FMA with the bias
        if (HAS_BIAS) out_value += bias[RESIDUAL ? m * p.n + n : n];
        y[m * p.n + n] = out_value;
      }
    }
  }
}
