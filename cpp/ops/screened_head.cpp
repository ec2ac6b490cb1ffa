#include "ops/screened_head.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "ops/bitlinear.hpp"
#include "ops/dispatch.hpp"
#include "ops/sample_passes.hpp"
#include "ops/tuning.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/kernel.hpp"
#include "runtime/sequence.hpp"

namespace bitnet::ops {
namespace {

// 16-value vectors of a row a head_screen lane holds in registers (J): at most this many.
constexpr int64_t kScreenMaxVectors = 32;

// Rows a head_screen subgroup requests at once, and its workgroups a multiprocessor: the fastest
// pair measured for the 2B4T head.
uint32_t screen_rows() { return tuning().screen_rows.value_or(2); }
uint32_t screen_groups() { return tuning().screen_groups.value_or(2); }

// Rows a head_verify workgroup takes (its CHUNK) for rows of x: its candidates go 8 at a time,
// one a team of 32 invocations, so where most rows are candidates (top-p over logits of a small
// spread, a trained model's) many workgroups must share them; several rows' argmax, with few
// candidates each, in larger chunks (fewer workgroups of little work: docs/PERFORMANCE.md).
int64_t verify_chunk(int64_t rows) { return tuning().verify_chunk.value_or(rows > 1 ? 1024 : 128); }
// head_verify's workgroups over a head of v rows.
int64_t verify_workgroups(int64_t v, int64_t rows) {
  return (v + verify_chunk(rows) - 1) / verify_chunk(rows);
}

int64_t screen_vectors(const Device& device, int64_t k) {
  const int64_t width = std::max<uint32_t>(1, device.info().subgroup_size);
  return ((k + 15) / 16 + width - 1) / width;
}

}  // namespace

bool screened_argmax_fits(const Device& device, int64_t k, int64_t rows) {
  // Several rows: a row of workgroups each in the passes after the screening.
  return k > 0 && k % 4 == 0 && rows > 0 &&
         rows <= int64_t{device.limits().maxComputeWorkGroupCount[1]} &&
         screen_vectors(device, k) <= kScreenMaxVectors;
}

namespace {

struct ScreenShape {
  int64_t rows, v, k, padded_k;
};

// The checks screened_argmax and screened_sample share (most_rows: rows of x the op takes).
ScreenShape check_screening(const char* op, const Tensor& x, const Tensor& head,
                            const Tensor& head_q, const Tensor& head_meta, int64_t most_rows) {
  if (x.dtype() != DType::float32)
    throw DTypeError("x: expected float32, got " + std::string(dtype_name(x.dtype())));
  require_float(head, "head");
  if (head_q.dtype() != DType::int8)
    throw DTypeError("head_q: expected int8, got " + std::string(dtype_name(head_q.dtype())));
  if (head_meta.dtype() != DType::float32)
    throw DTypeError("head_meta: expected float32, got " +
                     std::string(dtype_name(head_meta.dtype())));
  if (x.shape().size() != 2 || x.shape()[0] < 1 || x.shape()[0] > most_rows ||
      head.shape().size() != 2 || x.shape()[1] != head.shape()[1])
    throw ShapeError(std::string("expected x ") + (most_rows == 1 ? "[1, K]" : "[M, K], M >= 1,") +
                     " and head [V, K], got x " + shape_text(x.shape()) + " and head " +
                     shape_text(head.shape()));
  const int64_t rows = x.shape()[0], v = head.shape()[0], k = x.shape()[1];
  const int64_t padded_k = (k + 15) / 16 * 16;
  if (v == 0)
    throw ShapeError(std::string(op) + ": the head has no rows (shape " + shape_text(head.shape()) +
                     ")");
  if (head_q.shape() != std::vector<int64_t>{v, padded_k} ||
      head_meta.shape() != std::vector<int64_t>{v, 4})
    throw ShapeError("expected head_q [" + std::to_string(v) + ", " + std::to_string(padded_k) +
                     "] and head_meta [" + std::to_string(v) + ", 4] for head " +
                     shape_text(head.shape()) + ", got " + shape_text(head_q.shape()) + " and " +
                     shape_text(head_meta.shape()));
  for (const Tensor* t : {&head, &head_q, &head_meta})
    if (&t->device() != &x.device())
      throw ArgumentError("x, head, head_q and head_meta must live on one device");
  const auto& device = x.device_ptr();
  if (!screened_argmax_fits(*device, k))
    throw ArgumentError(std::string(op) + " takes K % 4 == 0 and at most " +
                        std::to_string(kScreenMaxVectors *
                                       std::max<uint32_t>(1, device->info().subgroup_size) * 16) +
                        " values a row on this device, got K = " + std::to_string(k));
  if (!screened_argmax_fits(*device, k, rows))
    throw ShapeError(std::string(op) + ": too many rows of x (" + std::to_string(rows) + ")");
  // Indices into several rows' products [2 rows, V] stay within int32.
  if (v > std::numeric_limits<int32_t>::max() / 2 ||
      rows > std::numeric_limits<int32_t>::max() / 2 / v)
    throw ShapeError(std::string(op) + ": too many rows (" + std::to_string(v) + " x " +
                     std::to_string(rows) + ")");
  return {rows, v, k, padded_k};
}

// Head rows a head_brackets workgroup takes.
constexpr int64_t kBracketChunk = 2048;

// head_screen's workgroups: subgroups of about 32 rows each, at most screen_groups() a
// multiprocessor where the count is known.
uint64_t screen_workgroups(const Device& device, int64_t v) {
  const uint32_t subgroups = subgroups_in(device, 256);
  uint64_t groups = (static_cast<uint64_t>(v) + 32 * subgroups - 1) / (32 * subgroups);
  if (const uint32_t multiprocessors = device.info().multiprocessors)
    groups = std::min<uint64_t>(groups, uint64_t{multiprocessors} * screen_groups());
  return std::clamp<uint64_t>(groups, 1, 65535);
}

// Workgroups along x of the first pass that brackets every head row: head_screen's for one row of
// x, head_brackets' chunks for several; each writes one lower end a row of x into lows.
uint64_t bracket_workgroups(const Device& device, int64_t v, int64_t rows) {
  return rows == 1 ? screen_workgroups(device, v)
                   : static_cast<uint64_t>((v + kBracketChunk - 1) / kBracketChunk);
}

// head_screen for rows of k values ("_sample": the screened draw's variant), with the packed dot
// products where the device accelerates them (as BitLinear takes them).
Kernel screen_kernel(const std::shared_ptr<Device>& device, int64_t k, bool sample) {
  const bool hardware =
      device->feature("integer_dot_product") && device->feature("integer_dot_product_accelerated");
  return Kernel::builtin(
      device,
      std::string(hardware ? "head_screen_dot" : "head_screen_int") + (sample ? "_sample" : ""),
      {{0, screen_vectors(*device, k)}, {1, int64_t{screen_rows()}}});
}

// head_verify for a head of `dtype` ("head_verify_sample": the screened draw's variant). A
// candidate row's vectors a lane requests at once: all of them, up to 8 (the sums' order does not
// depend on it).
Kernel verify_kernel(const std::shared_ptr<Device>& device, const char* base, DType dtype,
                     int64_t k, int64_t rows) {
  return Kernel::builtin(
      device, float_variant(base, dtype),
      {{0, std::clamp<int64_t>((k / 4 + 31) / 32, 1, 8)}, {1, verify_chunk(rows)}});
}

// Several rows' first passes: their 16-bit values as two int8 rows each, one int8 matmul of those
// with the head's copy on the device's matmul path (tensor cores where it has them, reading the
// copy once for up to 32 rows of x), then head_brackets over a grid of `groups` x rows, its
// bindings after the products (int32 [2 rows, V]), the head's meta and the rows' stats: `outputs`
// (high and lows; for "head_brackets_sample" with `draw`, lows, params and start: the ends go over
// the products).
void record_row_brackets(Sequence& sequence, const Tensor& x, const Tensor& head_q,
                         const Tensor& head_meta, const ScreenShape& shape, uint64_t groups,
                         const Tensor& products, const std::vector<BufferBinding>& outputs,
                         std::span<const std::byte> push, bool draw) {
  const auto& device = x.device_ptr();
  const int64_t rows = shape.rows;
  Tensor split = Tensor::empty(device, std::vector<int64_t>{2 * rows, shape.padded_k}, DType::int8);
  Tensor stats = Tensor::empty(device, std::vector<int64_t>{rows, 4}, DType::float32);
  {
    Kernel kernel = Kernel::builtin(device, "head_split_rows");
    struct {
      uint32_t k, padded_k;
    } split_push{static_cast<uint32_t>(shape.k), static_cast<uint32_t>(shape.padded_k)};
    BufferBinding bindings[] = {x.binding(), split.binding(), stats.binding()};
    sequence.dispatch(kernel, {static_cast<uint32_t>(rows), 1, 1}, bindings,
                      push_bytes(split_push));
  }
  record_int8_products(sequence, split, head_q, products);
  sequence.name_last_op("head_screen_matmul");
  Kernel kernel = Kernel::builtin(device, draw ? "head_brackets_sample" : "head_brackets_argmax",
                                  {{0, kBracketChunk}});
  std::vector<BufferBinding> bindings{products.binding(), head_meta.binding(), stats.binding()};
  bindings.insert(bindings.end(), outputs.begin(), outputs.end());
  sequence.dispatch(kernel, {static_cast<uint32_t>(groups), static_cast<uint32_t>(rows), 1},
                    bindings, push);
}

}  // namespace

Tensor screened_argmax(const Tensor& x, const Tensor& head, const Tensor& head_q,
                       const Tensor& head_meta, const std::optional<Tensor>& given,
                       const std::optional<Tensor>& given_high) {
  const ScreenShape shape = check_screening("screened_argmax", x, head, head_q, head_meta,
                                            std::numeric_limits<int32_t>::max());
  const auto [rows, v, k, padded_k] = shape;
  const auto& device = x.device_ptr();
  Tensor out = output(device, given, {rows}, DType::int32, "out", {&x, &head, &head_q, &head_meta});
  const uint64_t groups = bracket_workgroups(*device, v, rows);
  const int64_t chunks = verify_workgroups(v, rows);
  // The brackets' high ends: for several rows without `high` given, over the int8 matmul's
  // products (row 2m: 4 bytes a head row and row of x fewer in every graph a server keeps).
  std::optional<Tensor> high_out;
  if (given_high || rows == 1)
    high_out = output(device, given_high,
                      rows == 1 ? std::vector<int64_t>{v} : std::vector<int64_t>{rows, v},
                      DType::float32, "high", {&x, &head, &head_q, &head_meta, &out});
  Tensor lows = Tensor::empty(device, std::vector<int64_t>{rows, static_cast<int64_t>(groups)},
                              DType::float32);
  Tensor partial = Tensor::empty(device, std::vector<int64_t>{rows, chunks, 2}, DType::uint32);
  const auto grid = checked_grid(*device, {static_cast<uint64_t>(chunks), uint64_t(rows), 1},
                                 "screened_argmax over " + shape_text(head.shape()));
  Recorder op(device);
  // The last verifying workgroup of each row resets its counter.
  Tensor counter = self_resetting_counters(op.sequence(), rows);
  BufferBinding high;
  uint32_t high_stride = static_cast<uint32_t>(v);
  if (rows == 1) {
    Kernel kernel = screen_kernel(device, k, false);
    struct {
      uint32_t v, k, vectors;
    } push{static_cast<uint32_t>(v), static_cast<uint32_t>(k),
           static_cast<uint32_t>(padded_k / 16)};
    high = high_out->binding();
    BufferBinding bindings[] = {x.binding(), head_q.binding(), head_meta.binding(), high,
                                lows.binding()};
    op.sequence().dispatch(kernel, {static_cast<uint32_t>(groups), 1, 1}, bindings,
                           push_bytes(push));
  } else {
    const Tensor products = Tensor::empty(device, std::vector<int64_t>{2 * rows, v}, DType::int32);
    high = high_out ? high_out->binding() : products.binding();
    high_stride = static_cast<uint32_t>(high_out ? v : 2 * v);
    struct {
      uint32_t v, high_stride;
    } push{static_cast<uint32_t>(v), high_stride};
    record_row_brackets(op.sequence(), x, head_q, head_meta, shape, groups, products,
                        {high, lows.binding()}, push_bytes(push), false);
  }
  {
    Kernel kernel = verify_kernel(device, "head_verify", head.dtype(), k, rows);
    struct {
      uint32_t v, k, lows, high_stride;
    } push{static_cast<uint32_t>(v), static_cast<uint32_t>(k), static_cast<uint32_t>(groups),
           high_stride};
    BufferBinding bindings[] = {x.binding(),       head.binding(),    high,         lows.binding(),
                                partial.binding(), counter.binding(), out.binding()};
    op.sequence().dispatch(kernel, grid, bindings, push_bytes(push));
  }
  op.run();
  return out;
}

Tensor screened_sample(const Tensor& x, const Tensor& head, const Tensor& head_q,
                       const Tensor& head_meta, const Tensor& params, const Tensor& start,
                       int64_t offset, const std::optional<Tensor>& given,
                       const std::optional<Tensor>& given_exact, bool top_p) {
  const ScreenShape shape = check_screening("screened_sample", x, head, head_q, head_meta,
                                            std::numeric_limits<int32_t>::max());
  const auto [rows, v, k, padded_k] = shape;
  check_sampling(params, start, offset, rows, x);
  const auto& device = x.device_ptr();
  check_top_p(*device, top_p);
  Tensor out = output(device, given, {rows}, DType::int32, "out",
                      {&x, &head, &head_q, &head_meta, &params, &start});
  const uint64_t groups = bracket_workgroups(*device, v, rows);
  const int64_t chunks = verify_workgroups(v, rows);
  const auto grid = checked_grid(*device, {static_cast<uint64_t>(chunks), uint64_t(rows), 1},
                                 "screened_sample over " + shape_text(head.shape()));
  // The largest lower draw_score, and lower end, of each screening workgroup.
  Tensor lows = Tensor::empty(device, std::vector<int64_t>{2, rows, static_cast<int64_t>(groups)},
                              DType::float32);
  std::optional<Tensor> exact_out;
  if (given_exact || rows == 1)
    exact_out = output(
        device, given_exact, rows == 1 ? std::vector<int64_t>{v} : std::vector<int64_t>{rows, v},
        DType::float32, "exact", {&x, &head, &head_q, &head_meta, &params, &start, &out});
  const auto [params_stride, start_stride] = sampling_strides(params, start);
  Recorder op(device);
  const SampleScratch scratch = sample_scratch(op.sequence(), rows, v, true, top_p);
  // Each row's bracket ends and the candidates' exact logits (-inf for every other head row): for
  // one row, tensors of their own; for several, the rows of the int8 matmul's products, which
  // head_brackets overwrites with each pair's ends (row 2m the low ends, 2m + 1 the high ends) and
  // head_verify the low ends with the exact logits (the select passes have read them by then):
  // 8 bytes a head row and row of x instead of 20 in the graphs a server keeps for every batch.
  BufferBinding high, low, exact;
  uint32_t high_at = 0, ends_stride = static_cast<uint32_t>(v);
  if (rows == 1) {
    Tensor high_row = Tensor::empty(device, std::vector<int64_t>{1, v}, DType::float32);
    Tensor low_row = Tensor::empty(device, std::vector<int64_t>{1, v}, DType::float32);
    Kernel kernel = screen_kernel(device, k, true);
    struct {
      uint32_t v, k, vectors, offset, params_stride;
    } push{static_cast<uint32_t>(v), static_cast<uint32_t>(k), static_cast<uint32_t>(padded_k / 16),
           static_cast<uint32_t>(offset), params_stride};
    BufferBinding bindings[] = {x.binding(),        head_q.binding(), head_meta.binding(),
                                high_row.binding(), lows.binding(),   low_row.binding(),
                                params.binding(),   start.binding()};
    op.sequence().dispatch(kernel, {static_cast<uint32_t>(groups), 1, 1}, bindings,
                           push_bytes(push));
    high = high_row.binding();
    low = low_row.binding();
  } else {
    struct {
      uint32_t v, offset, start_stride, params_stride;
    } push{static_cast<uint32_t>(v), static_cast<uint32_t>(offset), start_stride, params_stride};
    const Tensor products = Tensor::empty(device, std::vector<int64_t>{2 * rows, v}, DType::int32);
    record_row_brackets(op.sequence(), x, head_q, head_meta, shape, groups, products,
                        {lows.binding(), params.binding(), start.binding()}, push_bytes(push),
                        true);
    high = low = products.binding();
    high_at = static_cast<uint32_t>(v);
    ends_stride = static_cast<uint32_t>(2 * v);
  }
  exact = exact_out ? exact_out->binding() : low;
  const uint32_t exact_stride = exact_out ? static_cast<uint32_t>(v) : ends_stride;
  // Each row's top_k-th largest lower end (its passes do nothing for a row without top_k).
  record_sample(op.sequence(), device, scratch, low, out.binding(), params, start, v, offset, 0,
                static_cast<uint64_t>(rows), 0, 2, false, ends_stride);
  {
    Kernel kernel = verify_kernel(device, "head_verify_sample", head.dtype(), k, rows);
    struct {
      uint32_t v, k, lows, offset, start_stride, params_stride, high_at, high_stride, exact_stride;
    } push{static_cast<uint32_t>(v),
           static_cast<uint32_t>(k),
           static_cast<uint32_t>(groups),
           static_cast<uint32_t>(offset),
           start_stride,
           params_stride,
           high_at,
           ends_stride,
           exact_stride};
    BufferBinding bindings[] = {
        x.binding(),      head.binding(),  high, lows.binding(), scratch.select.binding(),
        params.binding(), start.binding(), exact};
    op.sequence().dispatch(kernel, grid, bindings, push_bytes(push));
  }
  record_sample(op.sequence(), device, scratch, exact, out.binding(), params, start, v, offset, 0,
                static_cast<uint64_t>(rows), 0, 3, top_p, exact_stride);
  op.run([nans = scratch.nans] { raise_if_nan_logits(nans); });
  return out;
}

}  // namespace bitnet::ops
