// BitLinear for large M on int8 tensor cores (cooperative matrices, 16 x 16 x 32 int8 -> int32
// per subgroup of 32), the body of bitlinear_coopmat.comp (VK_NV_cooperative_matrix) and
// bitlinear_coopmat_khr.comp (VK_KHR_cooperative_matrix), which define MATRIX_A, MATRIX_B,
// MATRIX_C, LOAD_MATRIX and STORE_MATRIX (column-major where the last argument is true) and
// MULTIPLY_ADD. A workgroup of 8 subgroups owns a TILE_M x TILE_N output tile and walks K in steps
// of 16 * BLOCKS: the int8 activations (already in the interleaved layout of bitlinear_common.glsl)
// and the packed ternary weights come from memory into registers DEPTH steps ahead, then into
// shared memory, the weights expanded there to signed int8 in the same interleaved order, so the K
// permutation cancels in the dot product and no row-sum correction is needed. Each subgroup
// multiplies a (TILE_M / SUBGROUP_ROWS) x (TILE_N / SUBGROUP_COLS) part of the tile, the 8
// subgroups in SUBGROUP_ROWS x SUBGROUP_COLS. The epilogue stages every 16 x 16 int32 result
// through shared memory (the tiles' space, no longer needed) to scale it by gamma / s[m] and add
// the bias ([N]; RESIDUAL: an [M, N] residual, element by element), where VECTOR_ROWS each lane
// taking four adjacent values of a row at a time (16-byte loads and stores). FULL_TILES: M, N and
// K are whole tiles and steps, so no load or store is tested. TERNARY = false multiplies two
// interleaved int8 matrices (int8_matmul). Shared memory: (TILE_M + TILE_N) * (BLOCKS + 1) * 16
// bytes.
// SPLITS > 1 (few rows of x, where the tiles alone leave most multiprocessors idle): workgroup
// (x, y, z) takes blocks [z p.split_blocks, (z + 1) p.split_blocks) of K only and adds its int32
// sums into `partial` [M, N] with integer atomics (exact in any order); the last of a tile's
// SPLITS workgroups to finish, counted in tickets[tile], takes the sums (zeroing them and its
// ticket for the next call) and runs the epilogue: bit for bit the unsplit result.
#include "bitlinear_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool TERNARY = true;
layout(constant_id = 1) const bool HAS_BIAS = false;
layout(constant_id = 2) const bool WITH_OUTPUT = true;
layout(constant_id = 3) const bool WITH_ACCUMULATOR = false;
// TILE_M * BLOCKS and TILE_N * BLOCKS multiples of 256: each of the 256 invocations loads whole
// vectors of both tiles.
layout(constant_id = 4) const uint TILE_M = 128;
layout(constant_id = 5) const uint TILE_N = 128;
layout(constant_id = 6) const uint BLOCKS = 4;    // blocks of 16 int8 (one uvec4) per K step, even

const uint STRIDE = BLOCKS + 1;     // uvec4 per shared row, one of skew against bank conflicts
layout(constant_id = 7) const uint SUBGROUP_ROWS = 2;  // 1, 2, 4 or 8
layout(constant_id = 8) const uint DEPTH = 1;          // K steps loaded ahead: 1 or 2
layout(constant_id = 9) const bool RESIDUAL = false;
layout(constant_id = 10) const bool VECTOR_ROWS = false;  // N % 4 == 0: rows of whole vec4s
layout(constant_id = 11) const bool FULL_TILES = false;
layout(constant_id = 12) const uint SPLITS = 1;
const uint SUBGROUP_COLS = 8 / SUBGROUP_ROWS;
const uint C_ROWS = TILE_M / (SUBGROUP_ROWS * 16), C_COLS = TILE_N / (SUBGROUP_COLS * 16);
const uint A_LOADS = TILE_M * BLOCKS / 256, B_LOADS = TILE_N * BLOCKS / 256;

layout(std430, binding = 0) readonly buffer WeightWords { uint w[]; };    // TERNARY: [N, blocks]
layout(std430, binding = 1) readonly buffer WeightVectors { uvec4 b[]; };  // int8: [N, blocks]
layout(std430, binding = 2) readonly buffer Activations { uvec4 a[]; };    // [M, blocks]
layout(std430, binding = 3) readonly buffer Scales { float scales[]; };
layout(std430, binding = 4) readonly buffer Gamma { float gamma[]; };
layout(std430, binding = 5) readonly buffer Bias { float bias[]; };
layout(std430, binding = 5) readonly buffer Bias4 { vec4 bias4[]; };  // the same, VECTOR_ROWS
layout(std430, binding = 6) writeonly buffer Output { float y[]; };
layout(std430, binding = 7) writeonly buffer Accumulators { int accumulators[]; };
layout(std430, binding = 6) writeonly buffer Output4 { vec4 y4[]; };
layout(std430, binding = 7) writeonly buffer Accumulators4 { ivec4 accumulators4[]; };
layout(std430, binding = 8) coherent buffer Partial { int partial[]; };     // SPLITS: [M, N], zero
layout(std430, binding = 9) coherent buffer Tickets { uint tickets[]; };   // SPLITS: a tile's, zero
layout(push_constant) uniform Push { uint m; uint n; uint blocks; uint split_blocks; } p;
shared bool s_last;

// The A tile, then the B tile; after the K loop, one 16 x 16 int32 result per subgroup (64 uvec4).
shared uvec4 tiles[(TILE_M + TILE_N) * STRIDE];
const uint B_TILE = TILE_M * STRIDE;

// The 16 codes of a packed word as signed int8 (c - 1), in the interleaved order: component i
// holds the weights 4j + i, j = 0..3, like word i of an activation block.
uvec4 expand(uint word) {
  uvec4 values;
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    const uint c = codes(word, i);
    const uint plus_one = (c >> 1) & 0x01010101u;         // code 2 -> +1
    const uint minus_one = ~(c | (c >> 1)) & 0x01010101u;  // code 0 -> 0xFF (-1)
    values[i] = plus_one | (minus_one * 0xFFu);
  }
  return values;
}

void main() {
  const uint thread = gl_LocalInvocationID.x;
  const uint m0 = gl_WorkGroupID.y * TILE_M, n0 = gl_WorkGroupID.x * TILE_N;
  // The blocks of K this workgroup takes: all, or its split's.
  const uint k_first = SPLITS > 1 ? gl_WorkGroupID.z * p.split_blocks : 0;
  const uint k_end = SPLITS > 1 ? min(k_first + p.split_blocks, p.blocks) : p.blocks;
  const uint subgroup = gl_SubgroupID;
  const uint sub_row = subgroup / SUBGROUP_COLS, sub_col = subgroup % SUBGROUP_COLS;

  MATRIX_C result[C_ROWS][C_COLS];
  [[unroll]] for (uint i = 0; i < C_ROWS; ++i)
    [[unroll]] for (uint j = 0; j < C_COLS; ++j)
      result[i][j] = MATRIX_C(0);

  // A K step's loads in registers (the weights still packed: 16 codes a word), DEPTH steps
  // ahead: set 0, and with DEPTH 2 set 1 for every other step. Named sets, not an array of sets,
  // as an array indexed from an unrolled loop made the kernel a quarter slower.
  uvec4 a0[A_LOADS], a1[A_LOADS], b0[B_LOADS], b1[B_LOADS];
  uint w0[B_LOADS], w1[B_LOADS];
  // Loads for the K step starting at block `first` into set (A, W, B): zeros past M, N or K
  // (code 1 is weight 0).
  #define LOAD_STEP(first, A, W, B)                                                          \
    [[unroll]] for (uint l = 0; l < A_LOADS; ++l) {                                          \
      const uint e = thread + l * 256, row = e / BLOCKS, block = (first) + e % BLOCKS;        \
      A[l] = FULL_TILES || (m0 + row < p.m && block < k_end) ? a[(m0 + row) * p.blocks + block] \
                                                             : uvec4(0);                    \
    }                                                                                        \
    [[unroll]] for (uint l = 0; l < B_LOADS; ++l) {                                          \
      const uint e = thread + l * 256, row = e / BLOCKS, block = (first) + e % BLOCKS;        \
      const bool inside = FULL_TILES || (n0 + row < p.n && block < k_end);                   \
      if (TERNARY) W[l] = inside ? w[(n0 + row) * p.blocks + block] : 0x55555555u;           \
      else B[l] = inside ? b[(n0 + row) * p.blocks + block] : uvec4(0);                      \
    }
  // Set (A, W, B) into the tiles, the weights expanded to int8, between barriers: every subgroup
  // is done reading the previous step's tiles, then every tile is written.
  #define STORE_STEP(A, W, B)                                                                \
    barrier();                                                                               \
    [[unroll]] for (uint l = 0; l < A_LOADS; ++l) {                                          \
      const uint e = thread + l * 256;                                                       \
      tiles[(e / BLOCKS) * STRIDE + e % BLOCKS] = A[l];                                      \
    }                                                                                        \
    [[unroll]] for (uint l = 0; l < B_LOADS; ++l) {                                          \
      const uint e = thread + l * 256;                                                       \
      tiles[B_TILE + (e / BLOCKS) * STRIDE + e % BLOCKS] = TERNARY ? expand(W[l]) : B[l];    \
    }                                                                                        \
    barrier();
  #define MULTIPLY_STEP()                                                                    \
    [[unroll]] for (uint step = 0; step < BLOCKS; step += 2) {  /* 32 values per multiply */ \
      MATRIX_A mat_a[C_ROWS];                                                                \
      [[unroll]] for (uint i = 0; i < C_ROWS; ++i) {                                         \
        const uint row = 16 * (C_ROWS * sub_row + i);                                        \
        LOAD_MATRIX(mat_a[i], tiles, row * STRIDE + step, STRIDE, false);                    \
      }                                                                                      \
      [[unroll]] for (uint j = 0; j < C_COLS; ++j) {                                         \
        MATRIX_B mat_b;                                                                      \
        const uint col = 16 * (C_COLS * sub_col + j);                                        \
        /* column-major K x N */                                                             \
        LOAD_MATRIX(mat_b, tiles, B_TILE + col * STRIDE + step, STRIDE, true);               \
        [[unroll]] for (uint i = 0; i < C_ROWS; ++i)                                         \
          result[i][j] = MULTIPLY_ADD(mat_a[i], mat_b, result[i][j]);                        \
      }                                                                                      \
    }

  LOAD_STEP(k_first, a0, w0, b0)
  if (DEPTH == 1) {
    for (uint first = k_first; first < k_end; first += BLOCKS) {
      STORE_STEP(a0, w0, b0)
      if (first + BLOCKS < k_end) { LOAD_STEP(first + BLOCKS, a0, w0, b0) }
      MULTIPLY_STEP()
    }
  } else {  // two steps a round, the loads two steps ahead
    if (k_first + BLOCKS < k_end) { LOAD_STEP(k_first + BLOCKS, a1, w1, b1) }
    for (uint first = k_first; first < k_end; first += 2 * BLOCKS) {
      STORE_STEP(a0, w0, b0)
      if (first + 2 * BLOCKS < k_end) { LOAD_STEP(first + 2 * BLOCKS, a0, w0, b0) }
      MULTIPLY_STEP()
      if (first + BLOCKS >= k_end) break;  // uniform
      STORE_STEP(a1, w1, b1)
      if (first + 3 * BLOCKS < k_end) { LOAD_STEP(first + 3 * BLOCKS, a1, w1, b1) }
      MULTIPLY_STEP()
    }
  }

  const uint lane = gl_SubgroupInvocationID;
  const uint staging = subgroup * 64;  // in uvec4: 16 rows of 16 int32, 4 uvec4 a row
  // VECTOR_ROWS: a lane takes the staged vectors e = lane + 32 t (t < 2) of a 16 x 16 result, row
  // e / 4, columns 4 (e % 4) to 4 (e % 4) + 3, with 16-byte loads and stores; otherwise the values
  // e = lane + 32 t (t < 8), row e / 16, column e % 16, one at a time (16-byte stores make the
  // epilogue several times faster: docs/PERFORMANCE.md). A lane's value v of a result is component
  // v % 4 of vector v / 4, or value v. With RESIDUAL the next result's residuals are requested
  // before the current one is written: independent loads in flight instead of one load waited for
  // per value (which cost more than a separate add).
  const uint PER_LANE = 8, RESULTS = C_ROWS * C_COLS;
  float residual_next[PER_LANE];
  // The output row and column of the first value of result[i][j].
  #define RESULT_ROW0(i) (m0 + 16 * (C_ROWS * sub_row + (i)))
  #define RESULT_COL0(j) (n0 + 16 * (C_COLS * sub_col + (j)))
  // The residuals of a lane's values of result f, zeros past M and N.
  #define LOAD_RESIDUALS(f, R)                                                                \
    {                                                                                         \
      const uint row0 = RESULT_ROW0((f) / C_COLS), col0 = RESULT_COL0((f) % C_COLS);         \
      if (VECTOR_ROWS) {                                                                      \
        [[unroll]] for (uint t = 0; t < 2; ++t) {                                            \
          const uint e = lane + 32 * t, m = row0 + e / 4, n = col0 + 4 * (e % 4);            \
          const vec4 r =                                                                     \
              FULL_TILES || (m < p.m && n < p.n) ? bias4[(m * p.n + n) / 4] : vec4(0.0);     \
          [[unroll]] for (uint c = 0; c < 4; ++c) R[4 * t + c] = r[c];                       \
        }                                                                                     \
      } else {                                                                                \
        [[unroll]] for (uint t = 0; t < PER_LANE; ++t) {                                     \
          const uint e = lane + 32 * t, m = row0 + e / 16, n = col0 + e % 16;               \
          R[t] = m < p.m && n < p.n ? bias[m * p.n + n] : 0.0;                               \
        }                                                                                     \
      }                                                                                       \
    }
  if (HAS_BIAS && RESIDUAL && WITH_OUTPUT) LOAD_RESIDUALS(0, residual_next)
  barrier();  // every subgroup is done reading the tiles
  const float gamma_value = gamma[0];
  // y for accumulator `value` of row m, column n: value * gamma / s[m] + the bias or residual.
  // precise: not contracted into the addition, so y + residual is bit for bit the sum of y and the
  // residual (the H100 folded the division's reciprocal into an FMA).
  #define SCALED(value, scale, added, out_value)                                              \
    {                                                                                         \
      precise float scaled = float(value) * gamma_value / (scale);                            \
      if (HAS_BIAS) scaled += (added);                                                        \
      out_value = scaled;                                                                     \
    }
  if (SPLITS > 1) {
    // This split's sums into `partial` (rows of x past M hold nothing: not added).
    [[unroll]] for (uint f = 0; f < RESULTS; ++f) {
      const uint row0 = RESULT_ROW0(f / C_COLS), col0 = RESULT_COL0(f % C_COLS);
      STORE_MATRIX(result[f / C_COLS][f % C_COLS], tiles, staging, 4, false);
      subgroupBarrier();
      [[unroll]] for (uint t = 0; t < PER_LANE; ++t) {
        const uint e = lane + 32 * t, m = row0 + e / 16, n = col0 + e % 16;
        if (m < p.m && n < p.n) atomicAdd(partial[m * p.n + n], int(tiles[staging + e / 4][e % 4]));
      }
      subgroupBarrier();
    }
    memoryBarrierBuffer();
    barrier();
    const uint tile = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (thread == 0) {
      s_last = atomicAdd(tickets[tile], 1u) == SPLITS - 1;
      if (s_last) tickets[tile] = 0u;  // every split has counted: ready for the next call
    }
    barrier();
    if (!s_last) return;
    memoryBarrierBuffer();
    // The epilogue over the whole tile, EPILOGUE_BATCH values an invocation at a time: their sums
    // (taken and zeroed), scales and biases all requested before any is used, so that their round
    // trips overlap instead of following one another.
    const uint EPILOGUE_VALUES = TILE_M * TILE_N / 256;
    const uint EPILOGUE_BATCH = EPILOGUE_VALUES < 8 ? EPILOGUE_VALUES : 8;
    for (uint first = 0; first < EPILOGUE_VALUES; first += EPILOGUE_BATCH) {
      int values[EPILOGUE_BATCH];
      float row_scales[EPILOGUE_BATCH], added[EPILOGUE_BATCH];
      [[unroll]] for (uint b = 0; b < EPILOGUE_BATCH; ++b) {
        const uint e = thread + 256 * (first + b), m = m0 + e / TILE_N, n = n0 + e % TILE_N;
        const bool inside = m < p.m && n < p.n;
        values[b] = inside ? atomicExchange(partial[m * p.n + n], 0) : 0;
        row_scales[b] = inside && WITH_OUTPUT ? scales[m] : 1.0;
        added[b] = inside && WITH_OUTPUT && HAS_BIAS ? (RESIDUAL ? bias[m * p.n + n] : bias[n])
                                                     : 0.0;
      }
      [[unroll]] for (uint b = 0; b < EPILOGUE_BATCH; ++b) {
        const uint e = thread + 256 * (first + b), m = m0 + e / TILE_N, n = n0 + e % TILE_N;
        if (m >= p.m || n >= p.n) continue;
        if (WITH_ACCUMULATOR) accumulators[m * p.n + n] = values[b];
        if (WITH_OUTPUT) {
          float out_value;
          SCALED(values[b], row_scales[b], added[b], out_value)
          y[m * p.n + n] = out_value;
        }
      }
    }
    return;
  }
  [[unroll]] for (uint f = 0; f < RESULTS; ++f) {
    const uint i = f / C_COLS, j = f % C_COLS;
    float residual[PER_LANE];
    if (HAS_BIAS && RESIDUAL && WITH_OUTPUT) {
      residual = residual_next;
      if (f + 1 < RESULTS) LOAD_RESIDUALS(f + 1, residual_next)
    }
    STORE_MATRIX(result[i][j], tiles, staging, 4, false);
    subgroupBarrier();
    const uint row0 = RESULT_ROW0(i), col0 = RESULT_COL0(j);
    if (VECTOR_ROWS) {
      [[unroll]] for (uint t = 0; t < 2; ++t) {
        const uint e = lane + 32 * t, m = row0 + e / 4, n = col0 + 4 * (e % 4);
        if (!FULL_TILES && (m >= p.m || n >= p.n)) continue;
        const ivec4 value = ivec4(tiles[staging + e]);
        if (WITH_ACCUMULATOR) accumulators4[(m * p.n + n) / 4] = value;
        if (WITH_OUTPUT) {
          const float scale = scales[m];
          const vec4 biases = HAS_BIAS && !RESIDUAL ? bias4[n / 4] : vec4(0.0);
          vec4 out_value;
          [[unroll]] for (uint c = 0; c < 4; ++c)
            SCALED(value[c], scale, RESIDUAL ? residual[4 * t + c] : biases[c], out_value[c])
          y4[(m * p.n + n) / 4] = out_value;
        }
      }
    } else {
      [[unroll]] for (uint t = 0; t < PER_LANE; ++t) {
        const uint e = lane + 32 * t, m = row0 + e / 16, n = col0 + e % 16;
        if (m >= p.m || n >= p.n) continue;
        const int value = int(tiles[staging + e / 4][e % 4]);
        if (WITH_ACCUMULATOR) accumulators[m * p.n + n] = value;
        if (WITH_OUTPUT) {
          float out_value;
          SCALED(value, scales[m], RESIDUAL ? residual[t] : bias[n], out_value)
          y[m * p.n + n] = out_value;
        }
      }
    }
    subgroupBarrier();
  }
}
