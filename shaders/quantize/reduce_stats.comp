#version 450
//! variant f32
//! variant f16 INPUT_F16
// Statistics of consecutive segments of a flat array (one workgroup per segment, fixed
// summation order, so the same input gives bit-identical output on every run). Non-finite
// values are counted (an integer atomic: order does not matter) and left out of the sums.
#extension GL_GOOGLE_include_directive : require
#include "quantize_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Input { ELEMENT x[]; };
layout(std430, binding = 1) writeonly buffer Output { Stats stats[]; };
layout(std430, binding = 2) buffer Counter { uint nonfinite_total; };
layout(push_constant) uniform Push {
  uint segment_length;
  uint segments;      // in this dispatch
  uint elements;      // bound elements (the last segment may be short)
  uint first_output;  // index of this dispatch's first segment in `stats`
} p;

shared float s_sum_abs[256], s_sum[256], s_max_abs[256], s_min[256], s_max[256];
shared uint s_bad[256];

void main() {
  const uint lane = gl_LocalInvocationID.x;
  for (uint segment = gl_WorkGroupID.x; segment < p.segments; segment += gl_NumWorkGroups.x) {
    const uint begin = segment * p.segment_length;
    const uint end = min(begin + p.segment_length, p.elements);
    float sum_abs = 0.0, sum = 0.0, max_abs = 0.0;
    float lo = 3.402823466e38, hi = -3.402823466e38;
    uint bad = 0;
    for (uint i = begin + lane; i < end; i += 256) {
      const float v = float(x[i]);
      if (!finite(v)) { bad++; continue; }
      sum_abs += abs(v);
      sum += v;
      max_abs = max(max_abs, abs(v));
      lo = min(lo, v);
      hi = max(hi, v);
    }
    s_sum_abs[lane] = sum_abs; s_sum[lane] = sum; s_max_abs[lane] = max_abs;
    s_min[lane] = lo; s_max[lane] = hi; s_bad[lane] = bad;
    barrier();
    for (uint width = 128; width > 0; width >>= 1) {
      if (lane < width) {
        s_sum_abs[lane] += s_sum_abs[lane + width];
        s_sum[lane] += s_sum[lane + width];
        s_max_abs[lane] = max(s_max_abs[lane], s_max_abs[lane + width]);
        s_min[lane] = min(s_min[lane], s_min[lane + width]);
        s_max[lane] = max(s_max[lane], s_max[lane + width]);
        s_bad[lane] += s_bad[lane + width];
      }
      barrier();
    }
    if (lane == 0) {
      stats[p.first_output + segment] = Stats(s_sum_abs[0], s_sum[0], s_max_abs[0], s_min[0],
                                              s_max[0], end - begin, s_bad[0], 0u);
      if (s_bad[0] > 0) atomicAdd(nonfinite_total, s_bad[0]);
    }
    barrier();  // shared memory is reused by the next segment
  }
}
