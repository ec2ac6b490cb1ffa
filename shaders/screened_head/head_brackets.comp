#version 450
// The screened argmax's brackets for several rows of h (ops/screened_head.cpp, M > 1), from the
// int8 matmul of head_split_rows' rows with the head's int8 copy: for row m of h and head row v,
// the bracket of bracket_common.glsl from hi_m . q_v and lo_m . q_v; high[m, v] its high end
// (NaN where row m has no bracket), and lows[m, g] the largest low end of workgroup g's head
// rows. Workgroup (g, m) takes CHUNK head rows of row m.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "bracket_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint CHUNK = 2048;
layout(std430, binding = 0) readonly buffer Products { int products[]; };  // int32 [2M, V]
layout(std430, binding = 1) readonly buffer Meta { vec4 meta[]; };  // [V]: sigma_v, D', N, unused
layout(std430, binding = 2) readonly buffer Stats { vec4 stats[]; };  // [M], head_split_rows'
layout(std430, binding = 3) writeonly buffer High { float high[]; };  // [M, V]
layout(std430, binding = 4) writeonly buffer Lows { float lows[]; };  // [M, workgroups along x]
layout(push_constant) uniform Push { uint v; } p;
shared float s_low[256];

void main() {
  const uint m = gl_WorkGroupID.y, id = gl_LocalInvocationID.x;
  const vec4 row = stats[m];
  const float sigma_h = row.x, norm_h = row.y, error_h = row.z;
  const bool unbounded = row.w != 0.0;
  const float not_a_number = uintBitsToFloat(0x7FC00000u);
  float best_low = -1.0 / 0.0;
  const uint first = gl_WorkGroupID.x * CHUNK, end = min(first + CHUNK, p.v);
  for (uint v = first + id; v < end; v += 256) {
    const vec4 r = meta[v];
    const int high_sum = products[2 * m * p.v + v], low_sum = products[(2 * m + 1) * p.v + v];
    const vec2 ends = bracket(high_sum, low_sum, sigma_h, norm_h, error_h, r);
    high[m * p.v + v] = unbounded ? not_a_number : ends.y;
    if (!unbounded && ends.x > best_low) best_low = ends.x;  // NaN never raises it
  }
  best_low = subgroupMax(best_low);
  if (subgroupElect()) s_low[gl_SubgroupID] = best_low;
  barrier();
  if (id == 0) {
    for (uint s = 1; s < gl_NumSubgroups; ++s) best_low = max(best_low, s_low[s]);
    lows[m * gl_NumWorkGroups.x + gl_WorkGroupID.x] = best_low;
  }
}
