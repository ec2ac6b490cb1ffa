#version 450
// int8 values in {-1, 0, 1} to packed ternary words; values outside that set are counted.
#extension GL_GOOGLE_include_directive : require
#include "quantize_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Values { int8_t values[]; };
layout(std430, binding = 1) writeonly buffer Packed { uint packed[]; };
layout(std430, binding = 2) buffer Counter { uint invalid_total; };
layout(push_constant) uniform Push { uint rows; uint k; uint words_per_row; } p;

void main() {
  const uint words = p.rows * p.words_per_row;
  for (uint index = gl_GlobalInvocationID.x; index < words;
       index += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
    const uint row = index / p.words_per_row;
    const uint first_k = (index % p.words_per_row) * 16;
    uint word = 0x55555555u;
    uint invalid = 0;
    for (uint j = 0; j < 16 && first_k + j < p.k; ++j) {
      const int v = int(values[row * p.k + first_k + j]);
      if (v < -1 || v > 1) invalid++;
      word = (word & ~(3u << (2 * j))) | (uint(clamp(v, -1, 1) + 1) << (2 * j));
    }
    packed[index] = word;
    if (invalid > 0) atomicAdd(invalid_total, invalid);
  }
}
