#version 450
//! variant f32
//! variant f16 INPUT_F16
// Per-row int8 activation quantization for BitLinear (docs/NUMERICS.md): s = 127 / max(max|x|,
// eps), x_q = clip(round(x * s), -128, 127), written in the interleaved, zero-padded layout of
// bitlinear_common.glsl, with each row's sum of x_q (ROW_SUMS: the tensor-core kernels need none,
// and without them a row takes one barrier, not two). One workgroup per row.
// Rows with K % 4 == 0: invocation t reads vectors t, t + 256, ... (coalesced), rows of up to
// 16 * 256 vectors (K <= 16384) held in registers between the absmax and the quantization; a quad
// of invocations holds one 16-value block, and a 4 x 4 byte transpose across the quad turns its
// four quantized vectors into the block's four interleaved words, written one per invocation.
// Other rows: one value per invocation, written to its interleaved byte.
// Fused inputs (the cached path only; ops/bitlinear.cpp checks): GATED quantizes
// relu(x)^2 * up (BitNet's gated FFN) instead of x, and NORM quantizes the RMS-normalized row
// v r g (r = 1 / sqrt(mean(v^2) + norm_eps), g the norm weight), so a decoder's norm and its
// BitLinear pre-pass are one dispatch. As r > 0, max|v r g| = r max|v g|: the sum of squares and
// max|v g| are one reduction, and the codes round (v g)(r s) (docs/NUMERICS.md).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_quad : require
#include "../quantize/quantize_common.glsl"
#include "bitlinear_common.glsl"
#include "prepare_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const float EPS = 1e-5;
layout(constant_id = 1) const bool NORM = false;
layout(constant_id = 2) const bool GATED = false;
layout(std430, binding = 0) readonly buffer Input { ELEMENT x[]; };
layout(std430, binding = 1) readonly buffer Input4 { ELEMENT4 x4[]; };  // the same tensor
layout(std430, binding = 2) writeonly buffer Quantized { uint xq[]; };   // [rows, padded_k / 4]
layout(std430, binding = 3) writeonly buffer Scales { float scales[]; };
layout(std430, binding = 4) writeonly buffer RowSums { int row_sums[]; };
layout(std430, binding = 5) buffer Counter { uint nonfinite_total; };
layout(std430, binding = 6) readonly buffer NormWeight { vec4 norm_weight4[]; };  // [K] with NORM
layout(std430, binding = 7) readonly buffer Up { ELEMENT4 up4[]; };  // [rows, K] with GATED
layout(push_constant) uniform Push { uint rows; uint k; uint padded_k; float norm_eps; } p;

// Vectors per invocation held in registers: ceil(padded K / 4 / 256), at most 16, set by the host
// so that short rows take few registers and more workgroups fit on a multiprocessor.
layout(constant_id = 3) const uint CACHED = 16;
layout(constant_id = 4) const bool ROW_SUMS = true;

shared float s_max[256];
shared int s_sum[256];
shared uint s_bad[256];
shared float s_squares[256];

// Each reduction: every subgroup's share published, one barrier, then the total read by every
// invocation that needs it. A scratch array is written again (the next row) only after later
// barriers that every invocation reaches after reading it: two barriers a row (one without
// ROW_SUMS).

// max|x| of the workgroup's values and (NORM) their sum of squares (float32, in a fixed order:
// lanes, subgroups, then subgroup by subgroup), in every invocation; without ROW_SUMS their
// NaN/Inf count too (in `bad`), as no later barrier reduces it.
float reduce_row(float absmax, float partial_squares, out float squares, inout uint bad) {
  absmax = subgroupMax(absmax);  // max is exact in any order
  if (NORM) partial_squares = subgroupAdd(partial_squares);
  if (!ROW_SUMS) bad = subgroupAdd(bad);
  if (subgroupElect()) {
    s_max[gl_SubgroupID] = absmax;
    if (NORM) s_squares[gl_SubgroupID] = partial_squares;
    if (!ROW_SUMS) s_bad[gl_SubgroupID] = bad;
  }
  barrier();
  float total = 0.0;
  squares = 0.0;
  if (!ROW_SUMS) bad = 0;
  for (uint s = 0; s < gl_NumSubgroups; ++s) {
    total = max(total, s_max[s]);
    if (NORM) squares += s_squares[s];
    if (!ROW_SUMS) bad += s_bad[s];
  }
  return total;
}

void finish_row(uint row, float scale, int sum, uint bad) {
  if (!ROW_SUMS) {  // bad is the row's count already (reduce_row)
    if (gl_LocalInvocationID.x == 0) {
      scales[row] = scale;
      if (bad > 0) atomicAdd(nonfinite_total, bad);
    }
    // Every invocation is done reading the reductions before the next row's write (uniform).
    if (row + gl_NumWorkGroups.x < p.rows) barrier();
    return;
  }
  sum = subgroupAdd(sum);  // integer sums: exact in any order
  bad = subgroupAdd(bad);
  if (subgroupElect()) {
    s_sum[gl_SubgroupID] = sum;
    s_bad[gl_SubgroupID] = bad;
  }
  barrier();
  if (gl_LocalInvocationID.x == 0) {
    int total = 0;
    uint bad_total = 0;
    for (uint s = 0; s < gl_NumSubgroups; ++s) {
      total += s_sum[s];
      bad_total += s_bad[s];
    }
    scales[row] = scale;
    row_sums[row] = total;
    if (bad_total > 0) atomicAdd(nonfinite_total, bad_total);
  }
  // Invocation 0 is done reading before the next row's reductions write (uniform).
  if (row + gl_NumWorkGroups.x < p.rows) barrier();
}

void main() {
  const uint lane = gl_LocalInvocationID.x;
  const uint vectors = p.k / 4, padded_vectors = p.padded_k / 4;
  const bool vectorized = p.k % 4 == 0;  // rows start on a vector
  const bool cached = vectorized && padded_vectors <= CACHED * 256;
  // The norm's weights requested with the first row, not after its sum of squares' barrier.
  vec4 norm_weights[NORM ? CACHED : 1];
  if (NORM && cached)
    [[unroll]] for (uint c = 0; c < CACHED; ++c) {
      const uint v = lane + c * 256;
      norm_weights[c] = v < vectors ? norm_weight4[v] : vec4(0.0);
    }
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    float absmax = 0.0;
    uint bad = 0;
    int sum = 0;
    if (cached) {
      vec4 cache[CACHED];
      [[unroll]] for (uint c = 0; c < CACHED; ++c) {
        const uint v = lane + c * 256;
        cache[c] = v < vectors ? vec4(x4[row * vectors + v]) : vec4(0.0);
        if (GATED && v < vectors) {
          const vec4 g = max(cache[c], vec4(0.0));
          cache[c] = g * g * vec4(up4[row * vectors + v]);
        }
      }
      // precise: the same operations as the fused matvec's, not contracted in its own way.
      precise float squares = 0.0;
      if (NORM) {
        [[unroll]] for (uint c = 0; c < CACHED; ++c) squares += dot(cache[c], cache[c]);
        [[unroll]] for (uint c = 0; c < CACHED; ++c)
          if (lane + c * 256 < vectors) cache[c] *= norm_weights[c];
      }
      [[unroll]] for (uint c = 0; c < CACHED; ++c)
        if (lane + c * 256 < vectors)
          [[unroll]] for (uint e = 0; e < 4; ++e) accumulate(cache[c][e], absmax, bad);
      float total_squares, scale, product_scale;
      const float max_value = reduce_row(absmax, squares, total_squares, bad);
      quantization_scales(max_value, NORM, total_squares, p.k, p.norm_eps, EPS, scale,
                          product_scale);
      [[unroll]] for (uint c = 0; c < CACHED; ++c) {
        const uint v = lane + c * 256;
        if (c * 256 < padded_vectors) {  // uniform: whole quads stay together
          const uint word = interleaved_word(cache[c], product_scale, sum);
          if (v < padded_vectors) xq[row * padded_vectors + v] = word;
        }
      }
      finish_row(row, scale, sum, bad);
    } else if (vectorized) {
      for (uint v = lane; v < vectors; v += 256) {
        const vec4 value = vec4(x4[row * vectors + v]);
        [[unroll]] for (uint e = 0; e < 4; ++e) accumulate(value[e], absmax, bad);
      }
      float unused;
      const float scale = divide(127.0, max(reduce_row(absmax, 0.0, unused, bad), EPS));
      for (uint base = 0; base < padded_vectors; base += 256) {  // uniform trip count
        const uint v = base + lane;
        const vec4 value = v < vectors ? vec4(x4[row * vectors + v]) : vec4(0.0);
        const uint word = interleaved_word(value, scale, sum);
        if (v < padded_vectors) xq[row * padded_vectors + v] = word;
      }
      finish_row(row, scale, sum, bad);
    } else {
      for (uint k = lane; k < p.k; k += 256) accumulate(float(x[row * p.k + k]), absmax, bad);
      float unused;
      const float scale = divide(127.0, max(reduce_row(absmax, 0.0, unused, bad), EPS));
      // Four values to a word: invocation t builds word t of the row's interleaved layout.
      for (uint w = lane; w < padded_vectors; w += 256) {
        const uint block = w / 4, i = w % 4;
        uint word = 0;
        [[unroll]] for (uint j = 0; j < 4; ++j) {
          const uint k = block * 16 + 4 * j + i;
          const int q = k < p.k ? quantize(float(x[row * p.k + k]), scale) : 0;
          sum += q;
          word |= (uint(q) & 0xFFu) << (8 * j);
        }
        xq[row * padded_vectors + w] = word;
      }
      finish_row(row, scale, sum, bad);
    }
  }
}
