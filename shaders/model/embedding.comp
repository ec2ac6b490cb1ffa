#version 450
//! variant f32
//! variant f16 INPUT_F16
// Embedding lookup: out[t, :] = float(table[ids[t], :]) for ids [T] (int32) and table [V, H].
// An id outside [0, V) writes a zero row and is counted in `invalid` (the op then raises).
#extension GL_GOOGLE_include_directive : require
#include "../ops/ops_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Table { ELEMENT table[]; };
layout(std430, binding = 1) readonly buffer Ids { int ids[]; };
layout(std430, binding = 2) writeonly buffer Out { float out_values[]; };
layout(std430, binding = 3) buffer Invalid { uint invalid; };
layout(push_constant) uniform Push { uint t; uint h; uint v; } p;

void main() {
  const uint total = p.t * p.h;
  for (uint index = gl_GlobalInvocationID.x; index < total; index += gl_NumWorkGroups.x * 256) {
    const uint t = index / p.h, j = index % p.h;
    const int id = ids[t];
    const bool valid = id >= 0 && uint(id) < p.v;
    if (!valid && j == 0) atomicAdd(invalid, 1u);
    out_values[index] = valid ? float(table[uint(id) * p.h + j]) : 0.0;
  }
}
