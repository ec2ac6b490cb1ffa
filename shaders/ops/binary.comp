#version 450
//! variant f32
//! variant f16 INPUT_F16
// y = a OP b with NumPy broadcasting, float32 arithmetic, OP 0 add, 1 sub, 2 mul, 3 div.
// SAME_SHAPE: a, b and y are one contiguous shape, read and written as 16-byte vectors.
// Otherwise each output index is split over up to 6 axes and mapped through per-input element
// strides (0 along broadcast axes).
#extension GL_GOOGLE_include_directive : require
#include "ops_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint OP = 0;
layout(constant_id = 1) const bool SAME_SHAPE = true;
layout(std430, binding = 0) readonly buffer A { ELEMENT a[]; };
layout(std430, binding = 1) readonly buffer A4 { ELEMENT4 a4[]; };
layout(std430, binding = 2) readonly buffer B { ELEMENT b[]; };
layout(std430, binding = 3) readonly buffer B4 { ELEMENT4 b4[]; };
layout(std430, binding = 4) writeonly buffer Y { ELEMENT y[]; };
layout(std430, binding = 5) writeonly buffer Y4 { ELEMENT4 y4[]; };
layout(push_constant) uniform Push {
  uint n; uint ndim; uint shape[6]; uint a_strides[6]; uint b_strides[6];
} p;

vec4 apply(vec4 x, vec4 z) {
  if (OP == 0) return x + z;
  if (OP == 1) return x - z;
  if (OP == 2) return x * z;
  return x / z;
}

void main() {
  const uint stride = gl_NumWorkGroups.x * 256;
  if (SAME_SHAPE) {
    const uint vectors = p.n / 4;
    for (uint i = gl_GlobalInvocationID.x; i < vectors; i += stride)
      y4[i] = ELEMENT4(apply(vec4(a4[i]), vec4(b4[i])));
    const uint tail = 4 * vectors + gl_GlobalInvocationID.x;
    if (tail < p.n) y[tail] = ELEMENT(apply(vec4(float(a[tail])), vec4(float(b[tail]))).x);
    return;
  }
  for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
    uint rest = i, ia = 0, ib = 0;
    for (int axis = int(p.ndim) - 1; axis >= 0; --axis) {
      const uint coordinate = rest % p.shape[axis];
      rest /= p.shape[axis];
      ia += coordinate * p.a_strides[axis];
      ib += coordinate * p.b_strides[axis];
    }
    y[i] = ELEMENT(apply(vec4(float(a[ia])), vec4(float(b[ib]))).x);
  }
}
