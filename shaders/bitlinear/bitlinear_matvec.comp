#version 450
//! variant dot HW_DOT
//! variant int
// y[m, n] = (sum_k x_q[m, k] W_q[n, k]) * gamma / s[m] (+ bias[n]) for small M (decode).
// Each subgroup owns ROWS output rows at a time and walks them together: every lane streams
// 16-byte vectors (64 weights) of all ROWS rows, coalesced across the subgroup, and reuses each
// x vector for all of them (UNROLL vectors of each row in flight at once); the sums are then one subgroupAdd each, with no shared memory and no
// barrier. A workgroup owns p.rows_per_group consecutive rows, handed to its subgroups in turn
// whatever the subgroup size. W is read exactly once.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "bitlinear_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint M = 1;
layout(constant_id = 1) const uint ROWS = 4;
layout(constant_id = 2) const bool HAS_BIAS = false;
layout(constant_id = 3) const bool WITH_ACCUMULATOR = false;
layout(constant_id = 4) const bool VECTORS = true;  // rows of W are whole 16-byte vectors
layout(constant_id = 5) const uint UNROLL = 1;      // vectors of each row a lane loads at once
layout(constant_id = 6) const bool RESIDUAL = false;  // bias is a residual [M, N] added to y
layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, binding = 1) readonly buffer Weights4 { uvec4 w4[]; };  // the same tensor
layout(std430, binding = 2) readonly buffer Activations { uvec4 x4[]; };
layout(std430, binding = 3) readonly buffer RowSums { int row_sums[]; };
layout(std430, binding = 4) readonly buffer Scales { float scales[]; };
layout(std430, binding = 5) readonly buffer Gamma { float gamma[]; };
layout(std430, binding = 6) readonly buffer Bias { float bias[]; };
layout(std430, binding = 7) writeonly buffer Output { float y[]; };
layout(std430, binding = 8) writeonly buffer Accumulators { int accumulators[]; };
layout(push_constant) uniform Push { uint n; uint words_per_row; uint rows_per_group; } p;

int dot16(uvec4 xv, uint word) {
  return dot4(xv.x, codes(word, 0)) + dot4(xv.y, codes(word, 1)) + dot4(xv.z, codes(word, 2)) +
         dot4(xv.w, codes(word, 3));
}

void main() {
  const uint lane = gl_SubgroupInvocationID, width = gl_SubgroupSize;
  const uint words = p.words_per_row;
  const uint group_first = gl_WorkGroupID.x * p.rows_per_group;
  const uint group_end = min(group_first + p.rows_per_group, p.n);
  for (uint first = group_first + gl_SubgroupID * ROWS; first < group_end;
       first += gl_NumSubgroups * ROWS) {
    int acc[M * ROWS];
    [[unroll]] for (uint i = 0; i < M * ROWS; ++i) acc[i] = 0;
    if (VECTORS) {
      const uint vectors = words / 4;
      for (uint c0 = lane; c0 < vectors; c0 += width * UNROLL) {
        uvec4 wv[UNROLL][ROWS];
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
          const uint c = c0 + u * width;
          [[unroll]] for (uint r = 0; r < ROWS; ++r)
            wv[u][r] = c < vectors && first + r < group_end ? w4[(first + r) * vectors + c]
                                                            : uvec4(0x55555555u);
        }
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
          const uint c = c0 + u * width;
          if (c >= vectors) break;
          [[unroll]] for (uint m = 0; m < M; ++m)
            [[unroll]] for (uint j = 0; j < 4; ++j) {
              const uvec4 xv = x4[m * words + c * 4 + j];  // one uvec4 per 16-weight block
              [[unroll]] for (uint r = 0; r < ROWS; ++r)
                acc[m * ROWS + r] += dot16(xv, wv[u][r][j]);
            }
        }
      }
    } else {
      for (uint c = lane; c < words; c += width) {
        uint wv[ROWS];
        [[unroll]] for (uint r = 0; r < ROWS; ++r)
          wv[r] = first + r < group_end ? w[(first + r) * words + c] : 0x55555555u;
        [[unroll]] for (uint m = 0; m < M; ++m) {
          const uvec4 xv = x4[m * words + c];
          [[unroll]] for (uint r = 0; r < ROWS; ++r) acc[m * ROWS + r] += dot16(xv, wv[r]);
        }
      }
    }
    [[unroll]] for (uint i = 0; i < M * ROWS; ++i) {
      const int total = subgroupAdd(acc[i]);  // integer sums: exact in any order
      const uint m = i / ROWS, n = first + i % ROWS;
      if (lane == i % width && n < group_end) {
        const int a = total - row_sums[m];
        float value = float(a) * gamma[0] / scales[m];
        if (HAS_BIAS) value += bias[RESIDUAL ? m * p.n + n : n];
        y[m * p.n + n] = value;
        if (WITH_ACCUMULATOR) accumulators[m * p.n + n] = a;
      }
    }
  }
}
