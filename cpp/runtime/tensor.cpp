#include "runtime/tensor.hpp"

#include <cstring>
#include <limits>
#include <string>

#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/sequence.hpp"

namespace bitnet {

uint64_t Tensor::element_count(std::span<const int64_t> shape, DType dtype) {
  uint64_t count = 1;
  const uint64_t limit = std::numeric_limits<int64_t>::max() / dtype_size(dtype);
  for (int64_t dim : shape) {
    if (dim < 0) throw ShapeError("negative dimension " + std::to_string(dim) + " in shape");
    if (dim != 0 && count > limit / static_cast<uint64_t>(dim))
      throw ShapeError("shape has more elements than fit in memory");
    count *= static_cast<uint64_t>(dim);
  }
  return count;
}

Tensor::Tensor(std::shared_ptr<Allocation> allocation, std::vector<int64_t> shape, DType dtype)
    : allocation_(std::move(allocation)),
      shape_(std::move(shape)),
      dtype_(dtype),
      size_(element_count(shape_, dtype)) {
  if (nbytes() > allocation_->capacity())
    throw ShapeError("tensor of " + std::to_string(nbytes()) + " bytes in an allocation of " +
                     std::to_string(allocation_->capacity()));
}

Tensor Tensor::empty(const std::shared_ptr<Device>& device, std::span<const int64_t> shape,
                     DType dtype, Placement placement, bool by_op) {
  const uint64_t bytes = element_count(shape, dtype) * dtype_size(dtype);
  return Tensor(device->allocate(bytes, placement, by_op), {shape.begin(), shape.end()}, dtype);
}

Tensor Tensor::import_host(const std::shared_ptr<Device>& device, void* data,
                           std::span<const int64_t> shape, DType dtype,
                           std::shared_ptr<void> owner) {
  const uint64_t bytes = element_count(shape, dtype) * dtype_size(dtype);
  const uint64_t alignment = device->info().host_import_alignment;
  if (alignment == 0)
    throw UnsupportedError("device '" + device->info().name +
                           "' does not support VK_EXT_external_memory_host (zero-copy import)");
  // The import covers whole alignment units; the tensor itself never touches the tail.
  const uint64_t imported =
      std::max<uint64_t>(alignment, (bytes + alignment - 1) / alignment * alignment);
  return Tensor(device->import_host_memory(data, imported, std::move(owner)),
                {shape.begin(), shape.end()}, dtype);
}

void Tensor::upload(const void* source, uint64_t bytes) {
  if (bytes != nbytes())
    throw ShapeError("upload of " + std::to_string(bytes) + " bytes into a tensor of " +
                     std::to_string(nbytes()) + " bytes");
  if (bytes == 0) return;
  device().ensure_usable();
  allocation_->mark_host_data();
  if (host_visible()) {
    std::memcpy(mapped_data(), source, bytes);
    return;
  }
  auto staging = device().allocate(bytes, Placement::host);
  std::memcpy(staging->mapped(), source, bytes);
  Sequence sequence(device_ptr(), Timing::off);
  sequence.copy({staging, 0, bytes}, binding());
  sequence.run();
}

void Tensor::download(void* destination, uint64_t bytes) const {
  if (bytes != nbytes())
    throw ShapeError("download of a tensor of " + std::to_string(nbytes()) + " bytes into " +
                     std::to_string(bytes) + " bytes");
  if (bytes == 0) return;
  device().ensure_usable();
  if (host_visible() && allocation_->host_cached()) {
    std::memcpy(destination, mapped_data(), bytes);
    return;
  }
  auto staging = device().allocate(bytes, Placement::host);
  Sequence sequence(device_ptr(), Timing::off);
  sequence.copy(binding(), {staging, 0, bytes});
  sequence.run();
  std::memcpy(destination, staging->mapped(), bytes);
}

Tensor Tensor::reshaped(std::vector<int64_t> shape) const {
  int64_t known = 1, unknown = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (unknown >= 0) throw ShapeError("reshape: only one dimension can be -1");
      unknown = static_cast<int64_t>(i);
    } else if (shape[i] < 0) {
      throw ShapeError("reshape: negative dimension " + std::to_string(shape[i]));
    } else {
      known *= shape[i];
    }
  }
  const auto count = static_cast<int64_t>(size_);
  if (unknown >= 0) {
    if (known == 0 || count % known != 0)
      throw ShapeError("cannot reshape a tensor of " + std::to_string(count) +
                       " elements with a -1 dimension");
    shape[static_cast<size_t>(unknown)] = count / known;
  }
  if (static_cast<uint64_t>(element_count(shape, dtype_)) != size_) {
    std::string text;
    for (int64_t d : shape) text += (text.empty() ? "" : ", ") + std::to_string(d);
    throw ShapeError("cannot reshape a tensor of " + std::to_string(count) +
                     " elements into shape (" + text + ")");
  }
  return Tensor(allocation_, std::move(shape), dtype_);
}

}  // namespace bitnet
