// Shared by the quantization shaders: the per-segment statistics and the counter-based random
// numbers. Layouts match cpp/ops/quantize.hpp.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

#ifdef INPUT_F16
#define ELEMENT float16_t
#define ELEMENT4 f16vec4
#else
#define ELEMENT float
#define ELEMENT4 vec4
#endif

// Keys' and values' element type in the attention shaders: KV_F16 is a float16 KV cache beside
// float32 queries (every value is converted to float32 as it is read).
#if defined(INPUT_F16) || defined(KV_F16)
#define KV_ELEMENT float16_t
#define KV_ELEMENT4 f16vec4
#else
#define KV_ELEMENT float
#define KV_ELEMENT4 vec4
#endif

struct Stats {
  float sum_abs;
  float sum;
  float max_abs;
  float min_value;
  float max_value;
  uint count;
  uint nonfinite;
  uint pad;
};

bool finite(float v) { return !isnan(v) && !isinf(v); }

// a / b for any finite b. Vulkan bounds a division's error only for |b| in [2^-126, 2^126]; past
// that, drivers may compute a * (1 / b) with 1 / b flushed to zero (the H100 does). Scaling b by
// 2^-32 first, and the quotient back, keeps the result as precise as any in-range division (both
// scalings are exact while the values stay normal). `precise` and ldexp keep the compiler from
// folding the scalings away again (it did, with plain multiplications).
float divide(float a, float b) {
  const float two_to_125 = 4.2535296e37;
  if (abs(b) < two_to_125) return a / b;
  precise float quotient = a / ldexp(b, -32);
  return ldexp(quotient, -32);
}

// PCG hash (O'Neill): a stateless 32-bit mix, so element i's random number depends on
// (seed, i) alone and is the same on every device and in the NumPy reference.
uint pcg_hash(uint v) {
  uint state = v * 747796405u + 2891336453u;
  uint word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
  return (word >> 22u) ^ word;
}

float uniform01(uint seed_lo, uint seed_hi, uint index) {
  uint h = pcg_hash(index ^ pcg_hash(seed_lo ^ pcg_hash(seed_hi)));
  return float(h >> 8) * (1.0 / 16777216.0);
}
