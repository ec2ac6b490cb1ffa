#pragma once
#include <optional>

#include "runtime/tensor.hpp"

// The language-model head read through an int8 screening copy (shaders/screened_head): the exact
// argmax or draw of the float head's logits, computing only the rows that can win.
namespace bitnet::ops {

// np.argmax(x @ head.T, axis=1) for rows of x (float32 [M, K], K % 4 == 0) and a float head
// [V, K] (float32 or float16), through a screening copy of the head: head_q int8 [V, Kp] (Kp = K
// rounded up to 16, zero-padded) with per-row scales and error norms in head_meta float32 [V, 4]
// (models.py's screening_tables: sigma_v, D', N, 0). Every pair of a row of x and a row of the
// head gets a bracket around its logit from the int8 copy; the head rows whose bracket reaches
// the largest lower end of x's row are computed exactly, as linear_rows computes them, and the
// largest (the first of equal ones, the first NaN) wins: the indices argmax_rows(linear_rows(x,
// head)) gives, reading the head's int8 copy (for several rows, in an int8 matmul on the device's
// matmul path) instead of the float head. int32 [M]. Where screened_argmax_fits(device, K, M) is
// false: ArgumentError for K (K % 4, rows longer than a subgroup's lanes hold in registers),
// ShapeError for M (more rows than a grid's second dimension holds). high (float32 [V] for one
// row, else [M, V]; for inspection): receives each bracket's upper end, NaN where the row of x is
// not screened.
Tensor screened_argmax(const Tensor& x, const Tensor& head, const Tensor& head_q,
                       const Tensor& head_meta, const std::optional<Tensor>& out = {},
                       const std::optional<Tensor>& high = {});
// sample_rows(linear_rows(x, head), params, start, offset) for rows of x (float32 [M, K],
// K % 4 == 0, as screened_argmax takes them; params and start as sample_rows takes them: [6] or
// [M, 8], [1] or [M]), through the head's screening copy: every row's bracket [low, high] around
// its logit (for several rows, from the int8 matmul screened_argmax records); with top_k, the rows
// whose high reaches the top_k-th largest low (the top_k-th largest logit is at least that), else
// the rows whose draw score of high reaches the largest draw score of any low, get their logits
// computed exactly as linear_rows computes them, every other row -inf, and sample_rows draws from
// those: the same index, reading the int8 copy and a few float rows instead of the float head.
// int32 [M]; NaN in a row of x makes every head row its candidate (and raises as sample_rows
// does). top_p: as sample_rows's; without top_k the candidates are then the rows whose high
// reaches the largest low less 22.5 t (every other row's top-p weight is 0: it is never kept, and
// the nucleus threshold is the same). exact (float32 [V] for one row, else [M, V]; for
// inspection): receives the candidates' logits and -inf elsewhere.
Tensor screened_sample(const Tensor& x, const Tensor& head, const Tensor& head_q,
                       const Tensor& head_meta, const Tensor& params, const Tensor& start,
                       int64_t offset, const std::optional<Tensor>& out = {},
                       const std::optional<Tensor>& exact = {}, bool top_p = false);
// Whether screened_argmax and screened_sample take `rows` rows of k values on this device.
bool screened_argmax_fits(const Device& device, int64_t k, int64_t rows = 1);

}  // namespace bitnet::ops
