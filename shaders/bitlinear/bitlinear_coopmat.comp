#version 450
// BitLinear for large M on VK_NV_cooperative_matrix: bitlinear_coopmat.glsl.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix : require
#extension GL_NV_integer_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int32 : require
#extension GL_EXT_control_flow_attributes : require
#define MATRIX_A icoopmatNV<8, gl_ScopeSubgroup, 16, 32>
#define MATRIX_B icoopmatNV<8, gl_ScopeSubgroup, 32, 16>
#define MATRIX_C icoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define LOAD_MATRIX(matrix, array, element, stride, column_major) \
  coopMatLoadNV(matrix, array, element, stride, column_major)
#define STORE_MATRIX(matrix, array, element, stride, column_major) \
  coopMatStoreNV(matrix, array, element, stride, column_major)
#define MULTIPLY_ADD(a, b, c) coopMatMulAddNV(a, b, c)
#include "bitlinear_coopmat.glsl"
