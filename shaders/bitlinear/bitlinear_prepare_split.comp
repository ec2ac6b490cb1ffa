#version 450
//! variant f32
//! variant f16 INPUT_F16
// The BitLinear activation pre-pass for a few long rows (decode), spread over many workgroups
// instead of one per row: workgroup (c, m) owns chunk c (512 vectors, 2048 values) of row m.
// PHASE 0 writes the chunk's max|x| to partial[m][c] and counts NaN/Inf; PHASE 1 reduces row m's
// partial maxima (max is exact in any order), quantizes its chunk into the interleaved layout of
// bitlinear_common.glsl and adds the chunk's sum of x_q to row_sums[m] (zeroed by PHASE 0; integer
// atomics, so the total is exact and order-free). Rows need K % 4 == 0.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_quad : require
#include "../quantize/quantize_common.glsl"
#include "bitlinear_common.glsl"
#include "prepare_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const float EPS = 1e-5;
layout(constant_id = 1) const uint PHASE = 0;
layout(std430, binding = 0) readonly buffer Input4 { ELEMENT4 x4[]; };
layout(std430, binding = 1) buffer Partial { float partial[]; };       // [rows, chunks]
layout(std430, binding = 2) writeonly buffer Quantized { uint xq[]; };  // [rows, padded_k / 4]
layout(std430, binding = 3) writeonly buffer Scales { float scales[]; };
layout(std430, binding = 4) buffer RowSums { int row_sums[]; };
layout(std430, binding = 5) buffer Counter { uint nonfinite_total; };
layout(push_constant) uniform Push { uint rows; uint k; uint padded_k; uint chunks; } p;

const uint CHUNK = 512;  // vectors

shared float s_max[256];
shared int s_sum[256];
shared uint s_bad[256];

void main() {
  const uint lane = gl_LocalInvocationID.x;
  const uint chunk = gl_WorkGroupID.x, row = gl_WorkGroupID.y;
  const uint vectors = p.k / 4, padded_vectors = p.padded_k / 4;
  const uint first = chunk * CHUNK;
  float absmax = 0.0;
  uint bad = 0;
  vec4 values[2];
  [[unroll]] for (uint j = 0; j < 2; ++j) {
    const uint v = first + lane + 256 * j;
    values[j] = v < vectors ? vec4(x4[row * vectors + v]) : vec4(0.0);
  }
  if (PHASE == 0) {
    [[unroll]] for (uint j = 0; j < 2; ++j)
      [[unroll]] for (uint e = 0; e < 4; ++e) accumulate(values[j][e], absmax, bad);
  } else {
    for (uint c = lane; c < p.chunks; c += 256) absmax = max(absmax, partial[row * p.chunks + c]);
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
  if (PHASE == 0) {
    if (lane == 0) {
      partial[row * p.chunks + chunk] = s_max[0];
      if (chunk == 0) row_sums[row] = 0;  // PHASE 1 adds to it after the barrier between them
      if (s_bad[0] > 0) atomicAdd(nonfinite_total, s_bad[0]);
    }
    return;
  }
  const float scale = divide(127.0, max(s_max[0], EPS));
  int sum = 0;
  [[unroll]] for (uint j = 0; j < 2; ++j) {
    if (first + 256 * j < padded_vectors) {  // uniform: whole quads stay together
      const uint v = first + lane + 256 * j;
      const uint word = interleaved_word(values[j], scale, sum);
      if (v < padded_vectors) xq[row * padded_vectors + v] = word;
    }
  }
  sum = subgroupAdd(sum);
  if (subgroupElect()) s_sum[gl_SubgroupID] = sum;
  barrier();
  if (lane == 0) {
    for (uint s = 1; s < gl_NumSubgroups; ++s) s_sum[0] += s_sum[s];
    atomicAdd(row_sums[row], s_sum[0]);
    if (chunk == 0) scales[row] = scale;
  }
}
