// Shared by the element-wise and row shaders in shaders/ops: element types and activations
// (docs/NUMERICS.md; backward is the exact derivative). Values are computed in float32.
// Element types (ELEMENT, ELEMENT4 by INPUT_F16), finite() and uniform01() come from here:
#include "../quantize/quantize_common.glsl"

const uint RELU = 0, LEAKY_RELU = 1, RELU2 = 2, GELU = 3, GELU_TANH = 4, SILU = 5, SIGMOID = 6,
           TANH = 7;

// erfc with a fractional error below 1.2e-7 everywhere (Chebyshev fit, Numerical Recipes' erfcc),
// computed directly so that 0.5 x erfc(-x / sqrt 2) keeps its relative precision for large -x.
float erfc_approx(float z) {
  const float t = 1.0 / (1.0 + 0.5 * abs(z));
  const float r = t * exp(-z * z - 1.26551223 +
      t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 +
      t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 +
      t * 0.17087277)))))))));
  return z >= 0.0 ? r : 2.0 - r;
}

float sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }

// max(x, 0) that keeps NaN, as NumPy's maximum does (GLSL's max may return either operand).
float relu(float x) { return isnan(x) ? x : max(x, 0.0); }

// max(a, b) that keeps NaN from either side (NumPy's max and maximum).
float nan_max(float a, float b) { return isnan(a) ? a : (isnan(b) ? b : max(a, b)); }

float activation(uint op, float x, float alpha) {
  if (op == RELU) return relu(x);
  if (op == LEAKY_RELU) return x > 0.0 ? x : alpha * x;
  if (op == RELU2) { const float r = relu(x); return r * r; }
  if (op == GELU) return 0.5 * x * erfc_approx(-x * 0.70710678);
  // 0.5 (1 + tanh u) = sigmoid(2u): no cancellation where tanh u rounds to -1.
  if (op == GELU_TANH) return x * sigmoid(1.5957691216 * (x + 0.044715 * x * x * x));
  if (op == SILU) return x * sigmoid(x);
  if (op == SIGMOID) return sigmoid(x);
  return tanh(x);
}

float activation_derivative(uint op, float x, float alpha) {
  if (op == RELU) return x > 0.0 ? 1.0 : 0.0;
  if (op == LEAKY_RELU) return x > 0.0 ? 1.0 : alpha;
  if (op == RELU2) return 2.0 * relu(x);
  if (op == GELU)
    return 0.5 * erfc_approx(-x * 0.70710678) + x * exp(-0.5 * x * x) * 0.3989422804;
  if (op == GELU_TANH) {
    const float s = sigmoid(1.5957691216 * (x + 0.044715 * x * x * x));
    return s + x * s * (1.0 - s) * 1.5957691216 * (1.0 + 0.134145 * x * x);
  }
  if (op == SILU) { const float s = sigmoid(x); return s * (1.0 + x * (1.0 - s)); }
  if (op == SIGMOID) { const float s = sigmoid(x); return s * (1.0 - s); }
  const float t = tanh(x);
  return 1.0 - t * t;
}

// Attention's causal rule (attention*.comp): keys that query `at` of a sequence of SEQ_TOKENS
// new tokens sees among l (it sits at position l - SEQ_TOKENS + at); all l when not causal.
uint visible_keys(bool causal, uint l, uint at, uint seq_tokens) {
  return causal ? (l + at + 1 > seq_tokens ? min(l, l + at + 1 - seq_tokens) : 0) : l;
}
