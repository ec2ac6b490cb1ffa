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
