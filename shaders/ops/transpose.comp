#version 450
//! variant f32
//! variant f16 INPUT_F16
// y [cols, rows] = x [rows, cols]^T through 32 x 32 tiles in shared memory (one column of padding
// against bank conflicts): reads and writes both coalesced.
#extension GL_GOOGLE_include_directive : require
#include "ops_common.glsl"
layout(local_size_x = 32, local_size_y = 8) in;
layout(std430, binding = 0) readonly buffer X { ELEMENT x[]; };
layout(std430, binding = 1) writeonly buffer Y { ELEMENT y[]; };
layout(push_constant) uniform Push { uint rows; uint cols; } p;

shared float tile[32][33];

void main() {
  const uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
  const uint c0 = gl_WorkGroupID.x * 32, r0 = gl_WorkGroupID.y * 32;
  for (uint j = ty; j < 32; j += 8)
    if (r0 + j < p.rows && c0 + tx < p.cols) tile[j][tx] = float(x[(r0 + j) * p.cols + c0 + tx]);
  barrier();
  for (uint j = ty; j < 32; j += 8)
    if (c0 + j < p.cols && r0 + tx < p.rows) y[(c0 + j) * p.rows + r0 + tx] = ELEMENT(tile[tx][j]);
}
