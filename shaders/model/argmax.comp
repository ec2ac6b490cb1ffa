#version 450
// Index of the largest value of each row, as np.argmax: x float32 [M, N] -> int32 [M]; the
// first of equal maxima, and the first NaN where a row has one. Two passes: PHASE 0, workgroup
// (c, row) takes the c-th chunk of CHUNK values of the row and writes its best (value, index);
// PHASE 1, one workgroup a row picks the best of the chunks. Picking is order-independent
// (argmax_common.glsl), so the result is exact.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "argmax_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint PHASE = 0;
layout(std430, binding = 0) readonly buffer X { float x[]; };
// [M, chunks]: (value bits, index)
layout(std430, binding = 1) buffer Partial { uvec2 partial[]; };
layout(std430, binding = 2) writeonly buffer Out { int index_out[]; };
layout(push_constant) uniform Push { uint m; uint n; uint chunks; } p;

const uint CHUNK = 1024;  // four values an invocation, requested together

void main() {
  const uint id = gl_LocalInvocationID.x, row = gl_WorkGroupID.y;
  float best = -1.0 / 0.0;
  uint best_index = 0xffffffffu;
  if (PHASE == 0) {
    const uint first = gl_WorkGroupID.x * CHUNK, end = min(first + CHUNK, p.n);
    float v[CHUNK / 256];
    [[unroll]] for (uint t = 0; t < CHUNK / 256; ++t) {
      const uint j = first + id + 256 * t;
      v[t] = j < end ? x[row * p.n + j] : 0.0;
    }
    [[unroll]] for (uint t = 0; t < CHUNK / 256; ++t) {
      const uint j = first + id + 256 * t;
      if (j < end && before(v[t], j, best, best_index)) { best = v[t]; best_index = j; }
    }
  } else {
    for (uint c = id; c < p.chunks; c += 256) offer(partial[row * p.chunks + c], best, best_index);
  }
  workgroup_best(best, best_index);
  if (id == 0) {
    if (PHASE == 0) partial[row * p.chunks + gl_WorkGroupID.x] = packed_best();
    else index_out[row] = int(s_index[0]);
  }
}
