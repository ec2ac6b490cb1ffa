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
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "quantize_common.glsl"
#include "../runtime/strided_loop.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool SYMMETRIC = true;
layout(constant_id = 1) const float QMAX = 127.0;
layout(constant_id = 2) const float EPS = 1e-5;
layout(std430, binding = 0) readonly buffer Input { ELEMENT x[]; };
layout(std430, binding = 1) readonly buffer Input4 { ELEMENT4 x4[]; };       // the same tensor
layout(std430, binding = 2) writeonly buffer Quantized { uint8_t q[]; };
layout(std430, binding = 3) writeonly buffer Quantized4 { uint q4[]; };      // the same tensor
layout(std430, binding = 4) writeonly buffer Scales { float scales[]; };
layout(std430, binding = 5) writeonly buffer ZeroPoints { uint8_t zero_points[]; };
layout(std430, binding = 6) buffer Counter { uint nonfinite_total; };
layout(push_constant) uniform Push { uint rows; uint k; uint first_row; } p;

shared float s_a[256], s_b[256];
shared uint s_bad[256];

// Symmetric: max|x| in a; asymmetric: min x in a, max x in b. Non-finite values are counted.
void accumulate(float v, inout float a, inout float b, inout uint bad) {
  if (!finite(v)) { bad++; return; }
  if (SYMMETRIC) a = max(a, abs(v));
  else { a = min(a, v); b = max(b, v); }
}

uint quantize(float v, float scale, float zero_point) {
  if (SYMMETRIC) {
    precise float product = v * scale;
    return uint(int(clamp(roundEven(product), -QMAX - 1.0, QMAX))) & 0xFFu;
  }
  return uint(clamp(roundEven(divide(v, scale)) + zero_point, 0.0, QMAX));
}

// Rows of up to CACHED_VECTORS * 256 vec4 stay in registers between the two passes: the row is
// read from memory once, with every load issued before the reduction waits on any of them.
const uint CACHED_VECTORS = 8;

void reduce_row(inout float a, inout float b, inout uint bad) {
  const uint lane = gl_LocalInvocationID.x;
  // max and min are exact in any order, so subgroup reductions keep results deterministic.
  a = SYMMETRIC ? subgroupMax(a) : subgroupMin(a);
  b = subgroupMax(b);
  bad = subgroupAdd(bad);
  if (subgroupElect()) {
    s_a[gl_SubgroupID] = a;
    s_b[gl_SubgroupID] = b;
    s_bad[gl_SubgroupID] = bad;
  }
  barrier();
  if (lane == 0) {
    for (uint s = 1; s < gl_NumSubgroups; ++s) {
      s_a[0] = SYMMETRIC ? max(s_a[0], s_a[s]) : min(s_a[0], s_a[s]);
      s_b[0] = max(s_b[0], s_b[s]);
      s_bad[0] += s_bad[s];
    }
  }
  barrier();
}

void row_scale(out float scale, out float zero_point) {
  zero_point = 0.0;
  if (SYMMETRIC) {
    scale = divide(QMAX, max(s_a[0], EPS));
  } else {
    const float low = min(s_a[0], 0.0), high = max(s_b[0], 0.0);
    // high - low overflows float32 past FLT_MAX (e.g. -3e38 .. 3e38). Tested without infinities,
    // which drivers may assume away.
    // `precise`: the driver must not refactor the split form back into (high - low) / QMAX.
    precise float headroom = 3.4028235e38 + low;
    precise float split = high / QMAX - low / QMAX;
    scale = high > headroom ? split : max(high - low, EPS) / QMAX;
    zero_point = clamp(roundEven(divide(-low, scale)), 0.0, QMAX);
  }
}

uint quantize4(vec4 v, float scale, float zero_point) {
  return quantize(v.x, scale, zero_point) | quantize(v.y, scale, zero_point) << 8 |
         quantize(v.z, scale, zero_point) << 16 | quantize(v.w, scale, zero_point) << 24;
}

void main() {
  const uint lane = gl_LocalInvocationID.x;
  const bool vectorized = p.k % 4 == 0;  // rows start on 16-byte (input) and 4-byte (q) bounds
  const uint vectors = p.k / 4;
  const bool cached = vectorized && vectors <= CACHED_VECTORS * 256;
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    const uint base = row * p.k;
    float a = SYMMETRIC ? 0.0 : 3.402823466e38, b = -3.402823466e38;
    uint bad = 0;
    vec4 cache[CACHED_VECTORS];
    if (cached) {
      [[unroll]] for (uint c = 0; c < CACHED_VECTORS; ++c) {
        const uint i = lane + c * 256;
        cache[c] = i < vectors ? vec4(x4[base / 4 + i]) : vec4(0.0);
      }
      [[unroll]] for (uint c = 0; c < CACHED_VECTORS; ++c) {
        if (lane + c * 256 < vectors) {
          accumulate(cache[c].x, a, b, bad); accumulate(cache[c].y, a, b, bad);
          accumulate(cache[c].z, a, b, bad); accumulate(cache[c].w, a, b, bad);
        }
      }
    } else if (vectorized) {
      FOR_STRIDED(i, lane, vectors, 256) {
        const vec4 v = vec4(x4[base / 4 + i]);
        accumulate(v.x, a, b, bad); accumulate(v.y, a, b, bad);
        accumulate(v.z, a, b, bad); accumulate(v.w, a, b, bad);
      }
    } else {
      FOR_STRIDED(i, lane, p.k, 256) accumulate(float(x[base + i]), a, b, bad);
    }
    reduce_row(a, b, bad);
    float scale, zero_point;
    row_scale(scale, zero_point);
    if (cached) {
      [[unroll]] for (uint c = 0; c < CACHED_VECTORS; ++c) {
        const uint i = lane + c * 256;
        if (i < vectors) q4[base / 4 + i] = quantize4(cache[c], scale, zero_point);
      }
    } else if (vectorized) {
      FOR_STRIDED(i, lane, vectors, 256)
        q4[base / 4 + i] = quantize4(vec4(x4[base / 4 + i]), scale, zero_point);
    } else {
      FOR_STRIDED(i, lane, p.k, 256)
        q[base + i] = uint8_t(quantize(float(x[base + i]), scale, zero_point));
    }
    if (lane == 0) {
      scales[p.first_row + row] = scale;
      if (!SYMMETRIC) zero_points[p.first_row + row] = uint8_t(uint(zero_point));
      if (s_bad[0] > 0) atomicAdd(nonfinite_total, s_bad[0]);
    }
    barrier();
  }
}
