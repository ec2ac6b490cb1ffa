#include "ops/attention.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "ops/dispatch.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/kernel.hpp"
#include "runtime/sequence.hpp"

namespace bitnet::ops {
namespace {

constexpr int64_t kSplitKeys = 256;  // SPLIT in shaders/ops/attention_split.comp

// A few queries over many keys (decode) split the keys over workgroups; BITNET_GPU_ATTENTION_SPLIT
// = 0 or 1 overrides, for tests and tuning.
bool use_split(int64_t tq, int64_t l) {
  if (auto forced = environment_switch("BITNET_GPU_ATTENTION_SPLIT")) return *forced && l > 0;
  return tq <= 8 && l >= 512;
}

}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                 std::optional<int64_t> kv_length, const std::optional<Tensor>& given) {
  require_float(q, "q");
  require_same_kind(q, "q", k, "k");
  require_same_kind(q, "q", v, "v");
  if (q.shape().size() != 3 || k.shape().size() != 3 || v.shape() != k.shape())
    throw ShapeError("expected q [TQ, HQ, D] and k, v [L, HKV, D], got q " + shape_text(q.shape()) +
                     ", k " + shape_text(k.shape()) + ", v " + shape_text(v.shape()));
  const int64_t tq = q.shape()[0], hq = q.shape()[1], d = q.shape()[2];
  const int64_t rows = k.shape()[0], hkv = k.shape()[1];
  if (k.shape()[2] != d || hkv == 0 || hq % hkv != 0)
    throw ShapeError("q " + shape_text(q.shape()) + " and k " + shape_text(k.shape()) +
                     ": head dims must match and HQ must be a multiple of HKV");
  if (d == 0 || d > 256) throw UnsupportedError("head dim " + std::to_string(d) + ": expected 1 to 256");
  const int64_t l = kv_length.value_or(rows);
  if (l < 0 || l > rows)
    throw ShapeError("kv_length " + std::to_string(l) + " is outside k's " + std::to_string(rows) + " rows");
  if (causal && l < tq)
    throw ShapeError("causal attention needs at least as many keys (" + std::to_string(l) +
                     ") as queries (" + std::to_string(tq) + ")");
  const auto& device = q.device_ptr();
  Tensor out = output(device, given, q.shape(), q.dtype(), "out", {&q, &k, &v});
  if (tq == 0 || hq == 0) return out;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  if (use_split(tq, l)) {
    // Decode: the keys split over many workgroups, then one pass merging the splits.
    const int64_t splits = (l + kSplitKeys - 1) / kSplitKeys;
    Tensor partial = Tensor::empty(device, std::vector<int64_t>{tq, hq, splits, d + 2}, DType::float32);
    struct {
      uint32_t tq, hq, hkv, d, l;
      float scale;
      uint32_t splits;
    } push{static_cast<uint32_t>(tq), static_cast<uint32_t>(hq), static_cast<uint32_t>(hkv),
           static_cast<uint32_t>(d), static_cast<uint32_t>(l), scale, static_cast<uint32_t>(splits)};
    const auto grid = checked_grid(*device, {static_cast<uint64_t>(splits), static_cast<uint64_t>(hq),
                                             static_cast<uint64_t>(tq)},
                                   "attention over " + std::to_string(tq) + " queries x " +
                                       std::to_string(hq) + " heads");
    BufferBinding bindings[] = {q.binding(), k.binding(), v.binding(), out.binding(), partial.binding()};
    Sequence sequence(device, Timing::off);
    for (bool combine : {false, true}) {
      Kernel kernel = Kernel::builtin(device, float_variant("attention_split", q.dtype()),
                                      {{0, causal}, {1, combine}});
      sequence.dispatch(kernel, {combine ? 1u : grid[0], grid[1], grid[2]}, bindings, push_bytes(push));
    }
    sequence.run();
    return out;
  }
  Kernel kernel = Kernel::builtin(device, float_variant("attention", q.dtype()), {{0, causal}});
  struct {
    uint32_t tq, hq, hkv, d, l;
    float scale;
  } push{static_cast<uint32_t>(tq), static_cast<uint32_t>(hq), static_cast<uint32_t>(hkv),
         static_cast<uint32_t>(d), static_cast<uint32_t>(l), scale};
  const auto grid = checked_grid(*device, {static_cast<uint64_t>(tq), static_cast<uint64_t>(hq), 1},
                                 "attention over " + std::to_string(tq) + " queries x " +
                                     std::to_string(hq) + " heads");
  BufferBinding bindings[] = {q.binding(), k.binding(), v.binding(), out.binding()};
  Sequence sequence(device, Timing::off);
  sequence.dispatch(kernel, grid, bindings, push_bytes(push));
  sequence.run();
  return out;
}

Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const std::optional<Tensor>& given) {
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
  Sequence sequence(device, Timing::off);
  sequence.dispatch(kernel, {workgroups(*device, x.size() / 2), 1, 1}, bindings, push_bytes(push));
  sequence.run();
  return out;
}

void copy_rows(const Tensor& rows, const Tensor& destination, int64_t first_row) {
  if (rows.dtype() != destination.dtype() || rows.shape().empty() || destination.shape().empty() ||
      std::vector<int64_t>(rows.shape().begin() + 1, rows.shape().end()) !=
          std::vector<int64_t>(destination.shape().begin() + 1, destination.shape().end()))
    throw ShapeError("rows " + shape_text(rows.shape()) + " " + std::string(dtype_name(rows.dtype())) +
                     " do not fit the rows of " + shape_text(destination.shape()) + " " +
                     std::string(dtype_name(destination.dtype())));
  if (first_row < 0 || first_row + rows.shape()[0] > destination.shape()[0])
    throw ShapeError("rows " + std::to_string(first_row) + " .. " +
                     std::to_string(first_row + rows.shape()[0]) + " are outside the " +
                     std::to_string(destination.shape()[0]) + " rows of the destination");
  if (&rows.device() != &destination.device()) throw ArgumentError("rows and destination: two devices");
  if (rows.nbytes() == 0) return;
  const uint64_t row_bytes = rows.nbytes() / static_cast<uint64_t>(rows.shape()[0]);
  Sequence sequence(rows.device_ptr(), Timing::off);
  sequence.copy(rows.binding(), {destination.allocation(), static_cast<uint64_t>(first_row) * row_bytes,
                                 rows.nbytes()});
  sequence.run();
}

}  // namespace bitnet::ops
