#version 450
//! variant f32
//! variant f16 INPUT_F16
// Element-wise activations over n values, 4 at a time through vector views (a scalar tail):
//   MODE 0: y = act(x)                      MODE 1: y = grad * act'(x)   (backward)
//   MODE 2: y = act(x) * other              (fused gate: silu_mul, relu2_mul)
//   MODE 3: y = relu(x) * keep / (1 - p)    (relu_dropout; keep = uniform01(seed, i) >= p)
// Inputs and output share the element type; arithmetic is float32.
#extension GL_GOOGLE_include_directive : require
#include "ops_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint OP = 0;
layout(constant_id = 1) const uint MODE = 0;
layout(std430, binding = 0) readonly buffer X { ELEMENT x[]; };
layout(std430, binding = 1) readonly buffer X4 { ELEMENT4 x4[]; };      // the same tensor
layout(std430, binding = 2) readonly buffer Other { ELEMENT other[]; };  // grad or up
layout(std430, binding = 3) readonly buffer Other4 { ELEMENT4 other4[]; };
layout(std430, binding = 4) writeonly buffer Y { ELEMENT y[]; };
layout(std430, binding = 5) writeonly buffer Y4 { ELEMENT4 y4[]; };
layout(push_constant) uniform Push {
  uint n; uint first; float alpha; float p; uint seed_lo; uint seed_hi;
} p;

float apply(float v, float o, uint index) {
  if (MODE == 0) return activation(OP, v, p.alpha);
  if (MODE == 1) return o * activation_derivative(OP, v, p.alpha);
  if (MODE == 2) return activation(OP, v, p.alpha) * o;
  // Dropout: index counts from the whole tensor's start, so chunks draw the same mask.
  const bool keep = uniform01(p.seed_lo, p.seed_hi, p.first + index) >= p.p;
  return keep ? relu(v) / (1.0 - p.p) : 0.0;
}

void main() {
  const uint stride = gl_NumWorkGroups.x * 256;
  const uint vectors = p.n / 4;
  for (uint i = gl_GlobalInvocationID.x; i < vectors; i += stride) {
    const vec4 v = vec4(x4[i]);
    const vec4 o = MODE == 0 || MODE == 3 ? vec4(0.0) : vec4(other4[i]);
    vec4 r;
    for (uint e = 0; e < 4; ++e) r[e] = apply(v[e], o[e], 4 * i + e);
    y4[i] = ELEMENT4(r);
  }
  const uint tail = 4 * vectors + gl_GlobalInvocationID.x;
  if (tail < p.n) {
    const float o = MODE == 0 || MODE == 3 ? 0.0 : float(other[tail]);
    y[tail] = ELEMENT(apply(float(x[tail]), o, tail));
  }
}
