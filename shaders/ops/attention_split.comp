#version 450
//! variant f32
//! variant f16 INPUT_F16
//! variant f32_kv16 KV_F16
// Attention for a few queries over many keys (decode), split over the keys: workgroup (s, h, i)
// takes keys [s * SPLIT, (s + 1) * SPLIT) of query i and head h (see attention.comp for the
// layouts and the causal rule). It scores its keys at once, eight invocations a key splitting
// the head dimension; the workgroup then writes its max m, sum of
// exp(score - m), and sum of exp(score - m) v for the COMBINE pass, which merges the splits in
// order: out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M). Batched caches and FROM_START
// as in attention.comp (splits past the keys a query sees are empty).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "ops_common.glsl"
#include "group_reduce.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool CAUSAL = true;
layout(constant_id = 1) const bool COMBINE = false;
layout(constant_id = 2) const bool FROM_START = false;
layout(std430, binding = 0) readonly buffer Q { ELEMENT q[]; };
layout(std430, binding = 1) readonly buffer K { KV_ELEMENT k[]; };
layout(std430, binding = 2) readonly buffer V { KV_ELEMENT v[]; };
layout(std430, binding = 3) writeonly buffer O { ELEMENT o[]; };
layout(std430, binding = 4) buffer Partial { float partial[]; };  // [TQ, HQ, splits, D + 2]
layout(std430, binding = 5) readonly buffer Start { uint start[]; };  // [1] or [B] with FROM_START
layout(push_constant) uniform Push {
  uint tq; uint hq; uint hkv; uint d; uint l; float scale; uint splits; uint seq_tokens;
  uint cache_rows; uint start_stride;  // 0: start[0] for every sequence, 1: start[b]
  uint slots;  // 0: sequence b's keys are cache sequence b's; else start[slots + b]'s
  uint cache_batch;
} p;

// The cache sequence holding sequence b's keys: b, or its slot (the last where past the caches).
uint cache_sequence(uint b) {
  return FROM_START && p.slots != 0 ? min(start[p.slots + b], p.cache_batch - 1) : b;
}

const uint SPLIT = 32;
const float LOWEST = -3.402823466e38;
shared float s_q[256];
shared float s_p[SPLIT];
shared float s_acc[256];
shared float s_w[256];

// sum over j = first, first + stride, ... < end of weight(j) * value(j), four loads in flight.
#define STRIDED_SUM(result, first, stride, end, term)                                   \
  {                                                                                     \
    float a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;                                       \
    uint j = first;                                                                     \
    for (; j + 3 * (stride) < (end); j += 4 * (stride)) {                               \
      a0 += term(j);                                                                    \
      a1 += term(j + (stride));                                                         \
      a2 += term(j + 2 * (stride));                                                     \
      a3 += term(j + 3 * (stride));                                                     \
    }                                                                                   \
    for (; j < (end); j += (stride)) a0 += term(j);                                     \
    result = (a0 + a1) + (a2 + a3);                                                     \
  }

void main() {
  const uint lane = gl_LocalInvocationID.x;
  const uint split = gl_WorkGroupID.x, h = gl_WorkGroupID.y, i = gl_WorkGroupID.z;
  const uint record = ((i * p.hq + h) * p.splits) * (p.d + 2);  // split 0 of (i, h)
  const uint g = h / (p.hq / p.hkv);
  const uint b = i / p.seq_tokens, at_token = i % p.seq_tokens;
  const uint l = FROM_START ? min(start[b * p.start_stride] + p.seq_tokens, p.cache_rows) : p.l;
  const uint keys = visible_keys(CAUSAL, l, at_token, p.seq_tokens);
  const uint live = min((keys + SPLIT - 1) / SPLIT, p.splits);  // splits with keys to score
  // Value dimension e of key subset `subset`: 256 / D subsets run in parallel, summed in order.
  const uint subsets = max(1u, 256 / p.d), e = lane % p.d, subset = lane / p.d;
  if (COMBINE) {  // one workgroup per (i, h): gl_WorkGroupID.x is 0
    // Splits 256 at a time: each lane reads one split's (m, l), then the value sums are weighed
    // (independent loads), rescaling as the running max grows.
    float running_max = LOWEST, total = 0.0, acc = 0.0;
    for (uint first = 0; first < live; first += 256) {
      const uint s = first + lane;
      const float m_s = s < live ? partial[record + s * (p.d + 2)] : LOWEST;
      const float l_s = s < live ? partial[record + s * (p.d + 2) + 1] : 0.0;
      const float new_max = max(running_max, group_max(m_s));
      const float w = s < live ? exp(m_s - new_max) : 0.0;
      s_w[lane] = w;
      const float chunk_total = group_sum(l_s * w);  // its barriers also publish s_w
      const float correction = exp(running_max - new_max);
      total = total * correction + chunk_total;
      const uint count = min(256u, live - first);
      float a = 0.0;
#define SPLIT_TERM(j) (s_w[j] * partial[record + (first + (j)) * (p.d + 2) + 2 + e])
      if (subset < subsets) STRIDED_SUM(a, subset, subsets, count, SPLIT_TERM)
      s_acc[lane] = subset < subsets ? a : 0.0;
      barrier();
      if (lane < p.d) {
        float chunk_acc = 0.0;
        for (uint t = 0; t < subsets; ++t) chunk_acc += s_acc[t * p.d + lane];
        acc = acc * correction + chunk_acc;
      }
      running_max = new_max;
      barrier();  // s_w and s_acc are rewritten by the next round
    }
    if (lane < p.d) o[(i * p.hq + h) * p.d + lane] = ELEMENT(total > 0.0 ? acc / total : 0.0);
    return;
  }
  if (split >= live) return;  // the whole workgroup: no keys here (the merge skips it)
  const uint base = cache_sequence(b) * p.cache_rows;
  const uint first = split * SPLIT;
  const uint count = min(SPLIT, keys - first);
  if (lane < p.d) s_q[lane] = float(q[(i * p.hq + h) * p.d + lane]);
  barrier();
  // Scores: all SPLIT keys at once, 8 invocations a key splitting the head dimension (their
  // loads independent and coalesced), then summed over the 8 in order.
  {
    const uint j = lane / 8, part = lane % 8;
    float s = 0.0;
    if (j < count) {
      const uint row = ((base + first + j) * p.hkv + g) * p.d;
      for (uint c = part; c < p.d; c += 8) s += s_q[c] * float(k[row + c]);
    }
    s_acc[lane] = s;
    barrier();
    if (part == 0 && j < count) {
      float total = 0.0;
      for (uint t = 0; t < 8; ++t) total += s_acc[lane + t];
      s_p[j] = total * p.scale;
    }
  }
  barrier();
  float local_max = LOWEST;
  for (uint j = lane; j < count; j += 256) local_max = max(local_max, s_p[j]);
  const float m = group_max(local_max);
  float local_sum = 0.0;
  for (uint j = lane; j < count; j += 256) {
    const float x = exp(s_p[j] - m);
    s_p[j] = x;
    local_sum += x;
  }
  const float total = group_sum(local_sum);  // its barriers also publish s_p
  const uint at = record + split * (p.d + 2);
  float a = 0.0;
#define KEY_TERM(j) (s_p[j] * float(v[((base + first + (j)) * p.hkv + g) * p.d + e]))
  if (subset < subsets) STRIDED_SUM(a, subset, subsets, count, KEY_TERM)
  s_acc[lane] = subset < subsets ? a : 0.0;
  barrier();
  if (lane < p.d) {
    float acc = 0.0;
    for (uint t = 0; t < subsets; ++t) acc += s_acc[t * p.d + lane];
    partial[at + 2 + lane] = acc;
  }
  if (lane == 0) {
    partial[at] = m;
    partial[at + 1] = total;
  }
}
