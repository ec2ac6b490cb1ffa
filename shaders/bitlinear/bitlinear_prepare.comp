#version 450
//! variant f32
//! variant f16 INPUT_F16
// Per-row int8 activation quantization for BitLinear (docs/NUMERICS.md): s = 127 / max(max|x|,
// eps), x_q = clip(round(x * s), -128, 127), written in the interleaved, zero-padded layout of
// bitlinear_common.glsl, with each row's sum of x_q. One workgroup per row.
#extension GL_GOOGLE_include_directive : require
#include "../quantize/quantize_common.glsl"
#include "bitlinear_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const float EPS = 1e-5;
layout(std430, binding = 0) readonly buffer Input { ELEMENT x[]; };
layout(std430, binding = 1) writeonly buffer Quantized { uint8_t xq[]; };
layout(std430, binding = 2) writeonly buffer Scales { float scales[]; };
layout(std430, binding = 3) writeonly buffer RowSums { int row_sums[]; };
layout(std430, binding = 4) buffer Counter { uint nonfinite_total; };
layout(push_constant) uniform Push { uint rows; uint k; uint padded_k; } p;

shared float s_max[256];
shared int s_sum[256];
shared uint s_bad[256];

void main() {
  const uint lane = gl_LocalInvocationID.x;
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    float absmax = 0.0;
    uint bad = 0;
    for (uint k = lane; k < p.k; k += 256) {
      const float v = float(x[row * p.k + k]);
      if (finite(v)) absmax = max(absmax, abs(v));
      else bad++;
    }
    absmax = subgroupMax(absmax);
    bad = subgroupAdd(bad);
    if (subgroupElect()) { s_max[gl_SubgroupID] = absmax; s_bad[gl_SubgroupID] = bad; }
    barrier();
    if (lane == 0)
      for (uint s = 1; s < gl_NumSubgroups; ++s) {
        s_max[0] = max(s_max[0], s_max[s]);
        s_bad[0] += s_bad[s];
      }
    barrier();
    const float scale = 127.0 / max(s_max[0], EPS);
    int sum = 0;
    for (uint k = lane; k < p.padded_k; k += 256) {
      int q = 0;
      if (k < p.k) {
        precise float product = float(x[row * p.k + k]) * scale;
        q = int(clamp(roundEven(product), -128.0, 127.0));
      }
      sum += q;
      xq[row * p.padded_k + interleaved(k)] = uint8_t(uint(q) & 0xFFu);
    }
    sum = subgroupAdd(sum);  // integer sums: exact in any order
    if (subgroupElect()) s_sum[gl_SubgroupID] = sum;
    barrier();
    if (lane == 0) {
      for (uint s = 1; s < gl_NumSubgroups; ++s) s_sum[0] += s_sum[s];
      scales[row] = scale;
      row_sums[row] = s_sum[0];
      if (s_bad[0] > 0) atomicAdd(nonfinite_total, s_bad[0]);
    }
    barrier();
  }
}
