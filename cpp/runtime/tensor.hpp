#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/dtype.hpp"
#include "runtime/memory.hpp"

namespace bitnet {

class Device;

// A typed, shaped, C-contiguous array in one Vulkan buffer.
class Tensor {
 public:
  Tensor(std::shared_ptr<Allocation> allocation, std::vector<int64_t> shape, DType dtype);
  // by_op: made by an op for its result (a recording graph with reuse_memory may give it, and
  // later take, an intermediate's memory: Graph); false for tensors a caller makes and fills.
  static Tensor empty(const std::shared_ptr<Device>& device, std::span<const int64_t> shape,
                      DType dtype, Placement placement = Placement::device, bool by_op = true);
  // Wraps caller-owned host memory (VK_EXT_external_memory_host); `owner` keeps it alive.
  static Tensor import_host(const std::shared_ptr<Device>& device, void* data,
                            std::span<const int64_t> shape, DType dtype,
                            std::shared_ptr<void> owner);
  // Element count of `shape`; ShapeError for negative sizes or a count that overflows.
  static uint64_t element_count(std::span<const int64_t> shape, DType dtype);

  const std::vector<int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  uint64_t size() const { return size_; }
  uint64_t nbytes() const { return size_ * dtype_size(dtype_); }
  Placement placement() const { return allocation_->placement(); }
  bool host_visible() const { return allocation_->mapped() != nullptr; }
  std::byte* mapped_data() const { return allocation_->mapped(); }
  Device& device() const { return allocation_->device(); }
  const std::shared_ptr<Device>& device_ptr() const { return allocation_->device_ptr(); }
  const std::shared_ptr<Allocation>& allocation() const { return allocation_; }
  BufferBinding binding() const { return {allocation_, 0, nbytes()}; }
  // The same memory under another shape with as many elements (one dimension may be -1).
  Tensor reshaped(std::vector<int64_t> shape) const;

  // Host <-> tensor copies of exactly nbytes(); through a staging buffer where the memory is
  // not mapped, or (for reads) not host-cached, where reading it directly would be slow.
  void upload(const void* source, uint64_t bytes);
  void download(void* destination, uint64_t bytes) const;

 private:
  std::shared_ptr<Allocation> allocation_;
  std::vector<int64_t> shape_;
  DType dtype_;
  uint64_t size_;
};

}  // namespace bitnet
