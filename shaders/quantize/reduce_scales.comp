#version 450
// Combines runs of `run` segment statistics (fixed order) and derives each run's scale:
//   MODE 0, weights:      scale = gamma = max(mean|W|, eps), alpha = mean(W)
//   MODE 1, symmetric:    scale = qmax / max(max|x|, eps)
#extension GL_GOOGLE_include_directive : require
#include "quantize_common.glsl"
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint MODE = 0;
layout(constant_id = 1) const float QMAX = 127.0;
layout(constant_id = 2) const float EPS = 1e-5;
layout(std430, binding = 0) readonly buffer Input { Stats stats[]; };
layout(std430, binding = 1) writeonly buffer Scales { float scales[]; };
layout(std430, binding = 2) writeonly buffer Means { float means[]; };
layout(push_constant) uniform Push { uint run; uint outputs; } p;

shared float s_sum_abs[64], s_sum[64], s_max_abs[64];
shared uint s_count[64];

void main() {
  const uint lane = gl_LocalInvocationID.x;
  for (uint o = gl_WorkGroupID.x; o < p.outputs; o += gl_NumWorkGroups.x) {
    float sum_abs = 0.0, sum = 0.0, max_abs = 0.0;
    uint count = 0;
    for (uint i = lane; i < p.run; i += 64) {
      const Stats s = stats[o * p.run + i];
      sum_abs += s.sum_abs; sum += s.sum; max_abs = max(max_abs, s.max_abs);
      count += s.count - s.nonfinite;
    }
    s_sum_abs[lane] = sum_abs; s_sum[lane] = sum; s_max_abs[lane] = max_abs;
    s_count[lane] = count;
    barrier();
    for (uint width = 32; width > 0; width >>= 1) {
      if (lane < width) {
        s_sum_abs[lane] += s_sum_abs[lane + width];
        s_sum[lane] += s_sum[lane + width];
        s_max_abs[lane] = max(s_max_abs[lane], s_max_abs[lane + width]);
        s_count[lane] += s_count[lane + width];
      }
      barrier();
    }
    if (lane == 0) {
      const float n = float(max(s_count[0], 1u));
      scales[o] = MODE == 0 ? max(s_sum_abs[0] / n, EPS) : divide(QMAX, max(s_max_abs[0], EPS));
      means[o] = s_sum[0] / n;
    }
    barrier();
  }
}
