#include "ops/model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/attention.hpp"
#include "ops/dispatch.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/kernel.hpp"
#include "runtime/sequence.hpp"

namespace bitnet::ops {

namespace {

// Keys a decode_attention workgroup takes (SPLIT in shaders/model/decode_attention.comp): the
// caller's 16, 32 or 64 (0: 32), or BITNET_GPU_DECODE_SPLIT for tuning; 32 where G * SPLIT would
// pass 256.
int64_t decode_split_keys(int64_t heads_per_kv, int64_t requested) {
  if (requested != 0 && requested != 16 && requested != 32 && requested != 64)
    throw ArgumentError("split_keys: expected 16, 32 or 64 (or 0), got " + std::to_string(requested));
  const int64_t split =
      environment_choice("BITNET_GPU_DECODE_SPLIT", {16, 32, 64}).value_or(requested != 0 ? requested : 32);
  return heads_per_kv * split <= 256 ? split : 32;
}

// Vectors of a weight row a linear_rows lane requests at once: 2, or BITNET_GPU_HEAD_IN_FLIGHT
// (1 to 8). Measured on the H100, the 2B4T float16 head (128256 x 2560): 261 us with 1, 236 with
// 2, 244 with 4, 276 with 8.
uint32_t head_in_flight() { return tuning_value("BITNET_GPU_HEAD_IN_FLIGHT", 2, 8); }

}  // namespace

Tensor embedding(const Tensor& table, const Tensor& ids, const std::optional<Tensor>& given) {
  require_float(table, "table");
  if (ids.dtype() != DType::int32)
    throw DTypeError("ids: expected int32, got " + std::string(dtype_name(ids.dtype())));
  if (table.shape().size() != 2 || ids.shape().size() != 1)
    throw ShapeError("expected table [V, H] and ids [T], got table " + shape_text(table.shape()) +
                     " and ids " + shape_text(ids.shape()));
  if (&table.device() != &ids.device()) throw ArgumentError("table and ids must live on one device");
  const int64_t t = ids.shape()[0], v = table.shape()[0], h = table.shape()[1];
  const auto& device = table.device_ptr();
  Tensor out = output(device, given, {t, h}, DType::float32, "out", {&table, &ids});
  if (out.size() == 0) return out;
  OpSequence op(device);
  Tensor invalid = zeroed_counter(device);
  Kernel kernel = Kernel::builtin(device, float_variant("embedding", table.dtype()));
  struct {
    uint32_t t, h, v;
  } push{static_cast<uint32_t>(t), static_cast<uint32_t>(h), static_cast<uint32_t>(v)};
  BufferBinding bindings[] = {table.binding(), ids.binding(), out.binding(), invalid.binding()};
  op.sequence().dispatch(kernel, {workgroups(*device, out.size()), 1, 1}, bindings, push_bytes(push));
  op.run([invalid, v] {
    if (uint32_t found = read_counter(invalid))
      throw ArgumentError("ids: " + std::to_string(found) + " token id" + (found == 1 ? " is" : "s are") +
                          " outside [0, " + std::to_string(v) + ")");
  });
  return out;
}

Tensor linear_rows(const Tensor& x, const Tensor& w, const std::optional<Tensor>& given) {
  require_float(w, "w");
  if (x.dtype() != DType::float32) throw DTypeError("x: expected float32, got " + std::string(dtype_name(x.dtype())));
  if (x.shape().size() != 2 || w.shape().size() != 2 || x.shape()[1] != w.shape()[1])
    throw ShapeError("expected x [M, K] and w [N, K], got x " + shape_text(x.shape()) + " and w " +
                     shape_text(w.shape()));
  if (&x.device() != &w.device()) throw ArgumentError("x and w must live on one device");
  const int64_t m = x.shape()[0], k = x.shape()[1], n = w.shape()[0];
  const auto& device = x.device_ptr();
  Tensor out = output(device, given, {m, n}, DType::float32, "out", {&x, &w});
  if (out.size() == 0) return out;
  OpSequence op(device);
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
  const auto grid = checked_grid(*device, {(static_cast<uint64_t>(n) + 7) / 8, (static_cast<uint64_t>(m) + 3) / 4, 1},
                                 "linear_rows of " + shape_text(out.shape()));
  op.sequence().dispatch(kernel, grid, bindings, push_bytes(push));
  op.run();
  return out;
}

Tensor argmax_rows(const Tensor& x, const std::optional<Tensor>& given) {
  if (x.dtype() != DType::float32) throw DTypeError("x: expected float32, got " + std::string(dtype_name(x.dtype())));
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
  const auto grid = checked_grid(*device, {static_cast<uint64_t>(chunks), static_cast<uint64_t>(m), 1},
                                 "argmax over " + shape_text(x.shape()));
  OpSequence op(device);
  for (int64_t phase : {0, 1}) {
    Kernel kernel = Kernel::builtin(device, "argmax", {{0, phase}});
    op.sequence().dispatch(kernel, {phase == 0 ? grid[0] : 1u, grid[1], 1}, bindings, push_bytes(push));
  }
  op.run();
  return out;
}

namespace {

// 16-value vectors of a row a head_screen lane holds in registers (J): at most this many.
constexpr int64_t kScreenMaxVectors = 32;

// Rows a head_screen subgroup requests at once, or BITNET_GPU_SCREEN_ROWS (1 to 4), and its
// workgroups a multiprocessor, or BITNET_GPU_SCREEN_GROUPS (1 to 16). Measured on the H100, the
// 2B4T head (128256 x 2560), kernel alone (benchmarks/bench_head.py, 2026-11-23): 1, 2 and 4 rows
// with 4 workgroups 127.6, 127.8-129.4 and 126.9-127.7 us; 2 rows with 2 workgroups 124.5-124.7,
// with 1 130.2-131.2. Requesting the next rows before multiplying the current ones (and the
// first before h is read) gave 124.0-125.0 us with 1 row and 2 workgroups, 131.8-139.4 with 2.
uint32_t screen_rows() { return tuning_value("BITNET_GPU_SCREEN_ROWS", 2, 4); }
uint32_t screen_groups() { return tuning_value("BITNET_GPU_SCREEN_GROUPS", 2, 16); }

// Rows a head_verify workgroup takes (its CHUNK), or BITNET_GPU_VERIFY_CHUNK (1 to 1024): its
// candidates go 8 at a time, one a team of 32 invocations, so where most rows are candidates (top-p
// over logits of a small spread, a trained model's) many workgroups must share them.
int64_t verify_chunk() { return tuning_value("BITNET_GPU_VERIFY_CHUNK", 128, 1024); }
// head_verify's workgroups over a head of v rows.
int64_t verify_workgroups(int64_t v) { return (v + verify_chunk() - 1) / verify_chunk(); }

// uint32 counters in device memory for kernels whose last workgroup resets its counter for the
// next run (or graph replay): zeroed once, here, through the mapping where the memory is mapped
// (a submission of its own otherwise): recording a 2B4T decode step makes 31 of them, and took
// 6.8 ms with a submission and a wait each against 5.8 ms so on the H100 (bench_record.py).
Tensor self_resetting_counters(const std::shared_ptr<Device>& device, int64_t count) {
  Tensor counters = Tensor::empty(device, std::vector<int64_t>{count}, DType::uint32);
  const std::vector<uint32_t> zeros(static_cast<size_t>(count), 0u);
  counters.upload(zeros.data(), counters.nbytes());
  return counters;
}

int64_t screen_vectors(const Device& device, int64_t k) {
  const int64_t width = std::max<uint32_t>(1, device.info().subgroup_size);
  return ((k + 15) / 16 + width - 1) / width;
}

}  // namespace

bool screened_argmax_fits(const Device& device, int64_t k) {
  return k > 0 && k % 4 == 0 && screen_vectors(device, k) <= kScreenMaxVectors;
}

namespace {

struct ScreenShape {
  int64_t v, k, padded_k;
};

// The checks screened_argmax and screened_sample share.
ScreenShape check_screening(const char* op, const Tensor& x, const Tensor& head, const Tensor& head_q,
                            const Tensor& head_meta) {
  if (x.dtype() != DType::float32) throw DTypeError("x: expected float32, got " + std::string(dtype_name(x.dtype())));
  require_float(head, "head");
  if (head_q.dtype() != DType::int8)
    throw DTypeError("head_q: expected int8, got " + std::string(dtype_name(head_q.dtype())));
  if (head_meta.dtype() != DType::float32)
    throw DTypeError("head_meta: expected float32, got " + std::string(dtype_name(head_meta.dtype())));
  if (x.shape().size() != 2 || x.shape()[0] != 1 || head.shape().size() != 2 || x.shape()[1] != head.shape()[1])
    throw ShapeError("expected x [1, K] and head [V, K], got x " + shape_text(x.shape()) + " and head " +
                     shape_text(head.shape()));
  const int64_t v = head.shape()[0], k = x.shape()[1], padded_k = (k + 15) / 16 * 16;
  if (v == 0) throw ShapeError(std::string(op) + ": the head has no rows (shape " + shape_text(head.shape()) + ")");
  if (head_q.shape() != std::vector<int64_t>{v, padded_k} || head_meta.shape() != std::vector<int64_t>{v, 4})
    throw ShapeError("expected head_q [" + std::to_string(v) + ", " + std::to_string(padded_k) + "] and head_meta [" +
                     std::to_string(v) + ", 4] for head " + shape_text(head.shape()) + ", got " +
                     shape_text(head_q.shape()) + " and " + shape_text(head_meta.shape()));
  for (const Tensor* t : {&head, &head_q, &head_meta})
    if (&t->device() != &x.device()) throw ArgumentError("x, head, head_q and head_meta must live on one device");
  const auto& device = x.device_ptr();
  if (!screened_argmax_fits(*device, k))
    throw ArgumentError(std::string(op) + " takes K % 4 == 0 and at most " +
                        std::to_string(kScreenMaxVectors * std::max<uint32_t>(1, device->info().subgroup_size) * 16) +
                        " values a row on this device, got K = " + std::to_string(k));
  if (v > std::numeric_limits<int32_t>::max() / 2)
    throw ShapeError(std::string(op) + ": too many rows (" + std::to_string(v) + ")");
  return {v, k, padded_k};
}

// head_screen's workgroups: subgroups of about 32 rows each, at most screen_groups() a
// multiprocessor where the count is known.
uint64_t screen_workgroups(const Device& device, int64_t v) {
  const uint32_t subgroups = subgroups_in(device, 256);
  uint64_t groups = (static_cast<uint64_t>(v) + 32 * subgroups - 1) / (32 * subgroups);
  if (const uint32_t multiprocessors = device.info().multiprocessors)
    groups = std::min<uint64_t>(groups, uint64_t{multiprocessors} * screen_groups());
  return std::clamp<uint64_t>(groups, 1, 65535);
}

// head_screen for rows of k values ("_sample": the screened draw's variant), with the packed dot
// products where the device accelerates them (as BitLinear takes them).
Kernel screen_kernel(const std::shared_ptr<Device>& device, int64_t k, bool sample) {
  const bool hardware = device->feature("integer_dot_product") && device->feature("integer_dot_product_accelerated");
  return Kernel::builtin(device, std::string(hardware ? "head_screen_dot" : "head_screen_int") + (sample ? "_sample" : ""),
                         {{0, screen_vectors(*device, k)}, {1, int64_t{screen_rows()}}});
}

// head_verify for a head of `dtype` ("head_verify_sample": the screened draw's variant). A
// candidate row's vectors a lane requests at once: all of them, up to 8 (the sums' order does not
// depend on it).
Kernel verify_kernel(const std::shared_ptr<Device>& device, const char* base, DType dtype, int64_t k) {
  return Kernel::builtin(device, float_variant(base, dtype),
                         {{0, std::clamp<int64_t>((k / 4 + 31) / 32, 1, 8)}, {1, verify_chunk()}});
}

}  // namespace

Tensor screened_argmax(const Tensor& x, const Tensor& head, const Tensor& head_q, const Tensor& head_meta,
                       const std::optional<Tensor>& given, const std::optional<Tensor>& given_high) {
  const auto [v, k, padded_k] = check_screening("screened_argmax", x, head, head_q, head_meta);
  const auto& device = x.device_ptr();
  Tensor out = output(device, given, {1}, DType::int32, "out", {&x, &head, &head_q, &head_meta});
  const uint64_t groups = screen_workgroups(*device, v);
  const int64_t chunks = verify_workgroups(v);
  Tensor high = output(device, given_high, {v}, DType::float32, "high", {&x, &head, &head_q, &head_meta, &out});
  Tensor lows = Tensor::empty(device, std::vector<int64_t>{static_cast<int64_t>(groups)}, DType::float32);
  Tensor partial = Tensor::empty(device, std::vector<int64_t>{chunks, 2}, DType::uint32);
  // The last verifying workgroup resets the counter.
  Tensor counter = self_resetting_counters(device, 1);
  OpSequence op(device);
  {
    Kernel kernel = screen_kernel(device, k, false);
    struct {
      uint32_t v, k, vectors;
    } push{static_cast<uint32_t>(v), static_cast<uint32_t>(k), static_cast<uint32_t>(padded_k / 16)};
    BufferBinding bindings[] = {x.binding(), head_q.binding(), head_meta.binding(), high.binding(), lows.binding()};
    op.sequence().dispatch(kernel, {static_cast<uint32_t>(groups), 1, 1}, bindings, push_bytes(push));
  }
  {
    Kernel kernel = verify_kernel(device, "head_verify", head.dtype(), k);
    struct {
      uint32_t v, k, lows;
    } push{static_cast<uint32_t>(v), static_cast<uint32_t>(k), static_cast<uint32_t>(groups)};
    BufferBinding bindings[] = {x.binding(),       head.binding(),    high.binding(), lows.binding(),
                                partial.binding(), counter.binding(), out.binding()};
    const auto grid = checked_grid(*device, {static_cast<uint64_t>(chunks), 1, 1}, "screened_argmax over " + shape_text(head.shape()));
    op.sequence().dispatch(kernel, grid, bindings, push_bytes(push));
  }
  op.run();
  return out;
}

namespace {

// CHUNK, BINS and TICKETS in shaders/model/sample_rows.comp and sample_nucleus.comp
constexpr int64_t kSampleChunk = 1024, kSampleBins = 2048, kSampleTickets = 8;

// A draw's scratch for up to `rows` rows of n values at once (sample_rows.comp's bindings 3 to 7
// and 9, sample_nucleus.comp's 2 to 6): the bins, masses, tickets and the nucleus's largest key
// reset themselves, so blocks of rows, and draws one after another, reuse it.
struct SampleScratch {
  Tensor bins, tickets, select, partial, nans, masses, nucleus;
  uint32_t chunks;
};

// selects: the top-k select or nucleus passes run (else their bins are not read, and each row's
// select state says "every value kept"); nucleus: the nucleus passes run.
SampleScratch sample_scratch(const std::shared_ptr<Device>& device, int64_t rows, int64_t n, bool selects,
                             bool nucleus) {
  const int64_t chunks = (n + kSampleChunk - 1) / kSampleChunk;
  Tensor select = Tensor::empty(device, std::vector<int64_t>{rows, 4}, DType::uint32);
  if (!selects) {
    std::vector<uint32_t> every_value_kept(static_cast<size_t>(rows) * 4, 0u);  // (prefix, wanted, all, -)
    for (size_t r = 0; r < static_cast<size_t>(rows); ++r) every_value_kept[4 * r + 2] = 1u;
    select.upload(every_value_kept.data(), select.nbytes());
  }
  return {self_resetting_counters(device, selects ? rows * kSampleBins : 1),
          self_resetting_counters(device, rows * kSampleTickets),
          select,
          Tensor::empty(device, std::vector<int64_t>{rows, chunks, 2}, DType::uint32),
          zeroed_counter(device),
          self_resetting_counters(device, nucleus ? rows * kSampleBins * 2 : 2),  // uint64 each
          self_resetting_counters(device, rows * 8),
          static_cast<uint32_t>(chunks)};
}

// Records sample_rows.comp's phases first_phase .. last_phase (0-2: the top_k select, 3: the draw)
// over `rows` rows of n values (logits and out bound at their first row, row0 their index in the
// whole array), with sample_nucleus.comp's four passes before the draw where nucleus (top-p).
void record_sample(Sequence& sequence, const std::shared_ptr<Device>& device, const SampleScratch& scratch,
                   const BufferBinding& logits, const BufferBinding& out, const Tensor& params, const Tensor& start,
                   int64_t n, int64_t offset, uint64_t row0, uint64_t rows, int64_t first_phase, int64_t last_phase,
                   bool nucleus = false) {
  struct {
    uint32_t n, chunks, offset, row0;
  } push{static_cast<uint32_t>(n), scratch.chunks, static_cast<uint32_t>(offset), static_cast<uint32_t>(row0)};
  BufferBinding bindings[] = {logits,
                              params.binding(),
                              start.binding(),
                              scratch.bins.binding(),
                              scratch.select.binding(),
                              scratch.tickets.binding(),
                              scratch.partial.binding(),
                              scratch.nans.binding(),
                              out,
                              scratch.nucleus.binding()};
  const std::array<uint32_t, 3> grid{scratch.chunks, static_cast<uint32_t>(rows), 1};
  for (int64_t phase = first_phase; phase <= last_phase; ++phase) {
    if (phase == 3 && nucleus) {
      struct {
        uint32_t n, chunks;
      } nucleus_push{static_cast<uint32_t>(n), scratch.chunks};
      BufferBinding nucleus_bindings[] = {logits,
                                          params.binding(),
                                          scratch.bins.binding(),
                                          scratch.select.binding(),
                                          scratch.tickets.binding(),
                                          scratch.masses.binding(),
                                          scratch.nucleus.binding()};
      for (int64_t pass = 0; pass < 4; ++pass) {
        Kernel kernel = Kernel::builtin(device, "sample_nucleus", {{0, pass}});
        sequence.dispatch(kernel, grid, nucleus_bindings, push_bytes(nucleus_push));
      }
    }
    Kernel kernel = Kernel::builtin(device, "sample_rows", {{0, phase}});
    sequence.dispatch(kernel, grid, bindings, push_bytes(push));
  }
}

// The checks sample_rows and screened_sample share.
void check_sampling(const Tensor& params, const Tensor& start, int64_t offset, const Tensor& on) {
  if (params.dtype() != DType::uint32 || params.shape() != std::vector<int64_t>{6})
    throw DTypeError("params: expected uint32 [6], got " + std::string(dtype_name(params.dtype())) + " " +
                     shape_text(params.shape()));
  if (start.dtype() != DType::int32 || start.size() != 1)
    throw DTypeError("start: expected one int32 value, got " + std::string(dtype_name(start.dtype())) + " " +
                     shape_text(start.shape()));
  if (&params.device() != &on.device() || &start.device() != &on.device())
    throw ArgumentError("params and start must live on the logits' device");
  if (offset < 0 || offset > std::numeric_limits<uint32_t>::max())
    throw ArgumentError("offset: expected an integer in [0, 2^32), got " + std::to_string(offset));
}

void check_top_p(const Device& device, bool top_p) {
  if (top_p && !device.feature("int64_atomics"))
    throw UnsupportedError("top-p sampling needs 64-bit integer atomics (shaderInt64 and shaderBufferInt64Atomics), "
                           "which device '" + device.info().name + "' lacks");
}

void raise_if_nan_logits(const Tensor& nans) {
  if (uint32_t found = read_counter(nans))
    throw ArgumentError("logits contain " + std::to_string(found) + " NaN value" + (found == 1 ? "" : "s") +
                        ": nothing to draw from (the rows holding them got index -1)");
}

}  // namespace

Tensor sample_rows(const Tensor& logits, const Tensor& params, const Tensor& start, int64_t offset,
                   const std::optional<Tensor>& given, bool top_p, bool top_k) {
  if (logits.dtype() != DType::float32)
    throw DTypeError("logits: expected float32, got " + std::string(dtype_name(logits.dtype())));
  if (logits.shape().size() != 2) throw ShapeError("logits: expected [M, N], got " + shape_text(logits.shape()));
  check_sampling(params, start, offset, logits);
  const int64_t m = logits.shape()[0], n = logits.shape()[1];
  if (n == 0) throw ShapeError("sampling from empty rows: logits have shape " + shape_text(logits.shape()));
  if (n > std::numeric_limits<int32_t>::max())
    throw ShapeError("sample_rows: rows of " + std::to_string(n) + " values are over 2^31 - 1");
  const auto& device = logits.device_ptr();
  check_top_p(*device, top_p);
  Tensor out = output(device, given, {m}, DType::int32, "out", {&logits, &params, &start});
  if (m == 0) return out;
  // Rows a block of dispatches takes: 64 where the select passes run (each row's bins are 8 KiB),
  // else as many multiples of 64 as a dispatch's grid holds (the draw alone, one dispatch for up to
  // 65472 rows). Multiples of 64 rows start at multiples of 256 bytes, which every Vulkan device
  // takes as a storage buffer offset.
  const bool selects = top_k || top_p;
  const uint64_t block_limit =
      selects ? 64 : std::max<uint64_t>(64, std::min<uint64_t>(65535, device->info().max_workgroup_count[1]) / 64 * 64);
  std::vector<RowRange> blocks;
  for (const RowRange& range : row_ranges(*device, static_cast<uint64_t>(m), {static_cast<uint64_t>(n) * 4, 4}))
    for (uint64_t first = 0; first < range.count; first += block_limit)
      blocks.push_back({range.first + first, std::min(block_limit, range.count - first)});
  const int64_t block_rows = static_cast<int64_t>(std::min<uint64_t>(block_limit, static_cast<uint64_t>(m)));
  checked_grid(*device, {static_cast<uint64_t>((n + kSampleChunk - 1) / kSampleChunk), static_cast<uint64_t>(block_rows), 1},
               "sample_rows over " + shape_text(logits.shape()));
  const SampleScratch scratch = sample_scratch(device, block_rows, n, selects, top_p);
  OpSequence op(device);
  for (const RowRange& block : blocks)
    record_sample(op.sequence(), device, scratch, rows_of(logits, block, static_cast<uint64_t>(n) * 4),
                  rows_of(out, block, 4), params, start, n, offset, block.first, block.count, top_k ? 0 : 3, 3, top_p);
  op.run([nans = scratch.nans] { raise_if_nan_logits(nans); });
  return out;
}

Tensor screened_sample(const Tensor& x, const Tensor& head, const Tensor& head_q, const Tensor& head_meta,
                       const Tensor& params, const Tensor& start, int64_t offset, const std::optional<Tensor>& given,
                       const std::optional<Tensor>& given_exact, bool top_p) {
  const auto [v, k, padded_k] = check_screening("screened_sample", x, head, head_q, head_meta);
  check_sampling(params, start, offset, x);
  const auto& device = x.device_ptr();
  check_top_p(*device, top_p);
  Tensor out = output(device, given, {1}, DType::int32, "out", {&x, &head, &head_q, &head_meta, &params, &start});
  const uint64_t groups = screen_workgroups(*device, v);
  const int64_t chunks = verify_workgroups(v);
  checked_grid(*device, {static_cast<uint64_t>(chunks), 1, 1}, "screened_sample over " + shape_text(head.shape()));
  // Each row's bracket ends; the largest lower draw_score, and lower end, of each screening
  // workgroup; the candidates' exact logits with -inf for every other row; the draw's scratch.
  Tensor high = Tensor::empty(device, std::vector<int64_t>{v}, DType::float32);
  Tensor low = Tensor::empty(device, std::vector<int64_t>{1, v}, DType::float32);
  Tensor lows = Tensor::empty(device, std::vector<int64_t>{2, static_cast<int64_t>(groups)}, DType::float32);
  Tensor exact = output(device, given_exact, {v}, DType::float32, "exact", {&x, &head, &head_q, &head_meta, &params, &start, &out})
                     .reshaped({1, v});
  const SampleScratch scratch = sample_scratch(device, 1, v, true, top_p);
  OpSequence op(device);
  {
    Kernel kernel = screen_kernel(device, k, true);
    struct {
      uint32_t v, k, vectors, offset;
    } push{static_cast<uint32_t>(v), static_cast<uint32_t>(k), static_cast<uint32_t>(padded_k / 16),
           static_cast<uint32_t>(offset)};
    BufferBinding bindings[] = {x.binding(),    head_q.binding(), head_meta.binding(), high.binding(),
                                lows.binding(), low.binding(),    params.binding(),    start.binding()};
    op.sequence().dispatch(kernel, {static_cast<uint32_t>(groups), 1, 1}, bindings, push_bytes(push));
  }
  // The top_k-th largest lower end (its passes do nothing without top_k).
  record_sample(op.sequence(), device, scratch, low.binding(), out.binding(), params, start, v, offset, 0, 1, 0, 2);
  {
    Kernel kernel = verify_kernel(device, "head_verify_sample", head.dtype(), k);
    struct {
      uint32_t v, k, lows, offset;
    } push{static_cast<uint32_t>(v), static_cast<uint32_t>(k), static_cast<uint32_t>(groups),
           static_cast<uint32_t>(offset)};
    BufferBinding bindings[] = {x.binding(),       head.binding(),   high.binding(),  lows.binding(),
                                scratch.select.binding(), params.binding(), start.binding(), exact.binding()};
    op.sequence().dispatch(kernel, {static_cast<uint32_t>(chunks), 1, 1}, bindings, push_bytes(push));
  }
  record_sample(op.sequence(), device, scratch, exact.binding(), out.binding(), params, start, v, offset, 0, 1, 0, 3,
                top_p);
  op.run([nans = scratch.nans] { raise_if_nan_logits(nans); });
  return out;
}

namespace {

struct AppendShape {
  int64_t rows, hq, hkv, d, batch, cache_rows;
};

// The checks rope_append and decode_attention share.
AppendShape check_append(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos,
                         const Tensor& sin, const Tensor& start, const Tensor& k_cache, const Tensor& v_cache) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&k_cache, "k_cache"},
                                {&v_cache, "v_cache"}, {&cos, "cos"}, {&sin, "sin"}})
    if (t->dtype() != DType::float32)
      throw DTypeError(std::string(name) + ": expected float32, got " + std::string(dtype_name(t->dtype())));
  if (start.dtype() != DType::int32 || start.size() != 1)
    throw DTypeError("start: expected one int32 value, got " + std::string(dtype_name(start.dtype())) + " " +
                     shape_text(start.shape()));
  if (q.shape().size() != 3 || k.shape().size() != 3 || v.shape() != k.shape() || k_cache.shape().size() != 4 ||
      v_cache.shape() != k_cache.shape())
    throw ShapeError("expected q [B * T, HQ, D], k and v [B * T, HKV, D] and caches [B, ROWS, HKV, D], got q " +
                     shape_text(q.shape()) + ", k " + shape_text(k.shape()) + ", v " + shape_text(v.shape()) +
                     ", caches " + shape_text(k_cache.shape()));
  const AppendShape shape{q.shape()[0], q.shape()[1], k.shape()[1], q.shape()[2], k_cache.shape()[0],
                          k_cache.shape()[1]};
  if (k.shape()[0] != shape.rows || k.shape()[2] != shape.d || shape.d % 2 != 0 || k_cache.shape()[2] != shape.hkv ||
      k_cache.shape()[3] != shape.d || shape.batch == 0 || shape.rows % shape.batch != 0)
    throw ShapeError("q " + shape_text(q.shape()) + ", k " + shape_text(k.shape()) + " and caches " +
                     shape_text(k_cache.shape()) + " do not fit: rows must be a multiple of B, D even and shared");
  if (cos.shape().size() != 2 || cos.shape()[1] != shape.d / 2 || cos.shape()[0] == 0 || sin.shape() != cos.shape())
    throw ShapeError("angle tables: expected [positions, " + std::to_string(shape.d / 2) + "], got " +
                     shape_text(cos.shape()) + " and " + shape_text(sin.shape()));
  for (const Tensor* t : {&k, &v, &cos, &sin, &start, &k_cache, &v_cache})
    if (&t->device() != &q.device())
      throw ArgumentError(std::string(op) + ": every tensor must live on q's device");
  return shape;
}

}  // namespace

Tensor rope_append(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos, const Tensor& sin,
                   const Tensor& start, const Tensor& k_cache, const Tensor& v_cache) {
  const AppendShape shape = check_append("rope_append", q, k, v, cos, sin, start, k_cache, v_cache);
  const auto& device = q.device_ptr();
  Tensor q_out = Tensor::empty(device, q.shape(), DType::float32);
  if (shape.rows == 0) return q_out;
  struct {
    uint32_t rows, hq, hkv, d, period, cache_rows, table_rows;
  } push{static_cast<uint32_t>(shape.rows), static_cast<uint32_t>(shape.hq), static_cast<uint32_t>(shape.hkv),
         static_cast<uint32_t>(shape.d), static_cast<uint32_t>(shape.rows / shape.batch),
         static_cast<uint32_t>(shape.cache_rows), static_cast<uint32_t>(cos.shape()[0])};
  const uint64_t total = static_cast<uint64_t>(shape.rows) * ((shape.hq + shape.hkv) * (shape.d / 2) + shape.hkv * shape.d);
  Kernel kernel = Kernel::builtin(device, "rope_append");
  BufferBinding bindings[] = {q.binding(), k.binding(), v.binding(), cos.binding(), sin.binding(),
                              q_out.binding(), k_cache.binding(), v_cache.binding(), start.binding()};
  OpSequence op(device);
  op.sequence().dispatch(kernel, {workgroups(*device, total), 1, 1}, bindings, push_bytes(push));
  op.run();
  return q_out;
}

Tensor decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos, const Tensor& sin,
                        const Tensor& start, const Tensor& k_cache, const Tensor& v_cache,
                        int64_t requested_split) {
  const AppendShape shape = check_append("decode_attention", q, k, v, cos, sin, start, k_cache, v_cache);
  const auto& device = q.device_ptr();
  const int64_t heads_per_kv = shape.hkv > 0 && shape.hq % shape.hkv == 0 ? shape.hq / shape.hkv : 0;
  // One dispatch for one new token a sequence, D % 4 == 0, D <= 256, up to 8 query heads a KV head
  // and the shared memory it needs; otherwise (or with BITNET_GPU_FUSED_ATTENTION=0) the two ops it fuses.
  // Its shared memory (shaders/model/decode_attention.comp): s_q, s_part, s_p, the per-head values,
  // s_k_new, s_v_new and s_reduce (256 each), s_w (256 * MERGE_PER_LANE = 512), the vec4 s_sum4
  // (256) and a flag.
  const int64_t split_keys = decode_split_keys(heads_per_kv, requested_split);
  const int64_t shared_bytes = 4 * (2 * heads_per_kv * 256 + heads_per_kv * split_keys + 4 * heads_per_kv +
                                    3 * 256 + 512) + 16 * 256 + 16;
  const bool fused = shape.rows == shape.batch && shape.d % 4 == 0 && shape.d <= 256 && heads_per_kv >= 1 &&
                     heads_per_kv <= 8 && shared_bytes <= device->limits().maxComputeSharedMemorySize &&
                     environment_switch("BITNET_GPU_FUSED_ATTENTION").value_or(true);
  if (!fused) {
    const Tensor rotated = rope_append(q, k, v, cos, sin, start, k_cache, v_cache);
    return attention_cached(rotated, k_cache, v_cache, start, true, std::nullopt);
  }
  Tensor out = Tensor::empty(device, q.shape(), DType::float32);
  if (shape.rows == 0 || shape.hq == 0) return out;
  const int64_t splits = (shape.cache_rows + split_keys - 1) / split_keys;
  Tensor partial = Tensor::empty(device, std::vector<int64_t>{shape.batch, shape.hq, splits, shape.d + 4},
                                 DType::float32);
  // The last workgroup of each (sequence, KV head) resets its counter.
  Tensor counter = self_resetting_counters(device, shape.batch * shape.hkv);
  struct {
    uint32_t hq, hkv, cache_rows, table_rows, splits;
    float scale;
  } push{static_cast<uint32_t>(shape.hq), static_cast<uint32_t>(shape.hkv),
         static_cast<uint32_t>(shape.cache_rows), static_cast<uint32_t>(cos.shape()[0]),
         static_cast<uint32_t>(splits), 1.0f / std::sqrt(static_cast<float>(shape.d))};
  // The head dimension is a specialization constant (HEAD_DIM): it sizes the kernel's register arrays.
  Kernel kernel = Kernel::builtin(device, "decode_attention",
                                  {{0, heads_per_kv}, {1, split_keys}, {2, int64_t{shape.d}}});
  BufferBinding bindings[] = {q.binding(), k.binding(), v.binding(), cos.binding(), sin.binding(),
                              k_cache.binding(), v_cache.binding(), k_cache.binding(), start.binding(),
                              partial.binding(), counter.binding(), out.binding(), v_cache.binding(),
                              partial.binding()};
  const auto grid = checked_grid(*device, {static_cast<uint64_t>(splits), static_cast<uint64_t>(shape.hkv),
                                           static_cast<uint64_t>(shape.batch)},
                                 "decode attention over " + std::to_string(shape.cache_rows) + " cache rows");
  OpSequence op(device);
  op.sequence().dispatch(kernel, grid, bindings, push_bytes(push));
  op.run();
  return out;
}

}  // namespace bitnet::ops
