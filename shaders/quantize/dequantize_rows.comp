#version 450
// x_deq = x_q / s_row (symmetric, int8) or (x_q - zero_point) * step (asymmetric, uint8).
#extension GL_GOOGLE_include_directive : require
#include "quantize_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool SYMMETRIC = true;
layout(std430, binding = 0) readonly buffer Quantized { uint8_t q[]; };
layout(std430, binding = 1) readonly buffer Scales { float scales[]; };
layout(std430, binding = 2) readonly buffer ZeroPoints { uint8_t zero_points[]; };  // asymmetric
layout(std430, binding = 3) writeonly buffer Output { float x[]; };
layout(push_constant) uniform Push { uint rows; uint k; uint first_row; } p;

void main() {
  const uint elements = p.rows * p.k;
  for (uint i = gl_GlobalInvocationID.x; i < elements;
       i += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
    const uint row = p.first_row + i / p.k;
    const uint bits = uint(q[i]);
    x[i] = SYMMETRIC ? float(int(bits << 24) >> 24) / scales[row]
                     : (float(bits) - float(uint(zero_points[row]))) * scales[row];
  }
}
