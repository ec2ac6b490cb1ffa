#version 450
//! variant f32
//! variant f16 INPUT_F16
//! variant f32_kv16 KV_F16
// attention.comp for many queries (prefill), D <= 256: workgroup (block, h) takes BQ = 16 * ROWS
// consecutive query rows of one sequence and head h (ROWS = 2, or 4 for long sequences up to
// D = 128) and walks the keys in tiles of BK keys (the host picks 32, 16 or 8 by shared
// memory and length), each staged in shared memory once for all its queries. Invocation (row
// group rg, lane-in-group kg), rg < 16, kg < 8, owns rows ROWS rg .. ROWS rg + ROWS - 1: their
// scores against keys kg + 8 j of a tile and their output vectors kg + 8 j. A row's eight
// invocations are eight neighbours in one subgroup: each holds the row's running max and sum
// (online softmax) in registers, and they combine a tile's max and sum by shuffles (a butterfly,
// so all eight get the same values). Scores: the eight hold the rows in registers, an eighth of
// the vectors each (kg + 8 i), score every key of the tile on their part, and sum the partial
// scores of eight keys at a time across the eight in three halving shuffles, after which each
// holds its own keys' sums (fewer shared-memory reads a multiply-add than whole rows from shared
// memory). Per tile: the keys into shared memory, scores, softmax, weights into shared
// memory, then the values into the same shared memory (their loads in flight during the scores)
// and the weighted sum. Layouts, the causal rule, batched caches and FROM_START as in
// attention.comp; a query that sees no key gets zeros. Needs subgroups of a power of two from 8
// with shuffles.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "ops_common.glsl"
layout(local_size_x = 128) in;
layout(constant_id = 0) const bool CAUSAL = true;
layout(constant_id = 1) const bool FROM_START = false;
layout(constant_id = 2) const uint BK = 32;  // keys a tile: 8 or a multiple of 8 up to 32
layout(constant_id = 3) const uint D4 = 32;  // vectors of 4 a head row: ceil(D / 4) <= 64
layout(constant_id = 6) const uint ROWS = 2;  // query rows a row group: 2 or 4 (D <= 128)
layout(std430, binding = 0) readonly buffer Q { ELEMENT q[]; };   // [TQ, HQ, D]
layout(std430, binding = 1) readonly buffer K { KV_ELEMENT k[]; };   // [>= L, HKV, D]
layout(std430, binding = 2) readonly buffer V { KV_ELEMENT v[]; };   // [>= L, HKV, D]
layout(std430, binding = 3) writeonly buffer O { ELEMENT o[]; };  // [TQ, HQ, D]
layout(std430, binding = 4) readonly buffer Start { uint start[]; };  // [1] or [B] with FROM_START
layout(push_constant) uniform Push {
  uint tq; uint hq; uint hkv; uint d; uint l; float scale; uint seq_tokens; uint cache_rows;
  uint start_stride;  // 0: start[0] for every sequence, 1: start[b]
  uint slots;  // 0: sequence b's keys are cache sequence b's; else start[slots + b]'s
  uint cache_batch;
} p;

// The cache sequence holding sequence b's keys: b, or its slot (the last where past the caches).
uint cache_sequence(uint b) {
  return FROM_START && p.slots != 0 ? min(start[p.slots + b], p.cache_batch - 1) : b;
}

const uint GROUP = 8, BQ = 16 * ROWS, KEYS = BK / GROUP;
// Rows of D4 vectors padded to a multiple of 8 (128 bytes); vector c of row r sits at
// c ^ (r & 7), so the eight rows or keys a subgroup's clusters read at once hit distinct banks.
const uint ROW = (D4 + 7) / 8 * 8, OUT4 = ROW / GROUP;  // OUT4: vectors of a row an invocation owns
const float LOWEST = -3.402823466e38;
shared vec4 s_kv[BK * ROW];          // the tile's keys, then its values
shared float s_p[BQ * (BK + 1)];     // the tile's weights, a row padded by one
const uint SHARE = (BK * D4 + 127) / 128;  // tile vectors an invocation stages

float group_max(float x) {
  x = max(x, subgroupShuffleXor(x, 1));
  x = max(x, subgroupShuffleXor(x, 2));
  return max(x, subgroupShuffleXor(x, 4));
}

float group_sum(float x) {
  x += subgroupShuffleXor(x, 1);
  x += subgroupShuffleXor(x, 2);
  return x + subgroupShuffleXor(x, 4);
}

uint slot(uint row, uint c) { return row * ROW + (c ^ (row & 7u)); }

// Vector c of key `key` of the tile at `first` (zeros past the keys and the head dimension).
vec4 fetch(bool values, uint first, uint count, uint base, uint g, uint key, uint c) {
  vec4 r = vec4(0.0);
  if (key < count) {
    const uint at = ((base + first + key) * p.hkv + g) * p.d + 4 * c;
    [[unroll]] for (uint i = 0; i < 4; ++i)
      if (4 * c + i < p.d) r[i] = float(values ? v[at + i] : k[at + i]);
  }
  return r;
}

void fetch_tile(bool values, uint first, uint count, uint base, uint g, out vec4 part[SHARE]) {
  [[unroll]] for (uint i = 0; i < SHARE; ++i) {
    const uint e = gl_LocalInvocationID.x + 128 * i;
    part[i] = e < BK * D4 ? fetch(values, first, count, base, g, e / D4, e % D4) : vec4(0.0);
  }
}

void store_tile(vec4 part[SHARE]) {
  [[unroll]] for (uint i = 0; i < SHARE; ++i) {
    const uint e = gl_LocalInvocationID.x + 128 * i;
    if (e < BK * D4) s_kv[slot(e / D4, e % D4)] = part[i];
  }
}

void main() {
  const uint h = gl_WorkGroupID.y;
  const uint blocks = (p.seq_tokens + BQ - 1) / BQ;
  // Causal blocks late in a sequence see the most keys: they are dispatched first.
  const uint block = CAUSAL ? blocks - 1 - gl_WorkGroupID.x % blocks : gl_WorkGroupID.x % blocks;
  const uint b = gl_WorkGroupID.x / blocks, at0 = block * BQ;
  const uint g = h / (p.hq / p.hkv), d = p.d;
  const uint l = FROM_START ? min(start[b * p.start_stride] + p.seq_tokens, p.cache_rows) : p.l;
  const uint rows = min(BQ, p.seq_tokens - at0);
  // the block's last query sees the most
  const uint most_keys = visible_keys(CAUSAL, l, at0 + rows - 1, p.seq_tokens);
  const uint base = cache_sequence(b) * p.cache_rows, first_row = b * p.seq_tokens + at0;
  // Roles from the subgroup layout, so that a row's eight invocations share a subgroup.
  const uint t = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
  const uint rg = t / GROUP, kg = t % GROUP, r0 = ROWS * rg;
  vec4 q_part[ROWS][OUT4];  // vectors kg + 8 i of rows r0 .. r0 + ROWS - 1
  [[unroll]] for (uint r = 0; r < ROWS; ++r)
    [[unroll]] for (uint i = 0; i < OUT4; ++i) {
      const uint c = kg + GROUP * i;
      q_part[r][i] = vec4(0.0);
      if (r0 + r < rows && c < D4)
        [[unroll]] for (uint e = 0; e < 4; ++e)
          if (4 * c + e < d)
            q_part[r][i][e] = float(q[((first_row + r0 + r) * p.hq + h) * d + 4 * c + e]);
    }
  uint my_keys[ROWS];
  float m[ROWS], total[ROWS];
  vec4 acc[ROWS][OUT4];
  [[unroll]] for (uint r = 0; r < ROWS; ++r) {
    my_keys[r] = r0 + r < rows ? visible_keys(CAUSAL, l, at0 + r0 + r, p.seq_tokens) : 0;
    m[r] = LOWEST;
    total[r] = 0.0;
    [[unroll]] for (uint j = 0; j < OUT4; ++j) acc[r][j] = vec4(0.0);
  }
  vec4 part[SHARE];
  fetch_tile(false, 0, min(BK, most_keys), base, g, part);
  for (uint first = 0; first < most_keys; first += BK) {
    const uint count = min(BK, most_keys - first);
    barrier();  // the previous tile's values and weights are used
    store_tile(part);
    fetch_tile(true, first, count, base, g, part);  // the values, awaited after the scores
    barrier();
    float score[ROWS][KEYS];
    [[unroll]] for (uint r = 0; r < ROWS; ++r)
      [[unroll]] for (uint j = 0; j < KEYS; ++j) score[r][j] = 0.0;
    {
      // Eight keys at a time: the partial sums of the rows for keys 8 j + x (x < 8) on this
      // invocation's part, then summed across the eight in three halving exchanges, after
      // which invocation kg holds key 8 j + kg's (the scores' usual layout).
// One halving exchange of the partial sums with the invocation H lanes away (H = 4, 2, 1).
#define HALVE(part, H)                                                                \
      {                                                                               \
        const bool upper = (kg & H) != 0;                                             \
        [[unroll]] for (uint r = 0; r < ROWS; ++r)                                    \
          [[unroll]] for (uint x = 0; x < H; ++x) {                                   \
            const float sent = upper ? part[r][x] : part[r][x + H];                   \
            const float kept = upper ? part[r][x + H] : part[r][x];                   \
            part[r][x] = kept + subgroupShuffleXor(sent, H);                          \
          }                                                                           \
      }
#define SPLIT_STEP                                                                   \
      {                                                                              \
        float part[ROWS][GROUP];                                                     \
        [[unroll]] for (uint x = 0; x < GROUP; ++x) {                                \
          [[unroll]] for (uint r = 0; r < ROWS; ++r) part[r][x] = 0.0;               \
          [[unroll]] for (uint i = 0; i < OUT4; ++i) {                               \
            const uint c = kg + GROUP * i;                                           \
            if (c < D4) {                                                            \
              const vec4 key = s_kv[slot(GROUP * j + x, c)];                         \
              [[unroll]] for (uint r = 0; r < ROWS; ++r)                             \
                part[r][x] += dot(q_part[r][i], key);                                \
            }                                                                        \
          }                                                                          \
        }                                                                            \
        HALVE(part, 4)                                                               \
        HALVE(part, 2)                                                               \
        HALVE(part, 1)                                                               \
        [[unroll]] for (uint r = 0; r < ROWS; ++r) score[r][j] = part[r][0];         \
      }
      [[unroll]] for (uint j = 0; j < KEYS; ++j) SPLIT_STEP  // score[r][j]: literal indices
    }
    [[unroll]] for (uint r = 0; r < ROWS; ++r) {
      float tile_max = LOWEST;
      [[unroll]] for (uint j = 0; j < KEYS; ++j) {
        score[r][j] = first + kg + GROUP * j < my_keys[r] ? score[r][j] * p.scale : LOWEST;
        tile_max = max(tile_max, score[r][j]);
      }
      const float new_max = max(m[r], group_max(tile_max));
      float sum = 0.0;
      [[unroll]] for (uint j = 0; j < KEYS; ++j) {
        const float w = score[r][j] == LOWEST ? 0.0 : exp(score[r][j] - new_max);
        s_p[(r0 + r) * (BK + 1) + kg + GROUP * j] = w;
        sum += w;
      }
      const float correction = m[r] == LOWEST ? 0.0 : exp(m[r] - new_max);
      total[r] = total[r] * correction + group_sum(sum);
      m[r] = new_max;
      [[unroll]] for (uint j = 0; j < OUT4; ++j) acc[r][j] *= correction;
    }
    barrier();  // the keys are used
    store_tile(part);
    if (first + BK < most_keys)
      fetch_tile(false, first + BK, min(BK, most_keys - first - BK), base, g, part);
    barrier();
    [[unroll]] for (uint key = 0; key < BK; ++key) {
      float w[ROWS];
      [[unroll]] for (uint r = 0; r < ROWS; ++r) w[r] = s_p[(r0 + r) * (BK + 1) + key];
      [[unroll]] for (uint j = 0; j < OUT4; ++j) {
        const uint c = kg + GROUP * j;
        if (c < D4) {
          const vec4 value = s_kv[slot(key, c)];
          [[unroll]] for (uint r = 0; r < ROWS; ++r) acc[r][j] += w[r] * value;
        }
      }
    }
  }
  [[unroll]] for (uint r = 0; r < ROWS; ++r) {
    if (r0 + r >= rows) continue;
    [[unroll]] for (uint j = 0; j < OUT4; ++j)
      [[unroll]] for (uint i = 0; i < 4; ++i) {
        const uint e = 4 * (kg + GROUP * j) + i;
        if (e < d)
          o[((first_row + r0 + r) * p.hq + h) * d + e] =
              ELEMENT(total[r] > 0.0 ? acc[r][j][i] / total[r] : 0.0);
      }
  }
}
