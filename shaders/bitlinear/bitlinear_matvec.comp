#version 450
//! variant dot HW_DOT
//! variant int
// y[m, n] = (sum_k x_q[m, k] W_q[n, k]) * gamma / s[m] (+ bias[n]) for small M (decode).
// A workgroup owns ROWS output rows and splits K over its 256 invocations: each streams 16-byte
// vectors (64 weights) of every owned row, coalesced, and reuses each x vector for all ROWS rows;
// then the partial sums are reduced across subgroups in shared memory. W is read exactly once.
#extension GL_GOOGLE_include_directive : require
#include "bitlinear_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint M = 1;
layout(constant_id = 1) const uint ROWS = 4;
layout(constant_id = 2) const bool HAS_BIAS = false;
layout(constant_id = 3) const bool WITH_ACCUMULATOR = false;
layout(constant_id = 4) const bool VECTORS = true;  // rows of W are whole 16-byte vectors
layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, binding = 1) readonly buffer Weights4 { uvec4 w4[]; };  // the same tensor
layout(std430, binding = 2) readonly buffer Activations { uvec4 x4[]; };
layout(std430, binding = 3) readonly buffer RowSums { int row_sums[]; };
layout(std430, binding = 4) readonly buffer Scales { float scales[]; };
layout(std430, binding = 5) readonly buffer Gamma { float gamma[]; };
layout(std430, binding = 6) readonly buffer Bias { float bias[]; };
layout(std430, binding = 7) writeonly buffer Output { float y[]; };
layout(std430, binding = 8) writeonly buffer Accumulators { int accumulators[]; };
layout(push_constant) uniform Push { uint n; uint words_per_row; } p;

shared int partial[64][M * ROWS];

void main() {
  const uint lane = gl_LocalInvocationID.x;
  const uint first = gl_WorkGroupID.x * ROWS;
  int acc[M * ROWS];
  for (uint i = 0; i < M * ROWS; ++i) acc[i] = 0;
  const uint words = p.words_per_row;
  if (VECTORS) {
    for (uint c = lane; c < words / 4; c += 256) {
      uvec4 wv[ROWS];
      for (uint r = 0; r < ROWS; ++r)
        wv[r] = first + r < p.n ? w4[(first + r) * (words / 4) + c] : uvec4(0x55555555u);
      for (uint m = 0; m < M; ++m) {
        const uint xbase = m * words + c * 4;  // in uvec4 units: one per 16-weight block
        for (uint j = 0; j < 4; ++j) {
          const uvec4 xv = x4[xbase + j];
          for (uint r = 0; r < ROWS; ++r) {
            const uint word = wv[r][j];
            acc[m * ROWS + r] += dot4(xv.x, codes(word, 0)) + dot4(xv.y, codes(word, 1)) +
                                 dot4(xv.z, codes(word, 2)) + dot4(xv.w, codes(word, 3));
          }
        }
      }
    }
  } else {
    for (uint c = lane; c < words; c += 256) {
      uint wv[ROWS];
      for (uint r = 0; r < ROWS; ++r) wv[r] = first + r < p.n ? w[(first + r) * words + c] : 0x55555555u;
      for (uint m = 0; m < M; ++m) {
        const uvec4 xv = x4[m * words + c];
        for (uint r = 0; r < ROWS; ++r)
          acc[m * ROWS + r] += dot4(xv.x, codes(wv[r], 0)) + dot4(xv.y, codes(wv[r], 1)) +
                               dot4(xv.z, codes(wv[r], 2)) + dot4(xv.w, codes(wv[r], 3));
      }
    }
  }
  for (uint i = 0; i < M * ROWS; ++i) {
    const int total = subgroupAdd(acc[i]);
    if (subgroupElect()) partial[gl_SubgroupID][i] = total;
  }
  barrier();
  if (lane < M * ROWS) {
    const uint m = lane / ROWS, n = first + lane % ROWS;
    int total = 0;
    for (uint s = 0; s < gl_NumSubgroups; ++s) total += partial[s][lane];
    if (n < p.n) {
      const int a = total - row_sums[m];
      float value = float(a) * gamma[0] / scales[m];
      if (HAS_BIAS) value += bias[n];
      y[m * p.n + n] = value;
      if (WITH_ACCUMULATOR) accumulators[m * p.n + n] = a;
    }
  }
}
