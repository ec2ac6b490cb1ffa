#version 450
//! variant f32
//! variant f16 INPUT_F16
// W_q = clip(round(W / gamma), -1, 1), packed 2 bits per weight as code W_q + 1: word c of a row
// holds weights 16c..16c+15, weight 16c+j in bits 2j..2j+1 (the public byte layout, read as
// little-endian words). Padding weights get code 1 (zero).
#extension GL_GOOGLE_include_directive : require
#include "quantize_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Weights { ELEMENT w[]; };
layout(std430, binding = 1) readonly buffer Weights4 { ELEMENT4 w4[]; };  // the same tensor
layout(std430, binding = 2) readonly buffer Scales { float scales[]; };
layout(std430, binding = 3) writeonly buffer Packed { uint packed[]; };
layout(push_constant) uniform Push {
  uint rows;  // in this dispatch
  uint k;
  uint words_per_row;
  uint group_size;  // 0: one scale for the whole tensor
  uint first_row;
} p;

// The code of v / gamma. The hot loop divides by a gamma known to be in the range where Vulkan
// bounds division (|gamma| < 2^125); larger gammas are scaled into it together with v (exact:
// powers of two; a v that becomes subnormal and flushes to zero still rounds to code 1).
uint code(float v, float gamma) { return uint(int(clamp(roundEven(v / gamma), -1.0, 1.0)) + 1); }
const float TWO_TO_125 = 4.2535296e37;

void main() {
  const uint words = p.rows * p.words_per_row;
  for (uint index = gl_GlobalInvocationID.x; index < words;
       index += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
    const uint row = index / p.words_per_row;
    const uint first_k = (index % p.words_per_row) * 16;
    const uint groups_per_row = p.group_size == 0 ? 1 : p.k / p.group_size;
    const uint base = row * p.k + first_k;
    uint word = 0x55555555u;  // code 1 everywhere
    // Whole words inside one group (per tensor, or groups of a multiple of 16) read one scale
    // and, where rows are 16-byte aligned (K % 4 == 0), 16-byte vectors.
    if ((p.group_size == 0 || p.group_size % 16 == 0) && first_k + 16 <= p.k && p.k % 4 == 0) {
      const float gamma =
          scales[p.group_size == 0 ? 0
                                   : (p.first_row + row) * groups_per_row + first_k / p.group_size];
      word = 0;
      if (abs(gamma) < TWO_TO_125) {
        for (uint j = 0; j < 4; ++j) {
          const vec4 v = vec4(w4[base / 4 + j]);
          word |= (code(v.x, gamma) | code(v.y, gamma) << 2 | code(v.z, gamma) << 4 |
                   code(v.w, gamma) << 6) << (8 * j);
        }
      } else {
        const float g = ldexp(gamma, -32);
        for (uint j = 0; j < 4; ++j) {
          const vec4 v = ldexp(vec4(w4[base / 4 + j]), ivec4(-32));
          word |= (code(v.x, g) | code(v.y, g) << 2 | code(v.z, g) << 4 | code(v.w, g) << 6)
                  << (8 * j);
        }
      }
    } else {
      for (uint j = 0; j < 16 && first_k + j < p.k; ++j) {
        const uint k = first_k + j;
        const uint group =
            p.group_size == 0 ? 0 : (p.first_row + row) * groups_per_row + k / p.group_size;
        const uint c =
            uint(int(clamp(roundEven(divide(float(w[base + j]), scales[group])), -1.0, 1.0)) + 1);
        word = (word & ~(3u << (2 * j))) | (c << (2 * j));
      }
    }
    packed[index] = word;
  }
}
