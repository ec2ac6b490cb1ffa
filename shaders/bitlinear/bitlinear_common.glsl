// Shared by the BitLinear shaders.
//
// Layouts. W: packed ternary codes c = W_q + 1 (docs/NUMERICS.md), 16 per uint word. x: int8,
// each row padded with zeros to Kp = a multiple of 16 and, inside every block of 16, interleaved:
// word i of a block holds x[16b + i], x[16b + 4 + i], x[16b + 8 + i], x[16b + 12 + i]. Then
// (w >> 2i) & 0x03030303 holds the codes of exactly those four weights, one per byte, and
//   acc = sum_k x_q[k] * (c[k] - 1) = sum_i dot4(x_word_i, codes_i) - sum_k x_q[k],
// so a 16-weight word costs four shifts/masks and four 4-way dot products.
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require

// Byte i of a packed 4 x 8-bit word, as a signed int8.
int byte_of(uint word, uint i) { return int(word << (24 - 8 * i)) >> 24; }

#ifdef HW_DOT
#extension GL_EXT_spirv_intrinsics : require
// OpSDot (SPV_KHR_integer_dot_product) on packed 4x8-bit signed vectors.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018],
                  id = 4450)
int sdot_packed(uint a, uint b, spirv_literal int format);
int dot4(uint a, uint b) { return sdot_packed(a, b, 0); }
// OpSUDot: a's bytes signed, b's unsigned.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018],
                  id = 4452)
int sudot_packed(uint a, uint b, spirv_literal int format);
int sudot4(uint a, uint b) { return sudot_packed(a, b, 0); }
#else
int dot4(uint a, uint b) {
  const ivec4 va = ivec4(byte_of(a, 0), byte_of(a, 1), byte_of(a, 2), byte_of(a, 3));
  const ivec4 vb = ivec4(byte_of(b, 0), byte_of(b, 1), byte_of(b, 2), byte_of(b, 3));
  return va.x * vb.x + va.y * vb.y + va.z * vb.z + va.w * vb.w;
}
int sudot4(uint a, uint b) {
  const ivec4 va = ivec4(byte_of(a, 0), byte_of(a, 1), byte_of(a, 2), byte_of(a, 3));
  const ivec4 vb = ivec4((uvec4(b) >> uvec4(0, 8, 16, 24)) & 0xFFu);
  return va.x * vb.x + va.y * vb.y + va.z * vb.z + va.w * vb.w;
}
#endif

uint codes(uint w, uint i) { return (w >> (2 * i)) & 0x03030303u; }

// Position of element k of a row in the interleaved layout.
uint interleaved(uint k) { return (k & ~15u) | ((k & 3u) << 2) | ((k >> 2) & 3u); }
