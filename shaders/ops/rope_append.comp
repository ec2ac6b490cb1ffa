#version 450
//! variant f32
//! variant f32_kv16 KV_F16
// One decoder step's rotary embedding and KV-cache append in one dispatch (float32): for rows
// [B * T] of new tokens, row t of sequence b = t / T at position start[b] + t % T
// (start[0] for every sequence where start holds one value),
//   q_out = rope(q)                      [B * T, HQ, D]
//   k_cache[c, position] = rope(k)       caches [C, CACHE_ROWS, HKV, D]
//   v_cache[c, position] = v
// where c, the cache sequence, is b, or start[SLOTS + b] where start holds B positions and then
// B cache slots (SLOTS = B; a slot past the caches' C is not written).
// with rope as in shaders/ops/rope.comp (half-split, float64 angle tables [TABLE_ROWS, D / 2]).
// Rows that would land past a cache's end are not written. KV_F16: the caches hold float16 (each
// value rounded to nearest, ties to even).
#extension GL_GOOGLE_include_directive : require
#include "../quantize/quantize_common.glsl"
#include "rope_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) readonly buffer Cos { float cos_table[]; };
layout(std430, binding = 4) readonly buffer Sin { float sin_table[]; };
layout(std430, binding = 5) writeonly buffer QOut { float q_out[]; };
layout(std430, binding = 6) writeonly buffer KCache { KV_ELEMENT k_cache[]; };
layout(std430, binding = 7) writeonly buffer VCache { KV_ELEMENT v_cache[]; };
layout(std430, binding = 8) readonly buffer Start { uint start[]; };
layout(push_constant) uniform Push {
  uint rows; uint hq; uint hkv; uint d; uint period; uint cache_rows; uint table_rows;
  uint start_stride;  // 0: start[0] for every sequence, 1: start[b]
  uint slots;         // 0: cache sequence b; else start[slots + b]
  uint cache_batch;   // C
} p;

// The cache sequence of step sequence b, or p.cache_batch where none is to be written.
uint cache_sequence(uint b) { return p.slots == 0 ? b : min(start[p.slots + b], p.cache_batch); }

void main() {
  const uint half_d = p.d / 2;
  const uint q_pairs = p.rows * p.hq * half_d, k_pairs = p.rows * p.hkv * half_d;
  const uint kv_row = p.hkv * p.d, total = q_pairs + k_pairs + p.rows * kv_row;
  for (uint index = gl_GlobalInvocationID.x; index < total; index += gl_NumWorkGroups.x * 256) {
    if (index < q_pairs + k_pairs) {
      const bool is_q = index < q_pairs;
      const uint j = is_q ? index : index - q_pairs, heads = is_q ? p.hq : p.hkv;
      const uint i = j % half_d, th = j / half_d, t = th / heads, h = th % heads;
      const uint position = start[t / p.period * p.start_stride] + t % p.period;
      const uint table = min(position, p.table_rows - 1) * half_d + i;
      const float c = cos_table[table], s = sin_table[table];
      const uint at = th * p.d + i;
      const float a = is_q ? q[at] : k[at], b = is_q ? q[at + half_d] : k[at + half_d];
      const vec2 r = rope_rotate(a, b, c, s);
      if (is_q) {
        q_out[at] = r.x;
        q_out[at + half_d] = r.y;
      } else if (position < p.cache_rows && cache_sequence(t / p.period) < p.cache_batch) {
        const uint to = ((cache_sequence(t / p.period) * p.cache_rows + position) * p.hkv + h) *
                            p.d + i;
        k_cache[to] = KV_ELEMENT(r.x);
        k_cache[to + half_d] = KV_ELEMENT(r.y);
      }
    } else {
      const uint j = index - q_pairs - k_pairs, t = j / kv_row, e = j % kv_row;
      const uint position = start[t / p.period * p.start_stride] + t % p.period;
      const uint c = cache_sequence(t / p.period);
      if (position < p.cache_rows && c < p.cache_batch)
        v_cache[(c * p.cache_rows + position) * kv_row + e] = KV_ELEMENT(v[j]);
    }
  }
}
