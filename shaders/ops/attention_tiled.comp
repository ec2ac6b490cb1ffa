#version 450
//! variant f32
//! variant f16 INPUT_F16
// attention.comp for many queries (prefill), D <= 128: workgroup (block, h) takes BQ = 16
// consecutive query rows of one sequence and head h, and walks the keys in tiles of BK = 16 that
// it stages in shared memory once for all its queries (attention.comp reads every key once per
// query). Per tile: invocation (query, key) scores one pair; each query's running max and sum
// (online softmax) are updated in key order; invocation (query, dims) then adds the weighted
// values of its D / 16 dimensions. Layouts, the causal rule, batched caches and FROM_START as in
// attention.comp; a query that sees no key gets zeros.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "ops_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool CAUSAL = true;
layout(constant_id = 1) const bool FROM_START = false;
// The loops inside the tile loop with fixed trip counts, unrolled (set on lavapipe, which ends an
// invocation's loops after 65535 passes in all, silently: see shaders/runtime/strided_loop.glsl;
// the variable loops reached that within about 25k keys). Off elsewhere: on the H100 the unrolled
// form made prefill attention 11% slower.
layout(constant_id = 2) const bool UNROLLED = false;
layout(std430, binding = 0) readonly buffer Q { ELEMENT q[]; };   // [TQ, HQ, D]
layout(std430, binding = 1) readonly buffer K { ELEMENT k[]; };   // [>= L, HKV, D]
layout(std430, binding = 2) readonly buffer V { ELEMENT v[]; };   // [>= L, HKV, D]
layout(std430, binding = 3) writeonly buffer O { ELEMENT o[]; };  // [TQ, HQ, D]
layout(std430, binding = 4) readonly buffer Start { uint start[]; };  // [1] with FROM_START
layout(push_constant) uniform Push {
  uint tq; uint hq; uint hkv; uint d; uint l; float scale; uint seq_tokens; uint cache_rows;
} p;

// Rows of vec4 (the head dimension zero-padded to a multiple of 4); query and key rows padded by
// one vec4, so the eight invocations of a quarter subgroup hit distinct banks.
const uint BQ = 16, BK = 16, MOST_D = 128, ROW4 = MOST_D / 4, PADDED4 = ROW4 + 1;
const float LOWEST = -3.402823466e38;
shared vec4 s_q[BQ * PADDED4];
shared vec4 s_k[BK * PADDED4];
shared vec4 s_v[BK * ROW4];
shared float s_s[BQ * BK];  // scores, then weights
shared float s_m[BQ];
shared float s_l[BQ];
shared float s_correction[BQ];

const uint TILE_SHARE = BK * MOST_D / 256;  // tile elements an invocation stages

// Elements lane + 256 i of the key and value tile [first, first + count) (zeros past the keys and
// the head dimension).
void fetch_tile(uint first, uint count, uint base, uint g, uint d4, out float key_part[TILE_SHARE],
                out float value_part[TILE_SHARE]) {
  const uint lane = gl_LocalInvocationID.x, d = p.d;
  [[unroll]] for (uint i = 0; i < TILE_SHARE; ++i) {
    const uint index = lane + 256 * i, key = index / (4 * d4), e = index % (4 * d4);
    const uint at = ((base + first + key) * p.hkv + g) * d + e;
    const bool real = index < BK * 4 * d4 && key < count && e < d;
    key_part[i] = real ? float(k[at]) : 0.0;
    value_part[i] = real ? float(v[at]) : 0.0;
  }
}

void main() {
  const uint lane = gl_LocalInvocationID.x, h = gl_WorkGroupID.y;
  const uint blocks = (p.seq_tokens + BQ - 1) / BQ;
  const uint b = gl_WorkGroupID.x / blocks, at0 = (gl_WorkGroupID.x % blocks) * BQ;
  const uint g = h / (p.hq / p.hkv), d = p.d, d4 = (d + 3) / 4;
  const uint l = FROM_START ? min(start[0] + p.seq_tokens, p.cache_rows) : p.l;
  const uint rows = min(BQ, p.seq_tokens - at0);
  const uint most_keys = visible_keys(CAUSAL, l, at0 + rows - 1, p.seq_tokens);  // the block's last query sees the most
  const uint base = b * p.cache_rows, first_row = b * p.seq_tokens + at0;
  for (uint index = lane; index < BQ * 4 * d4; index += 256) {
    const uint row = index / (4 * d4), e = index % (4 * d4);
    s_q[row * PADDED4 + e / 4][e % 4] = row < rows && e < d ? float(q[((first_row + row) * p.hq + h) * d + e]) : 0.0;
  }
  if (lane < BQ) {
    s_m[lane] = LOWEST;
    s_l[lane] = 0.0;
  }
  // Roles: scoring (score_row, score_key); values (value_row, vec4 value_dim + 16 t, t < 2).
  const uint score_row = lane / BK, score_key = lane % BK;
  const uint value_row = lane / 16, value_dim = lane % 16;
  const uint my_keys = score_row < rows ? visible_keys(CAUSAL, l, at0 + score_row, p.seq_tokens) : 0;
  vec4 acc[2] = vec4[2](vec4(0.0), vec4(0.0));
  // Each invocation stages elements lane + 256 i (i < TILE_SHARE) of a tile: the next tile's are
  // requested from memory before the current one is computed, so their latency overlaps it.
  float next_k[TILE_SHARE], next_v[TILE_SHARE];
  fetch_tile(0, min(BK, most_keys), base, g, d4, next_k, next_v);
  for (uint first = 0; first < most_keys; first += BK) {
    const uint count = min(BK, most_keys - first);
    barrier();  // the previous tile's keys, values and weights are used
    [[unroll]] for (uint i = 0; i < TILE_SHARE; ++i) {
      const uint index = lane + 256 * i, key = index / (4 * d4), e = index % (4 * d4);
      if (index < BK * 4 * d4) {
        s_k[key * PADDED4 + e / 4][e % 4] = next_k[i];
        s_v[key * ROW4 + e / 4][e % 4] = next_v[i];
      }
    }
    if (first + BK < most_keys) fetch_tile(first + BK, min(BK, most_keys - first - BK), base, g, d4, next_k, next_v);
    barrier();
    float score = 0.0;
    if (UNROLLED) {
      [[unroll]] for (uint c = 0; c < ROW4; ++c)
        if (c < d4) score += dot(s_q[score_row * PADDED4 + c], s_k[score_key * PADDED4 + c]);
    } else {
      for (uint c = 0; c < d4; ++c) score += dot(s_q[score_row * PADDED4 + c], s_k[score_key * PADDED4 + c]);
    }
    s_s[lane] = first + score_key < my_keys ? score * p.scale : LOWEST;
    barrier();
    if (lane < BQ) {  // row `lane`: new max, weights, running sum, in key order
      const float old_max = s_m[lane];
      float m = old_max;
      [[unroll]] for (uint key = 0; key < BK; ++key) m = max(m, s_s[lane * BK + key]);
      float sum = 0.0;
      [[unroll]] for (uint key = 0; key < BK; ++key) {
        const float s = s_s[lane * BK + key];
        const float w = s == LOWEST ? 0.0 : exp(s - m);
        s_s[lane * BK + key] = w;
        sum += w;
      }
      const float correction = old_max == LOWEST ? 0.0 : exp(old_max - m);
      s_l[lane] = s_l[lane] * correction + sum;
      s_m[lane] = m;
      s_correction[lane] = correction;
    }
    barrier();
    const float correction = s_correction[value_row];
    acc[0] *= correction;
    acc[1] *= correction;
    if (UNROLLED) {
      [[unroll]] for (uint key = 0; key < BK; ++key)
        if (key < count) {
          const float w = s_s[value_row * BK + key];
          acc[0] += w * s_v[key * ROW4 + value_dim];
          acc[1] += w * s_v[key * ROW4 + value_dim + 16];
        }
    } else {
      for (uint key = 0; key < count; ++key) {
        const float w = s_s[value_row * BK + key];
        acc[0] += w * s_v[key * ROW4 + value_dim];
        acc[1] += w * s_v[key * ROW4 + value_dim + 16];
      }
    }
  }
  barrier();  // s_l is written (also where no tile ran)
  if (value_row < rows) {
    const float total = s_l[value_row];
    [[unroll]] for (uint t = 0; t < 2; ++t)
      [[unroll]] for (uint c = 0; c < 4; ++c) {
        const uint e = 4 * (value_dim + 16 * t) + c;
        if (e < d) o[((first_row + value_row) * p.hq + h) * d + e] = ELEMENT(total > 0.0 ? acc[t][c] / total : 0.0);
      }
  }
}
