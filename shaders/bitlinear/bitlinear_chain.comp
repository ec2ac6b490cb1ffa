#version 450
//! variant dot HW_DOT
//! variant int
// A decode step's projections after attention, and the next layer's q, k and v, in one persistent
// dispatch, for M rows (one a sequence):
//   phase 0: x1 = x + o_proj(rms_norm(a, attn_sub_norm))
//   phase 1: f = relu(gate(h))^2 * up(h) where h = rms_norm(x1, post_attention_layernorm)
//   phase 2: x2 = x1 + down_proj(rms_norm(f, ffn_sub_norm))
//   phase 3 (p.phases == 4): q, k, v = q/k/v_proj(rms_norm(x2, the next layer's input_layernorm))
// Each phase is what bitlinear_matvec's FUSED variant makes of that op: every workgroup quantizes
// the rows into shared memory with the same pre-pass (matvec_fused.glsl, on 256 invocations as the
// matvec's: the same sums), its subgroups take two rows at a time (a gate and an up row in phase 1),
// dealt across the workgroups first as the STRIDED matvec does.
// The grid is one round of workgroups that are all resident at once (the host sizes it from the
// device). Between phases each workgroup requests its first weights of the next phase, then waits
// until every workgroup has released the phase before on a device-scope counter: a dependency
// costs a grid-wide wait instead of a dispatch boundary (docs/PERFORMANCE.md). Every wait is
// bounded: a workgroup that polls p.most_polls times counts a timeout (the host raises
// DeviceError) and goes on. The last workgroup out zeroes the counters for the next dispatch.
// Needs K % 64 == 0 for both row lengths (whole 16-byte weight vectors) and even row counts.
#pragma use_vulkan_memory_model
#extension GL_KHR_memory_scope_semantics : require
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_quad : require
#include "../quantize/quantize_common.glsl"
#include "bitlinear_common.glsl"
#include "prepare_common.glsl"
#include "matvec_dot.glsl"
layout(local_size_x = 256, local_size_x_id = 3) in;
const uint WG_SIZE = gl_WorkGroupSize.x;
// The pre-pass runs on the first 256 invocations whatever WG_SIZE: its sums are the matvec's.
const uint PREPASS_SIZE = 256;
layout(constant_id = 0) const uint M = 1;
layout(constant_id = 2) const uint SHARED_WORDS = 1;  // M * the longer Kp / 4
layout(constant_id = 4) const uint CACHED = 16;       // ceil(the longer Kp / 4 / 256)
layout(constant_id = 5) const uint UNROLL = 1;        // vectors of a row a lane requests at once
// The codes masked in place (matvec_dot.glsl) outside phase 1, as the matvec does for one row.
layout(constant_id = 6) const bool MASKED_CODES = false;
const uint ROWS = 2;
const bool NORM = true, GATED = false;
const uint LINE = 32;  // words from one counter to the next: a 128-byte line each

// Weights (16-byte vectors) and their scales: o, gate, up, down, q, k, v.
layout(std430, binding = 0) readonly buffer WO { uvec4 w_o[]; };
layout(std430, binding = 1) readonly buffer GO { float gamma_o; };
layout(std430, binding = 2) readonly buffer WGate { uvec4 w_gate[]; };
layout(std430, binding = 3) readonly buffer GGate { float gamma_gate; };
layout(std430, binding = 4) readonly buffer WUp { uvec4 w_up[]; };
layout(std430, binding = 5) readonly buffer GUp { float gamma_up; };
layout(std430, binding = 6) readonly buffer WDown { uvec4 w_down[]; };
layout(std430, binding = 7) readonly buffer GDown { float gamma_down; };
layout(std430, binding = 8) readonly buffer WQ { uvec4 w_q[]; };
layout(std430, binding = 9) readonly buffer GQ { float gamma_q; };
layout(std430, binding = 10) readonly buffer WK { uvec4 w_k[]; };
layout(std430, binding = 11) readonly buffer GK { float gamma_k; };
layout(std430, binding = 12) readonly buffer WV { uvec4 w_v[]; };
layout(std430, binding = 13) readonly buffer GV { float gamma_v; };
// The phases' norm weights.
layout(std430, binding = 14) readonly buffer N0 { vec4 norm0[]; };
layout(std430, binding = 15) readonly buffer N1 { vec4 norm1[]; };
layout(std430, binding = 16) readonly buffer N2 { vec4 norm2[]; };
layout(std430, binding = 17) readonly buffer N3 { vec4 norm3[]; };
// float32 [M, hidden] inputs, written before the dispatch.
layout(std430, binding = 18) readonly buffer A4 { vec4 a4[]; };
layout(std430, binding = 19) readonly buffer X { float x_in[]; };
// What the phases write and the later phases read: coherent, each as floats and as vec4.
layout(std430, binding = 20) coherent buffer X1 { float x1[]; };
layout(std430, binding = 21) coherent readonly buffer X1v { vec4 x1_4[]; };
layout(std430, binding = 22) coherent buffer F { float ffn[]; };  // [M, inter]
layout(std430, binding = 23) coherent readonly buffer Fv { vec4 ffn4[]; };
layout(std430, binding = 24) coherent buffer X2 { float x2[]; };
layout(std430, binding = 25) coherent readonly buffer X2v { vec4 x2_4[]; };
layout(std430, binding = 26) writeonly buffer Q { float q_out[]; };  // [M, n_q]
layout(std430, binding = 27) writeonly buffer K { float k_out[]; };  // [M, n_kv]
layout(std430, binding = 28) writeonly buffer V { float v_out[]; };  // [M, n_kv]
// A counter a phase and one for the end, LINE words apart, zero between dispatches.
layout(std430, binding = 29) coherent buffer Sync { uint counters[]; };
layout(std430, binding = 30) buffer Nonfinite { uint nonfinite_total; };
layout(std430, binding = 31) buffer Timeouts { uint timeouts; };
layout(push_constant) uniform Push {
  uint hidden;  // K of phases 0, 1 and 3; N of phases 0 and 2
  uint inter;   // N of phase 1, K of phase 2
  uint n_q;
  uint n_kv;
  float norm_eps;
  float eps;
  uint most_polls;
  uint phases;  // 3 or 4 (uniform: a specialization constant made the H100 miscompile 3)
} p;

#define INPUT4(source, index) \
  ((source) == 0 ? a4[index] : (source) == 1 ? x1_4[index] : (source) == 2 ? ffn4[index] : x2_4[index])
#define NORM_WEIGHT4(source, index) \
  ((source) == 0 ? norm0[index] : (source) == 1 ? norm1[index] : (source) == 2 ? norm2[index] \
                                                                               : norm3[index])
#define UP4(index) vec4(0.0)
#include "matvec_fused.glsl"

// Weight slots: 0 o, 1 gate, 2 up, 3 down, 4 q, 5 k, 6 v.
uvec4 weight4(uint slot, uint index) {
  return slot == 0   ? w_o[index]
         : slot == 1 ? w_gate[index]
         : slot == 2 ? w_up[index]
         : slot == 3 ? w_down[index]
         : slot == 4 ? w_q[index]
         : slot == 5 ? w_k[index]
                     : w_v[index];
}
float gamma_of(uint slot) {
  return slot == 0   ? gamma_o
         : slot == 1 ? gamma_gate
         : slot == 2 ? gamma_up
         : slot == 3 ? gamma_down
         : slot == 4 ? gamma_q
         : slot == 5 ? gamma_k
                     : gamma_v;
}

uint row_length(uint phase) { return phase == 2 ? p.inter : p.hidden; }
// The rows a phase deals out: output rows, in phase 1 pairs of a gate and an up row, in phase 3
// the rows of q, k and v one after another.
uint phase_rows(uint phase) {
  return phase == 1 ? p.inter : phase == 3 ? p.n_q + 2 * p.n_kv : p.hidden;
}
uint row_step(uint phase) { return phase == 1 ? 1 : ROWS; }  // rows a subgroup takes at a time
bool masked(uint phase) { return MASKED_CODES && phase != 1; }

// Row r of a subgroup's rows at `first` as (weight slot, row of that weight, that weight's rows).
uvec3 locate(uint phase, uint first, uint r) {
  if (phase == 0) return uvec3(0, first + r, p.hidden);
  if (phase == 1) return uvec3(1 + r, first, p.inter);
  if (phase == 2) return uvec3(3, first + r, p.hidden);
  if (first < p.n_q) return uvec3(4, first + r, p.n_q);  // whole pairs: the counts are even
  if (first < p.n_q + p.n_kv) return uvec3(5, first - p.n_q + r, p.n_kv);
  return uvec3(6, first - p.n_q - p.n_kv + r, p.n_kv);
}

// The UNROLL vectors from c0 of the subgroup's rows at `first`.
void load_weights(out uvec4 wv[UNROLL][ROWS], uint phase, uint first, uint c0) {
  const uint vectors = row_length(phase) / 64;
  [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
    const uint c = c0 + u * gl_SubgroupSize;
    [[unroll]] for (uint r = 0; r < ROWS; ++r) {
      const uvec3 at = locate(phase, first, r);
      wv[u][r] = c < vectors && first < phase_rows(phase) ? weight4(at.x, at.y * vectors + c)
                                                          : uvec4(0x55555555u);
    }
  }
}

void store(uint slot, uint index, float value) {
  if (slot == 0) x1[index] = value;
  else if (slot == 3) x2[index] = value;
  else if (slot == 4) q_out[index] = value;
  else if (slot == 5) k_out[index] = value;
  else v_out[index] = value;
}

// The subgroup's rows of a phase from `first_row`, `stride` apart; `early` holds the first
// vectors of the first ones.
void compute_rows(uint phase, uint first_row, uint stride, uvec4 early[UNROLL][ROWS]) {
  const uint lane = gl_SubgroupInvocationID, width = gl_SubgroupSize;
  const uint vectors = row_length(phase) / 64, words = vectors * 4, total = phase_rows(phase);
  bool prefetched = true;
  for (uint first = first_row; first < total; first += stride) {
    int acc[M * ROWS];
    ivec3 scaled_acc[M * ROWS];  // masked: 4, 16 and 64 times the sums of parts 1, 2 and 3
    [[unroll]] for (uint i = 0; i < M * ROWS; ++i) {
      acc[i] = 0;
      scaled_acc[i] = ivec3(0);
    }
    for (uint c0 = lane; c0 < vectors; c0 += width * UNROLL) {
      uvec4 wv[UNROLL][ROWS];
      if (prefetched) {
        [[unroll]] for (uint u = 0; u < UNROLL; ++u)
          [[unroll]] for (uint r = 0; r < ROWS; ++r) wv[u][r] = early[u][r];
        prefetched = false;
      } else {
        load_weights(wv, phase, first, c0);
      }
      [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
        const uint c = c0 + u * width;
        if (c >= vectors) break;
        [[unroll]] for (uint m = 0; m < M; ++m)
          [[unroll]] for (uint j = 0; j < 4; ++j) {
            const uvec4 xv = s_x4[m * words + c * 4 + j];  // one uvec4 per 16-weight block
            [[unroll]] for (uint r = 0; r < ROWS; ++r) {
              const uint i = m * ROWS + r;
              dot_word(acc[i], scaled_acc[i], xv, wv[u][r][j], masked(phase));
            }
          }
      }
    }
    if (masked(phase))
      [[unroll]] for (uint i = 0; i < M * ROWS; ++i) acc[i] += unscaled(scaled_acc[i]);
    if (phase == 1) {  // f = relu(g)^2 * u of gate row `first` (g) and up row `first` (u)
      [[unroll]] for (uint m = 0; m < M; ++m) {
        const int gate_acc = subgroupAdd(acc[m * ROWS]) - row_sums[m];  // exact in any order
        const int up_acc = subgroupAdd(acc[m * ROWS + 1]) - row_sums[m];
        if (lane == m % width) {
          const float g = float(gate_acc) * gamma_gate / row_scales[m];
          const float u = float(up_acc) * gamma_up / row_scales[m];
          const float r = max(g, 0.0);
          ffn[m * p.inter + first] = r * r * u;
        }
      }
      continue;
    }
    [[unroll]] for (uint i = 0; i < M * ROWS; ++i) {
      const int sum = subgroupAdd(acc[i]);  // integer sums: exact in any order
      const uint m = i / ROWS;
      if (lane == i % width) {
        const uvec3 at = locate(phase, first, i % ROWS);
        // precise: bit for bit the matvec's y + residual (see bitlinear_matvec.comp)
        precise float value = float(sum - row_sums[m]) * gamma_of(at.x) / row_scales[m];
        if (phase == 0) value += x_in[m * p.hidden + at.y];
        if (phase == 2) value += x1[m * p.hidden + at.y];
        store(at.x, m * at.z + at.y, value);
      }
    }
  }
}

// Every workgroup's writes of `phase` made visible here, or a timeout counted. The barriers order
// shared memory too: the phase before read s_x4, which the next phase's pre-pass writes.
void wait_for(uint phase) {
  if (gl_LocalInvocationIndex == 0) {
    uint polls = 0;
    while (atomicLoad(counters[phase * LINE], gl_ScopeDevice, gl_StorageSemanticsBuffer,
                      gl_SemanticsAcquire) < gl_NumWorkGroups.x) {
      if (++polls >= p.most_polls) {
        atomicAdd(timeouts, 1u);
        break;
      }
    }
  }
  controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice,
                 gl_StorageSemanticsBuffer | gl_StorageSemanticsShared, gl_SemanticsAcquireRelease);
}

// This workgroup's writes of `phase` released to the others.
void release(uint phase) {
  controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice,
                 gl_StorageSemanticsBuffer | gl_StorageSemanticsShared, gl_SemanticsAcquireRelease);
  if (gl_LocalInvocationIndex == 0)
    atomicAdd(counters[phase * LINE], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer,
              gl_SemanticsRelease);
}

void run_phase(uint phase) {
  const uint step = row_step(phase), groups = gl_NumWorkGroups.x;
  const uint first_row = (gl_SubgroupID * groups + gl_WorkGroupID.x) * step;
  uvec4 early[UNROLL][ROWS];
  load_weights(early, phase, first_row, gl_SubgroupInvocationID);
  uint sink = 0;
  [[unroll]] for (uint u = 0; u < UNROLL; ++u)
    [[unroll]] for (uint r = 0; r < ROWS; ++r)
      sink ^= early[u][r].x ^ early[u][r].y ^ early[u][r].z ^ early[u][r].w;
  if (phase > 0) wait_for(phase - 1);
  const uint length = row_length(phase);
  const uint bad = quantize_rows(phase, length, length / 16, p.norm_eps, p.eps, true, sink);
  if (gl_WorkGroupID.x == 0 && subgroupElect() && bad > 0) atomicAdd(nonfinite_total, bad);
  compute_rows(phase, first_row, groups * gl_NumSubgroups * step, early);
  if (phase + 1 < p.phases) release(phase);
}

void main() {
  // Each phase a call of its own, so that the compiler folds the phase's choices.
  run_phase(0);
  run_phase(1);
  run_phase(2);
  if (p.phases == 4) run_phase(3);
  // The last workgroup out zeroes the counters (every workgroup has passed every wait).
  if (gl_LocalInvocationIndex == 0) {
    const uint done = atomicAdd(counters[4 * LINE], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                                gl_SemanticsAcquireRelease);
    if (done == gl_NumWorkGroups.x - 1)
      for (uint i = 0; i <= 4; ++i) atomicStore(counters[i * LINE], 0u, gl_ScopeDevice, 0, 0);
  }
}
