#version 450
//! variant f32
//! variant f16 INPUT_F16
//! variant f32_kv16 KV_F16
// Scaled dot-product attention with grouped-query heads, one workgroup per (query, head):
//   out[i, h] = softmax_j(q[i, h] . k[j, g] / sqrt(D)) v[j, g],  g = h / (HQ / HKV),
// over keys j < L (the first L rows of k and v, e.g. a KV cache), and with CAUSAL only
// j <= L - TQ + i (query i sits at position L - TQ + i). Keys go in chunks of 2048 with the
// running max and sum of an online softmax, so any L works; D <= 256, one output value an
// invocation. Sums and maxima run in a fixed order: the same input gives the same output.
// Batched caches: query row i belongs to sequence b = i / SEQ_TOKENS, whose keys are rows
// [b * CACHE_ROWS, ...) of k and v; with FROM_START, L = start[0] + SEQ_TOKENS is read from a
// tensor (a KV cache whose length changes between replays of a graph).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "ops_common.glsl"
#include "group_reduce.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool CAUSAL = true;
layout(constant_id = 1) const bool FROM_START = false;
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

const uint CHUNK = 2048;
shared float s_q[256];
shared float s_p[CHUNK];
shared float s_acc[256];

void main() {
  const uint lane = gl_LocalInvocationID.x;
  const uint i = gl_WorkGroupID.x, h = gl_WorkGroupID.y;
  const uint g = h / (p.hq / p.hkv);
  const uint b = i / p.seq_tokens, at = i % p.seq_tokens;
  const uint l = FROM_START ? min(start[b * p.start_stride] + p.seq_tokens, p.cache_rows) : p.l;
  // Keys this query sees (it sits at position l - SEQ_TOKENS + at).
  const uint keys = visible_keys(CAUSAL, l, at, p.seq_tokens);
  const uint base = cache_sequence(b) * p.cache_rows;
  if (lane < p.d) s_q[lane] = float(q[(i * p.hq + h) * p.d + lane]);
  barrier();
  float running_max = -3.402823466e38, running_sum = 0.0, acc = 0.0;
  for (uint first = 0; first < keys; first += CHUNK) {
    const uint count = min(CHUNK, keys - first);
    // Scores: each subgroup takes keys in turn, its lanes splitting the head dimension
    // (coalesced reads of a key row).
    for (uint j = gl_SubgroupID; j < count; j += gl_NumSubgroups) {
      const uint row = ((base + first + j) * p.hkv + g) * p.d;
      float s = 0.0;
      for (uint e = gl_SubgroupInvocationID; e < p.d; e += gl_SubgroupSize)
        s += s_q[e] * float(k[row + e]);
      s = subgroupAdd(s) * p.scale;
      if (subgroupElect()) s_p[j] = s;
    }
    barrier();
    float chunk_max = -3.402823466e38;
    for (uint j = lane; j < count; j += 256) chunk_max = max(chunk_max, s_p[j]);
    const float new_max = max(running_max, group_max(chunk_max));
    float chunk_sum = 0.0;
    for (uint j = lane; j < count; j += 256) {
      const float e = exp(s_p[j] - new_max);
      s_p[j] = e;
      chunk_sum += e;
    }
    const float correction = exp(running_max - new_max);
    // group_sum's barrier: s_p ready
    running_sum = running_sum * correction + group_sum(chunk_sum);
    running_max = new_max;
    // Values: 256 / D key subsets in parallel, each lane one dimension, then summed in order.
    const uint subsets = max(1u, 256 / p.d), e = lane % p.d, subset = lane / p.d;
    float a = 0.0;
    if (subset < subsets)
      for (uint j = subset; j < count; j += subsets)
        a += s_p[j] * float(v[((base + first + j) * p.hkv + g) * p.d + e]);
    s_acc[lane] = a;
    barrier();
    if (lane < p.d) {
      float chunk_acc = 0.0;
      for (uint t = 0; t < subsets; ++t) chunk_acc += s_acc[t * p.d + lane];
      acc = acc * correction + chunk_acc;
    }
    barrier();  // s_p and s_acc are rewritten by the next chunk
  }
  if (lane < p.d) o[(i * p.hq + h) * p.d + lane] = ELEMENT(keys == 0 ? 0.0 : acc / running_sum);
}
