#version 450
// int8 rows (or, TRANSPOSED, columns of an int8 [K, rows] matrix) to the interleaved, zero-padded
// layout of bitlinear_common.glsl, with each row's sum. One workgroup per row.
#extension GL_GOOGLE_include_directive : require
#include "../quantize/quantize_common.glsl"
#include "bitlinear_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool TRANSPOSED = false;
layout(std430, binding = 0) readonly buffer Input { int8_t values[]; };
layout(std430, binding = 1) writeonly buffer Output { uint8_t interleaved_values[]; };
layout(std430, binding = 2) writeonly buffer RowSums { int row_sums[]; };
layout(push_constant) uniform Push { uint rows; uint k; uint padded_k; } p;

shared int s_sum[256];

void main() {
  const uint lane = gl_LocalInvocationID.x;
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    int sum = 0;
    for (uint k = lane; k < p.padded_k; k += 256) {
      int v = 0;
      if (k < p.k) v = int(values[TRANSPOSED ? k * p.rows + row : row * p.k + k]);
      sum += v;
      interleaved_values[row * p.padded_k + interleaved(k)] = uint8_t(uint(v) & 0xFFu);
    }
    sum = subgroupAdd(sum);
    if (subgroupElect()) s_sum[gl_SubgroupID] = sum;
    barrier();
    if (lane == 0) {
      for (uint s = 1; s < gl_NumSubgroups; ++s) s_sum[0] += s_sum[s];
      row_sums[row] = s_sum[0];
    }
    barrier();
  }
}
