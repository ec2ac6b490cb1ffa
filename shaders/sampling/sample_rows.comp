#version 450
// Draws one index a row of float32 logits x [M, N] (Gumbel-max): the kept values are those at
// least the row's k-th largest (every one where k is 0, or where the row holds fewer than k
// numbers) and, with top-p, at least its nucleus threshold (sample_nucleus.comp), and the draw is
// the kept index j with the largest
//     s_j = x_j + T g_j (T < 1), or x_j (1 / T) + g_j (T >= 1: no overflow either way),
//     g_j = -log(-log(1 - u_j)),   u_j = (h_j + 0.5) / 2^32,
// with 1 / T rounded to float32 by the host, the first of equal ones (the first NaN where the row
// holds one: index -1 then), which is a draw from softmax(x / T) over the kept values.
// h_j = pcg(pcg(j) ^ key), key = pcg(m ^ pcg(step ^ pcg(seed_lo ^ pcg(seed_hi)))) (m the row's own
// key row where each row has its parameters),
// step = start[m] + offset (start[0] + offset where start holds one value): the noise depends on
// (seed, step, m, j) alone, so a row's draw does not depend on the other rows or on how the work
// is split (sampling_common.glsl).
// reference.sample_rows computes the same in float64.
//
// Four dispatches over chunks of CHUNK values (workgroup (c, m) takes chunk c of row m):
//   PHASE 0, 1, 2: a radix select of the k-th largest value's order key (key(), 11 + 11 + 10
//     bits): each workgroup counts its chunk's keys that share the digits picked so far, by their
//     next digit, into the row's bins; the last workgroup to finish (an atomic ticket, which it
//     resets) finds the digit where the count from the top reaches the k still wanted, and
//     resets the bins. k = 0 skips them.
//   (sample_nucleus.comp's four passes come between, for top-p.)
//   PHASE 3: each workgroup's best kept (s_j, j), then the last one's pick of the chunks' best;
//     the last one also resets the nucleus's maximum for the next run.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "../quantize/quantize_common.glsl"
#include "../model/argmax_common.glsl"
#include "sampling_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint PHASE = 0;
// The op binds blocks of rows: x and index_out start at the block's first row, p.row0 in the whole
// array (which keys the noise); the scratch, reused by every block, is indexed by the row within
// it.
layout(std430, binding = 0) readonly buffer X { float x[]; };
// T and 1 / T (float32 bits), k, seed_lo, seed_hi, top-p as p 2^32 (0: none): [6] for every row,
// or with p.params_stride 8 [M, 8], each row's own and at 6 the row its draw is keyed by
layout(std430, binding = 1) readonly buffer Params { uint params[]; };
// [1], or [M] for a step of each row's own (p.start_stride 1)
layout(std430, binding = 2) readonly buffer Start { int start[]; };
// [M, BINS], zero between phases
layout(std430, binding = 3) coherent buffer Bins { uint bins[]; };
// [M]: prefix, wanted, all
layout(std430, binding = 4) coherent buffer Select { uvec4 select_state[]; };
// [M, TICKETS], zero between runs
layout(std430, binding = 5) coherent buffer Tickets { uint tickets[]; };
// [M, chunks]: (s bits, index)
layout(std430, binding = 6) coherent buffer Partial { uvec2 partial[]; };
layout(std430, binding = 7) buffer NaNs { uint nan_count; };
layout(std430, binding = 8) writeonly buffer Out { int index_out[]; };
// [M, 8] (sample_nucleus.comp's Nucleus): the largest kept key, the threshold's key, ...; all zero
// between runs
layout(std430, binding = 9) coherent buffer Nucleus { uint nucleus[]; };
// row_stride: values from one row of x to the next (n, or more where x's rows are strided)
layout(push_constant) uniform Push {
  uint n; uint chunks; uint offset; uint row0; uint start_stride; uint params_stride;
  uint row_stride;
} p;

// Parameter i of block row `row`.
uint param(uint row, uint i) { return params[(p.row0 + row) * p.params_stride + i]; }

const uint CHUNK = 1024, BINS = 2048, PER_INVOCATION = CHUNK / 256, TICKETS = 8;
shared uint s_bins[BINS];
shared uint s_subgroup_sums[64];
shared bool s_last;

#include "../model/last_workgroup.glsl"

void select_digit(uint row, uint k) {
  const uint id = gl_LocalInvocationID.x;
  const uint shift = PHASE == 0 ? 21u : PHASE == 1 ? 10u : 0u;
  const uint high = shift + (PHASE == 2 ? 10u : 11u), digit_mask = (1u << (high - shift)) - 1u;
  const uvec4 state = PHASE == 0 ? uvec4(0u, k, 0u, 0u) : select_state[row];
  if (state.z != 0u) return;  // fewer numbers than k: every value is kept
  [[unroll]] for (uint i = 0; i < BINS / 256; ++i) s_bins[id + 256 * i] = 0u;
  barrier();
  const uint first = gl_WorkGroupID.x * CHUNK, end = min(first + CHUNK, p.n);
  float v[PER_INVOCATION];
  [[unroll]] for (uint t = 0; t < PER_INVOCATION; ++t) {
    const uint j = first + id + 256 * t;
    v[t] = j < end ? x[row * p.row_stride + j] : 0.0;
  }
  [[unroll]] for (uint t = 0; t < PER_INVOCATION; ++t) {
    const uint j = first + id + 256 * t;
    if (j >= end || isnan(v[t])) continue;
    const uint kv = key(v[t]);
    if (high == 32u || (kv >> high) == (state.x >> high))
      atomicAdd(s_bins[(kv >> shift) & digit_mask], 1u);
  }
  barrier();
  [[unroll]] for (uint i = 0; i < BINS / 256; ++i) {
    const uint count = s_bins[id + 256 * i];
    if (count != 0u) atomicAdd(bins[row * BINS + id + 256 * i], count);
  }
  if (!last_workgroup(row * TICKETS + PHASE)) return;
  // Invocation i takes digits BINS - 1 - 8 i down to BINS - 8 - 8 i, read and reset.
  uint counts[BINS / 256];
  uint sum = 0u;
  [[unroll]] for (uint u = 0; u < BINS / 256; ++u) {
    counts[u] = atomicExchange(bins[row * BINS + BINS - 1 - (BINS / 256) * id - u], 0u);
    sum += counts[u];
  }
  // above: the values counted by the invocations before this one (the larger digits)
  uint above = subgroupExclusiveAdd(sum);
  const uint subgroup_sum = subgroupAdd(sum);
  if (subgroupElect()) s_subgroup_sums[gl_SubgroupID] = subgroup_sum;
  barrier();
  uint total = 0u;
  for (uint s = 0; s < gl_NumSubgroups; ++s) {
    if (s < gl_SubgroupID) above += s_subgroup_sums[s];
    total += s_subgroup_sums[s];
  }
  const uint wanted = state.y;
  if (total < wanted) {
    if (id == 0) select_state[row] = uvec4(0u, 0u, 1u, 0u);
    return;
  }
  if (above < wanted && wanted <= above + sum) {
    [[unroll]] for (uint u = 0; u < BINS / 256; ++u) {
      if (above + counts[u] >= wanted) {
        const uint digit = BINS - 1 - (BINS / 256) * id - u;
        select_state[row] = uvec4(state.x | (digit << shift), wanted - above, 0u, 0u);
        break;
      }
      above += counts[u];
    }
  }
}

void draw(uint row, uint k) {
  const uint id = gl_LocalInvocationID.x;
  const uvec4 state = k == 0u ? uvec4(0u, 0u, 1u, 0u) : select_state[row];
  uint threshold = state.z != 0u ? 0u : state.x;  // every number's key is above 0
  const float temperature = uintBitsToFloat(param(row, 0));
  const float inverse = uintBitsToFloat(param(row, 1));
  const bool nucleus_ran = param(row, 5) != 0u && temperature != 0.0;
  if (nucleus_ran && nucleus_applies(nucleus[row * 8]))
    threshold = max(threshold, nucleus[row * 8 + 1]);
  const uint step = uint(start[(p.row0 + row) * p.start_stride]) + p.offset;
  const uint row_key = ROW_DRAW_KEY(params, (p.row0 + row) * p.params_stride, p.params_stride != 0,
                                    p.row0 + row, step);
  const uint first = gl_WorkGroupID.x * CHUNK, end = min(first + CHUNK, p.n);
  float v[PER_INVOCATION];
  [[unroll]] for (uint t = 0; t < PER_INVOCATION; ++t) {
    const uint j = first + id + 256 * t;
    v[t] = j < end ? x[row * p.row_stride + j] : 0.0;
  }
  float best = -1.0 / 0.0;
  uint best_index = 0xFFFFFFFFu, nans = 0u;
  [[unroll]] for (uint t = 0; t < PER_INVOCATION; ++t) {
    const uint j = first + id + 256 * t;
    if (j >= end) continue;
    if (isnan(v[t])) ++nans;
    else if (key(v[t]) < threshold) continue;
    const float s = draw_score(v[t], gumbel(j, row_key), temperature, inverse);
    if (before(s, j, best, best_index)) {
      best = s;
      best_index = j;
    }
  }
  nans = subgroupAdd(nans);
  if (subgroupElect() && nans != 0u) atomicAdd(nan_count, nans);
  workgroup_best(best, best_index);
  if (id == 0) partial[row * p.chunks + gl_WorkGroupID.x] = packed_best();
  if (!last_workgroup(row * TICKETS + PHASE)) return;
  // Every workgroup has read the row's state: all of it zero again, as its scratch is lent to
  // whatever op needs zeros next (a graph's or the device's pool), not only to the nucleus.
  if (nucleus_ran && id < 8) nucleus[row * 8 + id] = 0u;
  best = -1.0 / 0.0;
  best_index = 0xFFFFFFFFu;
  for (uint c = id; c < p.chunks; c += 256) offer(partial[row * p.chunks + c], best, best_index);
  workgroup_best(best, best_index);
  if (id == 0) index_out[row] = isnan(s_value[0]) ? -1 : int(s_index[0]);
}

void main() {
  const uint row = gl_WorkGroupID.y, k = param(row, 2);
  if (PHASE < 3) {
    if (k != 0u) select_digit(row, k);
  } else {
    draw(row, k);
  }
}
