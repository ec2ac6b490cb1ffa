#include "ops/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/dispatch.hpp"
#include "ops/sample_passes.hpp"
#include "ops/tuning.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/kernel.hpp"
#include "runtime/sequence.hpp"

namespace bitnet::ops {

// CHUNK, BINS and TICKETS in shaders/sampling/sample_rows.comp and sample_nucleus.comp
constexpr int64_t kSampleChunk = 1024, kSampleBins = 2048, kSampleTickets = 8;

// selects: the top-k select or nucleus passes run (else their bins are not read, and each row's
// select state says "every value kept"); nucleus: the nucleus passes run.
SampleScratch sample_scratch(Sequence& sequence, int64_t rows, int64_t n, bool selects,
                             bool nucleus) {
  const auto& device = sequence.device();
  const int64_t chunks = (n + kSampleChunk - 1) / kSampleChunk;
  // Not an op's result where its contents come from the host (Tensor::empty's by_op).
  Tensor select = Tensor::empty(device, std::vector<int64_t>{rows, 4}, DType::uint32,
                                Placement::device, selects);
  if (!selects) {
    std::vector<uint32_t> every_value_kept(static_cast<size_t>(rows) * 4,
                                           0u);  // (prefix, wanted, all, -)
    for (size_t r = 0; r < static_cast<size_t>(rows); ++r) every_value_kept[4 * r + 2] = 1u;
    select.upload(every_value_kept.data(), select.nbytes());
  }
  return {self_resetting_counters(sequence, selects ? rows * kSampleBins : 1),
          self_resetting_counters(sequence, rows * kSampleTickets),
          select,
          Tensor::empty(device, std::vector<int64_t>{rows, chunks, 2}, DType::uint32),
          zeroed_counter(device),
          self_resetting_counters(sequence, nucleus ? rows * kSampleBins * 2 : 2),  // uint64 each
          self_resetting_counters(sequence, rows * 8),
          static_cast<uint32_t>(chunks)};
}

// Records sample_rows.comp's phases first_phase .. last_phase (0-2: the top_k select, 3: the draw)
// over `rows` rows of n values (logits and out bound at their first row, row0 their index in the
// whole array; row_stride values from one row to the next, 0: n), with sample_nucleus.comp's four
// passes before the draw where nucleus (top-p).
void record_sample(Sequence& sequence, const std::shared_ptr<Device>& device,
                   const SampleScratch& scratch, const BufferBinding& logits,
                   const BufferBinding& out, const Tensor& params, const Tensor& start, int64_t n,
                   int64_t offset, uint64_t row0, uint64_t rows, int64_t first_phase,
                   int64_t last_phase, bool nucleus, int64_t row_stride) {
  const SamplingStrides strides = sampling_strides(params, start);
  const uint32_t stride = static_cast<uint32_t>(row_stride ? row_stride : n);
  struct {
    uint32_t n, chunks, offset, row0, start_stride, params_stride, row_stride;
  } push{static_cast<uint32_t>(n),
         scratch.chunks,
         static_cast<uint32_t>(offset),
         static_cast<uint32_t>(row0),
         strides.start,
         strides.params,
         stride};
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
        uint32_t n, chunks, row0, params_stride, row_stride;
      } nucleus_push{static_cast<uint32_t>(n), scratch.chunks, static_cast<uint32_t>(row0),
                     strides.params, stride};
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

SamplingStrides sampling_strides(const Tensor& params, const Tensor& start) {
  return {params.shape().size() == 2 ? 8u : 0u, start.size() == 1 ? 0u : 1u};
}

// The checks sample_rows and screened_sample share.
void check_sampling(const Tensor& params, const Tensor& start, int64_t offset, int64_t rows,
                    const Tensor& on) {
  if (params.dtype() != DType::uint32 || (params.shape() != std::vector<int64_t>{6} &&
                                          params.shape() != std::vector<int64_t>{rows, 8}))
    throw DTypeError("params: expected uint32 [6] (every row's) or [" + std::to_string(rows) +
                     ", 8] (each row's own, its draw's key row at 6), got " +
                     std::string(dtype_name(params.dtype())) + " " + shape_text(params.shape()));
  if (start.dtype() != DType::int32 || start.shape().size() != 1 ||
      (start.size() != 1 && start.size() != static_cast<uint64_t>(rows)))
    throw DTypeError("start: expected int32 [1] or [" + std::to_string(rows) +
                     "] (one a row), got " + std::string(dtype_name(start.dtype())) + " " +
                     shape_text(start.shape()));
  if (&params.device() != &on.device() || &start.device() != &on.device())
    throw ArgumentError("params and start must live on the logits' device");
  if (offset < 0 || offset > std::numeric_limits<uint32_t>::max())
    throw ArgumentError("offset: expected an integer in [0, 2^32), got " + std::to_string(offset));
}

void check_top_p(const Device& device, bool top_p) {
  if (top_p && !device.feature("int64_atomics"))
    throw UnsupportedError(
        "top-p sampling needs 64-bit integer atomics (shaderInt64 and shaderBufferInt64Atomics), "
        "which device '" +
        device.info().name + "' lacks");
}

void raise_if_nan_logits(const Tensor& nans) {
  if (uint32_t found = read_counter(nans))
    throw ArgumentError("logits contain " + std::to_string(found) + " NaN value" +
                        (found == 1 ? "" : "s") +
                        ": nothing to draw from (the rows holding them got index -1)");
}

Tensor sample_rows(const Tensor& logits, const Tensor& params, const Tensor& start, int64_t offset,
                   const std::optional<Tensor>& given, bool top_p, bool top_k) {
  if (logits.dtype() != DType::float32)
    throw DTypeError("logits: expected float32, got " + std::string(dtype_name(logits.dtype())));
  if (logits.shape().size() != 2)
    throw ShapeError("logits: expected [M, N], got " + shape_text(logits.shape()));
  const int64_t m = logits.shape()[0], n = logits.shape()[1];
  check_sampling(params, start, offset, m, logits);
  if (n == 0)
    throw ShapeError("sampling from empty rows: logits have shape " + shape_text(logits.shape()));
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
      selects ? 64
              : std::max<uint64_t>(
                    64, std::min<uint64_t>(65535, device->info().max_workgroup_count[1]) / 64 * 64);
  std::vector<RowRange> blocks;
  for (const RowRange& range :
       row_ranges(*device, static_cast<uint64_t>(m), {static_cast<uint64_t>(n) * 4, 4}))
    for (uint64_t first = 0; first < range.count; first += block_limit)
      blocks.push_back({range.first + first, std::min(block_limit, range.count - first)});
  const int64_t block_rows =
      static_cast<int64_t>(std::min<uint64_t>(block_limit, static_cast<uint64_t>(m)));
  checked_grid(*device,
               {static_cast<uint64_t>((n + kSampleChunk - 1) / kSampleChunk),
                static_cast<uint64_t>(block_rows), 1},
               "sample_rows over " + shape_text(logits.shape()));
  Recorder op(device);
  const SampleScratch scratch = sample_scratch(op.sequence(), block_rows, n, selects, top_p);
  for (const RowRange& block : blocks)
    record_sample(op.sequence(), device, scratch,
                  rows_of(logits, block, static_cast<uint64_t>(n) * 4), rows_of(out, block, 4),
                  params, start, n, offset, block.first, block.count, top_k ? 0 : 3, 3, top_p);
  op.run([nans = scratch.nans] { raise_if_nan_logits(nans); });
  return out;
}

}  // namespace bitnet::ops
