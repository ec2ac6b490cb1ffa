#version 450
//! variant f32
//! variant f64 FLOAT64
// q[b, i, j] *= sign(r[b, j, j]) (+1 where it is zero) for i < rows, j < count: the columns of a
// QR's Q that reproduce its input's columns with their signs (an SVD's singular vectors).
#extension GL_GOOGLE_include_directive : require
#include "linalg_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Q { SCALAR q[]; };
layout(std430, binding = 1) readonly buffer R { SCALAR r[]; };
layout(push_constant) uniform Push { uint rows; uint count; uint total; View vq; View vr; } p;

void main() {
  for (uint e = gl_GlobalInvocationID.x; e < p.total; e += gl_NumWorkGroups.x * 256) {
    const uint per = p.rows * p.count, b = e / per, i = (e % per) / p.count, j = e % p.count;
    if (r[at(p.vr, b, j, j)] < SCALAR(0)) q[at(p.vq, b, i, j)] = -q[at(p.vq, b, i, j)];
  }
}
