#version 450
// Packed ternary (W_q * gamma) or BINARY (W_b * beta) weights to float32, one word per invocation.
#extension GL_GOOGLE_include_directive : require
#include "quantize_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool BINARY = false;
layout(std430, binding = 0) readonly buffer Packed { uint packed[]; };
layout(std430, binding = 1) readonly buffer Scales { float scales[]; };
layout(std430, binding = 2) writeonly buffer Output { float w[]; };
layout(push_constant) uniform Push {
  uint rows; uint k; uint words_per_row; uint group_size; uint first_row;
} p;

void main() {
  const uint per_word = BINARY ? 32 : 16;
  const uint words = p.rows * p.words_per_row;
  const uint groups_per_row = p.group_size == 0 ? 1 : p.k / p.group_size;
  for (uint index = gl_GlobalInvocationID.x; index < words;
       index += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
    const uint row = index / p.words_per_row;
    const uint first_k = (index % p.words_per_row) * per_word;
    const uint word = packed[index];
    for (uint j = 0; j < per_word && first_k + j < p.k; ++j) {
      const uint k = first_k + j;
      const uint group =
          p.group_size == 0 ? 0 : (p.first_row + row) * groups_per_row + k / p.group_size;
      const float value = BINARY ? (((word >> j) & 1u) != 0 ? 1.0 : -1.0)
                                 : float(int((word >> (2 * j)) & 3u) - 1);
      w[row * p.k + k] = value * scales[group];
    }
  }
}
