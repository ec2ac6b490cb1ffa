// Shared by the BitLinear activation pre-passes (bitlinear_prepare, bitlinear_prepare_split and
// the fused matvec's): per-value absmax, a row's scales, int8 rounding, and the quad transpose
// into interleaved words. Needs
// quantize_common.glsl and GL_KHR_shader_subgroup_quad.

void accumulate(float v, inout float absmax, inout uint bad) {
  if (finite(v)) absmax = max(absmax, abs(v));
  else bad++;
}

// A row's s = 127 / max(max|v|, eps), and the scale its codes are rounded with. Behind a norm
// (normed: r = 1 / sqrt(squares / k + norm_eps), max_value = max|v g|) the normalized row's max is
// r max|v g| (r > 0), and the codes of v g round with r s (docs/NUMERICS.md). precise: the fused
// matvec and bitlinear_prepare make the same operations, contracted by neither compiler.
void quantization_scales(float max_value, bool normed, float squares, uint k, float norm_eps,
                         float eps, out float scale, out float product_scale) {
  precise float r = normed ? 1.0 / sqrt(squares / float(k) + norm_eps) : 1.0;
  scale = divide(127.0, max(normed ? r * max_value : max_value, eps));
  precise float product = normed ? r * scale : scale;
  product_scale = product;
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

