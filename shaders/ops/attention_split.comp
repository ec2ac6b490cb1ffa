#version 450
//! variant f32
//! variant f16 INPUT_F16
// Attention for a few queries over many keys (decode), split over the keys: workgroup (s, h, i)
// takes keys [s * SPLIT, (s + 1) * SPLIT) of query i and head h (see attention.comp for the
// layouts and the causal rule). Each subgroup scores keys in turn, its lanes splitting the head
// dimension (coalesced reads of each key row); the workgroup then writes its max m, sum of
// exp(score - m), and sum of exp(score - m) v for the COMBINE pass, which merges the splits in
// order: out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "ops_common.glsl"
#include "group_reduce.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool CAUSAL = true;
layout(constant_id = 1) const bool COMBINE = false;
layout(std430, binding = 0) readonly buffer Q { ELEMENT q[]; };
layout(std430, binding = 1) readonly buffer K { ELEMENT k[]; };
layout(std430, binding = 2) readonly buffer V { ELEMENT v[]; };
layout(std430, binding = 3) writeonly buffer O { ELEMENT o[]; };
layout(std430, binding = 4) buffer Partial { float partial[]; };  // [TQ, HQ, splits, D + 2]
layout(push_constant) uniform Push {
  uint tq; uint hq; uint hkv; uint d; uint l; float scale; uint splits;
} p;

const uint SPLIT = 256;
const float LOWEST = -3.402823466e38;
shared float s_q[256];
shared float s_p[SPLIT];

void main() {
  const uint lane = gl_LocalInvocationID.x;
  const uint split = gl_WorkGroupID.x, h = gl_WorkGroupID.y, i = gl_WorkGroupID.z;
  const uint record = ((i * p.hq + h) * p.splits) * (p.d + 2);  // split 0 of (i, h)
  if (COMBINE) {  // one workgroup per (i, h): gl_WorkGroupID.x is 0
    float m = LOWEST;
    for (uint s = 0; s < p.splits; ++s) m = max(m, partial[record + s * (p.d + 2)]);
    if (lane < p.d) {
      float total = 0.0, acc = 0.0;
      for (uint s = 0; s < p.splits; ++s) {
        const uint at = record + s * (p.d + 2);
        const float w = partial[at + 1] > 0.0 ? exp(partial[at] - m) : 0.0;
        total += partial[at + 1] * w;
        acc += partial[at + 2 + lane] * w;
      }
      o[(i * p.hq + h) * p.d + lane] = ELEMENT(total > 0.0 ? acc / total : 0.0);
    }
    return;
  }
  const uint g = h / (p.hq / p.hkv);
  const uint keys = CAUSAL ? min(p.l, p.l - p.tq + i + 1) : p.l;
  const uint first = split * SPLIT;
  const uint count = first < keys ? min(SPLIT, keys - first) : 0;
  if (lane < p.d) s_q[lane] = float(q[(i * p.hq + h) * p.d + lane]);
  barrier();
  const uint width = gl_SubgroupSize, sub_lane = gl_SubgroupInvocationID;
  for (uint j = gl_SubgroupID; j < count; j += gl_NumSubgroups) {
    const uint row = ((first + j) * p.hkv + g) * p.d;
    float s = 0.0;
    for (uint e = sub_lane; e < p.d; e += width) s += s_q[e] * float(k[row + e]);
    s = subgroupAdd(s) * p.scale;
    if (subgroupElect()) s_p[j] = s;
  }
  barrier();
  float local_max = LOWEST;
  for (uint j = lane; j < count; j += 256) local_max = max(local_max, s_p[j]);
  const float m = group_max(local_max);
  float local_sum = 0.0;
  for (uint j = lane; j < count; j += 256) {
    const float e = exp(s_p[j] - m);
    s_p[j] = e;
    local_sum += e;
  }
  const float total = group_sum(local_sum);  // its barriers also publish s_p
  const uint at = record + split * (p.d + 2);
  if (lane < p.d) {
    float acc = 0.0;
    for (uint j = 0; j < count; ++j) acc += s_p[j] * float(v[((first + j) * p.hkv + g) * p.d + lane]);
    partial[at + 2 + lane] = acc;
  }
  if (lane == 0) {
    partial[at] = count > 0 ? m : LOWEST;
    partial[at + 1] = count > 0 ? total : 0.0;
  }
}
