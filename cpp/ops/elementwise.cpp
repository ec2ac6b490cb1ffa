#include "ops/elementwise.hpp"

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

enum Mode : uint32_t { forward = 0, backward = 1, gate = 2, dropout = 3 };

void require_same(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  if (a.shape() != b.shape())
    throw ShapeError(std::string(a_name) + " of shape " + shape_text(a.shape()) + " and " + b_name +
                     " of shape " + shape_text(b.shape()) + " must have one shape");
  require_same_kind(a, a_name, b, b_name);
}

// A float32 [K] vector (a norm's weight or bias) for rows of x [..., K], on x's device.
void require_row_vector(const Tensor& t, const char* name, int64_t k, const Tensor& x) {
  if (t.dtype() != DType::float32 || t.shape() != std::vector<int64_t>{k})
    throw ShapeError(std::string(name) + ": expected float32 of shape (" + std::to_string(k) +
                     ",) for x of shape " + shape_text(x.shape()) + ", got " +
                     std::string(dtype_name(t.dtype())) + " " + shape_text(t.shape()));
  if (&t.device() != &x.device()) throw ArgumentError(std::string(name) + ": on another device");
}

Tensor run_elementwise(const Tensor& x, const Tensor* other, Activation op, Mode mode, float alpha,
                       float p, uint64_t seed, const std::optional<Tensor>& given,
                       const char* name) {
  require_float(x, "x");
  const auto& device = x.device_ptr();
  Tensor y = output(device, given, x.shape(), x.dtype(), name, {&x, other});
  if (x.size() == 0) return y;
  Kernel kernel = Kernel::builtin(device, float_variant("elementwise", x.dtype()),
                                  {{0, int64_t{static_cast<uint32_t>(op)}}, {1, int64_t{mode}}});
  const uint64_t element = dtype_size(x.dtype());
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  // Chunks of whole 16-byte vectors (row_ranges keeps every view inside the binding limit).
  for (const RowRange& range : row_ranges(*device, (x.size() + 3) / 4, {4 * element})) {
    RowRange elements{range.first * 4,
                      std::min<uint64_t>(range.count * 4, x.size() - range.first * 4)};
    const BufferBinding in = rows_of(x, elements, element);
    const BufferBinding extra = other ? rows_of(*other, elements, element) : in;
    const BufferBinding out = rows_of(y, elements, element);
    struct {
      uint32_t n, first;
      float alpha, p;
      uint32_t seed_lo, seed_hi;
    } push{static_cast<uint32_t>(elements.count), static_cast<uint32_t>(elements.first), alpha, p,
           static_cast<uint32_t>(seed),           static_cast<uint32_t>(seed >> 32)};
    BufferBinding bindings[] = {in, in, extra, extra, out, out};
    sequence.dispatch(kernel, {workgroups(*device, (elements.count + 3) / 4), 1, 1}, bindings,
                      push_bytes(push));
  }
  op_sequence.run();
  return y;
}

// K, the last axis every row op works along (ShapeError for 0-d or empty rows).
int64_t row_length(const Tensor& x) {
  require_float(x, "x");
  if (x.shape().empty() || x.shape().back() == 0)
    throw ShapeError("x: expected [..., K] with K > 0, got shape " + shape_text(x.shape()));
  return x.shape().back();
}

// Whether row_ops.comp holds rows of k values in registers (K % 4 == 0, K <= 8192).
bool rows_in_registers(int64_t k) { return k % 4 == 0 && k / 4 <= 8 * 256; }

// Vectors of 4 values a lane of row_ops.comp holds for rows of k values (its CACHED): the fewest
// that hold the row where it is kept in registers, else 1 (unused).
uint32_t row_vectors(int64_t k) {
  return rows_in_registers(k) ? static_cast<uint32_t>((k / 4 + 255) / 256) : 1u;
}

// Workgroups that the backward norms' rows are dealt to when each writes its column sums of the
// parameters' gradient terms (COLUMN_PARTIALS): two for each multiprocessor (the fastest measured;
// 128 where the count is unknown), and never so few that a workgroup takes more than 4096 rows
// (lavapipe ends an invocation's loops after 65535 passes).
uint64_t partial_groups(const Device& device, uint64_t rows) {
  const uint64_t per_multiprocessor = tuning().norm_groups_per_sm.value_or(2);
  const uint64_t multiprocessors =
      device.info().multiprocessors ? device.info().multiprocessors : 128;
  const uint64_t fill = multiprocessors * per_multiprocessor;
  return std::min({rows, std::max(fill, (rows + 4095) / 4096),
                   static_cast<uint64_t>(device.limits().maxComputeWorkGroupCount[0])});
}

// The backward norms' parameter-gradient terms (see NormGradients), which run_rows allocates.
struct GradientTerms {
  std::optional<Tensor> grad_times_xhat, grad_sum;
};

// shaders/ops/row_ops.comp's OP over x's rows, in chunks within the binding limit, into y; the
// backward norms (OP 3, 4) also return their gradient terms, float32 [R, K]: gxhat (grad * xhat)
// and, for layer_norm, gsum (grad), R being one row per row of x, or where rows are held in
// registers one row per workgroup of each chunk.
GradientTerms run_rows(uint32_t op, const Tensor& x, const Tensor* grad, const Tensor* weight,
                       const Tensor* bias, float eps, const Tensor& y) {
  const int64_t k = x.shape().back();
  const uint64_t rows = x.size() / static_cast<uint64_t>(k);
  const auto& device = x.device_ptr();
  const bool norm_backward = op == 3 || op == 4;
  const bool partials = norm_backward && rows_in_registers(k);
  const uint64_t row_bytes = static_cast<uint64_t>(k) * dtype_size(x.dtype());
  const uint64_t float_row = static_cast<uint64_t>(k) * 4;
  const std::vector<RowRange> ranges =
      row_ranges(*device, rows, {row_bytes, norm_backward ? float_row : 0});
  std::vector<uint64_t> groups;  // each chunk's workgroups, and with partials its rows of terms
  uint64_t term_rows = 0;
  for (const RowRange& range : ranges) {
    groups.push_back(partials ? partial_groups(*device, range.count) : range.count);
    term_rows += groups.back();
  }
  GradientTerms terms;
  if (norm_backward) {
    const std::vector<int64_t> shape{static_cast<int64_t>(term_rows), k};
    terms.grad_times_xhat = Tensor::empty(device, shape, DType::float32);
    if (op == 4) terms.grad_sum = Tensor::empty(device, shape, DType::float32);
  }
  if (rows == 0) return terms;
  Kernel kernel = Kernel::builtin(device, float_variant("row_ops", x.dtype()),
                                  {{0, int64_t{op}}, {1, int64_t{row_vectors(k)}}, {2, partials}});
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  uint64_t term_row = 0;  // the first row of the gradient terms this chunk writes
  for (size_t chunk = 0; chunk < ranges.size(); ++chunk) {
    const RowRange& range = ranges[chunk];
    struct {
      uint32_t rows, k;
      float eps;
    } push{static_cast<uint32_t>(range.count), static_cast<uint32_t>(k), eps};
    const RowRange term_range{term_row, groups[chunk]};
    term_row += groups[chunk];
    const BufferBinding in = rows_of(x, range, row_bytes), result = rows_of(y, range, row_bytes);
    const BufferBinding grad_rows = grad ? rows_of(*grad, range, row_bytes) : in;
    const BufferBinding gxhat_rows =
        terms.grad_times_xhat ? rows_of(*terms.grad_times_xhat, term_range, float_row) : result;
    const BufferBinding gsum_rows =
        terms.grad_sum ? rows_of(*terms.grad_sum, term_range, float_row) : gxhat_rows;
    BufferBinding bindings[] = {in,
                                in,
                                weight ? weight->binding() : in,
                                bias ? bias->binding() : in,
                                result,
                                result,
                                grad_rows,
                                gxhat_rows,
                                grad_rows,
                                gxhat_rows,
                                gsum_rows,
                                gsum_rows};
    sequence.dispatch(kernel, {workgroups(*device, groups[chunk], 1), 1, 1}, bindings,
                      push_bytes(push));
  }
  op_sequence.run();
  return terms;
}

}  // namespace

Tensor activation(const Tensor& x, Activation op, float alpha, const std::optional<Tensor>& out) {
  return run_elementwise(x, nullptr, op, forward, alpha, 0.0f, 0, out, "y");
}

Tensor activation_backward(const Tensor& grad_y, const Tensor& x, Activation op, float alpha,
                           const std::optional<Tensor>& out) {
  require_same(grad_y, "grad_y", x, "x");
  return run_elementwise(x, &grad_y, op, backward, alpha, 0.0f, 0, out, "grad_x");
}

Tensor gated_activation(const Tensor& gate, const Tensor& up, Activation op,
                        const std::optional<Tensor>& out) {
  require_same(gate, "gate", up, "up");
  return run_elementwise(gate, &up, op, Mode::gate, 0.0f, 0.0f, 0, out, "y");
}

Tensor relu_dropout(const Tensor& x, double p, uint64_t seed, const std::optional<Tensor>& out) {
  if (!(p >= 0.0 && p <= 1.0))
    throw ArgumentError("p: expected a probability in [0, 1], got " + std::to_string(p));
  // p = 1 drops everything: uniform01 < 1, so no value is kept and 1 - p never divides.
  return run_elementwise(x, nullptr, Activation::relu, dropout, 0.0f, static_cast<float>(p), seed,
                         out, "y");
}

Tensor row_op(const Tensor& x, RowOp op, const std::optional<Tensor>& weight,
              const std::optional<Tensor>& bias, float eps, const std::optional<Tensor>& out) {
  const int64_t k = row_length(x);
  if (weight) require_row_vector(*weight, "weight", k, x);
  if (bias) require_row_vector(*bias, "bias", k, x);
  if (op != RowOp::softmax && !weight) throw ArgumentError("weight: required");
  if (op == RowOp::layer_norm && !bias) throw ArgumentError("bias: required");
  if (!(eps >= 0.0f)) throw ArgumentError("eps: expected a non-negative number");
  Tensor y = output(x.device_ptr(), out, x.shape(), x.dtype(), "y",
                    {&x, weight ? &*weight : nullptr, bias ? &*bias : nullptr});
  run_rows(static_cast<uint32_t>(op), x, nullptr, weight ? &*weight : nullptr,
           bias ? &*bias : nullptr, eps, y);
  return y;
}

Tensor binary(const Tensor& a, const Tensor& b, BinaryOp op, const std::optional<Tensor>& given) {
  require_float(a, "a");
  require_same_kind(a, "a", b, "b");
  const size_t ndim = std::max(a.shape().size(), b.shape().size());
  if (ndim > 6) throw UnsupportedError("broadcasting over more than 6 axes");
  std::vector<int64_t> shape(ndim), sa(ndim, 1), sb(ndim, 1);
  for (size_t i = 0; i < a.shape().size(); ++i) sa[ndim - a.shape().size() + i] = a.shape()[i];
  for (size_t i = 0; i < b.shape().size(); ++i) sb[ndim - b.shape().size() + i] = b.shape()[i];
  for (size_t i = 0; i < ndim; ++i) {
    if (sa[i] != sb[i] && sa[i] != 1 && sb[i] != 1)
      throw ShapeError("operands could not be broadcast together with shapes " +
                       shape_text(a.shape()) + " " + shape_text(b.shape()));
    shape[i] = sa[i] == 1 ? sb[i] : sa[i];
  }
  const auto& device = a.device_ptr();
  Tensor y = output(device, given, shape, a.dtype(), "y", {&a, &b});
  if (y.size() == 0) return y;
  if (y.size() > 0xffffffffu) throw UnsupportedError("more than 2^32 elements");
  const bool same = a.shape() == b.shape();
  struct {
    uint32_t n, ndim, shape[6], a_strides[6], b_strides[6];
  } push{};
  push.n = static_cast<uint32_t>(y.size());
  push.ndim = static_cast<uint32_t>(ndim);
  uint64_t stride_a = 1, stride_b = 1;
  for (size_t i = ndim; i-- > 0;) {
    push.shape[i] = static_cast<uint32_t>(shape[i]);
    push.a_strides[i] = sa[i] == 1 ? 0 : static_cast<uint32_t>(stride_a);
    push.b_strides[i] = sb[i] == 1 ? 0 : static_cast<uint32_t>(stride_b);
    stride_a *= static_cast<uint64_t>(sa[i]);
    stride_b *= static_cast<uint64_t>(sb[i]);
  }
  Kernel kernel = Kernel::builtin(device, float_variant("binary", a.dtype()),
                                  {{0, int64_t{static_cast<uint32_t>(op)}}, {1, same}});
  BufferBinding bindings[] = {a.binding(), a.binding(), b.binding(),
                              b.binding(), y.binding(), y.binding()};
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  sequence.dispatch(kernel, {workgroups(*device, same ? (y.size() + 3) / 4 : y.size()), 1, 1},
                    bindings, push_bytes(push));
  op_sequence.run();
  return y;
}

Tensor softmax_backward(const Tensor& grad_y, const Tensor& x, const std::optional<Tensor>& given) {
  row_length(x);
  require_same(grad_y, "grad_y", x, "x");
  Tensor gx = output(x.device_ptr(), given, x.shape(), x.dtype(), "grad_x", {&x, &grad_y});
  run_rows(5, x, &grad_y, nullptr, nullptr, 0.0f, gx);
  return gx;
}

NormGradients norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, float eps,
                            bool layer_norm) {
  const int64_t k = row_length(x);
  require_same(grad_y, "grad_y", x, "x");
  require_row_vector(weight, "weight", k, x);
  Tensor grad_x = Tensor::empty(x.device_ptr(), x.shape(), x.dtype());
  GradientTerms terms = run_rows(layer_norm ? 4 : 3, x, &grad_y, &weight, nullptr, eps, grad_x);
  return {grad_x, *terms.grad_times_xhat, terms.grad_sum};
}

Tensor reduce(const Tensor& x, int64_t axis, ReduceOp op, const std::optional<Tensor>& given) {
  require_float(x, "x");
  const int64_t ndim = static_cast<int64_t>(x.shape().size());
  if (ndim == 0) throw ShapeError("x: a 0-d tensor has no axis to reduce");
  if (axis < -ndim || axis >= ndim)
    throw ShapeError("axis " + std::to_string(axis) + " is out of bounds for shape " +
                     shape_text(x.shape()));
  if (axis < 0) axis += ndim;
  const int64_t count = x.shape()[axis];
  if (count == 0 && op == ReduceOp::max)
    throw ShapeError("max over an empty axis of shape " + shape_text(x.shape()) +
                     " has no identity");
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x.shape()[i];
  for (int64_t i = axis + 1; i < ndim; ++i) inner *= x.shape()[i];
  std::vector<int64_t> shape = x.shape();
  shape.erase(shape.begin() + axis);
  const auto& device = x.device_ptr();
  Tensor y = output(device, given, shape, x.dtype(), "y", {&x});
  if (y.size() == 0) return y;
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  auto record = [&](const Tensor& from, const Tensor& to, int64_t o, int64_t c, int64_t in) {
    Kernel kernel = Kernel::builtin(device, float_variant("reduce", x.dtype()),
                                    {{0, int64_t{static_cast<uint32_t>(op)}}, {1, in == 1}});
    struct {
      uint32_t outer, count, inner;
    } push{static_cast<uint32_t>(o), static_cast<uint32_t>(c), static_cast<uint32_t>(in)};
    BufferBinding bindings[] = {from.binding(), to.binding()};
    sequence.dispatch(kernel,
                      {in == 1 ? workgroups(*device, o, 1) : workgroups(*device, o * in), 1, 1},
                      bindings, push_bytes(push));
  };
  // Few outputs along a long strided axis (a weight gradient's sum over rows) would leave most of
  // the GPU idle with one invocation per output: reduce chunks of the axis first, then the
  // chunks' results (sums of sums, means of equal-sized means, maxima of maxima).
  int64_t chunk = 0;
  if (inner > 1 && outer * inner < 65536 && count >= 1024)
    for (int64_t c = 256; c >= 16 && chunk == 0; --c)
      if (count % c == 0) chunk = c;
  if (chunk == 0 || x.dtype() == DType::float16) {  // float16 partial results would round
    record(x, y, outer, count, inner);
  } else {
    Tensor partial =
        Tensor::empty(device, std::vector<int64_t>{outer, count / chunk, inner}, x.dtype());
    record(x, partial, outer * (count / chunk), chunk, inner);
    record(partial, y, outer, count / chunk, inner);
  }
  op_sequence.run();
  return y;
}

Tensor transpose(const Tensor& x, const std::optional<Tensor>& given) {
  require_float(x, "x");
  if (x.shape().size() != 2)
    throw ShapeError("x: expected a 2-D matrix, got shape " + shape_text(x.shape()));
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  const auto& device = x.device_ptr();
  Tensor y = output(device, given, {cols, rows}, x.dtype(), "y", {&x});
  if (y.size() == 0) return y;
  const auto grid = checked_grid(
      *device, {static_cast<uint64_t>(cols + 31) / 32, static_cast<uint64_t>(rows + 31) / 32, 1},
      "matrix of shape " + shape_text(x.shape()));
  Kernel kernel = Kernel::builtin(device, float_variant("transpose", x.dtype()));
  struct {
    uint32_t rows, cols;
  } push{static_cast<uint32_t>(rows), static_cast<uint32_t>(cols)};
  BufferBinding bindings[] = {x.binding(), y.binding()};
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  sequence.dispatch(kernel, grid, bindings, push_bytes(push));
  op_sequence.run();
  return y;
}

Tensor matmul(const Tensor& a, const Tensor& b, const std::optional<Tensor>& given) {
  require_float(a, "a");
  require_same_kind(a, "a", b, "b");
  if (a.shape().size() != 2 || b.shape().size() != 2 || a.shape()[1] != b.shape()[0])
    throw ShapeError("cannot multiply shapes " + shape_text(a.shape()) + " and " +
                     shape_text(b.shape()) + ": expected [M, K] and [K, N]");
  const int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  const auto& device = a.device_ptr();
  Tensor c = output(device, given, {m, n}, a.dtype(), "c", {&a, &b});
  if (c.size() == 0) return c;
  const auto grid = checked_grid(
      *device, {static_cast<uint64_t>(n + 63) / 64, static_cast<uint64_t>(m + 63) / 64, 1},
      "product of shape (" + std::to_string(m) + ", " + std::to_string(n) + ")");
  Kernel kernel = Kernel::builtin(device, float_variant("matmul", a.dtype()));
  struct {
    uint32_t m, n, k;
  } push{static_cast<uint32_t>(m), static_cast<uint32_t>(n), static_cast<uint32_t>(k)};
  BufferBinding bindings[] = {a.binding(), b.binding(), c.binding()};
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  sequence.dispatch(kernel, grid, bindings, push_bytes(push));
  op_sequence.run();
  return c;
}

}  // namespace bitnet::ops
