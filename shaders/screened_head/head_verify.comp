#version 450
//! variant f32
//! variant f16 INPUT_F16
//! variant sample_f32 SAMPLE
//! variant sample_f16 INPUT_F16 SAMPLE
// The second pass of the screened argmax (head_screen.comp): workgroup g takes rows
// [CHUNK g, CHUNK (g + 1)) of the float head, keeps the candidates, the rows whose bracket reaches
// T = the largest lower end of any bracket (or is NaN), and computes their logits h . head[v]
// exactly as linear_rows does (a team of 32 invocations a row, the same order, precise), then
// writes its best (value, index); the last workgroup to finish (counted by an atomic, which it
// resets for the next run) picks the best of those. Workgroup (g, m) does so for row m of h
// (head_brackets.comp's brackets), with a counter and an index of its own. The row with the
// largest logit (the first of equal ones, or the first NaN) has a bracket that reaches T, so it
// is among the candidates.
// SAMPLE (the screened draw, ops/screened_head.cpp's screened_sample; for row m of h, with its own
// parameters and step where each row has them): the candidates are the rows whose upper end
// reaches the top_k-th largest lower end (its order key in select_state, from sample_rows.comp's
// select passes over head_screen's or head_brackets' low) where top_k is set, else the rows whose
// draw_score(upper end, g_v) reaches the largest draw_score(lower end, g_w) (lows); each
// candidate's logit, computed as above, goes to exact[m, v] and -inf to every other row, and
// sample_rows.comp then draws from exact: the draw it makes from linear_rows' logits. With top-p
// (params[5] != 0, T > 0) and no top_k, the candidates are the rows whose upper end reaches
// L - 22.5 T, L the largest lower end (the second half of lows): every other row's
// logit lies more than 22.5 T below the largest, so its top-p weight roundEven(exp((x - m) / T)
// 2^31) is 0 (exp(-22.18) = 2^-32) whatever the logit, it is never kept, and the nucleus passes
// give the same threshold from exact as from linear_rows' logits.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "../ops/ops_common.glsl"
#include "../model/argmax_common.glsl"
#ifdef SAMPLE
#include "../sampling/sampling_common.glsl"
#endif
layout(local_size_x = 256) in;
// as linear_rows (the order does not depend on it)
layout(constant_id = 0) const uint IN_FLIGHT = 2;
layout(std430, binding = 0) readonly buffer X4 { vec4 x4[]; };  // h float32 [M, K], K % 4 == 0
layout(std430, binding = 1) readonly buffer W4 { ELEMENT4 w4[]; };  // head [V, K]
layout(std430, binding = 2) readonly buffer High { float high[]; };  // [M, V]
// [M, screening workgroups] ([2, ...] with SAMPLE)
layout(std430, binding = 3) readonly buffer Lows { float lows[]; };
#ifdef SAMPLE
// [M]: prefix, wanted, all
layout(std430, binding = 4) readonly buffer Select { uvec4 select_state[]; };
// as sample_rows.comp's: [6] for every row, or [M, 8] (params_stride 8) each row's own
layout(std430, binding = 5) readonly buffer Params { uint params[]; };
layout(std430, binding = 6) readonly buffer Start { int start[]; };  // [1], or [M] (stride 1)
layout(std430, binding = 7) writeonly buffer Exact { float exact[]; };  // [M, V]
// high[m, v] at high[high_at + m high_stride + v], exact[m, v] at exact[m exact_stride + v]: the
// one buffer where they are the rows of head_brackets' products (each candidate row's exact value
// is written by the workgroup that read its high end, after reading it)
layout(push_constant) uniform Push {
  uint v; uint k; uint lows; uint offset; uint start_stride; uint params_stride;
  uint high_at; uint high_stride; uint exact_stride;
} p;
#else
// [M, chunks]: (value bits, index)
layout(std430, binding = 4) coherent buffer Partial { uvec2 partial[]; };
layout(std430, binding = 5) coherent buffer Counter { uint tickets[]; };  // [M], zero between runs
layout(std430, binding = 6) writeonly buffer Out { int index_out[]; };  // [M]
// high[m, v] at high[m high_stride + v] (2V where high is head_brackets' products buffer)
layout(push_constant) uniform Push { uint v; uint k; uint lows; uint high_stride; } p;
#endif

// rows a workgroup screens (ops/model.cpp's verify_chunk)
layout(constant_id = 1) const uint CHUNK = 128;
const uint TEAM = 32, TEAMS = 8;
shared float s_low[256];
shared uint s_count;
shared uint s_rows[CHUNK];
shared float partial_sum[256];
shared bool s_last;
#ifndef SAMPLE
#include "../model/last_workgroup.glsl"
#endif

void main() {
  const uint id = gl_LocalInvocationID.x, lane = id % TEAM, team = id / TEAM;
  const uint first = gl_WorkGroupID.x * CHUNK, end = min(first + CHUNK, p.v);
  // Row m of h: its row of high, its screening workgroups' lows.
  const uint m = gl_WorkGroupID.y, k4 = p.k / 4;
#ifdef SAMPLE
  const uint at = m * p.params_stride;
  const float temperature = uintBitsToFloat(params[at]);
  const float inverse = uintBitsToFloat(params[at + 1]);
  const bool by_key = params[at + 2] != 0u;
  const bool by_weight = !by_key && params[at + 5] != 0u && temperature != 0.0;
  // top-p: the largest lower end itself, the second half of lows
  const uint from = by_weight ? gl_NumWorkGroups.y * p.lows : 0u;
#else
  const uint from = 0u;
#endif
  float t = -1.0 / 0.0;
  for (uint i = id; i < p.lows; i += 256) {
    const float low = lows[from + m * p.lows + i];
    if (low > t) t = low;  // NaN never raises it
  }
  t = subgroupMax(t);
  if (subgroupElect()) s_low[gl_SubgroupID] = t;
  if (id == 0) s_count = 0;
  barrier();
  float threshold = s_low[0];
  for (uint s = 1; s < gl_NumSubgroups; ++s) threshold = max(threshold, s_low[s]);
#ifdef SAMPLE
  const uint row_key =
      ROW_DRAW_KEY(params, at, p.params_stride != 0, m, uint(start[m * p.start_stride]) + p.offset);
  const uvec4 selected = select_state[m];
  const uint low_key = by_key && selected.z == 0u ? selected.x : 0u;
  const float weight_floor = threshold - 22.5 * temperature;
  for (uint r = id; r < CHUNK; r += 256) {
    const uint row = first + r;
    if (row >= end) continue;
    const float h = high[p.high_at + m * p.high_stride + row];
    if (isnan(h) || (by_key     ? key(h) >= low_key
                     : by_weight ? !(h < weight_floor)
                                 : !(draw_score(h, gumbel(row, row_key), temperature, inverse) <
                                     threshold)))
      s_rows[atomicAdd(s_count, 1u)] = row;
    else
      exact[m * p.exact_stride + row] = -1.0 / 0.0;
  }
#else
  for (uint r = id; r < CHUNK; r += 256) {
    const uint row = first + r;
    if (row < end && !(high[m * p.high_stride + row] < threshold))
      s_rows[atomicAdd(s_count, 1u)] = row;
  }
#endif
  barrier();
  const uint count = s_count;
  float best = -1.0 / 0.0;
  uint best_index = 0xFFFFFFFFu;
  for (uint round = 0; round * TEAMS < count; ++round) {  // uniform
    const uint slot = round * TEAMS + team;
    const uint row = slot < count ? s_rows[slot] : 0xFFFFFFFFu;
    precise float acc = 0.0;
    if (row != 0xFFFFFFFFu) {
      // linear_rows' loop for one row of x
      for (uint c0 = lane; c0 < k4; c0 += TEAM * IN_FLIGHT) {
        vec4 wv[IN_FLIGHT];
        [[unroll]] for (uint u = 0; u < IN_FLIGHT; ++u) {
          const uint c = c0 + u * TEAM;
          wv[u] = c < k4 ? vec4(w4[row * k4 + c]) : vec4(0.0);
        }
        [[unroll]] for (uint u = 0; u < IN_FLIGHT; ++u) {
          const uint c = c0 + u * TEAM;
          if (c < k4) acc = acc + dot(wv[u], x4[m * k4 + c]);
        }
      }
    }
    partial_sum[id] = acc;
    barrier();
    for (uint s = TEAM / 2; s > 0; s >>= 1) {  // linear_rows' tree
      if (lane < s) partial_sum[id] += partial_sum[id + s];
      barrier();
    }
#ifdef SAMPLE
    if (lane == 0 && row != 0xFFFFFFFFu) exact[m * p.exact_stride + row] = partial_sum[id];
#else
    if (lane == 0 && row != 0xFFFFFFFFu && before(partial_sum[id], row, best, best_index)) {
      best = partial_sum[id];
      best_index = row;
    }
#endif
    barrier();  // partial_sum is written again next round
  }
#ifndef SAMPLE
  // Each team's best sits in its lane 0; every other invocation offers nothing.
  workgroup_best(lane == 0 ? best : -1.0 / 0.0, lane == 0 ? best_index : 0xFFFFFFFFu);
  if (id == 0) partial[m * gl_NumWorkGroups.x + gl_WorkGroupID.x] = packed_best();
  // The last workgroup of row m picks the best of its chunks.
  if (!last_workgroup(m)) return;
  best = -1.0 / 0.0;
  best_index = 0xFFFFFFFFu;
  for (uint c = id; c < gl_NumWorkGroups.x; c += 256)
    offer(partial[m * gl_NumWorkGroups.x + c], best, best_index);
  workgroup_best(best, best_index);
  if (id == 0) index_out[m] = int(s_index[0]);
#endif
}
