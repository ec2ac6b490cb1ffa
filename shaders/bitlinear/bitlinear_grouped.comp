#version 450
//! variant dot HW_DOT
//! variant int
// BitLinear with one weight scale per group of GROUP consecutive weights along K
// (docs/NUMERICS.md):
//   acc_g[m, n] = sum_{k in group g} x_q[m, k] W_q[n, k]        (exact int32)
//   y[m, n]     = (sum_g gamma[n, g] acc_g[m, n]) / s[m] (+ bias[n])
//   acc[m, n]   = sum_g acc_g[m, n]                              (the exact accumulator)
// x_q comes interleaved from bitlinear_prepare (bitlinear_common.glsl). Each subgroup takes ROWS
// output rows at a time for the workgroup's M_TILE activation rows (workgroup y picks them). With
// GROUP % 16 == 0 a 16-weight word lies in one group: its four 4-way dot products on the signed
// codes are that group's, weighted by its gamma in float; VECTORS (whole 16-byte vectors) has
// every lane stream one vector of each of its rows at a time, coalesced, as bitlinear_matvec does.
// Otherwise a word is taken weight by weight, the int sum flushed at each group boundary.
// The float sums are added across lanes by subgroupAdd (the reference's tolerance, not its order);
// the int32 accumulators are exact in any order.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "bitlinear_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint M_TILE = 1;
layout(constant_id = 1) const bool HAS_BIAS = false;
layout(constant_id = 2) const bool WITH_ACCUMULATOR = false;
layout(constant_id = 3) const bool WORD_GROUPS = true;  // GROUP % 16 == 0
// WORD_GROUPS and rows of whole 16-byte vectors
layout(constant_id = 4) const bool VECTORS = true;
layout(constant_id = 5) const uint ROWS = 2;
layout(std430, binding = 0) readonly buffer Weights { uint w[]; };             // packed [N, words]
layout(std430, binding = 1) readonly buffer Activations { uvec4 x4[]; };       // [M, words] blocks
layout(std430, binding = 2) readonly buffer Scales { float scales[]; };        // s [M]
layout(std430, binding = 3) readonly buffer Gamma { float gamma[]; };          // [N, K / GROUP]
layout(std430, binding = 4) readonly buffer Bias { float bias[]; };
layout(std430, binding = 5) writeonly buffer Output { float y[]; };
layout(std430, binding = 6) writeonly buffer Accumulators { int accumulators[]; };
layout(std430, binding = 7) readonly buffer Weights4 { uvec4 w4[]; };          // the same tensor
layout(push_constant) uniform Push {
  uint m; uint n; uint k; uint words_per_row; uint group; uint rows_per_group;
} p;

// The codes c = W_q + 1 of four weights, one per byte, as signed bytes W_q (no borrow between
// bytes).
uint signed_codes(uint c) { return ((c | 0x80808080u) - 0x01010101u) ^ 0x80808080u; }

int signed_dot16(uvec4 xv, uint word) {
  return dot4(xv.x, signed_codes(codes(word, 0))) + dot4(xv.y, signed_codes(codes(word, 1))) +
         dot4(xv.z, signed_codes(codes(word, 2))) + dot4(xv.w, signed_codes(codes(word, 3)));
}

void main() {
  const uint lane = gl_SubgroupInvocationID, width = gl_SubgroupSize;
  const uint words = p.words_per_row, groups = p.k / p.group;
  const uint m0 = gl_WorkGroupID.y * M_TILE;
  const uint group_first = gl_WorkGroupID.x * p.rows_per_group;
  const uint group_end = min(group_first + p.rows_per_group, p.n);
  for (uint first = group_first + gl_SubgroupID * ROWS; first < group_end;
       first += gl_NumSubgroups * ROWS) {
    float sums[M_TILE * ROWS];
    int totals[M_TILE * ROWS];
    [[unroll]] for (uint i = 0; i < M_TILE * ROWS; ++i) {
      sums[i] = 0.0;
      totals[i] = 0;
    }
    if (VECTORS) {
      const uint vectors = words / 4;
      for (uint c = lane; c < vectors; c += width) {
        uvec4 wv[ROWS];
        vec4 g[ROWS];  // the gamma of each of the vector's four words
        [[unroll]] for (uint r = 0; r < ROWS; ++r) {
          const uint n = first + r;
          wv[r] = n < group_end ? w4[n * vectors + c] : uvec4(0x55555555u);
          [[unroll]] for (uint j = 0; j < 4; ++j)
            g[r][j] = n < group_end ? gamma[n * groups + (64 * c + 16 * j) / p.group] : 0.0;
        }
        [[unroll]] for (uint i = 0; i < M_TILE; ++i) {
          if (m0 + i >= p.m) break;
          [[unroll]] for (uint j = 0; j < 4; ++j) {
            const uvec4 xv = x4[(m0 + i) * words + 4 * c + j];
            [[unroll]] for (uint r = 0; r < ROWS; ++r) {
              const int d = signed_dot16(xv, wv[r][j]);
              sums[i * ROWS + r] += g[r][j] * float(d);
              totals[i * ROWS + r] += d;
            }
          }
        }
      }
    } else {
      [[unroll]] for (uint r = 0; r < ROWS; ++r) {
        const uint n = first + r;
        if (n >= group_end) break;
        for (uint c = lane; c < words; c += width) {
          const uint word = w[n * words + c];
          [[unroll]] for (uint i = 0; i < M_TILE; ++i) {
            if (m0 + i >= p.m) break;
            const uvec4 xv = x4[(m0 + i) * words + c];
            if (WORD_GROUPS) {
              const int d = signed_dot16(xv, word);
              sums[i * ROWS + r] += gamma[n * groups + 16 * c / p.group] * float(d);
              totals[i * ROWS + r] += d;
              continue;
            }
            uint current = 16 * c / p.group;
            int run = 0;
            // Weight t of the word is x byte t / 4 of interleaved word t % 4.
            for (uint t = 0; t < 16 && 16 * c + t < p.k; ++t) {
              const uint at = (16 * c + t) / p.group;
              if (at != current) {
                sums[i * ROWS + r] += gamma[n * groups + current] * float(run);
                totals[i * ROWS + r] += run;
                run = 0;
                current = at;
              }
              run += byte_of(xv[t % 4], t / 4) * (int((word >> (2 * t)) & 3u) - 1);
            }
            sums[i * ROWS + r] += gamma[n * groups + current] * float(run);
            totals[i * ROWS + r] += run;
          }
        }
      }
    }
    [[unroll]] for (uint i = 0; i < M_TILE * ROWS; ++i) {
      const float sum = subgroupAdd(sums[i]);
      const int total = subgroupAdd(totals[i]);  // integer sums: exact in any order
      const uint m = m0 + i / ROWS, n = first + i % ROWS;
      if (lane == 0 && m < p.m && n < group_end) {
        precise float value = sum / scales[m];  // no FMA with the bias
        if (HAS_BIAS) value += bias[n];
        y[m * p.n + n] = value;
        if (WITH_ACCUMULATOR) accumulators[m * p.n + n] = total;
      }
    }
  }
}
