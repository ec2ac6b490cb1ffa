#version 450
//! variant f32
//! variant f64 FLOAT64
// The end of a split-K product (gemm.comp with splits > 1): C = beta C + alpha sum_s P_s, with the
// partials P [splits, B, M, N] contiguous and C at view vc, summed in split order.
#extension GL_GOOGLE_include_directive : require
#include "linalg_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Partial { SCALAR part[]; };
layout(std430, binding = 1) buffer C { SCALAR c[]; };
layout(push_constant) uniform Push {
  uint m; uint n; uint total; uint splits; float alpha; float beta; View vc;
} p;

void main() {
  for (uint e = gl_GlobalInvocationID.x; e < p.total; e += gl_NumWorkGroups.x * 256) {
    const uint per = p.m * p.n, b = e / per, i = (e % per) / p.n, j = e % p.n;
    SCALAR sum = 0;
    for (uint s = 0; s < p.splits; ++s) sum += part[s * p.total + e];
    const uint to = at(p.vc, b, i, j);
    const SCALAR beta = SCALAR(p.beta);
    c[to] = (beta == SCALAR(0) ? SCALAR(0) : beta * c[to]) + SCALAR(p.alpha) * sum;
  }
}
