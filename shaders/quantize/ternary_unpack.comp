#version 450
// Packed ternary words to int8 values in {-1, 0, 1}, one word (16 weights) per invocation.
#extension GL_GOOGLE_include_directive : require
#include "quantize_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Packed { uint packed[]; };
layout(std430, binding = 1) writeonly buffer Values { int8_t values[]; };
layout(push_constant) uniform Push { uint rows; uint k; uint words_per_row; } p;

void main() {
  const uint words = p.rows * p.words_per_row;
  for (uint index = gl_GlobalInvocationID.x; index < words;
       index += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
    const uint row = index / p.words_per_row;
    const uint first_k = (index % p.words_per_row) * 16;
    const uint word = packed[index];
    for (uint j = 0; j < 16 && first_k + j < p.k; ++j)
      values[row * p.k + first_k + j] = int8_t(int((word >> (2 * j)) & 3u) - 1);
  }
}
