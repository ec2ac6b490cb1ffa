#version 450
//! variant dot HW_DOT
//! variant int
//! variant dot_fused HW_DOT FUSED
//! variant int_fused FUSED
// y[m, n] = (sum_k x_q[m, k] W_q[n, k]) * gamma / s[m] (+ bias[n]) for small M (decode).
// Each subgroup owns ROWS output rows at a time and walks them together: every lane streams
// 16-byte vectors (64 weights) of all ROWS rows, coalesced across the subgroup, and reuses each
// x vector for all of them (UNROLL vectors of each row in flight at once); the sums are then one
// subgroupAdd each, with no shared memory and no
// barrier. A workgroup owns p.rows_per_group consecutive rows, handed to its subgroups in turn
// whatever the subgroup size. W is read exactly once.
// FUSED (float32 x, K % 4 == 0, M * Kp / 4 <= SHARED_WORDS): no separate pre-pass. Every
// workgroup quantizes the M activation rows itself into shared memory first, as
// bitlinear_prepare does (optionally relu(x)^2 * up, then an RMS norm, then absmax int8 in the
// interleaved layout; the norm's sum of squares reduced with the max): the rows are a few KiB
// read from cache, and the decode step saves a dependent dispatch. Workgroup 0 alone counts
// NaN/Inf values.
// STRIDED (FUSED, one weight or a GATED_OUT pair): the grid is one round of workgroups sized to
// fill the GPU (any local size), and rows are dealt to its subgroups in turn, ROW_STEP at a time,
// across workgroups first (so that idle subgroups, where the rows run out, are spread over the
// workgroups): each workgroup quantizes the rows once for many output rows (where quantizing them
// again in every small workgroup costs more: long rows, or many output rows), and every
// multiprocessor gets the same share of rows whatever their count.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#ifdef FUSED
#extension GL_KHR_shader_subgroup_quad : require
#include "../quantize/quantize_common.glsl"
#endif
#include "bitlinear_common.glsl"
layout(local_size_x = 256, local_size_x_id = 14) in;
const uint WG_SIZE = gl_WorkGroupSize.x;
layout(constant_id = 0) const uint M = 1;
layout(constant_id = 1) const uint ROWS = 4;
layout(constant_id = 2) const bool HAS_BIAS = false;
layout(constant_id = 3) const bool WITH_ACCUMULATOR = false;
layout(constant_id = 4) const bool VECTORS = true;  // rows of W are whole 16-byte vectors
layout(constant_id = 5) const uint UNROLL = 1;      // vectors of each row a lane loads at once
layout(constant_id = 6) const bool RESIDUAL = false;  // bias is a residual [M, N] added to y
layout(constant_id = 7) const bool NORM = false;    // FUSED: RMS-normalize the rows first
// FUSED: each subgroup's first weight vectors are requested before the pre-pass (and awaited while
// the pre-pass's own loads are in flight).
layout(constant_id = 13) const bool PREFETCH = false;
layout(constant_id = 8) const bool GATED = false;   // FUSED: quantize relu(x)^2 * up
layout(constant_id = 9) const uint SHARED_WORDS = 1;  // FUSED: M * Kp / 4
layout(constant_id = 15) const bool STRIDED = false;
// VECTORS: each part i of a weight word masked in place (codes times 4^i, one AND) instead of
// shifted down and masked, multiplied as unsigned bytes (OpSUDot) into an accumulator of its own,
// the scaled sums shifted down (exactly: sums of multiples of 4^i) and added after the row.
layout(constant_id = 16) const bool MASKED_CODES = false;
layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, binding = 1) readonly buffer Weights4 { uvec4 w4[]; };  // the same tensor
#ifdef FUSED
layout(std430, binding = 2) readonly buffer Input4 { vec4 input4[]; };      // float32 [M, K]
layout(std430, binding = 3) readonly buffer Up4 { vec4 up4[]; };            // [M, K] with GATED
layout(std430, binding = 4) readonly buffer NormWeight { vec4 norm_weight4[]; };  // [K] with NORM
layout(std430, binding = 9) buffer Counter { uint nonfinite_total; };
// WEIGHTS > 1: weights b and c share the quantized rows (q, k, v; gate, up): workgroups
// [0, groups_a) take weight a, then groups_b workgroups weight b, then weight c.
layout(constant_id = 11) const uint WEIGHTS = 1;
// GATED_OUT (WEIGHTS == 2, ROWS == 2): y[m, n] = relu(g)^2 * u of gate row n (g) and up row n
// (u), each computed as y would be, a subgroup's two rows being those two: the FFN's gated
// product in one dispatch, bit for bit what the GATED pre-pass of the next matvec makes of them.
layout(constant_id = 12) const bool GATED_OUT = false;
layout(std430, binding = 10) readonly buffer WeightsB { uint w_b[]; };
layout(std430, binding = 11) readonly buffer WeightsB4 { uvec4 w4_b[]; };
layout(std430, binding = 12) readonly buffer GammaB { float gamma_b[]; };
layout(std430, binding = 13) writeonly buffer OutputB { float y_b[]; };
layout(std430, binding = 14) readonly buffer WeightsC { uint w_c[]; };
layout(std430, binding = 15) readonly buffer WeightsC4 { uvec4 w4_c[]; };
layout(std430, binding = 16) readonly buffer GammaC { float gamma_c[]; };
layout(std430, binding = 17) writeonly buffer OutputC { float y_c[]; };
#else
layout(std430, binding = 2) readonly buffer Activations { uvec4 x4[]; };
layout(std430, binding = 3) readonly buffer RowSums { int row_sums[]; };
layout(std430, binding = 4) readonly buffer Scales { float scales[]; };
const bool GATED_OUT = false;
#endif
layout(std430, binding = 5) readonly buffer Gamma { float gamma[]; };
layout(std430, binding = 6) readonly buffer Bias { float bias[]; };
layout(std430, binding = 7) writeonly buffer Output { float y[]; };
layout(std430, binding = 8) writeonly buffer Accumulators { int accumulators[]; };
#ifdef FUSED
layout(push_constant) uniform Push {
  uint n; uint words_per_row; uint rows_per_group; uint k; float norm_eps; float eps;
  uint n_b; uint n_c; uint groups_a; uint groups_b;
} p;
#else
layout(push_constant) uniform Push { uint n; uint words_per_row; uint rows_per_group; } p;
#endif

#ifdef FUSED
#include "prepare_common.glsl"
// Vectors per invocation held in registers: ceil(Kp / 4 / WG_SIZE), at most 16.
layout(constant_id = 10) const uint CACHED = 16;
// The quantized rows, interleaved as bitlinear_prepare writes them, a 16-value block a uvec4.
shared uvec4 s_x4[(SHARED_WORDS + 3) / 4];
int row_sums[M];      // each row's sum and scale, the same in every invocation
float row_scales[M];
// Rows of x quantized together: their values requested at once and each reduction one barrier for
// all of them, as many as keep ROWS_AT_ONCE * CACHED <= 8 vectors in registers.
const uint ROWS_LIMIT = CACHED <= 8 ? 8 / CACHED : 1;
const uint ROWS_AT_ONCE = ROWS_LIMIT < M ? ROWS_LIMIT : M;
// Scratch slots a row: one a subgroup (subgroups of 4 invocations or more; the host checks).
const uint SLOTS = WG_SIZE / 4;
shared float s_reduce[ROWS_AT_ONCE * SLOTS];
shared float s_reduce_max[ROWS_AT_ONCE * SLOTS];
shared int s_reduce_int[ROWS_AT_ONCE * SLOTS];
shared uint s_sink[WG_SIZE];

// Each subgroup's share of the workgroup's sum (float, fixed order: lanes, then subgroup by
// subgroup), max or integer sum of row slot g, one value an invocation; the totals after a
// barrier. The three use scratch of their own, and each is written again (the next rows) only
// after a later barrier that every invocation reaches after reading it.
void publish_sum(uint g, float v) {
  v = subgroupAdd(v);
  if (subgroupElect()) s_reduce[g * SLOTS + gl_SubgroupID] = v;
}
float total_sum(uint g) {
  float total = 0.0;
  for (uint s = 0; s < gl_NumSubgroups; ++s) total += s_reduce[g * SLOTS + s];
  return total;
}

// The max and the rows' integer sums, whose order does not matter: in workgroups of more than 16
// subgroups (the strided grid's 1024 invocations on the H100; lavapipe's subgroups of 8 from 256)
// the subgroups' values are read by the lanes of every subgroup (every gl_SubgroupSize-th value a
// lane) and reduced by subgroup operations, instead of a loop in every invocation over every
// subgroup's value: faster from 32 subgroups a workgroup, not at 16 (docs/PERFORMANCE.md).
bool subgroup_reductions() { return gl_NumSubgroups > 16; }
void publish_max(uint g, float v) {
  v = subgroupMax(v);
  if (subgroupElect()) s_reduce_max[g * SLOTS + gl_SubgroupID] = v;
}
float total_max(uint g) {
  float result = 0.0;
  if (subgroup_reductions()) {
    for (uint s = gl_SubgroupInvocationID; s < gl_NumSubgroups; s += gl_SubgroupSize)
      result = max(result, s_reduce_max[g * SLOTS + s]);
    return subgroupMax(result);
  }
  for (uint s = 0; s < gl_NumSubgroups; ++s) result = max(result, s_reduce_max[g * SLOTS + s]);
  return result;
}
void publish_int(uint g, int v) {
  v = subgroupAdd(v);  // integer sums: exact in any order
  if (subgroupElect()) s_reduce_int[g * SLOTS + gl_SubgroupID] = v;
}
int total_int(uint g) {
  int total = 0;
  if (subgroup_reductions()) {
    for (uint s = gl_SubgroupInvocationID; s < gl_NumSubgroups; s += gl_SubgroupSize)
      total += s_reduce_int[g * SLOTS + s];
    return subgroupAdd(total);
  }
  for (uint s = 0; s < gl_NumSubgroups; ++s) total += s_reduce_int[g * SLOTS + s];
  return total;
}

// sink: a value made of the prefetched weights (PREFETCH), stored once the rows are requested so
// that the weights are waited for while the rows' loads are in flight, not after the pre-pass.
void quantize_rows(uint sink) {
  const uint lane = gl_LocalInvocationID.x;
  const uint vectors = p.k / 4, padded_vectors = p.words_per_row * 4;
  uint bad = 0;
  // The norm's weights requested with the rows, not after the sum of squares' barrier.
  vec4 norm_weights[NORM ? CACHED : 1];
  if (NORM)
    [[unroll]] for (uint c = 0; c < CACHED; ++c) {
      const uint v = lane + c * WG_SIZE;
      norm_weights[c] = v < vectors ? norm_weight4[v] : vec4(0.0);
    }
  for (uint first = 0; first < M; first += ROWS_AT_ONCE) {
    vec4 cache[ROWS_AT_ONCE][CACHED];  // row first + g in slot g; zeros past M
    [[unroll]] for (uint g = 0; g < ROWS_AT_ONCE; ++g) {
      const uint m = first + g;
      [[unroll]] for (uint c = 0; c < CACHED; ++c) {
        const uint v = lane + c * WG_SIZE;
        const bool inside = m < M && v < vectors;
        cache[g][c] = inside ? input4[m * vectors + v] : vec4(0.0);
        if (GATED && inside) {
          const vec4 x = max(cache[g][c], vec4(0.0));
          cache[g][c] = x * x * up4[m * vectors + v];
        }
      }
    }
    if (PREFETCH && first == 0) s_sink[lane] = sink;
    // NORM: r max|v g| is the normalized row's max (r > 0), so the sum of squares and max|v g|
    // share one barrier, and the codes round (v g)(r s), as bitlinear_prepare's do.
    [[unroll]] for (uint g = 0; g < ROWS_AT_ONCE; ++g) {
      if (NORM) {
        // precise: the same operations as bitlinear_prepare's, not contracted in its own way.
        precise float squares = 0.0;
        [[unroll]] for (uint c = 0; c < CACHED; ++c) squares += dot(cache[g][c], cache[g][c]);
        publish_sum(g, squares);
        [[unroll]] for (uint c = 0; c < CACHED; ++c)
          if (lane + c * WG_SIZE < vectors) cache[g][c] *= norm_weights[c];
      }
      float absmax = 0.0;
      [[unroll]] for (uint c = 0; c < CACHED; ++c)
        if (lane + c * WG_SIZE < vectors)
          [[unroll]] for (uint e = 0; e < 4; ++e) accumulate(cache[g][c][e], absmax, bad);
      publish_max(g, absmax);
    }
    barrier();
    [[unroll]] for (uint g = 0; g < ROWS_AT_ONCE; ++g) {
      const uint m = first + g;
      float scale, product_scale;
      quantization_scales(total_max(g), NORM, NORM ? total_sum(g) : 0.0, p.k, p.norm_eps, p.eps,
                          scale, product_scale);
      int sum = 0;
      if (m < M) {  // uniform
        [[unroll]] for (uint c = 0; c < CACHED; ++c) {
          const uint v = lane + c * WG_SIZE;
          if (c * WG_SIZE < padded_vectors) {  // uniform: whole quads stay together
            const uint word = interleaved_word(cache[g][c], product_scale, sum);
            if (v < padded_vectors) s_x4[(m * padded_vectors + v) >> 2][v & 3u] = word;
          }
        }
        row_scales[m] = scale;
      }
      publish_int(g, sum);
    }
    barrier();  // s_x4 and the subgroups' sums are written
    [[unroll]] for (uint g = 0; g < ROWS_AT_ONCE; ++g)
      if (first + g < M) row_sums[first + g] = total_int(g);
  }
  bad = subgroupAdd(bad);
  if (gl_WorkGroupID.x == 0 && subgroupElect() && bad > 0) atomicAdd(nonfinite_total, bad);
}

uvec4 activation_vector(uint index) { return s_x4[index]; }  // block `index` of the quantized rows
#define ACTIVATIONS(index) activation_vector(index)
#define ROW_SUM(m) row_sums[m]
#define SCALE(m) row_scales[m]
// The weight a workgroup takes (uniform in the workgroup; ?: evaluates one side only).
#define W4(which, index) ((which) == 0 ? w4[index] : (which) == 1 ? w4_b[index] : w4_c[index])
#define W(which, index) ((which) == 0 ? w[index] : (which) == 1 ? w_b[index] : w_c[index])
#define GAMMA(which) ((which) == 0 ? gamma[0] : (which) == 1 ? gamma_b[0] : gamma_c[0])
#else
#define ACTIVATIONS(index) x4[index]
#define ROW_SUM(m) row_sums[m]
#define SCALE(m) scales[m]
#define W4(which, index) w4[index]
#define W(which, index) w[index]
#define GAMMA(which) gamma[0]
#endif

// A subgroup's row r at `first`: row first + r of the workgroup's weight, or with GATED_OUT row
// `first` of weight r (gate, up).
uint row_of(uint first, uint r) { return GATED_OUT ? first : first + r; }
uint weight_of(uint which, uint r) { return GATED_OUT ? r : which; }
const uint ROW_STEP = GATED_OUT ? 1 : ROWS;  // output rows a subgroup takes at a time

int dot16(uvec4 xv, uint word) {
  return dot4(xv.x, codes(word, 0)) + dot4(xv.y, codes(word, 1)) + dot4(xv.z, codes(word, 2)) +
         dot4(xv.w, codes(word, 3));
}

// The UNROLL vectors from c0 of the subgroup's ROWS rows at `first` (whole 16-byte vectors).
void load_weights(out uvec4 wv[UNROLL][ROWS], uint which, uint first, uint c0, uint vectors,
                  uint group_end) {
  [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
    const uint c = c0 + u * gl_SubgroupSize;
    [[unroll]] for (uint r = 0; r < ROWS; ++r)
      wv[u][r] = c < vectors && row_of(first, r) < group_end
                     ? W4(weight_of(which, r), row_of(first, r) * vectors + c) : uvec4(0x55555555u);
  }
}

void main() {
  const uint lane = gl_SubgroupInvocationID, width = gl_SubgroupSize;
  const uint words = p.words_per_row;
  uint which = 0, group = gl_WorkGroupID.x, n_total = p.n;
#ifdef FUSED
  if (WEIGHTS > 1 && group >= p.groups_a) {
    which = 1;
    group -= p.groups_a;
    n_total = p.n_b;
    if (WEIGHTS > 2 && group >= p.groups_b) {
      which = 2;
      group -= p.groups_b;
      n_total = p.n_c;
    }
  }
#endif
  // The subgroup's first rows and its step to the next: a run of p.rows_per_group rows a
  // workgroup, or with STRIDED every subgroup of the grid in turn.
  const uint group_first = group * p.rows_per_group;
  const uint group_end = STRIDED ? n_total : min(group_first + p.rows_per_group, n_total);
  const uint subgroup_first = STRIDED ? (gl_SubgroupID * gl_NumWorkGroups.x + group) * ROW_STEP
                                      : group_first + gl_SubgroupID * ROW_STEP;
  const uint subgroup_step = STRIDED ? gl_NumWorkGroups.x * gl_NumSubgroups * ROW_STEP
                                     : gl_NumSubgroups * ROW_STEP;
  uvec4 early[UNROLL][ROWS];  // PREFETCH: the first pass's first vectors
  bool prefetched = false;
#ifdef FUSED
  prefetched = PREFETCH && VECTORS;
  uint sink = 0;
  if (prefetched) {
    load_weights(early, which, subgroup_first, lane, words / 4, group_end);
    [[unroll]] for (uint u = 0; u < UNROLL; ++u)
      [[unroll]] for (uint r = 0; r < ROWS; ++r)
        sink ^= early[u][r].x ^ early[u][r].y ^ early[u][r].z ^ early[u][r].w;
  }
  quantize_rows(sink);
#endif
  for (uint first = subgroup_first; first < group_end; first += subgroup_step) {
    int acc[M * ROWS];
    [[unroll]] for (uint i = 0; i < M * ROWS; ++i) acc[i] = 0;
    int scaled_acc[M * ROWS][3];  // MASKED_CODES: 4, 16 and 64 times the sums of parts 1, 2 and 3
    [[unroll]] for (uint i = 0; i < M * ROWS; ++i) scaled_acc[i] = int[3](0, 0, 0);
    if (VECTORS) {
      const uint vectors = words / 4;
      for (uint c0 = lane; c0 < vectors; c0 += width * UNROLL) {
        uvec4 wv[UNROLL][ROWS];
        if (prefetched) {
          [[unroll]] for (uint u = 0; u < UNROLL; ++u)
            [[unroll]] for (uint r = 0; r < ROWS; ++r) wv[u][r] = early[u][r];
          prefetched = false;
        } else {
          load_weights(wv, which, first, c0, vectors, group_end);
        }
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
          const uint c = c0 + u * width;
          if (c >= vectors) break;
          [[unroll]] for (uint m = 0; m < M; ++m)
            [[unroll]] for (uint j = 0; j < 4; ++j) {
              const uvec4 xv = ACTIVATIONS(m * words + c * 4 + j);  // one uvec4 per 16-weight block
              [[unroll]] for (uint r = 0; r < ROWS; ++r) {
                if (MASKED_CODES) {
                  const uint word = wv[u][r][j];
                  acc[m * ROWS + r] += sudot4(xv.x, word & 0x03030303u);
                  scaled_acc[m * ROWS + r][0] += sudot4(xv.y, word & 0x0C0C0C0Cu);
                  scaled_acc[m * ROWS + r][1] += sudot4(xv.z, word & 0x30303030u);
                  scaled_acc[m * ROWS + r][2] += sudot4(xv.w, word & 0xC0C0C0C0u);
                } else {
                  acc[m * ROWS + r] += dot16(xv, wv[u][r][j]);
                }
              }
            }
        }
      }
      if (MASKED_CODES)
        [[unroll]] for (uint i = 0; i < M * ROWS; ++i)
          acc[i] += (scaled_acc[i][0] >> 2) + (scaled_acc[i][1] >> 4) + (scaled_acc[i][2] >> 6);
    } else {
      for (uint c = lane; c < words; c += width) {
        uint wv[ROWS];
        [[unroll]] for (uint r = 0; r < ROWS; ++r)
          wv[r] = row_of(first, r) < group_end
                      ? W(weight_of(which, r), row_of(first, r) * words + c)
                      : 0x55555555u;
        [[unroll]] for (uint m = 0; m < M; ++m) {
          const uvec4 xv = ACTIVATIONS(m * words + c);
          [[unroll]] for (uint r = 0; r < ROWS; ++r) acc[m * ROWS + r] += dot16(xv, wv[r]);
        }
      }
    }
#ifdef FUSED
    if (GATED_OUT) {
      [[unroll]] for (uint m = 0; m < M; ++m) {
        // integer sums: exact in any order
        const int gate_acc = subgroupAdd(acc[m * ROWS]) - ROW_SUM(m);
        const int up_acc = subgroupAdd(acc[m * ROWS + 1]) - ROW_SUM(m);
        if (lane == m % width) {
          const float g = float(gate_acc) * gamma[0] / SCALE(m);
          const float u = float(up_acc) * gamma_b[0] / SCALE(m);
          const float r = max(g, 0.0);
          y[m * n_total + first] = r * r * u;
        }
      }
      continue;
    }
#endif
    // The totals are uniform; lane i % width takes total i and runs the epilogue once a round of
    // width totals, not the subgroup once a total with one lane active (M * ROWS rounds).
    int totals[M * ROWS];
    [[unroll]] for (uint i = 0; i < M * ROWS; ++i) totals[i] = subgroupAdd(acc[i]);  // exact
    for (uint round = 0; round < M * ROWS; round += width) {
      const uint i = round + lane, m = i / ROWS, n = first + i % ROWS;
      int total = 0, row_sum = 0;
      float scale = 1.0;
      [[unroll]] for (uint j = 0; j < M * ROWS; ++j)
        if (j == i) total = totals[j];
      [[unroll]] for (uint j = 0; j < M; ++j)
        if (j == m) {
          row_sum = ROW_SUM(j);
          scale = SCALE(j);
        }
      if (i < M * ROWS && n < group_end) {
        const int a = total - row_sum;
        // precise: not contracted into the addition, so y + residual is bit for bit the float32
        // sum of y and the residual (the H100 folded the division into an FMA with it).
        precise float value = float(a) * GAMMA(which) / scale;
        if (HAS_BIAS) value += bias[RESIDUAL ? m * n_total + n : n];
#ifdef FUSED
        if (which == 1) y_b[m * n_total + n] = value;
        else if (which == 2) y_c[m * n_total + n] = value;
        else y[m * n_total + n] = value;
#else
        y[m * n_total + n] = value;
#endif
        if (WITH_ACCUMULATOR) accumulators[m * n_total + n] = a;
      }
    }
  }
}
