#include "ops/attention.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "ops/dispatch.hpp"
#include "ops/tuning.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/kernel.hpp"
#include "runtime/sequence.hpp"

namespace bitnet::ops {
namespace {

constexpr int64_t kSplitKeys = 32;    // SPLIT in shaders/ops/attention_split.comp
constexpr int64_t kTiledMostD = 256;  // 4 * the largest D4 in shaders/ops/attention_tiled.comp

constexpr int64_t kTiledFromQueries = 16;  // query rows a sequence from which it is the default
// Query rows a sequence from which attention_tiled prefers 16-key tiles to 32 (fewer registers let
// more workgroups share a multiprocessor, which long sequences fill), and four query rows a row
// group to two up to D = 128.
constexpr int64_t kShortTilesFromQueries = 1536;

// attention_tiled's query rows a row group (ROWS) and a workgroup (BQ = 16 ROWS) for head
// dimension d and `queries` query rows a sequence: each key a tile is then read once for more
// queries. Four rows of up to 128 values for long sequences, else two (the fastest measured on
// the H100: docs/PERFORMANCE.md).
int64_t tiled_rows_per_group(int64_t d, int64_t queries) {
  return d <= 128 && queries >= kShortTilesFromQueries ? 4 : 2;
}
int64_t tiled_queries(int64_t d, int64_t queries) { return 16 * tiled_rows_per_group(d, queries); }

// attention_tiled's keys a tile (BK): the most of 32, 16 and 8 whose shared memory fits (at most
// 16 from kShortTilesFromQueries query rows a sequence, 8 above D = 128), for a head dimension
// of d (its layout: the queries' and the tile's rows of ceil(d / 4) vectors padded to a multiple
// of 8, and the tile's weights); 0 where none fits. Tuning's attention_tile_keys asks for one:
// ArgumentError where it does not fit.
uint32_t tiled_keys(const Device& device, int64_t d, int64_t queries) {
  const uint64_t row = (static_cast<uint64_t>(d) + 31) / 32 * 8;  // vectors
  const uint64_t most = device.limits().maxComputeSharedMemorySize;
  const auto bytes = [&](uint64_t keys) {
    const uint64_t block = static_cast<uint64_t>(tiled_queries(d, queries));
    return keys * row * 16 + block * (keys + 1) * 4;
  };
  if (const auto asked = tuning().attention_tile_keys) {
    if (bytes(*asked) > most)
      throw ArgumentError("attention_tile_keys=" + std::to_string(*asked) + ": tiles of " +
                          std::to_string(bytes(*asked)) + " bytes are over this device's " +
                          std::to_string(most) + " bytes of shared memory");
    return *asked;
  }
  // Also at most 8 staged vectors an invocation (keys x ceil(d / 4) <= 1024): the tile's loads
  // are held in registers.
  for (uint32_t keys : {32u, 16u, 8u})
    if (bytes(keys) <= most && (keys < 32 || queries < kShortTilesFromQueries) &&
        (d <= 128 || keys == 8) && keys * ((d + 3) / 4) <= 1024)
      return keys;
  return 0;
}

// A few queries over many keys (decode) split the keys over workgroups.
bool use_split(int64_t tq, int64_t l) {
  if (auto forced = tuning().attention_split) return *forced && l > 0;
  return tq <= 8 && l >= 512;
}

}  // namespace

namespace {

// Where the keys come from: L keys per sequence of `seq_tokens` query rows, each sequence's keys
// at rows [b * cache_rows, ...) of k and v; with `start`, L = start[0] + seq_tokens on the GPU.
struct KeyLayout {
  int64_t l = 0;
  int64_t seq_tokens = 1;
  int64_t cache_rows = 0;
  const Tensor* start = nullptr;
  StartLayout start_layout{0, 0, 0};
  int64_t cache_batch = 0;
};

// The float16 tensor-core path's invocations a workgroup (INVOCATIONS in attention_coopmat.comp,
// which takes 16 query rows a subgroup of 32) for `queries` query rows a sequence: 256 from
// kWideFromQueries (each key tile staged once for 128 rows), else 128 (more workgroups for short
// sequences). The fastest measured on the H100 (docs/PERFORMANCE.md).
constexpr int64_t kWideFromQueries = 1024;
int64_t coopmat_invocations(int64_t queries) { return queries >= kWideFromQueries ? 256 : 128; }

// Checks that the device and head dimension d allow attention in float16 on tensor cores.
void require_float16_attention(const Device& device, int64_t d) {
  if (!device.feature("cooperative_matrix_khr_float16"))
    throw UnsupportedError(
        "attention in float16 needs float16 cooperative matrices (VK_KHR_cooperative_matrix with "
        "16 x 16 x 16 float16 products and float32 sums in subgroups of 32, Vulkan 1.3), which "
        "device '" +
        device.info().name + "' does not have");
  // Past 128 its staged keys and values outgrow 48 KiB of shared memory.
  if (d % 32 != 0 || d > 128)
    throw UnsupportedError("attention in float16: head dim " + std::to_string(d) +
                           ": expected 32, 64, 96 or 128");
}

void record_attention(Recorder& op, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                      const KeyLayout& keys, bool split, const Tensor& out, bool float16 = false) {
  const auto& device = q.device_ptr();
  const int64_t tq = q.shape()[0], hq = q.shape()[1], d = q.shape()[2];
  const int64_t hkv = k.shape()[k.shape().size() - 2];
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const bool from_start = keys.start != nullptr;
  const BufferBinding start = (from_start ? *keys.start : k).binding();
  const std::string what =
      "attention over " + std::to_string(tq) + " queries x " + std::to_string(hq) + " heads";
  Sequence& sequence = op.sequence();
  if (split && !float16) {
    // Decode: the keys split over many workgroups, then one pass merging the splits.
    const int64_t most_keys = from_start ? keys.cache_rows : keys.l;
    const int64_t splits = std::max<int64_t>(1, (most_keys + kSplitKeys - 1) / kSplitKeys);
    Tensor partial =
        Tensor::empty(device, std::vector<int64_t>{tq, hq, splits, d + 2}, DType::float32);
    struct {
      uint32_t tq, hq, hkv, d, l;
      float scale;
      uint32_t splits, seq_tokens, cache_rows, start_stride, slots, cache_batch;
    } push{static_cast<uint32_t>(tq),
           static_cast<uint32_t>(hq),
           static_cast<uint32_t>(hkv),
           static_cast<uint32_t>(d),
           static_cast<uint32_t>(keys.l),
           scale,
           static_cast<uint32_t>(splits),
           static_cast<uint32_t>(keys.seq_tokens),
           static_cast<uint32_t>(keys.cache_rows),
           keys.start_layout.stride,
           keys.start_layout.slots,
           static_cast<uint32_t>(keys.cache_batch)};
    const auto grid = checked_grid(
        *device,
        {static_cast<uint64_t>(splits), static_cast<uint64_t>(hq), static_cast<uint64_t>(tq)},
        what);
    BufferBinding bindings[] = {q.binding(),   k.binding(),       v.binding(),
                                out.binding(), partial.binding(), start};
    for (bool combine : {false, true}) {
      Kernel kernel =
          Kernel::builtin(device, attention_variant("attention_split", q.dtype(), k.dtype()),
                          {{0, causal}, {1, combine}, {2, from_start}});
      sequence.dispatch(kernel, {combine ? 1u : grid[0], grid[1], grid[2]}, bindings,
                        push_bytes(push));
    }
    return;
  }
  // Many queries a sequence and D <= 256: blocks of 32 queries (64 for long ones) share each key
  // tile (attention_tiled.comp, where the device shuffles within subgroups of 8 or more); in
  // float16, blocks of 64 or 128 (attention_coopmat.comp). block_rows 0: a workgroup a query.
  const auto [kernel, block_rows] = [&]() -> std::pair<Kernel, int64_t> {
    if (float16) {
      const int64_t invocations = coopmat_invocations(keys.seq_tokens);
      return {Kernel::builtin(device, attention_variant("attention_coopmat", q.dtype(), k.dtype()),
                              {{0, causal}, {1, from_start}, {2, d}, {3, invocations}}),
              invocations / 2};
    }
    const uint32_t tile_keys = tiled_keys(*device, d, keys.seq_tokens);
    const bool tiled = d <= kTiledMostD && tile_keys > 0 && device->feature("subgroup_shuffle8") &&
                       tuning().attention_tiled.value_or(keys.seq_tokens >= kTiledFromQueries);
    Specialization specialization{{0, causal}, {1, from_start}};
    if (tiled) {
      specialization.emplace(2, static_cast<int64_t>(tile_keys));
      specialization.emplace(3, (d + 3) / 4);
      specialization.emplace(6, tiled_rows_per_group(d, keys.seq_tokens));
    }
    return {Kernel::builtin(
                device,
                attention_variant(tiled ? "attention_tiled" : "attention", q.dtype(), k.dtype()),
                specialization),
            tiled ? tiled_queries(d, keys.seq_tokens) : 0};
  }();
  struct {
    uint32_t tq, hq, hkv, d, l;
    float scale;
    uint32_t seq_tokens, cache_rows, start_stride, slots, cache_batch;
  } push{static_cast<uint32_t>(tq),
         static_cast<uint32_t>(hq),
         static_cast<uint32_t>(hkv),
         static_cast<uint32_t>(d),
         static_cast<uint32_t>(keys.l),
         scale,
         static_cast<uint32_t>(keys.seq_tokens),
         static_cast<uint32_t>(keys.cache_rows),
         keys.start_layout.stride,
         keys.start_layout.slots,
         static_cast<uint32_t>(keys.cache_batch)};
  const uint64_t sequences = static_cast<uint64_t>(tq / std::max<int64_t>(keys.seq_tokens, 1));
  const uint64_t blocks =
      block_rows ? (static_cast<uint64_t>(keys.seq_tokens) + block_rows - 1) / block_rows : 0;
  const auto grid = checked_grid(
      *device,
      {block_rows ? sequences * blocks : static_cast<uint64_t>(tq), static_cast<uint64_t>(hq), 1},
      what);
  BufferBinding bindings[] = {q.binding(), k.binding(), v.binding(), out.binding(), start};
  sequence.dispatch(kernel, grid, bindings, push_bytes(push));
}

}  // namespace

StartLayout start_layout(const Tensor& start, int64_t cache_batch, const Tensor& q) {
  const auto& shape = start.shape();
  const bool with_slots = shape.size() == 2 && shape[0] == 2 && shape[1] > 0;
  if (start.dtype() != DType::int32 ||
      !(with_slots || (shape.size() == 1 &&
                       (start.size() == 1 || start.size() == static_cast<uint64_t>(cache_batch)))))
    throw DTypeError("start: expected int32 [1] (every sequence), [" + std::to_string(cache_batch) +
                     "] (one a sequence) or [2, B] (positions, then cache slots), got " +
                     std::string(dtype_name(start.dtype())) + " " + shape_text(shape));
  if (&start.device() != &q.device()) throw ArgumentError("start must live on the device of q");
  if (with_slots) return {shape[1], 1u, static_cast<uint32_t>(shape[1])};
  return {cache_batch, start.size() == 1 ? 0u : 1u, 0u};
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                 std::optional<int64_t> kv_length, const std::optional<Tensor>& given,
                 bool float16) {
  require_float(q, "q");
  require_keys_values(q, k, "k", v, "v");
  if (q.shape().size() != 3 || k.shape().size() != 3 || v.shape() != k.shape())
    throw ShapeError("expected q [TQ, HQ, D] and k, v [L, HKV, D], got q " + shape_text(q.shape()) +
                     ", k " + shape_text(k.shape()) + ", v " + shape_text(v.shape()));
  const int64_t tq = q.shape()[0], hq = q.shape()[1], d = q.shape()[2];
  const int64_t rows = k.shape()[0], hkv = k.shape()[1];
  if (k.shape()[2] != d || hkv == 0 || hq % hkv != 0)
    throw ShapeError("q " + shape_text(q.shape()) + " and k " + shape_text(k.shape()) +
                     ": head dims must match and HQ must be a multiple of HKV");
  if (d == 0 || d > 256)
    throw UnsupportedError("head dim " + std::to_string(d) + ": expected 1 to 256");
  const int64_t l = kv_length.value_or(rows);
  if (l < 0 || l > rows)
    throw ShapeError("kv_length " + std::to_string(l) + " is outside k's " + std::to_string(rows) +
                     " rows");
  if (causal && l < tq)
    throw ShapeError("causal attention needs at least as many keys (" + std::to_string(l) +
                     ") as queries (" + std::to_string(tq) + ")");
  const auto& device = q.device_ptr();
  if (float16) require_float16_attention(*device, d);
  Tensor out = output(device, given, q.shape(), q.dtype(), "out", {&q, &k, &v});
  if (tq == 0 || hq == 0) return out;
  Recorder op(device);
  record_attention(op, q, k, v, causal, {l, std::max<int64_t>(tq, 1), rows, nullptr},
                   use_split(tq, l), out, float16);
  op.run();
  return out;
}

Tensor attention_cached(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& start, bool causal, const std::optional<Tensor>& given,
                        bool float16) {
  require_float(q, "q");
  require_keys_values(q, k_cache, "k_cache", v_cache, "v_cache");
  if (q.shape().size() != 3 || k_cache.shape().size() != 4 || v_cache.shape() != k_cache.shape())
    throw ShapeError("expected q [B * T, HQ, D] and caches [B, ROWS, HKV, D], got q " +
                     shape_text(q.shape()) + ", k_cache " + shape_text(k_cache.shape()) +
                     ", v_cache " + shape_text(v_cache.shape()));
  const int64_t rows_q = q.shape()[0], hq = q.shape()[1], d = q.shape()[2];
  const int64_t cache_batch = k_cache.shape()[0], cache_rows = k_cache.shape()[1],
                hkv = k_cache.shape()[2];
  if (k_cache.shape()[3] != d || hkv == 0 || hq % hkv != 0 || cache_batch == 0)
    throw ShapeError("q " + shape_text(q.shape()) + " and caches " + shape_text(k_cache.shape()) +
                     ": head dims must match and HQ must be a multiple of HKV");
  if (d == 0 || d > 256)
    throw UnsupportedError("head dim " + std::to_string(d) + ": expected 1 to 256");
  const StartLayout layout = start_layout(start, cache_batch, q);
  if (rows_q % layout.batch != 0)
    throw ShapeError("q " + shape_text(q.shape()) + ": its rows must be a multiple of the " +
                     std::to_string(layout.batch) + " sequences");
  const int64_t seq_tokens = rows_q / layout.batch;
  if (seq_tokens > cache_rows)
    throw ShapeError(std::to_string(seq_tokens) + " tokens a sequence do not fit caches of " +
                     std::to_string(cache_rows) + " rows");
  const auto& device = q.device_ptr();
  if (float16) require_float16_attention(*device, d);
  Tensor out = output(device, given, q.shape(), q.dtype(), "out", {&q, &k_cache, &v_cache});
  if (rows_q == 0 || hq == 0) return out;
  Recorder op(device);
  record_attention(op, q, k_cache, v_cache, causal,
                   {0, seq_tokens, cache_rows, &start, layout, cache_batch}, seq_tokens <= 8, out,
                   float16);
  op.run();
  return out;
}

Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin,
            const std::optional<Tensor>& given) {
  require_float(x, "x");
  if (x.shape().size() != 3 || x.shape()[2] % 2 != 0)
    throw ShapeError("x: expected [T, H, D] with D even, got " + shape_text(x.shape()));
  const int64_t t = x.shape()[0], h = x.shape()[1], d = x.shape()[2];
  const std::vector<int64_t> table{t, d / 2};
  for (const Tensor* c : {&cos, &sin})
    if (c->dtype() != DType::float32 || c->shape() != table)
      throw ShapeError("angle tables: expected float32 " + shape_text(table) + ", got " +
                       std::string(dtype_name(c->dtype())) + " " + shape_text(c->shape()));
  const auto& device = x.device_ptr();
  Tensor out = output(device, given, x.shape(), x.dtype(), "y", {&x});
  if (x.size() == 0) return out;
  Kernel kernel = Kernel::builtin(device, float_variant("rope", x.dtype()));
  struct {
    uint32_t t, h, d;
  } push{static_cast<uint32_t>(t), static_cast<uint32_t>(h), static_cast<uint32_t>(d)};
  BufferBinding bindings[] = {x.binding(), cos.binding(), sin.binding(), out.binding()};
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  sequence.dispatch(kernel, {workgroups(*device, x.size() / 2), 1, 1}, bindings, push_bytes(push));
  op_sequence.run();
  return out;
}

void copy_rows(const Tensor& rows, const Tensor& destination, int64_t first_row) {
  if (rows.dtype() != destination.dtype() || rows.shape().empty() || destination.shape().empty() ||
      std::vector<int64_t>(rows.shape().begin() + 1, rows.shape().end()) !=
          std::vector<int64_t>(destination.shape().begin() + 1, destination.shape().end()))
    throw ShapeError("rows " + shape_text(rows.shape()) + " " +
                     std::string(dtype_name(rows.dtype())) + " do not fit the rows of " +
                     shape_text(destination.shape()) + " " +
                     std::string(dtype_name(destination.dtype())));
  if (first_row < 0 || first_row + rows.shape()[0] > destination.shape()[0])
    throw ShapeError("rows " + std::to_string(first_row) + " .. " +
                     std::to_string(first_row + rows.shape()[0]) + " are outside the " +
                     std::to_string(destination.shape()[0]) + " rows of the destination");
  if (&rows.device() != &destination.device())
    throw ArgumentError("rows and destination: two devices");
  if (rows.nbytes() == 0) return;
  const uint64_t row_bytes = rows.nbytes() / static_cast<uint64_t>(rows.shape()[0]);
  Recorder op_sequence(rows.device_ptr());
  Sequence& sequence = op_sequence.sequence();
  sequence.copy(rows.binding(), {destination.allocation(),
                                 static_cast<uint64_t>(first_row) * row_bytes, rows.nbytes()});
  op_sequence.run();
}

}  // namespace bitnet::ops
