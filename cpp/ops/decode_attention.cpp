#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/attention.hpp"
#include "ops/dispatch.hpp"
#include "ops/tuning.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/kernel.hpp"
#include "runtime/sequence.hpp"

namespace bitnet::ops {
namespace {

// Keys a decode_attention workgroup takes (SPLIT in shaders/ops/decode_attention.comp): the
// caller's 16, 32 or 64 (0: 32), or Tuning's decode_split; 32 where G * SPLIT would pass 256.
int64_t decode_split_keys(int64_t heads_per_kv, int64_t requested) {
  if (requested != 0 && requested != 16 && requested != 32 && requested != 64)
    throw ArgumentError("split_keys: expected 16, 32 or 64 (or 0), got " +
                        std::to_string(requested));
  const int64_t split = tuning().decode_split.value_or(requested != 0 ? requested : 32);
  return heads_per_kv * split <= 256 ? split : 32;
}

struct AppendShape {
  int64_t rows, hq, hkv, d, batch, cache_rows, cache_batch;
  StartLayout start;
};

// The checks rope_append and decode_attention share.
AppendShape check_append(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& cos, const Tensor& sin, const Tensor& start,
                         const Tensor& k_cache, const Tensor& v_cache) {
  for (const auto& [t, name] :
       {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&cos, "cos"}, {&sin, "sin"}})
    if (t->dtype() != DType::float32)
      throw DTypeError(std::string(name) + ": expected float32, got " +
                       std::string(dtype_name(t->dtype())));
  // The caches: float32, or float16 (rounded to nearest as they are written).
  require_keys_values(q, k_cache, "k_cache", v_cache, "v_cache");
  if (q.shape().size() != 3 || k.shape().size() != 3 || v.shape() != k.shape() ||
      k_cache.shape().size() != 4 || v_cache.shape() != k_cache.shape())
    throw ShapeError(
        "expected q [B * T, HQ, D], k and v [B * T, HKV, D] and caches [B, ROWS, HKV, D], got q " +
        shape_text(q.shape()) + ", k " + shape_text(k.shape()) + ", v " + shape_text(v.shape()) +
        ", caches " + shape_text(k_cache.shape()));
  const int64_t cache_batch = k_cache.shape()[0];
  if (cache_batch == 0) throw ShapeError("caches: expected at least one sequence");
  const StartLayout layout = start_layout(start, cache_batch, q);
  const AppendShape shape{q.shape()[0], q.shape()[1],       k.shape()[1], q.shape()[2],
                          layout.batch, k_cache.shape()[1], cache_batch,  layout};
  if (k.shape()[0] != shape.rows || k.shape()[2] != shape.d || shape.d % 2 != 0 ||
      k_cache.shape()[2] != shape.hkv || k_cache.shape()[3] != shape.d ||
      shape.rows % shape.batch != 0)
    throw ShapeError("q " + shape_text(q.shape()) + ", k " + shape_text(k.shape()) +
                     " and caches " + shape_text(k_cache.shape()) +
                     " do not fit: rows must be a multiple of B, D even and shared");
  if (cos.shape().size() != 2 || cos.shape()[1] != shape.d / 2 || cos.shape()[0] == 0 ||
      sin.shape() != cos.shape())
    throw ShapeError("angle tables: expected [positions, " + std::to_string(shape.d / 2) +
                     "], got " + shape_text(cos.shape()) + " and " + shape_text(sin.shape()));
  for (const Tensor* t : {&k, &v, &cos, &sin, &k_cache, &v_cache})
    if (&t->device() != &q.device())
      throw ArgumentError(std::string(op) + ": every tensor must live on q's device");
  return shape;
}

}  // namespace

Tensor rope_append(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos,
                   const Tensor& sin, const Tensor& start, const Tensor& k_cache,
                   const Tensor& v_cache) {
  const AppendShape shape = check_append("rope_append", q, k, v, cos, sin, start, k_cache, v_cache);
  const auto& device = q.device_ptr();
  Tensor q_out = Tensor::empty(device, q.shape(), DType::float32);
  if (shape.rows == 0) return q_out;
  struct {
    uint32_t rows, hq, hkv, d, period, cache_rows, table_rows, start_stride, slots, cache_batch;
  } push{static_cast<uint32_t>(shape.rows),
         static_cast<uint32_t>(shape.hq),
         static_cast<uint32_t>(shape.hkv),
         static_cast<uint32_t>(shape.d),
         static_cast<uint32_t>(shape.rows / shape.batch),
         static_cast<uint32_t>(shape.cache_rows),
         static_cast<uint32_t>(cos.shape()[0]),
         shape.start.stride,
         shape.start.slots,
         static_cast<uint32_t>(shape.cache_batch)};
  const uint64_t total = static_cast<uint64_t>(shape.rows) *
                         ((shape.hq + shape.hkv) * (shape.d / 2) + shape.hkv * shape.d);
  Kernel kernel =
      Kernel::builtin(device, attention_variant("rope_append", q.dtype(), k_cache.dtype()));
  BufferBinding bindings[] = {q.binding(),       k.binding(),       v.binding(),
                              cos.binding(),     sin.binding(),     q_out.binding(),
                              k_cache.binding(), v_cache.binding(), start.binding()};
  Recorder op(device);
  op.sequence().dispatch(kernel, {workgroups(*device, total), 1, 1}, bindings, push_bytes(push));
  op.run();
  return q_out;
}

Tensor decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos,
                        const Tensor& sin, const Tensor& start, const Tensor& k_cache,
                        const Tensor& v_cache, int64_t requested_split) {
  const AppendShape shape =
      check_append("decode_attention", q, k, v, cos, sin, start, k_cache, v_cache);
  const auto& device = q.device_ptr();
  const int64_t heads_per_kv =
      shape.hkv > 0 && shape.hq % shape.hkv == 0 ? shape.hq / shape.hkv : 0;
  // One dispatch for one new token a sequence, D % 4 == 0, D <= 256, up to 8 query heads a KV head
  // and the shared memory it needs; otherwise the two ops it fuses.
  // Its shared memory (shaders/ops/decode_attention.comp): s_q and s_part (256 a head each), s_p,
  // s_k_new and s_v_new (256 each), the merge's vec2 and vec4 (256 each) and a flag.
  const int64_t split_keys = decode_split_keys(heads_per_kv, requested_split);
  const int64_t shared_bytes =
      4 * (2 * heads_per_kv * 256 + heads_per_kv * split_keys + 2 * 256) + (8 + 16) * 256 + 16;
  const bool fused = shape.rows == shape.batch && shape.d % 4 == 0 && shape.d <= 256 &&
                     heads_per_kv >= 1 && heads_per_kv <= 8 &&
                     shared_bytes <= device->limits().maxComputeSharedMemorySize &&
                     tuning().fused_attention.value_or(true);
  if (!fused) {
    const Tensor rotated = rope_append(q, k, v, cos, sin, start, k_cache, v_cache);
    return attention_cached(rotated, k_cache, v_cache, start, true, std::nullopt);
  }
  Tensor out = Tensor::empty(device, q.shape(), DType::float32);
  if (shape.rows == 0 || shape.hq == 0) return out;
  const int64_t splits = (shape.cache_rows + split_keys - 1) / split_keys;
  Tensor partial = Tensor::empty(
      device, std::vector<int64_t>{shape.batch, shape.hq, splits, shape.d + 4}, DType::float32);
  struct {
    uint32_t hq, hkv, cache_rows, table_rows, splits;
    float scale;
    uint32_t start_stride, slots, cache_batch;
  } push{static_cast<uint32_t>(shape.hq),
         static_cast<uint32_t>(shape.hkv),
         static_cast<uint32_t>(shape.cache_rows),
         static_cast<uint32_t>(cos.shape()[0]),
         static_cast<uint32_t>(splits),
         1.0f / std::sqrt(static_cast<float>(shape.d)),
         shape.start.stride,
         shape.start.slots,
         static_cast<uint32_t>(shape.cache_batch)};
  // The head dimension is a specialization constant (HEAD_DIM): it sizes the kernel's register
  // arrays.
  Kernel kernel =
      Kernel::builtin(device, attention_variant("decode_attention", q.dtype(), k_cache.dtype()),
                      {{0, heads_per_kv}, {1, split_keys}, {2, int64_t{shape.d}}});
  const auto grid =
      checked_grid(*device,
                   {static_cast<uint64_t>(shape.hkv), static_cast<uint64_t>(splits),
                    static_cast<uint64_t>(shape.batch)},
                   "decode attention over " + std::to_string(shape.cache_rows) + " cache rows");
  Recorder op(device);
  // The last workgroup of each (sequence, KV head) resets its counter.
  Tensor counter = self_resetting_counters(op.sequence(), shape.batch * shape.hkv);
  BufferBinding bindings[] = {
      q.binding(),       k.binding(),       v.binding(),       cos.binding(),    sin.binding(),
      k_cache.binding(), v_cache.binding(), k_cache.binding(), start.binding(),  partial.binding(),
      counter.binding(), out.binding(),     v_cache.binding(), partial.binding()};
  op.sequence().dispatch(kernel, grid, bindings, push_bytes(push));
  op.run();
  return out;
}

}  // namespace bitnet::ops
