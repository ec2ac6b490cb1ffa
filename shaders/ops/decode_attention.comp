#version 450
// One decode step's attention in one dispatch (float32): for B sequences of one new token each,
// sequence b's at position P = start[b] (start[0] for all where start holds one value),
//   k_cache[b, P] = rope(k[b]),  v_cache[b, P] = v[b]            (rope as in rope_append.comp)
//   out[b, h] = softmax(rope(q[b, h]) . K^T / sqrt(D)) V         over cache rows [0, min(P + 1,
// ROWS))
// so the steps rope_append + attention_cached make, with each key and value row read once for
// the G = HQ / HKV query heads that share it. Workgroup (s, g, b) takes keys [SPLIT s, SPLIT s +
// SPLIT)
// of KV head g: it scores them (PARTS invocations a key), takes their softmax weights and
// value sums, and writes its max m, sum of exp(score - m) and weighted values for each of its G
// heads. The workgroup holding key P computes that key and value itself (and appends them).
// The last workgroup of (g, b) to finish, counted by an atomic, then merges the splits:
// out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), taking CHUNK splits at a time (maxima and
// totals by halving in shared memory, value sums as vec4 with eight loads in flight, rescaled as
// the running maximum grows), and resets the counter for the next step. Needs D % 4 == 0,
// D <= 256 and G <= 8 (decode_attention falls back otherwise), and G * SPLIT <= 256.
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#include "rope_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint G = 1;  // query heads a KV head serves
layout(std430, binding = 0) readonly buffer Q { float q[]; };          // [B, HQ, D]
layout(std430, binding = 1) readonly buffer K { float k[]; };          // [B, HKV, D]
layout(std430, binding = 2) readonly buffer V { float v[]; };          // [B, HKV, D]
layout(std430, binding = 3) readonly buffer Cos { float cos_table[]; };
layout(std430, binding = 4) readonly buffer Sin { float sin_table[]; };
layout(std430, binding = 5) buffer KCache { float k_cache[]; };        // [B, ROWS, HKV, D]
layout(std430, binding = 6) buffer VCache { float v_cache[]; };
layout(std430, binding = 7) readonly buffer KCache4 { vec4 k_cache4[]; };  // the k_cache tensor
layout(std430, binding = 8) readonly buffer Start { uint start[]; };
// [B, HQ, splits, 4 + D]: m, l, -, -, sums
layout(std430, binding = 9) coherent buffer Partial { float partial[]; };
// the same tensor
layout(std430, binding = 13) coherent readonly buffer Partial4 { vec4 partial4[]; };
// [B, HKV], zero between steps
layout(std430, binding = 10) coherent buffer Counter { uint counter[]; };
layout(std430, binding = 11) writeonly buffer Out { float o[]; };      // [B, HQ, D]
// the v_cache tensor
layout(std430, binding = 12) readonly buffer VCacheRead { float v_cache_read[]; };
layout(push_constant) uniform Push {
  uint hq; uint hkv; uint cache_rows; uint table_rows; uint splits; float scale;
  uint start_stride;  // 0: start[0] for every sequence, 1: start[b]
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
shared float s_q[G * 256];
shared float s_k_new[256];
shared float s_v_new[256];
shared float s_part[G * 256];
shared float s_p[G * SPLIT];
shared float s_m[G];
shared float s_l[G];
shared float s_reduce[256];
const uint MERGE_PER_LANE = 2;  // splits whose (m, l) an invocation reads in each merge chunk
shared float s_w[256 * MERGE_PER_LANE];
shared vec4 s_sum4[256];
shared float s_grown[G];
shared float s_correction[G];
shared bool s_last;

// For each head h < G, the max (or sum) of s_reduce[h * SEGMENT + i] over i < SEGMENT (a power
// of two), by halving: deterministic, and in s_reduce[h * SEGMENT] afterwards.
void segment_reduce(uint segment, bool take_max) {
  const uint lane = gl_LocalInvocationID.x, i = lane % segment;
  for (uint stride = segment / 2; stride > 0; stride /= 2) {
    barrier();
    if (lane < G * segment && i < stride) {
      const float a = s_reduce[lane], b = s_reduce[lane + stride];
      s_reduce[lane] = take_max ? max(a, b) : a + b;
    }
  }
  barrier();
}

void main() {
  const uint lane = gl_LocalInvocationID.x;
  const uint split = gl_WorkGroupID.x, g = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
  const uint d = HEAD_DIM, half_d = d / 2, d4 = d / 4;
  const uint position = start[b * p.start_stride];
  const uint keys = min(position + 1, p.cache_rows);
  const uint live = (keys + SPLIT - 1) / SPLIT;
  if (split >= live) return;  // the whole workgroup: no keys here (nor counted)
  const uint first = split * SPLIT, count = min(SPLIT, keys - first);
  const bool holds_new = position < p.cache_rows && position >= first && position < first + count;
  const uint new_key = position - first;  // meaningful where holds_new
  const uint row_stride = p.hkv * d;      // floats from one cache row to the next
  const uint cache_base = (b * p.cache_rows + first) * row_stride + g * d;  // key `first`, head g

  // Request this invocation's key vectors and value entries at once (not the new key's).
  const uint j = lane / PARTS, part = lane % PARTS;
  vec4 key_vectors[MOST_VECTORS];
  [[unroll]] for (uint t = 0; t < MOST_VECTORS; ++t) {
    const uint c = part + PARTS * t;
    key_vectors[t] = j < count && c < d4 && !(holds_new && j == new_key)
                         ? k_cache4[(cache_base + j * row_stride) / 4 + c] : vec4(0.0);
  }
  const uint subsets = VALUE_SUBSETS, e = lane % d, subset = lane / d;
  float values[VALUE_SLOTS];
  [[unroll]] for (uint t = 0; t < VALUE_SLOTS; ++t) {
    const uint key = subset + t * subsets;
    values[t] = subset < subsets && key < count && !(holds_new && key == new_key)
                    ? v_cache_read[cache_base + key * row_stride + e] : 0.0;
  }

  // The G rotated queries, and the new key and value where this workgroup holds them.
  const uint table = min(position, p.table_rows - 1) * half_d;
  for (uint index = lane; index < G * half_d; index += 256) {
    const uint head = index / half_d, i = index % half_d;
    const uint at = (b * p.hq + g * G + head) * d + i;
    const float c = cos_table[table + i], s = sin_table[table + i];
    const vec2 r = rope_rotate(q[at], q[at + half_d], c, s);
    s_q[head * d + i] = r.x;
    s_q[head * d + i + half_d] = r.y;
  }
  if (holds_new) {
    const uint from = (b * p.hkv + g) * d, to = cache_base + new_key * row_stride;
    if (lane < half_d) {
      const float c = cos_table[table + lane], s = sin_table[table + lane];
      const vec2 r = rope_rotate(k[from + lane], k[from + lane + half_d], c, s);
      s_k_new[lane] = r.x;
      s_k_new[lane + half_d] = r.y;
      k_cache[to + lane] = r.x;
      k_cache[to + lane + half_d] = r.y;
    }
    if (lane < d) {
      const float x = v[from + lane];
      s_v_new[lane] = x;
      v_cache[to + lane] = x;
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
            vec4(s_k_new[4 * c], s_k_new[4 * c + 1], s_k_new[4 * c + 2], s_k_new[4 * c + 3]);
    }
  [[unroll]] for (uint head = 0; head < G; ++head) {
    float s = 0.0;
    [[unroll]] for (uint t = 0; t < MOST_VECTORS; ++t) {
      const uint c = part + PARTS * t;
      if (c < d4) {
        const uint at = head * d + 4 * c;
        s += dot(vec4(s_q[at], s_q[at + 1], s_q[at + 2], s_q[at + 3]), key_vectors[t]);
      }
    }
    s_part[head * 256 + lane] = s;
  }
  barrier();
  if (lane < G * SPLIT) {
    const uint head = lane / SPLIT, key = lane % SPLIT;
    float total = 0.0;
    for (uint t = 0; t < PARTS; ++t) total += s_part[head * 256 + key * PARTS + t];
    s_p[lane] = key < count ? total * p.scale : LOWEST;
  }
  barrier();
  // Softmax weights of each head over this split's keys (s_p holds G rows of SPLIT scores).
  if (lane < G * SPLIT) s_reduce[lane] = s_p[lane];
  segment_reduce(SPLIT, true);
  if (lane < G) s_m[lane] = s_reduce[lane * SPLIT];
  if (lane < G * SPLIT) {
    const uint head = lane / SPLIT, key = lane % SPLIT;
    s_p[lane] = key < count ? exp(s_p[lane] - s_reduce[head * SPLIT]) : 0.0;
  }
  barrier();
  if (lane < G * SPLIT) s_reduce[lane] = s_p[lane];
  segment_reduce(SPLIT, false);
  const uint record_stride = p.splits * (d + 4);
  const uint record0 = ((b * p.hq + g * G) * p.splits + split) * (d + 4);  // head 0 of the group
  if (lane < G) {
    partial[record0 + lane * record_stride] = s_m[lane];
    partial[record0 + lane * record_stride + 1] = s_reduce[lane * SPLIT];
  }
  // Value sums: invocation (subset, e) takes keys subset, subset + subsets, ... of dimension e
  // (weights and values past the split's keys are zero).
  if (holds_new)
    [[unroll]] for (uint t = 0; t < VALUE_SLOTS; ++t)
      if (subset < subsets && subset + t * subsets == new_key) values[t] = s_v_new[e];
  if (subset < subsets) {
    [[unroll]] for (uint head = 0; head < G; ++head) {
      float a = 0.0;
      [[unroll]] for (uint t = 0; t < VALUE_SLOTS; ++t) {
        const uint key = subset + t * subsets;
        if (key < SPLIT) a += s_p[head * SPLIT + key] * values[t];
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
  // Merge, CHUNK splits at a time: invocation (head, slot) reads the (m, l) of splits slot and
  // slot + LANES of its head; maxima and totals by halving over the LANES invocations of a head;
  // each output then adds the chunk's weighted value sums, eight loads in flight, rescaled as the
  // running maximum grows.
  const uint LANES = G == 1 ? 256 : G == 2 ? 128 : G <= 4 ? 64 : 32, CHUNK = MERGE_PER_LANE * LANES;
  const uint my_head = lane / LANES, slot = lane % LANES;
  if (lane < G) {
    s_m[lane] = LOWEST;
    s_l[lane] = 0.0;
  }
  // Output vectors (4 dimensions of one head): n4 of them, `sub`-sets of a chunk's splits each.
  const uint n4 = G * d4, subsets4 = max(1u, 256 / n4), rounds4 = (n4 + 255) / 256;  // rounds4 <= 2
  vec4 out4[2] = vec4[2](vec4(0.0), vec4(0.0));
  for (uint first_split = 0; first_split < live; first_split += CHUNK) {
    float m_s[MERGE_PER_LANE], l_s[MERGE_PER_LANE];
    float top = LOWEST;
    [[unroll]] for (uint i = 0; i < MERGE_PER_LANE; ++i) {
      const uint split_index = first_split + slot + i * LANES;
      const bool valid = my_head < G && split_index < live;
      const uint at = ((b * p.hq + g * G + my_head) * p.splits + split_index) * (d + 4);
      m_s[i] = valid ? partial[at] : LOWEST;
      l_s[i] = valid ? partial[at + 1] : 0.0;
      top = max(top, m_s[i]);
    }
    barrier();  // s_m's initial or previous values are written; s_w is read
    s_reduce[lane] = top;
    segment_reduce(LANES, true);
    const float new_max = my_head < G ? max(s_m[my_head], s_reduce[my_head * LANES]) : 0.0;
    float total = 0.0;
    [[unroll]] for (uint i = 0; i < MERGE_PER_LANE; ++i) {
      const float w =
          first_split + slot + i * LANES < live && my_head < G ? exp(m_s[i] - new_max) : 0.0;
      if (my_head < G) s_w[my_head * CHUNK + slot + i * LANES] = w;
      total += l_s[i] * w;
    }
    barrier();  // s_reduce's maxima are read
    if (slot == 0 && my_head < G) s_grown[my_head] = new_max;
    s_reduce[lane] = total;
    segment_reduce(LANES, false);
    if (lane < G) {
      const float correction = exp(s_m[lane] - s_grown[lane]);
      s_l[lane] = s_l[lane] * correction + s_reduce[lane * LANES];
      s_m[lane] = s_grown[lane];
      s_correction[lane] = correction;
    }
    barrier();
    const uint splits_here = min(CHUNK, live - first_split);
    for (uint r = 0; r < rounds4; ++r) {
      const uint item = lane + 256 * r, o4 = item % n4, sub = item / n4;
      const bool in_range = sub < subsets4 && item < subsets4 * n4;
      const uint head = o4 / d4, dim4 = o4 % d4;
      const uint base =
          (((b * p.hq + g * G + head) * p.splits + first_split) * (d + 4) + 4) / 4 + dim4;
      const uint stride4 = (d + 4) / 4;  // vec4 from one split's record to the next
      vec4 sum = vec4(0.0);
      if (in_range)
        for (uint j = sub; j < splits_here; j += 8 * subsets4) {
          vec4 loaded[8];  // independent loads first, then the sums in split order
          [[unroll]] for (uint u = 0; u < 8; ++u) {
            const uint split_u = j + u * subsets4;
            loaded[u] = split_u < splits_here ? partial4[base + split_u * stride4] : vec4(0.0);
          }
          [[unroll]] for (uint u = 0; u < 8; ++u) {
            const uint split_u = j + u * subsets4;
            if (split_u < splits_here) sum += s_w[head * CHUNK + split_u] * loaded[u];
          }
        }
      s_sum4[lane] = sum;
      barrier();
      if (in_range && sub == 0) {
        vec4 total = vec4(0.0);
        for (uint t = 0; t < subsets4; ++t) total += s_sum4[t * n4 + o4 - 256 * r];
        if (r == 0) out4[0] = out4[0] * s_correction[head] + total;
        else out4[1] = out4[1] * s_correction[head] + total;
      }
      barrier();
    }
  }
  for (uint r = 0; r < rounds4; ++r) {
    const uint item = lane + 256 * r, o4 = item % n4;
    if (item < n4) {  // sub == 0
      const uint head = o4 / d4, dim4 = o4 % d4;
      const vec4 value = s_l[head] > 0.0 ? (r == 0 ? out4[0] : out4[1]) / s_l[head] : vec4(0.0);
      const uint at = (b * p.hq + g * G + head) * d + 4 * dim4;
      o[at] = value.x;
      o[at + 1] = value.y;
      o[at + 2] = value.z;
      o[at + 3] = value.w;
    }
  }
}
