#version 450
//! variant f32
//! variant f16 INPUT_F16
// Per-row int8 activation quantization for BitLinear (docs/NUMERICS.md): s = 127 / max(max|x|,
// eps), x_q = clip(round(x * s), -128, 127), written in the interleaved, zero-padded layout of
// bitlinear_common.glsl, with each row's sum of x_q. One workgroup per row; each invocation owns
// whole blocks of 16 values, read as four vectors and written as one uvec4. Rows of up to
// 4 * 256 blocks (K <= 16384) stay in registers between the absmax and the quantization, so a
// decode step's single row costs one read of x.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "../quantize/quantize_common.glsl"
#include "bitlinear_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const float EPS = 1e-5;
layout(std430, binding = 0) readonly buffer Input { ELEMENT x[]; };
layout(std430, binding = 1) readonly buffer Input4 { ELEMENT4 x4[]; };  // the same tensor
layout(std430, binding = 2) writeonly buffer Quantized { uvec4 xq[]; };  // one block a vector
layout(std430, binding = 3) writeonly buffer Scales { float scales[]; };
layout(std430, binding = 4) writeonly buffer RowSums { int row_sums[]; };
layout(std430, binding = 5) buffer Counter { uint nonfinite_total; };
layout(push_constant) uniform Push { uint rows; uint k; uint padded_k; } p;

const uint CACHED_BLOCKS = 4;

shared float s_max[256];
shared int s_sum[256];
shared uint s_bad[256];

// Values 16b .. 16b + 15 of a row as four vec4 (v[j] = x[16b + 4j .. 16b + 4j + 3]), zeros past K.
void load_block(uint row, uint block, out vec4 v[4]) {
  const uint k0 = block * 16, base = row * p.k;
  if (p.k % 4 == 0 && k0 + 16 <= p.k) {  // the row, and so the block, starts on a vector
    [[unroll]] for (uint j = 0; j < 4; ++j) v[j] = vec4(x4[(base + k0) / 4 + j]);
  } else {
    [[unroll]] for (uint j = 0; j < 4; ++j)
      [[unroll]] for (uint e = 0; e < 4; ++e) {
        const uint k = k0 + 4 * j + e;
        v[j][e] = k < p.k ? float(x[base + k]) : 0.0;
      }
  }
}

void accumulate(vec4 v[4], inout float absmax, inout uint bad) {
  [[unroll]] for (uint j = 0; j < 4; ++j)
    [[unroll]] for (uint e = 0; e < 4; ++e) {
      if (finite(v[j][e])) absmax = max(absmax, abs(v[j][e]));
      else bad++;
    }
}

// Word i of the interleaved block holds values 4j + i, j = 0..3, one per byte.
uvec4 quantize_block(vec4 v[4], float scale, inout int sum) {
  uvec4 words = uvec4(0);
  [[unroll]] for (uint j = 0; j < 4; ++j)
    [[unroll]] for (uint i = 0; i < 4; ++i) {
      precise float product = v[j][i] * scale;
      const int q = int(clamp(roundEven(product), -128.0, 127.0));
      sum += q;
      words[i] |= (uint(q) & 0xFFu) << (8 * j);
    }
  return words;
}

void main() {
  const uint lane = gl_LocalInvocationID.x;
  const uint blocks = p.padded_k / 16;
  const bool cached = blocks <= CACHED_BLOCKS * 256;
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    float absmax = 0.0;
    uint bad = 0;
    vec4 cache[CACHED_BLOCKS][4];
    if (cached) {
      [[unroll]] for (uint c = 0; c < CACHED_BLOCKS; ++c)
        if (lane + c * 256 < blocks) load_block(row, lane + c * 256, cache[c]);
      [[unroll]] for (uint c = 0; c < CACHED_BLOCKS; ++c)
        if (lane + c * 256 < blocks) accumulate(cache[c], absmax, bad);
    } else {
      for (uint b = lane; b < blocks; b += 256) {
        vec4 v[4];
        load_block(row, b, v);
        accumulate(v, absmax, bad);
      }
    }
    absmax = subgroupMax(absmax);  // max is exact in any order
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
    if (cached) {
      [[unroll]] for (uint c = 0; c < CACHED_BLOCKS; ++c)
        if (lane + c * 256 < blocks)
          xq[row * blocks + lane + c * 256] = quantize_block(cache[c], scale, sum);
    } else {
      for (uint b = lane; b < blocks; b += 256) {
        vec4 v[4];
        load_block(row, b, v);
        xq[row * blocks + b] = quantize_block(v, scale, sum);
      }
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
