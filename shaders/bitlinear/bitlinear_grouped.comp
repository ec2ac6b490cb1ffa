#version 450
//! variant dot HW_DOT
//! variant int
// BitLinear with one weight scale per group of GROUP consecutive weights along K (docs/NUMERICS.md):
//   acc_g[m, n] = sum_{k in group g} x_q[m, k] W_q[n, k]        (exact int32)
//   y[m, n]     = (sum_g gamma[n, g] acc_g[m, n]) / s[m] (+ bias[n])
//   acc[m, n]   = sum_g acc_g[m, n]                              (the exact accumulator)
// x_q comes interleaved from bitlinear_prepare (bitlinear_common.glsl). Each subgroup takes one
// output row n at a time for the workgroup's M_TILE activation rows (workgroup y picks them); its
// lanes stride over the row's 16-weight words. With GROUP % 16 == 0 a word lies in one group: its
// four 4-way dot products on the signed codes are that group's, weighted by its gamma in float.
// Otherwise the word is taken weight by weight, the int sum flushed at each group boundary.
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
layout(std430, binding = 0) readonly buffer Weights { uint w[]; };             // packed [N, words]
layout(std430, binding = 1) readonly buffer Activations { uvec4 x4[]; };       // [M, words] blocks
layout(std430, binding = 2) readonly buffer Scales { float scales[]; };        // s [M]
layout(std430, binding = 3) readonly buffer Gamma { float gamma[]; };          // [N, K / GROUP]
layout(std430, binding = 4) readonly buffer Bias { float bias[]; };
layout(std430, binding = 5) writeonly buffer Output { float y[]; };
layout(std430, binding = 6) writeonly buffer Accumulators { int accumulators[]; };
layout(push_constant) uniform Push {
  uint m; uint n; uint k; uint words_per_row; uint group; uint rows_per_group;
} p;

// The codes c = W_q + 1 of four weights, one per byte, as signed bytes W_q (no borrow between bytes).
uint signed_codes(uint c) { return ((c | 0x80808080u) - 0x01010101u) ^ 0x80808080u; }

int byte_of(uint word, uint i) { return int(word << (24 - 8 * i)) >> 24; }

void main() {
  const uint lane = gl_SubgroupInvocationID, width = gl_SubgroupSize;
  const uint words = p.words_per_row, groups = p.k / p.group;
  const uint m0 = gl_WorkGroupID.y * M_TILE;
  const uint group_first = gl_WorkGroupID.x * p.rows_per_group;
  const uint group_end = min(group_first + p.rows_per_group, p.n);
  for (uint n = group_first + gl_SubgroupID; n < group_end; n += gl_NumSubgroups) {
    float sums[M_TILE];
    int totals[M_TILE];
    [[unroll]] for (uint i = 0; i < M_TILE; ++i) {
      sums[i] = 0.0;
      totals[i] = 0;
    }
    for (uint c = lane; c < words; c += width) {
      const uint word = w[n * words + c];
      if (WORD_GROUPS) {
        const float g = gamma[n * groups + 16 * c / p.group];
        [[unroll]] for (uint i = 0; i < M_TILE; ++i) {
          if (m0 + i >= p.m) break;
          const uvec4 xv = x4[(m0 + i) * words + c];
          const int d = dot4(xv.x, signed_codes(codes(word, 0))) + dot4(xv.y, signed_codes(codes(word, 1))) +
                        dot4(xv.z, signed_codes(codes(word, 2))) + dot4(xv.w, signed_codes(codes(word, 3)));
          sums[i] += g * float(d);
          totals[i] += d;
        }
      } else {
        [[unroll]] for (uint i = 0; i < M_TILE; ++i) {
          if (m0 + i >= p.m) break;
          const uvec4 xv = x4[(m0 + i) * words + c];
          uint current = 16 * c / p.group;
          int run = 0;
          // Weight t of the word is x byte t / 4 of interleaved word t % 4.
          for (uint t = 0; t < 16 && 16 * c + t < p.k; ++t) {
            const uint at = (16 * c + t) / p.group;
            if (at != current) {
              sums[i] += gamma[n * groups + current] * float(run);
              totals[i] += run;
              run = 0;
              current = at;
            }
            run += byte_of(xv[t % 4], t / 4) * (int((word >> (2 * t)) & 3u) - 1);
          }
          if (16 * c < p.k) {
            sums[i] += gamma[n * groups + current] * float(run);
            totals[i] += run;
          }
        }
      }
    }
    [[unroll]] for (uint i = 0; i < M_TILE; ++i) {
      const float sum = subgroupAdd(sums[i]);
      const int total = subgroupAdd(totals[i]);  // integer sums: exact in any order
      const uint m = m0 + i;
      if (lane == 0 && m < p.m) {
        float value = sum / scales[m];
        if (HAS_BIAS) value += bias[n];
        y[m * p.n + n] = value;
        if (WITH_ACCUMULATOR) accumulators[m * p.n + n] = total;
      }
    }
  }
}
