// Shared by head_screen.comp and head_brackets.comp: the bracket [approx - bound, approx + bound]
// around h . head[v] that head_screen.comp's header derives, from the two exact integer sums of
// h's 16-bit values' high and low bytes with head row v's int8 values (sum_high, sum_low), h's
// sigma_h, ||h|| and E_h, and row v's meta (sigma_v, D', N). Returns (low end, high end).
vec2 bracket(int sum_high, int sum_low, float sigma_h, float norm_h, float error_h, vec4 meta) {
  const float approx = sigma_h * (256.0 * float(sum_high) + float(sum_low)) * meta.x;
  // 1e-36: what flushing a product below the smallest normal float to zero can lose.
  const float bound =
      ((norm_h + error_h) * meta.y + error_h * meta.z) * (1.0 + 1.0 / 256.0) + 1e-36;
  return vec2(approx - bound, approx + bound);
}
