#version 450
//! variant f32
//! variant f16 INPUT_F16
// Per-tensor quantization with the scale s from reduce_scales (MODE 1): q = clip(round(g * s),
// -qmax - 1, qmax), or with STOCHASTIC rounding q = clip(floor(g * s + u), ...) where u in [0, 1)
// comes from the counter-based hash of (seed, element index).
#extension GL_GOOGLE_include_directive : require
#include "quantize_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool STOCHASTIC = false;
layout(constant_id = 1) const float QMAX = 127.0;
layout(std430, binding = 0) readonly buffer Input { ELEMENT g[]; };
layout(std430, binding = 1) readonly buffer Scales { float scales[]; };
layout(std430, binding = 2) writeonly buffer Quantized { uint8_t q[]; };
layout(push_constant) uniform Push {
  uint elements; uint first_element; uint seed_lo; uint seed_hi;
} p;

void main() {
  const float s = scales[0];
  for (uint i = gl_GlobalInvocationID.x; i < p.elements;
       i += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
    precise float product = float(g[i]) * s;
    float value;
    if (STOCHASTIC) {
      precise float shifted = product + uniform01(p.seed_lo, p.seed_hi, p.first_element + i);
      value = floor(shifted);
    } else {
      value = roundEven(product);
    }
    q[i] = uint8_t(uint(int(clamp(value, -QMAX - 1.0, QMAX))) & 0xFFu);
  }
}
