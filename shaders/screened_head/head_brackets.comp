#version 450
//! variant argmax
//! variant sample SAMPLE
// The screened head's brackets for several rows of h (ops/screened_head.cpp, M > 1), from the
// int8 matmul of head_split_rows' rows with the head's int8 copy: for row m of h and head row v,
// the bracket of bracket_common.glsl from hi_m . q_v and lo_m . q_v; high[m high_stride + v] its
// high end (NaN where row m has no bracket; high may be the products' buffer, stride 2V: the ends
// then go over row 2m, which only this invocation reads), and lows[m, g] the largest low end of
// workgroup g's head rows. Workgroup (g, m) takes CHUNK head rows of row m.
// SAMPLE (the screened draw of several rows): as head_screen.comp's SAMPLE for each row m, with
// row m's own parameters and step, the ends written over the two sums they come from (each
// invocation reads its pair before it writes it: no other reads them): products row 2m takes the
// low ends, row 2m + 1 the high ends (float32 bits); lows[m, g] the largest draw_score(low end,
// g_v) and lows[M + m, g] the largest low end itself.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "bracket_common.glsl"
#ifdef SAMPLE
#include "../quantize/quantize_common.glsl"
#include "../sampling/sampling_common.glsl"
#endif
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint CHUNK = 2048;
layout(std430, binding = 1) readonly buffer Meta { vec4 meta[]; };  // [V]: sigma_v, D', N, unused
layout(std430, binding = 2) readonly buffer RowStats { vec4 stats[]; };  // [M], head_split_rows'
#ifdef SAMPLE
layout(std430, binding = 0) buffer Products { int products[]; };  // int32 [2M, V], then the ends
layout(std430, binding = 3) writeonly buffer Lows { float lows[]; };  // [2, M, workgroups along x]
// as sample_rows.comp's: [6] for every row, or [M, 8] (params_stride 8) each row's own
layout(std430, binding = 4) readonly buffer Params { uint params[]; };
layout(std430, binding = 5) readonly buffer Start { int start[]; };  // [1], or [M] (stride 1)
layout(push_constant) uniform Push {
  uint v; uint offset; uint start_stride; uint params_stride;
} p;
#else
layout(std430, binding = 0) readonly buffer Products { int products[]; };  // int32 [2M, V]
layout(std430, binding = 3) writeonly buffer High { float high[]; };
layout(std430, binding = 4) writeonly buffer Lows { float lows[]; };  // [M, workgroups along x]
layout(push_constant) uniform Push { uint v; uint high_stride; } p;
#endif
shared float s_low[256];
#ifdef SAMPLE
shared float s_plain_low[256];
#endif

void main() {
  const uint m = gl_WorkGroupID.y, id = gl_LocalInvocationID.x;
  const vec4 row = stats[m];
  const float sigma_h = row.x, norm_h = row.y, error_h = row.z;
  const bool unbounded = row.w != 0.0;
  const float not_a_number = uintBitsToFloat(0x7FC00000u);
  float best_low = -1.0 / 0.0;
#ifdef SAMPLE
  float best_plain_low = -1.0 / 0.0;
  const uint at = m * p.params_stride;
  const float temperature = uintBitsToFloat(params[at]);
  const float inverse_temperature = uintBitsToFloat(params[at + 1]);
  const uint row_key =
      ROW_DRAW_KEY(params, at, p.params_stride != 0, m, uint(start[m * p.start_stride]) + p.offset);
#endif
  const uint first = gl_WorkGroupID.x * CHUNK, end = min(first + CHUNK, p.v);
  for (uint v = first + id; v < end; v += 256) {
    const vec4 r = meta[v];
    const int high_sum = products[2 * m * p.v + v], low_sum = products[(2 * m + 1) * p.v + v];
    const vec2 ends = bracket(high_sum, low_sum, sigma_h, norm_h, error_h, r);
#ifdef SAMPLE
    products[2 * m * p.v + v] = floatBitsToInt(unbounded ? not_a_number : ends.x);
    products[(2 * m + 1) * p.v + v] = floatBitsToInt(unbounded ? not_a_number : ends.y);
    if (!unbounded && ends.x > best_plain_low) best_plain_low = ends.x;
    const float low = draw_score(ends.x, gumbel(v, row_key), temperature, inverse_temperature);
#else
    high[m * p.high_stride + v] = unbounded ? not_a_number : ends.y;
    const float low = ends.x;
#endif
    if (!unbounded && low > best_low) best_low = low;  // NaN never raises it
  }
  best_low = subgroupMax(best_low);
  if (subgroupElect()) s_low[gl_SubgroupID] = best_low;
#ifdef SAMPLE
  best_plain_low = subgroupMax(best_plain_low);
  if (subgroupElect()) s_plain_low[gl_SubgroupID] = best_plain_low;
#endif
  barrier();
  if (id == 0) {
    const uint at_lows = m * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    for (uint s = 1; s < gl_NumSubgroups; ++s) best_low = max(best_low, s_low[s]);
    lows[at_lows] = best_low;
#ifdef SAMPLE
    for (uint s = 1; s < gl_NumSubgroups; ++s) best_plain_low = max(best_plain_low, s_plain_low[s]);
    lows[gl_NumWorkGroups.y * gl_NumWorkGroups.x + at_lows] = best_plain_low;
#endif
  }
}
