#pragma once
#include <cstdint>
#include <optional>

#include "runtime/tensor.hpp"

// Decoder attention pieces (docs/NUMERICS.md; shaders/ops/attention.comp, rope.comp).
namespace bitnet::ops {

// softmax(q k^T / sqrt(D)) v with grouped-query heads: q [TQ, HQ, D], k and v [>= L, HKV, D]
// (only their first `kv_length` rows are read: a KV cache), HQ a multiple of HKV, D <= 256.
// causal: query i sits at position L - TQ + i and sees keys up to it (needs L >= TQ).
// float16: q, k, v and the softmax weights rounded to float16 for the products, on tensor cores
// (attention_coopmat.comp; the device feature "cooperative_matrix_khr_float16", D 32, 64, 96 or
// 128).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                 std::optional<int64_t> kv_length, const std::optional<Tensor>& out = {},
                 bool float16 = false);

// attention() over batched caches [C, ROWS, HKV, D] whose length is read on the GPU: q [B * T,
// HQ, D] holds T new tokens a sequence, and sequence b attends over rows [0, start[b] + T) of its
// cache sequence (see StartLayout: b, or a slot of the caches). For recorded graphs (decode
// steps).
Tensor attention_cached(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& start, bool causal, const std::optional<Tensor>& out,
                        bool float16 = false);

// How an op over caches reads `start`, int32: [1] (every sequence's position), [B] (one a
// sequence; sequence b's cache is cache sequence b, so the caches hold B) or [2, B] (the positions,
// then each sequence's cache slot: the caches may hold any C sequences, and a slot past them is
// read as the last and never written). `stride` and `slots` are the shaders' push constants.
struct StartLayout {
  int64_t batch;    // B: sequences of the step
  uint32_t stride;  // 0: start[0] for every sequence, 1: start[b]
  uint32_t slots;   // 0: cache sequence b; else the slots begin at start[slots]
};
// DTypeError or ShapeError where start does not fit caches of `cache_batch` sequences.
StartLayout start_layout(const Tensor& start, int64_t cache_batch, const Tensor& q);

// Rotary embedding of x [T, H, D] (D even) with float32 angle tables cos and sin [T, D / 2].
Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin,
            const std::optional<Tensor>& out = {});

// Copies `rows` (all of it) into `destination` starting at row `first_row` (same dtype and row
// shape): how a KV cache appends on the device.
void copy_rows(const Tensor& rows, const Tensor& destination, int64_t first_row);

// A decode step's rotary embedding and KV-cache append in one dispatch (float32): returns
// rope(q) and writes rope(k) and v to rows start[b] + t % T of each sequence's cache sequence
// (caches [C, ROWS, HKV, D], start as StartLayout takes it; q, k, v: [B * T, heads, D]; cos, sin:
// [positions, D / 2]).
Tensor rope_append(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos,
                   const Tensor& sin, const Tensor& start, const Tensor& k_cache,
                   const Tensor& v_cache);

// rope_append, then attention_cached over the caches (causal), for one new token a sequence (q
// [B, HQ, D], k and v [B, HKV, D]) in one dispatch that reads each cached key and value once for
// the query heads sharing it; out [B, HQ, D]. Other shapes run the two ops. split_keys: keys a
// workgroup takes (16, 32 or 64), or 0 for 32; Tuning's decode_split overrides either.
Tensor decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos,
                        const Tensor& sin, const Tensor& start, const Tensor& k_cache,
                        const Tensor& v_cache, int64_t split_keys = 0);

}  // namespace bitnet::ops
