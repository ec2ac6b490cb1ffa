#version 450
// The screened argmax's first pass for several rows of h (ops/screened_head.cpp, M > 1): each row
// as 16-bit values h16 = roundEven(h * 32639 / max|h|), written as two int8 rows hi and lo with
// h16 = 256 hi + lo (lo in [-128, 127], hi in [-127, 127]: 32639 is the largest scale that keeps
// them there), so that an int8 matmul with the head's int8 copy gives the two integer sums
// head_screen.comp computes; and the row's sigma_h = max|h| / 32639, ||h||, E_h = 0.52 sqrt(K)
// sigma_h, and 1 where it gets no bracket (NaN or Inf, or 0 < max|h| < 1e-18: every head row is
// then a candidate). A workgroup a row; the padding past K is zeros.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "../ops/group_reduce.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X4 { vec4 x4[]; };  // h float32 [M, K], K % 4 == 0
layout(std430, binding = 1) writeonly buffer Split { uint split[]; };  // int8 [2M, Kp]
layout(std430, binding = 2) writeonly buffer Stats { vec4 stats[]; };  // [M]
layout(push_constant) uniform Push { uint k; uint padded_k; } p;

const float SCALE = 32639.0;

uint pack_bytes(ivec4 v) {
  const uvec4 b = uvec4(v) & 0xFFu;
  return b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);
}

void main() {
  const uint m = gl_WorkGroupID.x, id = gl_LocalInvocationID.x;
  const uint k4 = p.k / 4, words = p.padded_k / 4;
  float amax = 0.0;
  bool nonfinite = false;
  for (uint w = id; w < k4; w += 256) {
    const vec4 h = x4[m * k4 + w];
    nonfinite = nonfinite || any(isnan(h)) || any(isinf(h));
    const vec4 a = abs(h);
    amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
  }
  amax = group_max(amax);
  const bool unbounded = group_max(nonfinite ? 1.0 : 0.0) > 0.0 || (amax > 0.0 && amax < 1e-18);
  const float inverse = amax > 0.0 && !unbounded ? SCALE / amax : 0.0;
  const float unit = amax > 0.0 && !unbounded ? 1.0 / amax : 0.0;
  float squares = 0.0;
  for (uint w = id; w < words; w += 256) {
    const vec4 h = w < k4 ? x4[m * k4 + w] : vec4(0.0);
    const vec4 scaled = h * unit;
    squares += dot(scaled, scaled);
    const ivec4 h16 = ivec4(clamp(roundEven(h * inverse), vec4(-SCALE), vec4(SCALE)));
    const ivec4 lo = ((h16 + 128) & 255) - 128, hi = (h16 - lo) >> 8;
    split[2 * m * words + w] = pack_bytes(hi);
    split[(2 * m + 1) * words + w] = pack_bytes(lo);
  }
  squares = group_sum(squares);
  if (id == 0) {
    const float sigma_h = amax / SCALE;
    stats[m] = vec4(sigma_h, amax * sqrt(squares), 0.52 * sqrt(float(p.k)) * sigma_h,
                    unbounded ? 1.0 : 0.0);
  }
}
