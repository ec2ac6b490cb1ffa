#version 450
//! variant f32
//! variant f16 INPUT_F16
// W_b = sign(W - alpha) with sign(0) = +1, packed 1 bit per weight (1: +1, 0: -1): word c of a
// row holds weights 32c..32c+31, weight 32c+j in bit j. Padding bits are 0.
#extension GL_GOOGLE_include_directive : require
#include "quantize_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Weights { ELEMENT w[]; };
layout(std430, binding = 1) readonly buffer Means { float means[]; };
layout(std430, binding = 2) writeonly buffer Packed { uint packed[]; };
layout(push_constant) uniform Push {
  uint rows;
  uint k;
  uint words_per_row;
  uint group_size;
  uint first_row;
} p;

void main() {
  const uint words = p.rows * p.words_per_row;
  for (uint index = gl_GlobalInvocationID.x; index < words;
       index += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
    const uint row = index / p.words_per_row;
    const uint first_k = (index % p.words_per_row) * 32;
    const uint groups_per_row = p.group_size == 0 ? 1 : p.k / p.group_size;
    uint word = 0;
    for (uint j = 0; j < 32 && first_k + j < p.k; ++j) {
      const uint k = first_k + j;
      const uint group =
          p.group_size == 0 ? 0 : (p.first_row + row) * groups_per_row + k / p.group_size;
      if (float(w[row * p.k + k]) - means[group] >= 0.0) word |= 1u << j;
    }
    packed[index] = word;
  }
}
