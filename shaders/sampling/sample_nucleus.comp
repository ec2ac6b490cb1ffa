#version 450
// Top-p (nucleus) selection for sample_rows.comp's draw, per row of float32 logits x [M, N]: the
// row's threshold key tau, so that the draw keeps the values whose key is at least tau. Among the
// values kept by top-k (key at least the k-th largest's; every number where k is 0) with largest
// value m, each has the weight
//     W_j = roundEven(exp(d_j) 2^31),  d_j = (x_j - m) (1 / T) for T >= 1, (x_j - m) / T below,
// in float32 (so W of the largest is 2^31), and the value v is kept where the weights of the kept
// values above it, A(v), satisfy
//     A(v) 2^32 < P Z,   Z the sum of every weight, P = round(p 2^32) in [1, 2^32)
// in exact integers: the smallest set of the largest values that holds at least the share p of
// the mass, ties kept together. tau is the smallest kept value's key. Integer sums are exact in any
// order, so the threshold does not depend on how the work is split. Where T is 0, P is 0 (no
// top-p),
// or the largest kept value is infinite, every pass does nothing and the draw keeps every value
// top-k keeps. reference.sampling_kept computes the same in float64.
//
// Four dispatches over chunks of CHUNK values (workgroup (c, m) takes chunk c of row m), after
// sample_rows.comp's top-k passes and before its draw:
//   PHASE 0: the largest kept key, by atomicMax into nucleus[m].max_key (the draw's last workgroup
//     resets it).
//   PHASE 1, 2, 3: a radix select of tau (11 + 11 + 10 bits): each workgroup sums its chunk's
//     weights and counts its values that share the digits picked so far, by their next digit, into
//     the row's bins; the last workgroup to finish (an atomic ticket, which it resets) scans the
//     bins from the largest digit down and picks the smallest non-empty digit whose values above
//     it (with the mass above the prefix) stay under P Z, and resets the bins. Its value of the
//     largest weight in the bin satisfies the rule, those of every smaller digit break it.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_atomic_int64 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "../quantize/quantize_common.glsl"
#include "sampling_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint PHASE = 0;
// Rows in blocks, as sample_rows.comp binds them: x starts at the block's first row, the scratch
// is indexed by the row within the block.
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Params { uint params[]; };  // as sample_rows.comp's
// [M, BINS], zero between phases
layout(std430, binding = 2) coherent buffer Counts { uint counts[]; };
// sample_rows.comp's top-k state
layout(std430, binding = 3) readonly buffer Select { uvec4 select_state[]; };
// [M, 8]: slots 4 to 6 here
layout(std430, binding = 4) coherent buffer Tickets { uint tickets[]; };
// [M, BINS], zero between phases
layout(std430, binding = 5) coherent buffer Masses { uint64_t masses[]; };
struct NucleusState {
  uint max_key;    // the largest kept key (0: none yet)
  uint prefix;     // tau's digits picked so far (after PHASE 3: tau)
  uint unused0, unused1;
  uint64_t above;  // the weights of the kept values above the prefix's range
  uint64_t total;  // Z
};
layout(std430, binding = 6) coherent buffer Nucleus { NucleusState nucleus[]; };
// row_stride: values from one row of x to the next (n, or more where x's rows are strided)
layout(push_constant) uniform Push {
  uint n; uint chunks; uint row0; uint params_stride; uint row_stride;
} p;

// Parameter i of block row `row` (sample_rows.comp's).
uint param(uint row, uint i) { return params[(p.row0 + row) * p.params_stride + i]; }

const uint CHUNK = 1024, BINS = 2048, PER_INVOCATION = CHUNK / 256, TICKETS = 8;
// A chunk's weights by bin, their low 16 bits and the rest summed apart in 32-bit atomics (at
// most 1024 weights of at most 2^31 + 2^8: each sum stays below 2^32).
shared uint s_counts[BINS];
shared uint s_low[BINS];
shared uint s_high[BINS];
shared uint64_t s_scan[256];
shared uint s_subgroup_max[64];
shared uint s_pick;
shared bool s_last;

#include "../model/last_workgroup.glsl"

// W for value v of a row whose largest kept value is m.
uint64_t weight(float v, float m, float t, float inverse) {
  const float d = v - m;
  const float e = t >= 1.0 ? d * inverse : d / t;
  return uint64_t(roundEven(exp(e) * 2147483648.0));
}

// Whether above 2^32 < P Z, exactly (Z < 2^62: P Z splits into mid 2^32 + low).
bool under_share(uint64_t above, uint share, uint64_t total) {
  const uint64_t low = uint64_t(share) * (total & 0xFFFFFFFFul);
  const uint64_t mid = (low >> 32) + uint64_t(share) * (total >> 32);
  return above < mid || (above == mid && uint(low) != 0u);
}

// The smallest key top-k keeps in this row (every number's key is above 0).
uint top_k_threshold(uint row) {
  if (param(row, 2) == 0u) return 0u;
  const uvec4 state = select_state[row];
  return state.z != 0u ? 0u : state.x;
}

void largest(uint row, uint kept_from) {
  const uint id = gl_LocalInvocationID.x;
  const uint first = gl_WorkGroupID.x * CHUNK, end = min(first + CHUNK, p.n);
  uint most = 0u;
  [[unroll]] for (uint r = 0; r < PER_INVOCATION; ++r) {
    const uint j = first + id + 256 * r;
    if (j >= end) continue;
    const float v = x[row * p.row_stride + j];
    if (!isnan(v) && key(v) >= kept_from) most = max(most, key(v));
  }
  most = subgroupMax(most);
  if (subgroupElect()) s_subgroup_max[gl_SubgroupID] = most;
  barrier();
  if (id == 0) {
    for (uint s = 1; s < gl_NumSubgroups; ++s) most = max(most, s_subgroup_max[s]);
    if (most != 0u) atomicMax(nucleus[row].max_key, most);
  }
}

void select_digit(uint row, uint kept_from) {
  const uint id = gl_LocalInvocationID.x;
  const uint level = PHASE - 1;
  const uint shift = level == 0 ? 21u : level == 1 ? 10u : 0u;
  const uint high = shift + (level == 2 ? 10u : 11u), digit_mask = (1u << (high - shift)) - 1u;
  const uint max_key = nucleus[row].max_key;
  if (!nucleus_applies(max_key)) return;
  const float m = unkey(max_key), t = uintBitsToFloat(param(row, 0)),
              inverse = uintBitsToFloat(param(row, 1));
  const uint prefix = level == 0 ? 0u : nucleus[row].prefix;
  [[unroll]] for (uint i = 0; i < BINS / 256; ++i) {
    s_counts[id + 256 * i] = 0u;
    s_low[id + 256 * i] = 0u;
    s_high[id + 256 * i] = 0u;
  }
  barrier();
  const uint first = gl_WorkGroupID.x * CHUNK, end = min(first + CHUNK, p.n);
  [[unroll]] for (uint r = 0; r < PER_INVOCATION; ++r) {
    const uint j = first + id + 256 * r;
    if (j >= end) continue;
    const float v = x[row * p.row_stride + j];
    if (isnan(v)) continue;
    const uint kv = key(v);
    if (kv < kept_from || (high != 32u && (kv >> high) != (prefix >> high))) continue;
    const uint digit = (kv >> shift) & digit_mask;
    atomicAdd(s_counts[digit], 1u);
    const uint64_t w = weight(v, m, t, inverse);
    if (w != 0ul) {
      atomicAdd(s_low[digit], uint(w) & 0xFFFFu);
      atomicAdd(s_high[digit], uint(w >> 16));
    }
  }
  barrier();
  [[unroll]] for (uint i = 0; i < BINS / 256; ++i) {
    const uint bin = id + 256 * i;
    if (s_counts[bin] != 0u) {
      atomicAdd(counts[row * BINS + bin], s_counts[bin]);
      const uint64_t mass = (uint64_t(s_high[bin]) << 16) + uint64_t(s_low[bin]);
      if (mass != 0ul) atomicAdd(masses[row * BINS + bin], mass);
    }
  }
  if (!last_workgroup(row * TICKETS + 4 + level)) return;
  // Invocation i takes digits BINS - 1 - 8 i down to BINS - 8 - 8 i, read and reset.
  uint bin_counts[BINS / 256];
  uint64_t bin_masses[BINS / 256];
  uint64_t sum = 0ul;
  [[unroll]] for (uint u = 0; u < BINS / 256; ++u) {
    const uint bin = row * BINS + BINS - 1 - (BINS / 256) * id - u;
    bin_counts[u] = atomicExchange(counts[bin], 0u);
    bin_masses[u] = atomicExchange(masses[bin], 0ul);
    sum += bin_masses[u];
  }
  // An inclusive scan of the sums over the invocations (the larger digits first).
  s_scan[id] = sum;
  if (id == 0) s_pick = BINS;
  barrier();
  for (uint offset = 1; offset < 256; offset <<= 1) {
    const uint64_t before_me = id >= offset ? s_scan[id - offset] : 0ul;
    barrier();
    s_scan[id] += before_me;
    barrier();
  }
  const uint64_t total = level == 0 ? s_scan[255] : nucleus[row].total;
  const uint share = param(row, 5);
  uint64_t above = (level == 0 ? 0ul : nucleus[row].above) + (s_scan[id] - sum);
  uint pick = BINS;
  uint64_t pick_above = 0ul;
  [[unroll]] for (uint u = 0; u < BINS / 256; ++u) {
    if (bin_counts[u] != 0u && under_share(above, share, total)) {
      pick = BINS - 1 - (BINS / 256) * id - u;
      pick_above = above;
    }
    above += bin_masses[u];
  }
  if (pick != BINS) atomicMin(s_pick, pick);
  barrier();
  if (pick != BINS && pick == s_pick) {
    nucleus[row].prefix = prefix | (pick << shift);
    nucleus[row].above = pick_above;
    if (level == 0) nucleus[row].total = total;
  }
}

void main() {
  const uint row = gl_WorkGroupID.y;
  // No top-p, or the argmax.
  if (param(row, 5) == 0u || uintBitsToFloat(param(row, 0)) == 0.0) return;
  const uint kept_from = top_k_threshold(row);
  if (PHASE == 0) {
    largest(row, kept_from);
  } else {
    select_digit(row, kept_from);
  }
}
