#version 450
//! variant f32
//! variant f16 INPUT_F16
// Reduction over one axis of x viewed as [outer, length, inner], float32 accumulation (sums
// compensated, see accumulate()) in a fixed order (the same input gives the same output): OP 0 sum,
// 1 mean, 2 max. inner == 1: one workgroup per outer index, 256 strided partial results combined
// in order; otherwise one invocation per (outer, inner) walking the axis (coalesced across inner).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#include "ops_common.glsl"
#include "../runtime/strided_loop.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint OP = 0;
layout(constant_id = 1) const bool ROWS = true;  // inner == 1
layout(std430, binding = 0) readonly buffer X { ELEMENT x[]; };
layout(std430, binding = 1) writeonly buffer Y { ELEMENT y[]; };
layout(push_constant) uniform Push { uint outer; uint count; uint inner; } p;

shared float s_partial[256];

float combine(float a, float b) { return OP == 2 ? nan_max(a, b) : a + b; }
float start() { return OP == 2 ? -3.402823466e38 : 0.0; }
float finish(float v) { return OP == 1 ? v / float(p.count) : v; }
// acc = combine(acc, v); sums carry what each addition rounded away in `lost` (Kahan), so that a
// long run of values (a thread may add millions) keeps float32 precision.
void accumulate(inout precise float acc, inout precise float lost, float v) {
  if (OP == 2) {
    acc = nan_max(acc, v);
    return;
  }
  precise const float y = v - lost;
  precise const float t = acc + y;
  lost = isinf(t) ? 0.0 : (t - acc) - y;  // Inf - Inf would turn an infinite sum into NaN
  acc = t;
}

void main() {
  const uint lane = gl_LocalInvocationID.x;
  if (ROWS) {
    for (uint o = gl_WorkGroupID.x; o < p.outer; o += gl_NumWorkGroups.x) {
      precise float acc = start(), lost = 0.0;
      FOR_STRIDED(i, lane, p.count, 256) accumulate(acc, lost, float(x[o * p.count + i]));
      s_partial[lane] = acc;
      barrier();
      for (uint width = 128; width > 0; width /= 2) {  // a fixed tree: deterministic
        if (lane < width) s_partial[lane] = combine(s_partial[lane], s_partial[lane + width]);
        barrier();
      }
      if (lane == 0) y[o] = ELEMENT(finish(s_partial[0]));
      barrier();
    }
    return;
  }
  const uint outputs = p.outer * p.inner;
  for (uint index = gl_GlobalInvocationID.x; index < outputs; index += gl_NumWorkGroups.x * 256) {
    const uint o = index / p.inner, in_ = index % p.inner;
    precise float acc = start(), lost = 0.0;
    FOR_STRIDED(i, 0, p.count, 1)
        accumulate(acc, lost, float(x[(o * p.count + i) * p.inner + in_]));
    y[index] = ELEMENT(finish(acc));
  }
}
