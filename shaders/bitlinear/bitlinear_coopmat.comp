#version 450
// BitLinear for large M on int8 tensor cores (VK_NV_cooperative_matrix, 16 x 16 x 32 int8 ->
// int32 per subgroup of 32). A workgroup of 8 subgroups owns a TILE_M x TILE_N output tile and
// walks K in steps of 16 * BLOCKS: the int8 activations (already in the interleaved layout of
// bitlinear_common.glsl) and the packed ternary weights come from memory into registers one step
// ahead, then into shared memory, the weights expanded there to signed int8 in the same
// interleaved order, so the K permutation cancels in the dot product and no row-sum correction is
// needed. Each subgroup multiplies a (TILE_M / 2) x (TILE_N / 4) part of the tile. The epilogue
// stages every 16 x 16 int32 result through shared memory (the tiles' space, no longer needed) to
// scale it by gamma / s[m] and add the bias. TERNARY = false multiplies two interleaved int8
// matrices (int8_matmul). Shared memory: (TILE_M + TILE_N) * (BLOCKS + 1) * 16 bytes.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix : require
#extension GL_NV_integer_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int32 : require
#extension GL_EXT_control_flow_attributes : require
#include "bitlinear_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool TERNARY = true;
layout(constant_id = 1) const bool HAS_BIAS = false;
layout(constant_id = 2) const bool WITH_OUTPUT = true;
layout(constant_id = 3) const bool WITH_ACCUMULATOR = false;
layout(constant_id = 4) const uint TILE_M = 128;  // multiples of 64: each of the 256 invocations
layout(constant_id = 5) const uint TILE_N = 128;  // loads whole vectors of both tiles
layout(constant_id = 6) const uint BLOCKS = 4;    // blocks of 16 int8 (one uvec4) per K step, even

const uint STRIDE = BLOCKS + 1;     // uvec4 per shared row, one of skew against bank conflicts
const uint SUBGROUP_ROWS = 2, SUBGROUP_COLS = 4;
const uint C_ROWS = TILE_M / (SUBGROUP_ROWS * 16), C_COLS = TILE_N / (SUBGROUP_COLS * 16);
const uint A_LOADS = TILE_M * BLOCKS / 256, B_LOADS = TILE_N * BLOCKS / 256;

layout(std430, binding = 0) readonly buffer WeightWords { uint w[]; };    // TERNARY: [N, blocks]
layout(std430, binding = 1) readonly buffer WeightVectors { uvec4 b[]; };  // int8: [N, blocks]
layout(std430, binding = 2) readonly buffer Activations { uvec4 a[]; };    // [M, blocks]
layout(std430, binding = 3) readonly buffer Scales { float scales[]; };
layout(std430, binding = 4) readonly buffer Gamma { float gamma[]; };
layout(std430, binding = 5) readonly buffer Bias { float bias[]; };
layout(std430, binding = 6) writeonly buffer Output { float y[]; };
layout(std430, binding = 7) writeonly buffer Accumulators { int accumulators[]; };
layout(push_constant) uniform Push { uint m; uint n; uint blocks; } p;

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
  const uint subgroup = gl_SubgroupID;
  const uint sub_row = subgroup / SUBGROUP_COLS, sub_col = subgroup % SUBGROUP_COLS;

  icoopmatNV<32, gl_ScopeSubgroup, 16, 16> result[C_ROWS][C_COLS];
  [[unroll]] for (uint i = 0; i < C_ROWS; ++i)
    [[unroll]] for (uint j = 0; j < C_COLS; ++j) result[i][j] = icoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0);

  uvec4 next_a[A_LOADS];
  uvec4 next_b[B_LOADS];
  // Loads for the K step starting at block `first`: zeros past M, N or K.
  #define LOAD_STEP(first)                                                                   \
    [[unroll]] for (uint l = 0; l < A_LOADS; ++l) {                                          \
      const uint e = thread + l * 256, row = e / BLOCKS, block = (first) + e % BLOCKS;        \
      next_a[l] = m0 + row < p.m && block < p.blocks ? a[(m0 + row) * p.blocks + block]       \
                                                     : uvec4(0);                              \
    }                                                                                        \
    [[unroll]] for (uint l = 0; l < B_LOADS; ++l) {                                          \
      const uint e = thread + l * 256, row = e / BLOCKS, block = (first) + e % BLOCKS;        \
      const bool inside = n0 + row < p.n && block < p.blocks;                                \
      if (TERNARY) next_b[l] = inside ? expand(w[(n0 + row) * p.blocks + block]) : uvec4(0); \
      else next_b[l] = inside ? b[(n0 + row) * p.blocks + block] : uvec4(0);                 \
    }
  LOAD_STEP(0)

  for (uint first = 0; first < p.blocks; first += BLOCKS) {
    barrier();  // every subgroup is done reading the previous step's tiles
    [[unroll]] for (uint l = 0; l < A_LOADS; ++l) {
      const uint e = thread + l * 256;
      tiles[(e / BLOCKS) * STRIDE + e % BLOCKS] = next_a[l];
    }
    [[unroll]] for (uint l = 0; l < B_LOADS; ++l) {
      const uint e = thread + l * 256;
      tiles[B_TILE + (e / BLOCKS) * STRIDE + e % BLOCKS] = next_b[l];
    }
    barrier();
    if (first + BLOCKS < p.blocks) { LOAD_STEP(first + BLOCKS) }

    [[unroll]] for (uint step = 0; step < BLOCKS; step += 2) {  // 32 values per multiply
      icoopmatNV<8, gl_ScopeSubgroup, 16, 32> mat_a[C_ROWS];
      [[unroll]] for (uint i = 0; i < C_ROWS; ++i) {
        const uint row = 16 * (C_ROWS * sub_row + i);
        coopMatLoadNV(mat_a[i], tiles, row * STRIDE + step, STRIDE, false);
      }
      [[unroll]] for (uint j = 0; j < C_COLS; ++j) {
        icoopmatNV<8, gl_ScopeSubgroup, 32, 16> mat_b;
        const uint col = 16 * (C_COLS * sub_col + j);
        coopMatLoadNV(mat_b, tiles, B_TILE + col * STRIDE + step, STRIDE, true);  // column-major K x N
        [[unroll]] for (uint i = 0; i < C_ROWS; ++i)
          result[i][j] = coopMatMulAddNV(mat_a[i], mat_b, result[i][j]);
      }
    }
  }

  const uint lane = gl_SubgroupInvocationID;
  const uint staging = subgroup * 64;  // in uvec4: 16 rows of 16 int32, 4 uvec4 a row
  barrier();  // every subgroup is done reading the tiles
  [[unroll]] for (uint i = 0; i < C_ROWS; ++i) {
    [[unroll]] for (uint j = 0; j < C_COLS; ++j) {
      coopMatStoreNV(result[i][j], tiles, staging, 4, false);
      subgroupBarrier();
      const uint row0 = m0 + 16 * (C_ROWS * sub_row + i), col0 = n0 + 16 * (C_COLS * sub_col + j);
      for (uint e = lane; e < 256; e += gl_SubgroupSize) {
        const uint m = row0 + e / 16, n = col0 + e % 16;
        if (m >= p.m || n >= p.n) continue;
        const int value = int(tiles[staging + e / 4][e % 4]);
        if (WITH_ACCUMULATOR) accumulators[m * p.n + n] = value;
        if (WITH_OUTPUT) {
          float out_value = float(value) * gamma[0] / scales[m];
          if (HAS_BIAS) out_value += bias[n];
          y[m * p.n + n] = out_value;
        }
      }
      subgroupBarrier();
    }
  }
}
