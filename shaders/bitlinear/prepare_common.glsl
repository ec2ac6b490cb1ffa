// Shared by the BitLinear activation pre-passes (bitlinear_prepare, bitlinear_prepare_split):
// per-value absmax, int8 rounding, and the quad transpose into interleaved words. Needs
// quantize_common.glsl and GL_KHR_shader_subgroup_quad.

void accumulate(float v, inout float absmax, inout uint bad) {
  if (finite(v)) absmax = max(absmax, abs(v));
  else bad++;
}

int quantize(float v, float scale) {
  precise float product = v * scale;
  return int(clamp(roundEven(product), -128.0, 127.0));
}

// Vector j of a block (values 4j .. 4j + 3) quantized: byte e holds value 4j + e. The block's
// interleaved word i holds values 4j + i, j = 0..3: byte i of each of the quad's four vectors.
uint interleaved_word(vec4 v, float scale, inout int sum) {
  uint packed = 0;
  [[unroll]] for (uint e = 0; e < 4; ++e) {
    const int q = quantize(v[e], scale);
    sum += q;
    packed |= (uint(q) & 0xFFu) << (8 * e);
  }
  const uint i = gl_SubgroupInvocationID & 3u;
  uint word = 0;
  [[unroll]] for (uint j = 0; j < 4; ++j)
    word |= ((subgroupQuadBroadcast(packed, j) >> (8 * i)) & 0xFFu) << (8 * j);
  return word;
}

