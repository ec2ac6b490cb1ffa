#version 450
//! variant dot HW_DOT
//! variant int
//! variant dot_sample HW_DOT SAMPLE
//! variant int_sample SAMPLE
// The first pass of the greedy decode step's screened argmax (ops/model.cpp, screened_argmax):
// for every row v of a float head [V, K], a bracket [approx - bound, approx + bound] that holds
// every float32 evaluation of h . head[v], from an int8 copy of the head and a 16-bit copy of h.
//   head[v] ~ sigma_v q_v (q_v int8, per-row scale; models.py builds it), h ~ sigma_h h16
//   (h16 = roundEven(h 32767 / max|h|), split into a signed high byte and an unsigned low byte),
//   approx = sigma_v sigma_h (256 sum_k hi_k q_vk + sum_k lo_k q_vk), two exact integer dot
// products;
//   |h . head[v] - approx| <= ||h - sigma_h h16|| ||head[v]|| + ||sigma_h h16|| ||head[v] - sigma_v
// q_v||
//   (Cauchy-Schwarz), plus the float32 rounding of either side, which the row's D' (its
// quantization
//   error's norm D_v plus gamma (N_v + D_v), gamma covering K-term float32 sums in any order) and
//   N (its norm N_v) cover: bound = ((||h|| + E_h) D' + E_h N) (1 + 2^-8), E_h = 0.52 sqrt(K)
// sigma_h.
// Each subgroup takes rows team, team + teams, ... (ROWS at a time, their loads in flight
// together); hi[v] = approx + bound, and the workgroup's largest approx - bound in lows[group].
// Where h holds NaN or Inf, or the subgroup is too narrow for the
// J vectors a lane holds, every bracket is NaN: every row is then a candidate, checked exactly.
// SAMPLE (the screened draw, ops/model.cpp's screened_sample): each row's approx - bound also goes
// to low[v], and lows[group] takes the largest draw_score(approx - bound, g_v) instead: a lower
// bound of the largest score any row's logit can have (draw_score never decreases as x grows);
// lows[workgroups + group] the largest approx - bound itself (for top-p: a lower bound of the
// largest logit).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_vote : require
#include "../bitlinear/bitlinear_common.glsl"
#include "bracket_common.glsl"
#ifdef SAMPLE
#include "../quantize/quantize_common.glsl"
#include "../sampling/sampling_common.glsl"
#endif
layout(local_size_x = 256) in;
// 16-value vectors of a row a lane holds: ceil(Kp / 16 / subgroup size)
layout(constant_id = 0) const uint J = 1;
layout(constant_id = 1) const uint ROWS = 1;  // rows a subgroup requests at once
layout(std430, binding = 0) readonly buffer X4 { vec4 x4[]; };      // h float32 [K], K % 4 == 0
layout(std430, binding = 1) readonly buffer Q4 { uvec4 q4[]; };     // int8 head [V, Kp]
layout(std430, binding = 2) readonly buffer Meta { vec4 meta[]; };  // [V]: sigma_v, D', N, unused
layout(std430, binding = 3) writeonly buffer High { float high[]; };  // [V]
// [workgroups] ([2, workgroups] with SAMPLE)
layout(std430, binding = 4) writeonly buffer Lows { float lows[]; };
shared float s_low[256];
#ifdef SAMPLE
shared float s_plain_low[256];
layout(std430, binding = 5) writeonly buffer Low { float low_out[]; };  // [V]
// as sample_rows.comp's: [6], or [1, 8] (params_stride 8) with the draw's key row at 6
layout(std430, binding = 6) readonly buffer Params { uint params[]; };
layout(std430, binding = 7) readonly buffer Start { int start; };
// vectors: Kp / 16
layout(push_constant) uniform Push {
  uint v; uint k; uint vectors; uint offset; uint params_stride;
} p;
#else
layout(push_constant) uniform Push { uint v; uint k; uint vectors; } p;  // vectors: Kp / 16
#endif

// Four 16-bit values as the bytes of two words: high bytes (signed), low bytes (unsigned).
void split_bytes(ivec4 values, out uint high_word, out uint low_word) {
  high_word = 0;
  low_word = 0;
  [[unroll]] for (uint b = 0; b < 4; ++b) {
    high_word |= (uint(values[b] >> 8) & 0xFFu) << (8 * b);
    low_word |= (uint(values[b]) & 0xFFu) << (8 * b);
  }
}

void main() {
  const uint lane = gl_SubgroupInvocationID, width = gl_SubgroupSize;
  const uint team = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
  const uint teams = gl_NumWorkGroups.x * gl_NumSubgroups;
  const uint k4 = p.k / 4;
  // This lane's values of h: vector c = lane + width j holds h[16c .. 16c + 15], as the head's
  // vector c of a row holds its int8 values (word i: values 16c + 4i .. 16c + 4i + 3).
  vec4 h[J][4];
  float amax = 0.0;
  bool nonfinite = false;
  [[unroll]] for (uint j = 0; j < J; ++j) {
    const uint c = lane + width * j;
    [[unroll]] for (uint i = 0; i < 4; ++i) {
      const uint e = 4 * c + i;
      h[j][i] = c < p.vectors && e < k4 ? x4[e] : vec4(0.0);
      nonfinite = nonfinite || any(isnan(h[j][i])) || any(isinf(h[j][i]));
      const vec4 a = abs(h[j][i]);
      amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
    }
  }
  amax = subgroupMax(amax);
  // ||h|| as max|h| ||h / max|h|||: no square underflows to zero that matters (the sum is >= 1).
  // Below 1e-18 (or with NaN or Inf) the products below could underflow: no bracket then.
  const bool unbounded =
      subgroupAny(nonfinite) || width * J < p.vectors || (amax > 0.0 && amax < 1e-18);
  const float inverse = amax > 0.0 && !unbounded ? 32767.0 / amax : 0.0;
  const float sigma_h = amax / 32767.0, unit = amax > 0.0 && !unbounded ? 1.0 / amax : 0.0;
  float squares = 0.0;
  uint high_words[J][4], low_words[J][4];
  [[unroll]] for (uint j = 0; j < J; ++j)
    [[unroll]] for (uint i = 0; i < 4; ++i) {
      const vec4 scaled = h[j][i] * unit;
      squares += dot(scaled, scaled);
      split_bytes(ivec4(clamp(roundEven(h[j][i] * inverse), vec4(-32767.0), vec4(32767.0))),
                  high_words[j][i], low_words[j][i]);
    }
  squares = subgroupAdd(squares);
  const float norm_h = amax * sqrt(squares), error_h = 0.52 * sqrt(float(p.k)) * sigma_h;
  const float not_a_number = uintBitsToFloat(0x7FC00000u);
  float best_low = -1.0 / 0.0;
#ifdef SAMPLE
  float best_plain_low = -1.0 / 0.0;
  const float temperature = uintBitsToFloat(params[0]);
  const float inverse_temperature = uintBitsToFloat(params[1]);
  const uint row_key = ROW_DRAW_KEY(params, 0u, p.params_stride != 0, 0u, uint(start) + p.offset);
#endif
  for (uint first = team * ROWS; first < p.v; first += teams * ROWS) {
    uvec4 w[ROWS][J];
    [[unroll]] for (uint r = 0; r < ROWS; ++r)
      [[unroll]] for (uint j = 0; j < J; ++j) {
        const uint c = lane + width * j;
        w[r][j] = c < p.vectors && first + r < p.v ? q4[(first + r) * p.vectors + c] : uvec4(0);
      }
    // Row `first + lane`'s scale and norms, requested with its weights (lane r takes row r).
    const vec4 m = lane < ROWS && first + lane < p.v ? meta[first + lane] : vec4(0.0);
    [[unroll]] for (uint r = 0; r < ROWS; ++r) {
      const uint row = first + r;
      int sum_high = 0, sum_low = 0;  // exact: |sum_high| <= 128 * 127 K, |sum_low| <= 255 * 127 K
      [[unroll]] for (uint j = 0; j < J; ++j)
        [[unroll]] for (uint i = 0; i < 4; ++i) {
          sum_high += dot4(high_words[j][i], w[r][j][i]);
          sum_low += sudot4(w[r][j][i], low_words[j][i]);
        }
      sum_high = subgroupAdd(sum_high);
      sum_low = subgroupAdd(sum_low);
      if (lane == r && row < p.v) {
        const vec2 ends = bracket(sum_high, sum_low, sigma_h, norm_h, error_h, m);
        high[row] = unbounded ? not_a_number : ends.y;
#ifdef SAMPLE
        low_out[row] = unbounded ? not_a_number : ends.x;
        if (!unbounded && ends.x > best_plain_low) best_plain_low = ends.x;
        const float low =
            draw_score(ends.x, gumbel(row, row_key), temperature, inverse_temperature);
#else
        const float low = ends.x;
#endif
        if (!unbounded && low > best_low) best_low = low;  // NaN brackets never raise it
      }
    }
  }
  best_low = subgroupMax(best_low);  // lanes that took no row hold -inf
  if (subgroupElect()) s_low[gl_SubgroupID] = best_low;
#ifdef SAMPLE
  best_plain_low = subgroupMax(best_plain_low);
  if (subgroupElect()) s_plain_low[gl_SubgroupID] = best_plain_low;
#endif
  barrier();
  if (gl_LocalInvocationID.x == 0) {
    for (uint s = 1; s < gl_NumSubgroups; ++s) best_low = max(best_low, s_low[s]);
    lows[gl_WorkGroupID.x] = best_low;
#ifdef SAMPLE
    for (uint s = 1; s < gl_NumSubgroups; ++s) best_plain_low = max(best_plain_low, s_plain_low[s]);
    lows[gl_NumWorkGroups.x + gl_WorkGroupID.x] = best_plain_low;
#endif
  }
}
