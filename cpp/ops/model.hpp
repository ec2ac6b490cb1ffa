#pragma once
#include <optional>

#include "runtime/tensor.hpp"

// The pieces of a decoder that are not BitLinear, norms or attention (shaders/model).
namespace bitnet::ops {

// out[t, :] = table[ids[t], :] as float32: table [V, H] float32 or float16, ids int32 [T].
// ArgumentError (after the run, or after each replay of a graph) when an id is outside [0, V).
Tensor embedding(const Tensor& table, const Tensor& ids, const std::optional<Tensor>& out = {});

// y = x w^T for a float weight w [N, K] (float32 or float16) and float32 x [M, K]: y float32
// [M, N]. Meant for few rows (a language-model head at decode); w is read once per 4 rows of x.
Tensor linear_rows(const Tensor& x, const Tensor& w, const std::optional<Tensor>& out = {});

// np.argmax along the last axis of float32 x [M, N] (N > 0): int32 [M].
Tensor argmax_rows(const Tensor& x, const std::optional<Tensor>& out = {});

// Draws one index a row of float32 logits [M, N] (N > 0) from softmax(logits / temperature) over
// the row's values at least its top_k-th largest (all of them where top_k is 0 or the row holds
// fewer numbers), by the Gumbel-max trick with counter-based noise: row m's draw depends on
// (seed, start[0] + offset, m) and that row alone (shaders/model/sample_rows.comp, whose formulas
// reference.sample_rows repeats). params: uint32 [6], the float32 bits of the temperature t and of
// 1 / t (used where t >= 1), top_k, the seed's low and high words and top-p's P = round(p 2^32)
// (0: none), read when the op runs (a graph replays with new ones); t = 0 draws the first largest
// kept value, +inf values the first of them. top_p: records the nucleus passes
// (shaders/model/sample_nucleus.comp) that keep, of the top_k values, the smallest set of the
// largest holding the share p of softmax(logits / t) (UnsupportedError on a device without 64-bit
// integer atomics); without it P is not read. top_k: records the top-k select passes; without
// them (and top_p) the draw alone runs, one dispatch for up to 65472 rows, and every value is kept
// whatever params' k says. start: int32 [1]. int32 [M];
// -1 for a row that holds a NaN, and ArgumentError after the run (or each replay of a graph)
// naming how many NaNs the logits held.
Tensor sample_rows(const Tensor& logits, const Tensor& params, const Tensor& start, int64_t offset,
                   const std::optional<Tensor>& out = {}, bool top_p = false, bool top_k = true);

// np.argmax(x @ head.T) for one row of x (float32 [1, K], K % 4 == 0) and a float head [V, K]
// (float32 or float16), through a screening copy of the head: head_q int8 [V, Kp] (Kp = K
// rounded up to 16, zero-padded) with per-row scales and error norms in head_meta float32 [V, 4]
// (models.py's screening_tables: sigma_v, D', N, 0). Every row gets a bracket around its logit
// from the int8 copy; the rows whose bracket reaches the largest lower end are computed exactly,
// as linear_rows computes them, and the largest (the first of equal ones, the first NaN) wins:
// the index argmax_rows(linear_rows(x, head)) gives, reading the head's int8 copy once instead of
// the float head. int32 [1]. ArgumentError where screened_argmax_fits(device, K) is false (K % 4,
// or rows longer than a subgroup's lanes hold in registers). high (float32 [V], for inspection):
// receives each row's upper bracket end, NaN where the row is not screened.
Tensor screened_argmax(const Tensor& x, const Tensor& head, const Tensor& head_q, const Tensor& head_meta,
                       const std::optional<Tensor>& out = {}, const std::optional<Tensor>& high = {});
// sample_rows(linear_rows(x, head), params, start, offset) for one row of x (float32 [1, K],
// K % 4 == 0, as screened_argmax takes it), through the head's screening copy: every row's bracket
// [low, high] around its logit; with top_k, the rows whose high reaches the top_k-th largest low
// (the top_k-th largest logit is at least that), else the rows whose draw score of high reaches
// the largest draw score of any low, get their logits computed exactly as linear_rows computes
// them, every other row -inf, and sample_rows draws from those: the same index, reading the int8
// copy and a few float rows instead of the float head. int32 [1]; NaN in x makes every row a
// candidate (and raises as sample_rows does). top_p: as sample_rows's; without top_k the
// candidates are then the rows whose high reaches the largest low less 22.5 t (every other row's
// top-p weight is 0: it is never kept, and the nucleus threshold is the same). exact (float32
// [V], for inspection): receives the candidates' logits and -inf elsewhere.
Tensor screened_sample(const Tensor& x, const Tensor& head, const Tensor& head_q, const Tensor& head_meta,
                       const Tensor& params, const Tensor& start, int64_t offset, const std::optional<Tensor>& out = {},
                       const std::optional<Tensor>& exact = {}, bool top_p = false);
// Whether screened_argmax (and screened_sample) take rows of k values on this device.
bool screened_argmax_fits(const Device& device, int64_t k);

// A decode step's rotary embedding and KV-cache append in one dispatch (float32): returns
// rope(q) and writes rope(k) and v to rows start[0] + t % T of each sequence's caches [B, ROWS,
// HKV, D] (q, k, v: [B * T, heads, D]; cos, sin: [positions, D / 2]).
Tensor rope_append(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos, const Tensor& sin,
                   const Tensor& start, const Tensor& k_cache, const Tensor& v_cache);

// rope_append, then attention_cached over the caches (causal), for one new token a sequence (q
// [B, HQ, D], k and v [B, HKV, D]) in one dispatch that reads each cached key and value once for
// the query heads sharing it; out [B, HQ, D]. Other shapes run the two ops. split_keys: keys a
// workgroup takes (16, 32 or 64), or 0 for 32; BITNET_GPU_DECODE_SPLIT overrides either.
Tensor decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos, const Tensor& sin,
                        const Tensor& start, const Tensor& k_cache, const Tensor& v_cache, int64_t split_keys = 0);

}  // namespace bitnet::ops
