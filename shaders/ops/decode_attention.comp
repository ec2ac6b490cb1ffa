#version 450
//! variant f32
//! variant f32_kv16 KV_F16
// One decode step's attention in one dispatch (float32): for B sequences of one new token each,
// sequence b's at position P = start[b] (start[0] for all where start holds one value),
//   k_cache[c, P] = rope(k[b]),  v_cache[c, P] = v[b]            (rope as in rope_append.comp)
// in cache sequence c = b, or c = start[SLOTS + b] where start holds B positions and then B cache
// slots (a slot past the caches' C reads the last and writes nothing),
//   out[b, h] = softmax(rope(q[b, h]) . K^T / sqrt(D)) V         over cache rows [0, min(P + 1,
// ROWS))
// so the steps rope_append + attention_cached make, with each key and value row read once for
// the G = HQ / HKV query heads that share it. Workgroup (g, s, b) takes keys [SPLIT s, SPLIT s +
// SPLIT) of KV head g: it scores them (PARTS invocations a key), takes their softmax weights and
// value sums, and writes its max m, sum of exp(score - m) and weighted values for each of its G
// heads. The workgroup holding key P computes that key and value itself (and appends them).
// The last workgroup of (g, b) to finish, counted by an atomic, then merges the splits:
// out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), each invocation one output vector over a
// share of the splits in registers (docs/PERFORMANCE.md: a merge through shared memory with a
// barrier a step took 3.4 us of an 8.3 us dispatch), and resets the counter for the next step.
// Needs D % 4 == 0, D <= 256 and G <= 8 (decode_attention falls back otherwise), and
// G * SPLIT <= 256. KV_F16: the caches hold float16, and the new key and value are rounded to it
// before this step uses them, as later steps read them.
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "../quantize/quantize_common.glsl"
#include "rope_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint G = 1;  // query heads a KV head serves
layout(std430, binding = 0) readonly buffer Q { float q[]; };          // [B, HQ, D]
layout(std430, binding = 1) readonly buffer K { float k[]; };          // [B, HKV, D]
layout(std430, binding = 2) readonly buffer V { float v[]; };          // [B, HKV, D]
layout(std430, binding = 3) readonly buffer Cos { float cos_table[]; };
layout(std430, binding = 4) readonly buffer Sin { float sin_table[]; };
layout(std430, binding = 5) buffer KCache { KV_ELEMENT k_cache[]; };  // [B, ROWS, HKV, D]
layout(std430, binding = 6) buffer VCache { KV_ELEMENT v_cache[]; };
// the k_cache tensor
layout(std430, binding = 7) readonly buffer KCache4 { KV_ELEMENT4 k_cache4[]; };
layout(std430, binding = 8) readonly buffer Start { uint start[]; };
// [B, HQ, splits, 4 + D]: m, l, -, -, sums
layout(std430, binding = 9) coherent buffer Partial { float partial[]; };
// the same tensor
layout(std430, binding = 13) coherent readonly buffer Partial4 { vec4 partial4[]; };
// [B, HKV], zero between steps
layout(std430, binding = 10) coherent buffer Counter { uint counter[]; };
layout(std430, binding = 11) writeonly buffer Out { float o[]; };      // [B, HQ, D]
// the v_cache tensor
layout(std430, binding = 12) readonly buffer VCacheRead { KV_ELEMENT v_cache_read[]; };
layout(push_constant) uniform Push {
  uint hq; uint hkv; uint cache_rows; uint table_rows; uint splits; float scale;
  uint start_stride;  // 0: start[0] for every sequence, 1: start[b]
  uint slots;         // 0: cache sequence b; else start[slots + b]
  uint cache_batch;   // C
} p;

// Keys a workgroup scores (16, 32 or 64; G * SPLIT <= 256), PARTS invocations a key.
layout(constant_id = 1) const uint SPLIT = 32;
// The head dimension D (D % 4 == 0, D <= 256), a specialization constant because it sizes the
// per-invocation register arrays below: sized for 256 whatever D, the workgroups take twice the
// registers, and half as many share a multiprocessor.
layout(constant_id = 2) const uint HEAD_DIM = 256;
const uint PARTS = 256 / SPLIT;
// vec4 of a key row one invocation scores
const uint MOST_VECTORS = (HEAD_DIM / 4 + PARTS - 1) / PARTS;
const uint VALUE_SUBSETS = HEAD_DIM >= 256 ? 1 : 256 / HEAD_DIM;  // invocations sharing a dimension
// keys' values one invocation holds
const uint VALUE_SLOTS = (SPLIT - 1) / VALUE_SUBSETS + 1;
const float LOWEST = -3.402823466e38;
shared vec4 s_q4[G * 64];  // the rotated queries, a head's D values after another's
// The new key and value as the cache holds them: in its element type, so that float16 values are
// rounded here (a conversion to float16 and back in registers was elided on the H100).
shared KV_ELEMENT s_k_new[256];
shared KV_ELEMENT s_v_new[256];
shared float s_part[G * 256];
shared vec4 s_p4[G * SPLIT / 4];  // G rows of SPLIT scores, then weights (SPLIT % 4 == 0)
shared vec2 s_merge_stats[256];  // the merge's (m, l) and value sums of each invocation's splits
shared vec4 s_merge_sums[256];
shared bool s_last;

// Output vector `i` (dimensions 4i .. 4i + 3) of row `row` (sequence b, head h: b * HQ + h).
void store_output(uint row, uint i, vec4 value) {
  const uint at = row * HEAD_DIM + 4 * i;
  o[at] = value.x;
  o[at + 1] = value.y;
  o[at + 2] = value.z;
  o[at + 3] = value.w;
}

void main() {
  const uint lane = gl_LocalInvocationID.x;
  // The grid is (KV head, split, sequence): the live splits' workgroups come first whatever the
  // cache's size, so that they start before the workgroups past the context, which return.
  const uint g = gl_WorkGroupID.x, split = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
  const uint d = HEAD_DIM, half_d = d / 2, d4 = d / 4;
  const uint position = start[b * p.start_stride];
  const uint keys = min(position + 1, p.cache_rows);
  const uint live = (keys + SPLIT - 1) / SPLIT;
  if (split >= live) return;  // the whole workgroup: no keys here (nor counted)
  const uint first = split * SPLIT, count = min(SPLIT, keys - first);
  const bool holds_new = position < p.cache_rows && position >= first && position < first + count;
  const uint new_key = position - first;  // meaningful where holds_new
  const uint row_stride = p.hkv * d;      // floats from one cache row to the next
  const uint slot = p.slots == 0 ? b : start[p.slots + b];
  const bool owned = slot < p.cache_batch;
  const uint cache_sequence = min(slot, p.cache_batch - 1);  // a slot past the caches: the last
  // Key `first` of KV head g.
  const uint cache_base = (cache_sequence * p.cache_rows + first) * row_stride + g * d;

  // Request this invocation's key vectors and value entries at once (not the new key's).
  const uint j = lane / PARTS, part = lane % PARTS;
  vec4 key_vectors[MOST_VECTORS];
  [[unroll]] for (uint t = 0; t < MOST_VECTORS; ++t) {
    const uint c = part + PARTS * t;
    key_vectors[t] = j < count && c < d4 && !(holds_new && j == new_key)
                         ? vec4(k_cache4[(cache_base + j * row_stride) / 4 + c]) : vec4(0.0);
  }
  const uint subsets = VALUE_SUBSETS, e = lane % d, subset = lane / d;
  float values[VALUE_SLOTS];
  [[unroll]] for (uint t = 0; t < VALUE_SLOTS; ++t) {
    const uint key = subset * VALUE_SLOTS + t;
    values[t] = subset < subsets && key < count && !(holds_new && key == new_key)
                    ? float(v_cache_read[cache_base + key * row_stride + e]) : 0.0;
  }

  // The G rotated queries, and the new key and value where this workgroup holds them.
  const uint table = min(position, p.table_rows - 1) * half_d;
  for (uint index = lane; index < G * half_d; index += 256) {
    const uint head = index / half_d, i = index % half_d;
    const uint at = (b * p.hq + g * G + head) * d + i;
    const float c = cos_table[table + i], s = sin_table[table + i];
    const vec2 r = rope_rotate(q[at], q[at + half_d], c, s);
    s_q4[(head * d + i) / 4][i % 4] = r.x;
    s_q4[(head * d + i + half_d) / 4][(i + half_d) % 4] = r.y;
  }
  if (holds_new) {
    const uint from = (b * p.hkv + g) * d, to = cache_base + new_key * row_stride;
    if (lane < half_d) {
      const float c = cos_table[table + lane], s = sin_table[table + lane];
      const vec2 r = rope_rotate(k[from + lane], k[from + lane + half_d], c, s);
      const KV_ELEMENT low = KV_ELEMENT(r.x), high = KV_ELEMENT(r.y);
      s_k_new[lane] = low;
      s_k_new[lane + half_d] = high;
      if (owned) {
        k_cache[to + lane] = low;
        k_cache[to + lane + half_d] = high;
      }
    }
    if (lane < d) {
      const KV_ELEMENT x = KV_ELEMENT(v[from + lane]);
      s_v_new[lane] = x;
      if (owned) v_cache[to + lane] = x;
    }
  }
  barrier();

  // Scores: invocation (j, part) sums its vectors of key j against each query, then the PARTS
  // parts are added in order.
  if (holds_new && j == new_key)
    [[unroll]] for (uint t = 0; t < MOST_VECTORS; ++t) {
      const uint c = part + PARTS * t;
      if (c < d4)
        key_vectors[t] =
            vec4(float(s_k_new[4 * c]), float(s_k_new[4 * c + 1]), float(s_k_new[4 * c + 2]),
                 float(s_k_new[4 * c + 3]));
    }
  [[unroll]] for (uint head = 0; head < G; ++head) {
    float s = 0.0;
    [[unroll]] for (uint t = 0; t < MOST_VECTORS; ++t) {
      const uint c = part + PARTS * t;
      if (c < d4) {
        s += dot(s_q4[head * d4 + c], key_vectors[t]);
      }
    }
    s_part[head * 256 + lane] = s;
  }
  barrier();
  // Softmax weights of each head over this split's keys, a subgroup a head (no barrier between the
  // steps: a lane reads back only the scores it wrote): each key's PARTS parts added in order, the
  // max and the sum of exp(score - max) by subgroup operations.
  const uint record_stride = p.splits * (d + 4);
  const uint record0 = ((b * p.hq + g * G) * p.splits + split) * (d + 4);  // head 0 of the group
  for (uint head = gl_SubgroupID; head < G; head += gl_NumSubgroups) {
    float top = LOWEST;
    for (uint key = gl_SubgroupInvocationID; key < SPLIT; key += gl_SubgroupSize) {
      float total = 0.0;
      for (uint t = 0; t < PARTS; ++t) total += s_part[head * 256 + key * PARTS + t];
      const float score = key < count ? total * p.scale : LOWEST;
      const uint at = head * SPLIT + key;
      s_p4[at / 4][at % 4] = score;
      top = max(top, score);
    }
    top = subgroupMax(top);
    float sum = 0.0;
    for (uint key = gl_SubgroupInvocationID; key < SPLIT; key += gl_SubgroupSize) {
      const uint at = head * SPLIT + key;
      const float w = key < count ? exp(s_p4[at / 4][at % 4] - top) : 0.0;
      s_p4[at / 4][at % 4] = w;
      sum += w;
    }
    sum = subgroupAdd(sum);
    if (subgroupElect()) {
      partial[record0 + head * record_stride] = top;
      partial[record0 + head * record_stride + 1] = sum;
    }
  }
  barrier();
  // Value sums: invocation (subset, e) takes VALUE_SLOTS keys from subset * VALUE_SLOTS of
  // dimension e (weights and values past the split's keys are zero), their weights four at a time
  // where VALUE_SLOTS % 4 == 0.
  if (holds_new)
    [[unroll]] for (uint t = 0; t < VALUE_SLOTS; ++t)
      if (subset < subsets && subset * VALUE_SLOTS + t == new_key) values[t] = float(s_v_new[e]);
  if (subset < subsets) {
    [[unroll]] for (uint head = 0; head < G; ++head) {
      float a = 0.0;
      if (VALUE_SLOTS % 4 == 0) {
        [[unroll]] for (uint t = 0; t < VALUE_SLOTS; t += 4) {
          const uint key = subset * VALUE_SLOTS + t;
          if (key < SPLIT) {
            const vec4 w = s_p4[(head * SPLIT + key) / 4];
            a += w.x * values[t];
            a += w.y * values[t + 1];
            a += w.z * values[t + 2];
            a += w.w * values[t + 3];
          }
        }
      } else {
        [[unroll]] for (uint t = 0; t < VALUE_SLOTS; ++t) {
          const uint key = subset * VALUE_SLOTS + t, at = head * SPLIT + key;
          if (key < SPLIT) a += s_p4[at / 4][at % 4] * values[t];
        }
      }
      s_part[head * 256 + lane] = a;
    }
  }
  barrier();
  for (uint index = lane; index < G * d; index += 256) {
    const uint head = index / d, dim = index % d;
    float a = 0.0;
    for (uint t = 0; t < subsets; ++t) a += s_part[head * 256 + t * d + dim];
    partial[record0 + head * record_stride + 4 + dim] = a;
  }

  // The last workgroup of (g, b) merges.
  memoryBarrierBuffer();
  barrier();
  if (lane == 0) {
    const uint done = atomicAdd(counter[b * p.hkv + g], 1u);
    s_last = done == live - 1;
    // every live workgroup has counted: ready for the next step
    if (s_last) counter[b * p.hkv + g] = 0u;
  }
  barrier();
  if (!s_last) return;
  memoryBarrierBuffer();
  const uint stride4 = (d + 4) / 4;  // vec4 from one split's record to the next
  // Merge: invocation (sub, item) combines output vector `item` (4 dimensions of one head) over
  // the live splits sub, sub + merge_subsets, ..., eight at a time: their records requested at
  // once, rescaled once to the batch's maximum, then added in order. Where the outputs leave
  // invocations over, merge_subsets of them share the splits, their (m, l, sum) combined through
  // shared memory.
  const uint items = G * d4, merge_subsets = items >= 256 ? 1 : 256 / items;
  const uint sub = items >= 256 ? 0 : lane / items;
  for (uint item = items >= 256 ? lane : lane % items; item < items && sub < merge_subsets;
       item += 256) {
    const uint record = (b * p.hq + g * G + item / d4) * p.splits;  // split 0's, in records
    float m = LOWEST, l = 0.0;
    vec4 sum = vec4(0.0);
    for (uint first_split = sub; first_split < live; first_split += 8 * merge_subsets) {
      vec4 stats[8], sums[8];  // (m, l, -, -) and the value sums of eight splits
      [[unroll]] for (uint u = 0; u < 8; ++u) {
        const uint at = (record + min(first_split + u * merge_subsets, live - 1)) * stride4;
        stats[u] = partial4[at];
        sums[u] = partial4[at + 1 + item % d4];
      }
      float top = m;
      [[unroll]] for (uint u = 0; u < 8; ++u)
        if (first_split + u * merge_subsets < live) top = max(top, stats[u].x);
      const float correction = exp(m - top);
      l *= correction;
      sum *= correction;
      [[unroll]] for (uint u = 0; u < 8; ++u)
        if (first_split + u * merge_subsets < live) {
          const float w = exp(stats[u].x - top);
          l += stats[u].y * w;
          sum += sums[u] * w;
        }
      m = top;
    }
    if (merge_subsets == 1) {
      store_output(b * p.hq + g * G + item / d4, item % d4, l > 0.0 ? sum / l : vec4(0.0));
    } else {
      s_merge_stats[lane] = vec2(m, l);
      s_merge_sums[lane] = sum;
    }
  }
  if (merge_subsets > 1) {  // uniform: one output vector an invocation
    barrier();
    if (lane < items) {
      float top = LOWEST;
      for (uint t = 0; t < merge_subsets; ++t) top = max(top, s_merge_stats[t * items + lane].x);
      float l = 0.0;
      vec4 sum = vec4(0.0);
      for (uint t = 0; t < merge_subsets; ++t) {
        const vec2 stats = s_merge_stats[t * items + lane];
        const float w = exp(stats.x - top);
        l += stats.y * w;
        sum += s_merge_sums[t * items + lane] * w;
      }
      store_output(b * p.hq + g * G + lane / d4, lane % d4, l > 0.0 ? sum / l : vec4(0.0));
    }
  }
}
