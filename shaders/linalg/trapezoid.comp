#version 450
//! variant f32
//! variant f64 FLOAT64
// out[b, i, j] (rows x cols, contiguous) from the view vx: MODE 0, x's upper trapezoid (i <= j)
// with zeros below (R of a QR); 1, the identity (x not read: the start of Q); 2, all of x (a
// transposed or strided copy).
#extension GL_GOOGLE_include_directive : require
#include "linalg_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint MODE = 0;
layout(std430, binding = 0) readonly buffer X { SCALAR x[]; };
layout(std430, binding = 1) writeonly buffer Out { SCALAR o[]; };
layout(push_constant) uniform Push { uint rows; uint cols; uint total; View vx; } p;

void main() {
  for (uint e = gl_GlobalInvocationID.x; e < p.total; e += gl_NumWorkGroups.x * 256) {
    const uint per = p.rows * p.cols, b = e / per, i = (e % per) / p.cols, j = e % p.cols;
    o[e] = MODE == 1   ? SCALAR(i == j ? 1 : 0)
           : MODE == 2 || i <= j ? x[at(p.vx, b, i, j)]
                                 : SCALAR(0);
  }
}
