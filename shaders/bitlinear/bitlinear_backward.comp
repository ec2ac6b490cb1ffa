#version 450
// grad_x[m, k] = sum_n grad_y[m, n] * W_q[n, k] * gamma (straight-through estimator), summed over
// n in order; with GROUPED, gamma is gamma[n, k / group] (one scale per group of weights along K)
// and multiplies each term. One invocation per (m, k); neighbouring k share W words, so loads are
// broadcast.
#extension GL_GOOGLE_include_directive : require
#include "bitlinear_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, binding = 1) readonly buffer Gamma { float gamma[]; };
layout(std430, binding = 2) readonly buffer GradY { float grad_y[]; };
layout(std430, binding = 3) writeonly buffer GradX { float grad_x[]; };
layout(push_constant) uniform Push { uint m; uint n; uint k; uint words_per_row; uint group; } p;
layout(constant_id = 0) const bool GROUPED = false;

void main() {
  const uint total = p.m * p.k;
  for (uint index = gl_GlobalInvocationID.x; index < total; index += gl_NumWorkGroups.x * 256) {
    const uint m = index / p.k, k = index % p.k;
    float sum = 0.0;
    for (uint n = 0; n < p.n; ++n) {
      const int weight = int((w[n * p.words_per_row + k / 16] >> (2 * (k % 16))) & 3u) - 1;
      if (GROUPED)
        sum += grad_y[m * p.n + n] * (float(weight) * gamma[n * (p.k / p.group) + k / p.group]);
      else
        sum += grad_y[m * p.n + n] * float(weight);
    }
    grad_x[index] = GROUPED ? sum : sum * gamma[0];
  }
}
