#version 450
//! variant f32
//! variant f16 INPUT_F16
// Rotary position embedding, half-split layout: for x [T, H, D] and i < D / 2,
//   y[t, h, i]         = x[t, h, i] cos[t, i] - x[t, h, i + D/2] sin[t, i]
//   y[t, h, i + D/2]   = x[t, h, i] sin[t, i] + x[t, h, i + D/2] cos[t, i]
// with the angle tables [T, D / 2] computed in float64 on the host (float32 sin/cos of angles
// in the thousands of radians would lose the phase). One invocation per (t, h, i).
#extension GL_GOOGLE_include_directive : require
#include "ops_common.glsl"
#include "rope_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { ELEMENT x[]; };
layout(std430, binding = 1) readonly buffer Cos { float cos_table[]; };
layout(std430, binding = 2) readonly buffer Sin { float sin_table[]; };
layout(std430, binding = 3) writeonly buffer Y { ELEMENT y[]; };
layout(push_constant) uniform Push { uint t; uint h; uint d; } p;

void main() {
  const uint half_d = p.d / 2, pairs = p.t * p.h * half_d;
  for (uint index = gl_GlobalInvocationID.x; index < pairs; index += gl_NumWorkGroups.x * 256) {
    const uint i = index % half_d, th = index / half_d, t = th / p.h;
    const uint base = th * p.d;
    const float c = cos_table[t * half_d + i], s = sin_table[t * half_d + i];
    const float a = float(x[base + i]), b = float(x[base + i + half_d]);
    const vec2 r = rope_rotate(a, b, c, s);
    y[base + i] = ELEMENT(r.x);
    y[base + i + half_d] = ELEMENT(r.y);
  }
}
