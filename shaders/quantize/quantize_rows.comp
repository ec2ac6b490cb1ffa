#version 450
//! variant f32
//! variant f16 INPUT_F16
// Per-row (per-token) activation quantization, one workgroup per row: the row's absmax (or min and
// max) and its scale, then the row quantized, in one dispatch (the second read hits the cache).
//   symmetric:  s = qmax / max(max|x|, eps),  q = clip(round(x * s), -qmax - 1, qmax)   (int8)
//   asymmetric: lo = min(min x, 0), hi = max(max x, 0), step = max(hi - lo, eps) / levels,
//               zp = clip(round(-lo / step), 0, levels), q = clip(round(x / step) + zp, 0, levels)
//               (uint8; QMAX holds levels = 2^bits - 1)
#extension GL_GOOGLE_include_directive : require
#include "quantize_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool SYMMETRIC = true;
layout(constant_id = 1) const float QMAX = 127.0;
layout(constant_id = 2) const float EPS = 1e-5;
layout(std430, binding = 0) readonly buffer Input { ELEMENT x[]; };
layout(std430, binding = 1) writeonly buffer Quantized { uint8_t q[]; };
layout(std430, binding = 2) writeonly buffer Scales { float scales[]; };
layout(std430, binding = 3) writeonly buffer ZeroPoints { uint8_t zero_points[]; };
layout(std430, binding = 4) buffer Counter { uint nonfinite_total; };
layout(push_constant) uniform Push { uint rows; uint k; uint first_row; } p;

shared float s_a[256], s_b[256];
shared uint s_bad[256];

void main() {
  const uint lane = gl_LocalInvocationID.x;
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    const uint base = row * p.k;
    float a = SYMMETRIC ? 0.0 : 3.402823466e38;  // symmetric: max|x|; asymmetric: min x
    float b = -3.402823466e38;                   // asymmetric: max x
    uint bad = 0;
    for (uint i = lane; i < p.k; i += 256) {
      const float v = float(x[base + i]);
      if (!finite(v)) { bad++; continue; }
      if (SYMMETRIC) a = max(a, abs(v));
      else { a = min(a, v); b = max(b, v); }
    }
    s_a[lane] = a; s_b[lane] = b; s_bad[lane] = bad;
    barrier();
    for (uint width = 128; width > 0; width >>= 1) {
      if (lane < width) {
        s_a[lane] = SYMMETRIC ? max(s_a[lane], s_a[lane + width]) : min(s_a[lane], s_a[lane + width]);
        s_b[lane] = max(s_b[lane], s_b[lane + width]);
        s_bad[lane] += s_bad[lane + width];
      }
      barrier();
    }
    float scale, zero_point = 0.0;
    if (SYMMETRIC) {
      scale = QMAX / max(s_a[0], EPS);
    } else {
      const float low = min(s_a[0], 0.0), high = max(s_b[0], 0.0);
      scale = max(high - low, EPS) / QMAX;
      zero_point = clamp(roundEven(-low / scale), 0.0, QMAX);
    }
    for (uint i = lane; i < p.k; i += 256) {
      const float v = float(x[base + i]);
      if (SYMMETRIC) {
        precise float product = v * scale;
        const int value = int(clamp(roundEven(product), -QMAX - 1.0, QMAX));
        q[base + i] = uint8_t(uint(value) & 0xFFu);
      } else {
        const float value = clamp(roundEven(v / scale) + zero_point, 0.0, QMAX);
        q[base + i] = uint8_t(uint(value));
      }
    }
    if (lane == 0) {
      scales[p.first_row + row] = scale;
      if (!SYMMETRIC) zero_points[p.first_row + row] = uint8_t(uint(zero_point));
      if (s_bad[0] > 0) atomicAdd(nonfinite_total, s_bad[0]);
    }
    barrier();
  }
}
