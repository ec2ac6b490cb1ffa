#pragma once
#include <vulkan/vulkan.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/handle.hpp"

namespace bitnet {

class Device;

// Where a tensor's memory lives. `device`: device-local (also mapped where the device offers a
// device-local host-visible type); `host`: host-visible, preferably host-cached (for results the
// CPU reads); `imported`: the caller's own host memory through VK_EXT_external_memory_host.
enum class Placement : uint8_t { device, host, imported };

const char* placement_name(Placement placement);

// One VkBuffer with its own VkDeviceMemory, mapped where the memory type is host-visible.
struct MemoryBlock {
  BufferHandle buffer;
  MemoryHandle memory;
  std::byte* mapped = nullptr;
  uint64_t capacity = 0;
  uint32_t type_index = 0;
  Placement placement = Placement::device;
  bool host_cached = false;
};

struct MemoryStats {
  uint64_t allocated_bytes = 0;    // Vulkan memory held: in use plus pooled
  uint64_t in_use_bytes = 0;       // bytes of live tensors (as requested)
  uint64_t peak_in_use_bytes = 0;
  uint64_t pooled_bytes = 0;       // capacity of free blocks kept for reuse
  uint64_t pool_hits = 0;
  uint64_t pool_misses = 0;
  uint64_t live_blocks = 0;        // VkDeviceMemory objects alive
};

// Hands out MemoryBlocks and recycles them by size class. Each tensor gets a whole VkBuffer of its
// own (so a kernel binds it with offset 0 and the storage-buffer range limit applies per tensor);
// freed blocks wait on a free list keyed by (placement, memory type, capacity), and capacities are rounded up
// to four classes per power of two, so a loop of kernel calls reuses blocks instead of calling
// vkAllocateMemory, while at most 25% of a block is slack. trim() gives the free blocks back.
class MemoryPool {
 public:
  explicit MemoryPool(Device& device);
  MemoryBlock acquire(uint64_t size, Placement placement);
  MemoryBlock import_host(void* pointer, uint64_t size);
  void release(MemoryBlock block, uint64_t size);
  void trim();
  MemoryStats stats() const;
  static uint64_t size_class(uint64_t size);

 private:
  MemoryBlock create_block(uint64_t capacity, Placement placement);
  std::optional<uint32_t> choose_type(Placement placement) const;
  [[noreturn]] void throw_out_of_memory(uint64_t size, uint32_t type_index, const char* why) const;

  Device& device_;
  uint32_t buffer_type_bits_ = 0;
  std::optional<uint32_t> device_type_, host_type_;
  // BITNET_GPU_DEBUG_UNMAPPED_DEVICE_MEMORY=1: leave device placements unmapped, so devices whose
  // memory is all host-visible (lavapipe) exercise the staging and device-only paths too.
  bool unmapped_device_memory_ = false;
  mutable std::mutex mutex_;
  std::map<std::tuple<Placement, uint32_t, uint64_t>, std::vector<MemoryBlock>> free_blocks_;
  MemoryStats stats_;
};

// The memory behind one tensor. Returned to the pool (or, when imported, freed before the
// memory's owner is released) when the last reference goes.
class Allocation {
 public:
  Allocation(std::shared_ptr<Device> device, MemoryBlock block, uint64_t size,
             std::shared_ptr<void> owner = nullptr);
  ~Allocation();
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  VkBuffer buffer() const { return block_.buffer.get(); }
  uint64_t size() const { return size_; }
  uint64_t capacity() const { return block_.capacity; }
  std::byte* mapped() const { return block_.mapped; }
  bool host_cached() const { return block_.host_cached; }
  Placement placement() const { return block_.placement; }
  Device& device() const { return *device_; }
  const std::shared_ptr<Device>& device_ptr() const { return device_; }

 private:
  std::shared_ptr<Device> device_;
  std::shared_ptr<void> owner_;  // declared before block_: released after the block is freed
  MemoryBlock block_;
  uint64_t size_;
};

// A range of an allocation as a kernel or copy sees it.
struct BufferBinding {
  std::shared_ptr<Allocation> allocation;
  uint64_t offset = 0;
  uint64_t size = 0;
};

}  // namespace bitnet
