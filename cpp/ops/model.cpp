#include "ops/model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/dispatch.hpp"
#include "ops/tuning.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/kernel.hpp"
#include "runtime/sequence.hpp"

namespace bitnet::ops {
namespace {

// Vectors of a weight row a linear_rows lane requests at once: two keep enough loads in flight
// without the registers that more would take.
uint32_t head_in_flight() { return tuning().head_in_flight.value_or(2); }

}  // namespace

Tensor embedding(const Tensor& table, const Tensor& ids, const std::optional<Tensor>& given) {
  require_float(table, "table");
  if (ids.dtype() != DType::int32)
    throw DTypeError("ids: expected int32, got " + std::string(dtype_name(ids.dtype())));
  if (table.shape().size() != 2 || ids.shape().size() != 1)
    throw ShapeError("expected table [V, H] and ids [T], got table " + shape_text(table.shape()) +
                     " and ids " + shape_text(ids.shape()));
  if (&table.device() != &ids.device())
    throw ArgumentError("table and ids must live on one device");
  const int64_t t = ids.shape()[0], v = table.shape()[0], h = table.shape()[1];
  const auto& device = table.device_ptr();
  Tensor out = output(device, given, {t, h}, DType::float32, "out", {&table, &ids});
  if (out.size() == 0) return out;
  Recorder op(device);
  Tensor invalid = zeroed_counter(device);
  Kernel kernel = Kernel::builtin(device, float_variant("embedding", table.dtype()));
  struct {
    uint32_t t, h, v;
  } push{static_cast<uint32_t>(t), static_cast<uint32_t>(h), static_cast<uint32_t>(v)};
  BufferBinding bindings[] = {table.binding(), ids.binding(), out.binding(), invalid.binding()};
  op.sequence().dispatch(kernel, {workgroups(*device, out.size()), 1, 1}, bindings,
                         push_bytes(push));
  op.run([invalid, v] {
    if (uint32_t found = read_counter(invalid))
      throw ArgumentError("ids: " + std::to_string(found) + " token id" +
                          (found == 1 ? " is" : "s are") + " outside [0, " + std::to_string(v) +
                          ")");
  });
  return out;
}

Tensor linear_rows(const Tensor& x, const Tensor& w, const std::optional<Tensor>& given) {
  require_float(w, "w");
  if (x.dtype() != DType::float32)
    throw DTypeError("x: expected float32, got " + std::string(dtype_name(x.dtype())));
  if (x.shape().size() != 2 || w.shape().size() != 2 || x.shape()[1] != w.shape()[1])
    throw ShapeError("expected x [M, K] and w [N, K], got x " + shape_text(x.shape()) + " and w " +
                     shape_text(w.shape()));
  if (&x.device() != &w.device()) throw ArgumentError("x and w must live on one device");
  const int64_t m = x.shape()[0], k = x.shape()[1], n = w.shape()[0];
  const auto& device = x.device_ptr();
  Tensor out = output(device, given, {m, n}, DType::float32, "out", {&x, &w});
  if (out.size() == 0) return out;
  Recorder op(device);
  if (k == 0) {
    op.sequence().fill(out.binding(), 0);
    op.run();
    return out;
  }
  Kernel kernel = Kernel::builtin(device, float_variant("linear_rows", w.dtype()),
                                  {{0, k % 4 == 0}, {1, int64_t{head_in_flight()}}});
  struct {
    uint32_t m, n, k;
  } push{static_cast<uint32_t>(m), static_cast<uint32_t>(n), static_cast<uint32_t>(k)};
  BufferBinding bindings[] = {x.binding(), x.binding(), w.binding(), w.binding(), out.binding()};
  const auto grid = checked_grid(
      *device, {(static_cast<uint64_t>(n) + 7) / 8, (static_cast<uint64_t>(m) + 3) / 4, 1},
      "linear_rows of " + shape_text(out.shape()));
  op.sequence().dispatch(kernel, grid, bindings, push_bytes(push));
  op.run();
  return out;
}

Tensor argmax_rows(const Tensor& x, const std::optional<Tensor>& given) {
  if (x.dtype() != DType::float32)
    throw DTypeError("x: expected float32, got " + std::string(dtype_name(x.dtype())));
  if (x.shape().size() != 2) throw ShapeError("x: expected [M, N], got " + shape_text(x.shape()));
  const int64_t m = x.shape()[0], n = x.shape()[1];
  if (n == 0) throw ShapeError("argmax of empty rows: x has shape " + shape_text(x.shape()));
  const auto& device = x.device_ptr();
  Tensor out = output(device, given, {m}, DType::int32, "out", {&x});
  if (m == 0) return out;
  constexpr int64_t kChunk = 1024;  // CHUNK in shaders/model/argmax.comp
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  Tensor partial = Tensor::empty(device, std::vector<int64_t>{m, chunks, 2}, DType::uint32);
  struct {
    uint32_t m, n, chunks;
  } push{static_cast<uint32_t>(m), static_cast<uint32_t>(n), static_cast<uint32_t>(chunks)};
  BufferBinding bindings[] = {x.binding(), partial.binding(), out.binding()};
  const auto grid =
      checked_grid(*device, {static_cast<uint64_t>(chunks), static_cast<uint64_t>(m), 1},
                   "argmax over " + shape_text(x.shape()));
  Recorder op(device);
  for (int64_t phase : {0, 1}) {
    Kernel kernel = Kernel::builtin(device, "argmax", {{0, phase}});
    op.sequence().dispatch(kernel, {phase == 0 ? grid[0] : 1u, grid[1], 1}, bindings,
                           push_bytes(push));
  }
  op.run();
  return out;
}

}  // namespace bitnet::ops
