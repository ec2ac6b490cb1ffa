// The draw's formulas, shared by sample_rows.comp and the screened draw's passes (head_screen.comp,
// head_verify.comp with SAMPLE); reference.sampling_scores repeats them in float64. Needs
// pcg_hash (quantize_common.glsl).

// An order key: a < b as floats exactly where key(a) < key(b), -0 and +0 one key (NaN excluded).
uint key(float v) {
  uint bits = floatBitsToUint(v);
  if (bits == 0x80000000u) bits = 0u;
  return (bits & 0x80000000u) != 0u ? ~bits : bits | 0x80000000u;
}

// The float32 number of an order key (key's inverse).
float unkey(uint k) { return uintBitsToFloat((k & 0x80000000u) != 0u ? k & 0x7FFFFFFFu : ~k); }

// Whether top-p selects from a row whose largest kept value has order key max_key: a finite value
// (0: the row held no kept number; an infinite largest value makes every weight 0 or NaN, and the
// draw then takes from every kept value, as without top-p).
bool nucleus_applies(uint max_key) { return max_key != 0u && !isinf(unkey(max_key)); }

// -log(1 - w), w = (h + 0.5) / 2^32: an exponential variate, its relative precision kept where
// it is small (the large Gumbel values, which decide the draws).
float exponential(uint h) {
  const float two_to_minus_32 = 2.3283064e-10;
  if (h >= 0x80000000u) return -log((float(~h) + 0.5) * two_to_minus_32);  // 1 - w
  const float w = (float(h) + 0.5) * two_to_minus_32;
  if (w >= 0.0625) return -log(1.0 - w);
  // -log1p(-w) = w + w^2 / 2 + w^3 / 3 + ..., to float32 precision for w < 1/16
  return w * (1.0 + w * (1.0 / 2.0 + w * (1.0 / 3.0 + w * (1.0 / 4.0 +
                                                    w * (1.0 / 5.0 + w * (1.0 / 6.0 + w / 7.0))))));
}

// The noise key of row `row` of a draw at `step` with the seed's words seed_lo, seed_hi.
uint draw_key(uint row, uint step, uint seed_lo, uint seed_hi) {
  return pcg_hash(row ^ pcg_hash(step ^ pcg_hash(seed_lo ^ pcg_hash(seed_hi))));
}

// The key of row `row`'s draw at `step`, from the draw's parameters in buffer PARAMS at word `at`
// (the seed's words at 3 and 4): the row is keyed by its own index, or where each row has
// parameters of its own (`own`) by the key row at word 6. Every pass of a draw takes it from here.
#define ROW_DRAW_KEY(PARAMS, at, own, row, step) \
  draw_key((own) ? PARAMS[(at) + 6] : (row), (step), PARAMS[(at) + 3], PARAMS[(at) + 4])

// Index j's Gumbel noise under a row's key.
float gumbel(uint j, uint row_key) { return -log(exponential(pcg_hash(pcg_hash(j) ^ row_key))); }

// The score the draw takes the largest of: x + t g below t = 1, x (1 / t) + g from it (neither
// overflows); rounded once each step, so it never decreases as x grows.
float draw_score(float x, float g, float t, float inverse) {
  precise float s = t >= 1.0 ? x * inverse + g : x + t * g;
  return s;
}
