#include "ops/dispatch.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/graph.hpp"
#include "runtime/sequence.hpp"

namespace bitnet::ops {

std::vector<RowRange> row_ranges(const Device& device, uint64_t rows,
                                 std::initializer_list<uint64_t> row_bytes) {
  const uint64_t limit = device.limits().maxStorageBufferRange;
  const uint64_t align = std::max<uint64_t>(1, device.limits().minStorageBufferOffsetAlignment);
  uint64_t step = 1, most = rows;
  for (uint64_t bytes : row_bytes) {
    if (bytes == 0) continue;
    step = std::lcm(step, align / std::gcd(align, bytes));
    most = std::min(most, limit / bytes);
  }
  if (most >= rows) return {{0, rows}};
  const uint64_t chunk = most / step * step;
  if (chunk == 0)
    throw UnsupportedError(
        "one row of this tensor is larger than this device's "
        "maxStorageBufferRange of " +
        format_bytes(limit));
  std::vector<RowRange> ranges;
  for (uint64_t first = 0; first < rows; first += chunk)
    ranges.push_back({first, std::min(chunk, rows - first)});
  return ranges;
}

BufferBinding rows_of(const Tensor& tensor, const RowRange& range, uint64_t row_bytes) {
  const uint64_t offset = range.first * row_bytes;
  const uint64_t size =
      std::min(range.count * row_bytes, tensor.nbytes() - std::min(offset, tensor.nbytes()));
  return {tensor.allocation(), offset, size};
}

uint32_t workgroups(const Device& device, uint64_t invocations, uint32_t local_size) {
  const uint64_t needed = (invocations + local_size - 1) / local_size;
  return static_cast<uint32_t>(
      std::clamp<uint64_t>(needed, 1, device.limits().maxComputeWorkGroupCount[0]));
}

bool guards_loop_passes(const Device& device) {
  return device.info().driver_id == VK_DRIVER_ID_MESA_LLVMPIPE;
}

std::array<uint32_t, 3> checked_grid(const Device& device, std::array<uint64_t, 3> groups,
                                     const std::string& what) {
  std::array<uint32_t, 3> grid{};
  for (int axis = 0; axis < 3; ++axis) {
    if (groups[axis] > device.limits().maxComputeWorkGroupCount[axis])
      throw UnsupportedError(what + " is over this device's workgroup-count limits");
    grid[axis] = static_cast<uint32_t>(groups[axis]);
  }
  return grid;
}

uint32_t subgroups_in(const Device& device, uint32_t local_size) {
  return std::max<uint32_t>(1, local_size / std::max<uint32_t>(1, device.info().subgroup_size));
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

void require_float(const Tensor& t, const char* name) {
  if (t.dtype() != DType::float32 && t.dtype() != DType::float16)
    throw DTypeError(std::string(name) + ": expected float32 or float16, got " +
                     std::string(dtype_name(t.dtype())));
}

Tensor output(const std::shared_ptr<Device>& device, const std::optional<Tensor>& given,
              const std::vector<int64_t>& shape, DType dtype, const char* name,
              std::initializer_list<const Tensor*> inputs) {
  if (!given) return Tensor::empty(device, shape, dtype);
  const std::string label = std::string("out (") + name + ")";
  if (given->device_ptr() != device)
    throw ArgumentError(label + ": the tensor lives on another device");
  if (given->dtype() != dtype)
    throw DTypeError(label + ": expected " + std::string(dtype_name(dtype)) + ", got " +
                     std::string(dtype_name(given->dtype())));
  if (given->shape() != shape)
    throw ShapeError(label + ": expected shape " + shape_text(shape) + ", got " +
                     shape_text(given->shape()));
  for (const Tensor* input : inputs)
    if (input && input->allocation() == given->allocation())
      throw ArgumentError(label + ": shares memory with an input; pass a separate tensor");
  return *given;
}

void require_same_kind(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  if (a.dtype() != b.dtype())
    throw DTypeError(std::string(a_name) + " and " + b_name + " must have one dtype, got " +
                     std::string(dtype_name(a.dtype())) + " and " +
                     std::string(dtype_name(b.dtype())));
  if (&a.device() != &b.device())
    throw ArgumentError(std::string(a_name) + " and " + b_name + " must live on one device");
}

std::string float_variant(const char* base, DType dtype) {
  return std::string(base) + (dtype == DType::float16 ? "_f16" : "_f32");
}

void require_keys_values(const Tensor& q, const Tensor& k, const char* k_name, const Tensor& v,
                         const char* v_name) {
  require_same_kind(k, k_name, v, v_name);
  if (k.dtype() != q.dtype() && !(q.dtype() == DType::float32 && k.dtype() == DType::float16))
    throw DTypeError(std::string(k_name) + " and " + v_name + ": expected " +
                     std::string(dtype_name(q.dtype())) +
                     (q.dtype() == DType::float32 ? " or float16" : "") + " beside " +
                     std::string(dtype_name(q.dtype())) + " q, got " +
                     std::string(dtype_name(k.dtype())));
  if (&k.device() != &q.device())
    throw ArgumentError(std::string("q and ") + k_name + " must live on one device");
}

std::string attention_variant(const char* base, DType q, DType kv) {
  if (q == DType::float32 && kv == DType::float16) return std::string(base) + "_f32_kv16";
  return float_variant(base, q);
}

Tensor zeroed_counter(const std::shared_ptr<Device>& device) {
  // Not an op's result (Tensor::empty's by_op): its contents come from the host.
  Tensor tensor =
      Tensor::empty(device, std::vector<int64_t>{1}, DType::uint32, Placement::host, false);
  std::memset(tensor.mapped_data(), 0, sizeof(uint32_t));  // host-coherent memory: no flush
  if (Graph* graph = device->recording_graph()) graph->zero_before_replay(tensor);
  return tensor;
}

Tensor self_resetting_counters(Sequence& sequence, int64_t count) {
  const auto& device = sequence.device();
  // In a graph, ones an earlier op left zero where a barrier has ordered that op before this one.
  if (Graph* graph = device->recording_graph()) return graph->zeroed_scratch(count);
  const auto bytes = static_cast<uint64_t>(count) * sizeof(uint32_t);
  if (auto lent = device->scratch_pool().lend(bytes))
    return Tensor(std::move(lent), std::vector<int64_t>{count}, DType::uint32);
  Tensor counters = Tensor::empty(device, std::vector<int64_t>{count}, DType::uint32);
  sequence.fill(counters.binding(), 0u);
  return counters;
}

uint32_t read_counter(const Tensor& counter) {
  uint32_t value = 0;
  if (counter.host_visible())
    std::memcpy(&value, counter.mapped_data(), sizeof value);  // 4 bytes: no staging copy
  else
    counter.download(&value, sizeof value);
  return value;
}

void raise_if_nonfinite(const Tensor& counter, const char* name) {
  if (uint32_t found = read_counter(counter))
    throw ArgumentError(std::string(name) + " contains " + std::to_string(found) +
                        " NaN or Inf value" + (found == 1 ? "" : "s"));
}

}  // namespace bitnet::ops
