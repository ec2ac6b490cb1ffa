#include "ops/quantize.hpp"

#include <algorithm>
#include <bit>
#include <string>
#include <vector>

#include "ops/dispatch.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/kernel.hpp"
#include "runtime/sequence.hpp"

namespace bitnet::ops {
namespace {

constexpr uint64_t kStatsWords = 8;  // struct Stats in shaders/quantize/quantize_common.glsl

int quantization_max(int bits, bool symmetric) {
  if (bits < 2 || bits > 8)
    throw ArgumentError("bits: expected 2 to 8, got " + std::to_string(bits));
  return symmetric ? (1 << (bits - 1)) - 1 : (1 << bits) - 1;
}

Tensor make(const std::shared_ptr<Device>& device, std::vector<int64_t> shape, DType dtype,
            Placement placement = Placement::device) {
  return Tensor::empty(device, shape, dtype, placement);
}

// Segment statistics of the flat input, segments of `length` elements.
Tensor record_stats(Sequence& sequence, const Tensor& input, uint64_t length, const Tensor& count) {
  const auto& device = input.device_ptr();
  const uint64_t n = input.size();
  const uint64_t segments = (n + length - 1) / length;
  const uint64_t element = dtype_size(input.dtype());
  Tensor stats = make(device, {static_cast<int64_t>(segments), kStatsWords}, DType::uint32);
  Kernel kernel = Kernel::builtin(device, float_variant("reduce_stats", input.dtype()));
  for (const RowRange& range : row_ranges(*device, segments, {length * element})) {
    struct {
      uint32_t segment_length, segments, elements, first_output;
    } push{static_cast<uint32_t>(length), static_cast<uint32_t>(range.count),
           static_cast<uint32_t>(std::min(range.count * length, n - range.first * length)),
           static_cast<uint32_t>(range.first)};
    BufferBinding bindings[] = {rows_of(input, range, length * element), stats.binding(),
                                count.binding()};
    sequence.dispatch(kernel, {workgroups(*device, range.count, 1), 1, 1}, bindings,
                      push_bytes(push));
  }
  return stats;
}

// Combines runs of `run` segment statistics into `outputs` scales (and means).
void record_scales(Sequence& sequence, const Tensor& stats, uint64_t run, uint64_t outputs,
                   uint32_t mode, float qmax, const Tensor& scales, const Tensor& means) {
  const auto& device = stats.device_ptr();
  Kernel kernel = Kernel::builtin(device, "reduce_scales",
                                  {{0, int64_t{mode}}, {1, double{qmax}}, {2, double{kEps}}});
  struct {
    uint32_t run, outputs;
  } push{static_cast<uint32_t>(run), static_cast<uint32_t>(outputs)};
  BufferBinding bindings[] = {stats.binding(), scales.binding(), means.binding()};
  sequence.dispatch(kernel, {workgroups(*device, outputs, 1), 1, 1}, bindings, push_bytes(push));
}

struct PackPush {
  uint32_t rows, k, words_per_row, group_size, first_row;
};

}  // namespace

uint64_t tensor_segment(uint64_t elements) {
  return std::clamp<uint64_t>(std::bit_ceil(std::max<uint64_t>(elements / 2048, 1)), 4096, 65536);
}

QuantizedWeights quantize_weights(const Tensor& w, int64_t group_size, bool binary) {
  require_float(w, "w");
  if (w.shape().size() != 2)
    throw ShapeError("w: expected a 2-D matrix [N, K], got shape " + shape_text(w.shape()));
  const int64_t rows = w.shape()[0], cols = w.shape()[1];
  if (rows == 0 || cols == 0)
    throw ShapeError("w: the weight scale is a mean, which an empty matrix " +
                     shape_text(w.shape()) + " does not have");
  if (group_size < 0) throw ArgumentError("group_size: expected a positive size or None");
  if (group_size > 0 && cols % group_size != 0)
    throw ShapeError("group_size " + std::to_string(group_size) + " does not divide K = " +
                     std::to_string(cols) + " (w has shape " + shape_text(w.shape()) + ")");
  const auto& device = w.device_ptr();
  const uint64_t segment = group_size > 0 ? static_cast<uint64_t>(group_size)
                                          : tensor_segment(static_cast<uint64_t>(rows * cols));
  const int64_t groups = group_size > 0 ? rows * (cols / group_size) : 1;
  const uint64_t row_bytes = binary ? binary_row_bytes(cols) : ternary_row_bytes(cols);
  QuantizedWeights result{make(device, {rows, static_cast<int64_t>(row_bytes)}, DType::uint8),
                          make(device, {groups}, DType::float32),
                          make(device, {groups}, DType::float32),
                          rows,
                          cols,
                          group_size,
                          binary};

  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  Tensor nonfinite = zeroed_counter(device);
  Tensor stats = record_stats(sequence, w, segment, nonfinite);
  const uint64_t segments = static_cast<uint64_t>(stats.shape()[0]);
  record_scales(sequence, stats, group_size > 0 ? 1 : segments, groups, 0, 0.0f, result.scales,
                *result.means);
  Kernel pack = Kernel::builtin(
      device, float_variant(binary ? "binary_quantize" : "ternary_quantize", w.dtype()));
  const uint64_t element = dtype_size(w.dtype());
  for (const RowRange& range : row_ranges(*device, rows, {cols * element, row_bytes})) {
    PackPush push{static_cast<uint32_t>(range.count), static_cast<uint32_t>(cols),
                  static_cast<uint32_t>(row_bytes / 4), static_cast<uint32_t>(group_size),
                  static_cast<uint32_t>(range.first)};
    const BufferBinding weights = rows_of(w, range, cols * element);
    const BufferBinding packed = rows_of(result.packed, range, row_bytes);
    std::vector<BufferBinding> bindings;
    if (binary)
      bindings = {weights, result.means->binding(), packed};
    else
      bindings = {weights, weights, result.scales.binding(), packed};  // scalar and vec4 views
    sequence.dispatch(pack, {workgroups(*device, range.count * (row_bytes / 4)), 1, 1}, bindings,
                      push_bytes(push));
  }
  op_sequence.run([nonfinite] { raise_if_nonfinite(nonfinite, "w"); });
  return result;
}

QuantizedWeights weights_from_packed(const Tensor& packed, const Tensor& scales, int64_t rows,
                                     int64_t cols, int64_t group_size, bool binary) {
  if (rows <= 0 || cols <= 0)
    throw ShapeError("shape: expected a positive (N, K), got (" + std::to_string(rows) + ", " +
                     std::to_string(cols) + ")");
  if (group_size < 0 || (group_size > 0 && cols % group_size != 0))
    throw ShapeError("group_size " + std::to_string(group_size) +
                     " does not divide K = " + std::to_string(cols));
  const int64_t row_bytes =
      static_cast<int64_t>(binary ? binary_row_bytes(cols) : ternary_row_bytes(cols));
  if (packed.dtype() != DType::uint8)
    throw DTypeError("packed: expected uint8, got " + std::string(dtype_name(packed.dtype())));
  if (packed.shape() != std::vector<int64_t>{rows, row_bytes})
    throw ShapeError("packed: expected shape (" + std::to_string(rows) + ", " +
                     std::to_string(row_bytes) + ") for weights of shape (" + std::to_string(rows) +
                     ", " + std::to_string(cols) + "), got " + shape_text(packed.shape()));
  if (scales.dtype() != DType::float32)
    throw DTypeError("scale: expected float32, got " + std::string(dtype_name(scales.dtype())));
  const int64_t groups = group_size > 0 ? rows * (cols / group_size) : 1;
  if (static_cast<int64_t>(scales.size()) != groups)
    throw ShapeError("scale: expected " + std::to_string(groups) + " value(s), got " +
                     std::to_string(scales.size()));
  return QuantizedWeights{packed, scales, std::nullopt, rows, cols, group_size, binary};
}

Tensor dequantize_weights(const QuantizedWeights& weights, const std::optional<Tensor>& given) {
  const auto& device = weights.packed.device_ptr();
  Tensor out = output(device, given, {weights.rows, weights.cols}, DType::float32, "weights",
                      {&weights.packed, &weights.scales});
  const uint64_t row_bytes = static_cast<uint64_t>(weights.packed.shape()[1]);
  Kernel kernel = Kernel::builtin(device, "dequantize_weights", {{0, weights.binary}});
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  for (const RowRange& range :
       row_ranges(*device, weights.rows, {row_bytes, static_cast<uint64_t>(weights.cols) * 4})) {
    PackPush push{static_cast<uint32_t>(range.count), static_cast<uint32_t>(weights.cols),
                  static_cast<uint32_t>(row_bytes / 4), static_cast<uint32_t>(weights.group_size),
                  static_cast<uint32_t>(range.first)};
    BufferBinding bindings[] = {rows_of(weights.packed, range, row_bytes), weights.scales.binding(),
                                rows_of(out, range, weights.cols * 4)};
    sequence.dispatch(kernel, {workgroups(*device, range.count * (row_bytes / 4)), 1, 1}, bindings,
                      push_bytes(push));
  }
  op_sequence.run();
  return out;
}

Tensor unpack_ternary(const Tensor& packed, int64_t rows, int64_t cols,
                      const std::optional<Tensor>& given) {
  const auto& device = packed.device_ptr();
  const int64_t row_bytes = static_cast<int64_t>(ternary_row_bytes(cols));
  if (packed.dtype() != DType::uint8)
    throw DTypeError("packed: expected uint8, got " + std::string(dtype_name(packed.dtype())));
  if (rows < 0 || cols < 0 || packed.shape() != std::vector<int64_t>{rows, row_bytes})
    throw ShapeError("packed: expected shape (" + std::to_string(rows) + ", " +
                     std::to_string(row_bytes) + ") for shape (" + std::to_string(rows) + ", " +
                     std::to_string(cols) + "), got " + shape_text(packed.shape()));
  Tensor out = output(device, given, {rows, cols}, DType::int8, "values", {&packed});
  if (rows == 0 || cols == 0) return out;
  Kernel kernel = Kernel::builtin(device, "ternary_unpack");
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  for (const RowRange& range :
       row_ranges(*device, rows, {static_cast<uint64_t>(row_bytes), static_cast<uint64_t>(cols)})) {
    struct {
      uint32_t rows, k, words_per_row;
    } push{static_cast<uint32_t>(range.count), static_cast<uint32_t>(cols),
           static_cast<uint32_t>(row_bytes / 4)};
    BufferBinding bindings[] = {rows_of(packed, range, row_bytes), rows_of(out, range, cols)};
    sequence.dispatch(kernel, {workgroups(*device, range.count * (row_bytes / 4)), 1, 1}, bindings,
                      push_bytes(push));
  }
  op_sequence.run();
  return out;
}

Tensor pack_ternary(const Tensor& values, const std::optional<Tensor>& given) {
  if (values.dtype() != DType::int8)
    throw DTypeError("q: expected int8 values in {-1, 0, 1}, got " +
                     std::string(dtype_name(values.dtype())));
  if (values.shape().size() != 2)
    throw ShapeError("q: expected a 2-D matrix [N, K], got shape " + shape_text(values.shape()));
  const auto& device = values.device_ptr();
  const int64_t rows = values.shape()[0], cols = values.shape()[1];
  const int64_t row_bytes = static_cast<int64_t>(ternary_row_bytes(cols));
  Tensor packed = output(device, given, {rows, row_bytes}, DType::uint8, "packed", {&values});
  if (rows == 0 || cols == 0) return packed;
  Kernel kernel = Kernel::builtin(device, "ternary_pack");
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  Tensor invalid = zeroed_counter(device);
  for (const RowRange& range :
       row_ranges(*device, rows, {static_cast<uint64_t>(cols), static_cast<uint64_t>(row_bytes)})) {
    struct {
      uint32_t rows, k, words_per_row;
    } push{static_cast<uint32_t>(range.count), static_cast<uint32_t>(cols),
           static_cast<uint32_t>(row_bytes / 4)};
    BufferBinding bindings[] = {rows_of(values, range, cols), rows_of(packed, range, row_bytes),
                                invalid.binding()};
    sequence.dispatch(kernel, {workgroups(*device, range.count * (row_bytes / 4)), 1, 1}, bindings,
                      push_bytes(push));
  }
  op_sequence.run([invalid] {
    if (uint32_t found = read_counter(invalid))
      throw ArgumentError("q: ternary values must be -1, 0 or 1; " + std::to_string(found) +
                          " value" + (found == 1 ? " is" : "s are") + " not");
  });
  return packed;
}

QuantizedRows quantize_rows(const Tensor& x, int bits, bool symmetric, const RowOutputs& given) {
  require_float(x, "x");
  const int qmax = quantization_max(bits, symmetric);
  if (x.shape().empty())
    throw ShapeError("x: expected at least one axis [..., K], got a 0-d tensor");
  const int64_t cols = x.shape().back();
  if (cols == 0)
    throw ShapeError("x: the per-row scale reduces over the last axis, which is empty in shape " +
                     shape_text(x.shape()));
  const auto& device = x.device_ptr();
  const int64_t rows = static_cast<int64_t>(x.size()) / cols;
  std::vector<int64_t> leading(x.shape().begin(), x.shape().end() - 1);
  if (symmetric && given.zero_points)
    throw ArgumentError("out: symmetric quantization has no zero point to write");
  // The outputs differ in dtype or rank, so no two out= targets can be one tensor.
  QuantizedRows result{
      output(device, given.q, x.shape(), symmetric ? DType::int8 : DType::uint8, "q", {&x}),
      output(device, given.scales, leading, DType::float32, "scale", {&x}), std::nullopt};
  if (!symmetric)
    result.zero_points =
        output(device, given.zero_points, leading, DType::uint8, "zero_point", {&x});
  if (rows == 0) return result;
  Kernel kernel = Kernel::builtin(device, float_variant("quantize_rows", x.dtype()),
                                  {{0, symmetric}, {1, double(qmax)}, {2, double{kEps}}});
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  Tensor nonfinite = zeroed_counter(device);
  Tensor unused = make(device, {1}, DType::uint8);
  const uint64_t element = dtype_size(x.dtype());
  for (const RowRange& range :
       row_ranges(*device, rows, {cols * element, static_cast<uint64_t>(cols)})) {
    struct {
      uint32_t rows, k, first_row;
    } push{static_cast<uint32_t>(range.count), static_cast<uint32_t>(cols),
           static_cast<uint32_t>(range.first)};
    const BufferBinding input = rows_of(x, range, cols * element);
    const BufferBinding quantized = rows_of(result.q, range, cols);
    BufferBinding bindings[] = {input,
                                input,
                                quantized,
                                quantized,  // scalar and vector views
                                result.scales.binding(),
                                (symmetric ? unused : *result.zero_points).binding(),
                                nonfinite.binding()};
    sequence.dispatch(kernel, {workgroups(*device, range.count, 1), 1, 1}, bindings,
                      push_bytes(push));
  }
  op_sequence.run([nonfinite] { raise_if_nonfinite(nonfinite, "x"); });
  return result;
}

Tensor dequantize_rows(const Tensor& q, const Tensor& scales,
                       const std::optional<Tensor>& zero_points,
                       const std::optional<Tensor>& given) {
  const bool symmetric = !zero_points.has_value();
  const DType expected = symmetric ? DType::int8 : DType::uint8;
  if (q.dtype() != expected)
    throw DTypeError(std::string("q: expected ") +
                     (symmetric ? "int8" : "uint8 (with zero_point)") + ", got " +
                     std::string(dtype_name(q.dtype())));
  if (q.shape().empty() || q.shape().back() == 0)
    throw ShapeError("q: expected [..., K] with K > 0, got shape " + shape_text(q.shape()));
  const int64_t cols = q.shape().back();
  const int64_t rows = static_cast<int64_t>(q.size()) / cols;
  if (scales.dtype() != DType::float32 || static_cast<int64_t>(scales.size()) != rows)
    throw ShapeError("scale: expected float32 with one value per row (" + std::to_string(rows) +
                     "), got " + std::string(dtype_name(scales.dtype())) + " " +
                     shape_text(scales.shape()));
  if (zero_points &&
      (zero_points->dtype() != DType::uint8 || static_cast<int64_t>(zero_points->size()) != rows))
    throw ShapeError("zero_point: expected uint8 with one value per row (" + std::to_string(rows) +
                     ")");
  const auto& device = q.device_ptr();
  Tensor out = output(device, given, q.shape(), DType::float32, "x",
                      {&q, &scales, zero_points ? &*zero_points : nullptr});
  if (rows == 0) return out;
  Kernel kernel = Kernel::builtin(device, "dequantize_rows", {{0, symmetric}});
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  for (const RowRange& range :
       row_ranges(*device, rows, {static_cast<uint64_t>(cols), static_cast<uint64_t>(cols) * 4})) {
    struct {
      uint32_t rows, k, first_row;
    } push{static_cast<uint32_t>(range.count), static_cast<uint32_t>(cols),
           static_cast<uint32_t>(range.first)};
    BufferBinding bindings[] = {rows_of(q, range, cols), scales.binding(),
                                (zero_points ? *zero_points : q).binding(),
                                rows_of(out, range, cols * 4)};
    sequence.dispatch(kernel, {workgroups(*device, range.count * cols), 1, 1}, bindings,
                      push_bytes(push));
  }
  op_sequence.run();
  return out;
}

QuantizedTensor quantize_tensor(const Tensor& g, int bits, bool stochastic, uint64_t seed,
                                const std::optional<Tensor>& given_q,
                                const std::optional<Tensor>& given_scale) {
  require_float(g, "g");
  const int qmax = quantization_max(bits, true);
  if (g.size() == 0)
    throw ShapeError("g: the per-tensor scale reduces over all elements, and shape " +
                     shape_text(g.shape()) + " has none");
  const auto& device = g.device_ptr();
  QuantizedTensor result{output(device, given_q, g.shape(), DType::int8, "q", {&g}),
                         output(device, given_scale, {1}, DType::float32, "scale", {&g})};
  Tensor means = make(device, {1}, DType::float32);
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  Tensor nonfinite = zeroed_counter(device);
  Tensor stats = record_stats(sequence, g, tensor_segment(g.size()), nonfinite);
  record_scales(sequence, stats, static_cast<uint64_t>(stats.shape()[0]), 1, 1, float(qmax),
                result.scale, means);
  Kernel kernel = Kernel::builtin(device, float_variant("quantize_elements", g.dtype()),
                                  {{0, stochastic}, {1, double(qmax)}});
  const uint64_t element = dtype_size(g.dtype());
  for (const RowRange& range : row_ranges(*device, g.size(), {element, 1})) {
    struct {
      uint32_t elements, first_element, seed_lo, seed_hi;
    } push{static_cast<uint32_t>(range.count), static_cast<uint32_t>(range.first),
           static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
    BufferBinding bindings[] = {rows_of(g, range, element), result.scale.binding(),
                                rows_of(result.q, range, 1)};
    sequence.dispatch(kernel, {workgroups(*device, range.count), 1, 1}, bindings, push_bytes(push));
  }
  op_sequence.run([nonfinite] { raise_if_nonfinite(nonfinite, "g"); });
  return result;
}

}  // namespace bitnet::ops
