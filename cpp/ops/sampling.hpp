#pragma once
#include <optional>

#include "runtime/tensor.hpp"

// Drawing the next token on the GPU (shaders/sampling).
namespace bitnet::ops {

// Draws one index a row of float32 logits [M, N] (N > 0) from softmax(logits / temperature) over
// the row's values at least its top_k-th largest (all of them where top_k is 0 or the row holds
// fewer numbers), by the Gumbel-max trick with counter-based noise: row m's draw depends on
// (seed, start[m] + offset, m) and that row alone (shaders/sampling/sample_rows.comp, whose
// formulas reference.sample_rows repeats). params: uint32 [6], the float32 bits of the temperature
// t and of 1 / t (used where t >= 1), top_k, the seed's low and high words and top-p's P = round(p
// 2^32) (0: none), or [M, 8] each row's own, with at 6 the row its draw is keyed by instead of m
// (a sequence's draw alone, whatever its row); read when the op runs (a graph replays with new
// ones); t = 0 draws the first
// largest kept value, +inf values the first of them. top_p: records the nucleus passes
// (shaders/sampling/sample_nucleus.comp) that keep, of the top_k values, the smallest set of the
// largest holding the share p of softmax(logits / t) (UnsupportedError on a device without 64-bit
// integer atomics); without it P is not read. top_k: records the top-k select passes; without
// them (and top_p) the draw alone runs, one dispatch for up to 65472 rows, and every value is kept
// whatever params' k says. start: int32 [M], or [1] for every row. int32 [M];
// -1 for a row that holds a NaN, and ArgumentError after the run (or each replay of a graph)
// naming how many NaNs the logits held.
Tensor sample_rows(const Tensor& logits, const Tensor& params, const Tensor& start, int64_t offset,
                   const std::optional<Tensor>& out = {}, bool top_p = false, bool top_k = true);

}  // namespace bitnet::ops
