#pragma once
#include <vulkan/vulkan.h>

#include <atomic>
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

// One VkDeviceMemory that small blocks are carved from (MemoryPool), mapped where host-visible;
// freed when the last block bound to it is.
struct MemorySlab {
  MemoryHandle memory;
  std::byte* mapped = nullptr;
  bool host_cached = false;
  uint64_t size = 0;
  std::shared_ptr<std::atomic<uint64_t>> live_bytes;  // the pool's count of slab bytes alive
  MemorySlab() = default;
  MemorySlab(const MemorySlab&) = delete;
  MemorySlab& operator=(const MemorySlab&) = delete;
  ~MemorySlab();
};

// One VkBuffer with its own VkDeviceMemory, or (small blocks) bound to a range of a shared slab;
// mapped where the memory type is host-visible.
struct MemoryBlock {
  // Declared before the buffer, so the buffer is destroyed before the memory it is bound to.
  MemoryHandle memory;  // empty for a block in a slab
  std::shared_ptr<MemorySlab> slab;
  BufferHandle buffer;
  std::byte* mapped = nullptr;
  uint64_t capacity = 0;
  uint32_t type_index = 0;
  Placement placement = Placement::device;
  bool host_cached = false;
};

struct MemoryStats {
  uint64_t allocated_bytes = 0;  // Vulkan memory held: in use plus pooled
  uint64_t in_use_bytes = 0;     // bytes of live tensors (as requested)
  uint64_t peak_in_use_bytes = 0;
  uint64_t pooled_bytes = 0;  // capacity of free blocks kept for reuse
  uint64_t pool_hits = 0;
  uint64_t pool_misses = 0;
  uint64_t live_blocks = 0;  // blocks alive (a VkBuffer each), in use or pooled
  uint64_t slab_bytes = 0;   // VkDeviceMemory of the slabs that small blocks share
};

// Hands out MemoryBlocks and recycles them by size class. Each tensor gets a whole VkBuffer of its
// own (so a kernel binds it with offset 0 and the storage-buffer range limit applies per tensor);
// freed blocks wait on a free list keyed by (placement, memory type, capacity), and capacities are
// rounded up to four classes per power of two, so a loop of kernel calls reuses blocks instead of
// calling vkAllocateMemory, while at most 25% of a block is slack. Blocks of up to kSlabBlockMost
// bytes are bound to consecutive ranges of shared slabs (one vkAllocateMemory and one map for many:
// a recorded graph holds hundreds of intermediates, and drivers limit the number of allocations;
// BITNET_GPU_MEMORY_SLABS=0 gives every block its own). A memory type's first slab since the last
// trim() takes kSlabBytes, each next one twice the one before, up to kSlabMostBytes, so a few small
// tensors hold little. trim() gives the free blocks back, and with them every slab no live block is
// bound to.
class MemoryPool {
 public:
  explicit MemoryPool(Device& device);
  MemoryBlock acquire(uint64_t size, Placement placement);
  MemoryBlock import_host(void* pointer, uint64_t size);
  void release(MemoryBlock block, uint64_t size) noexcept;
  void trim();
  MemoryStats stats() const;
  static uint64_t size_class(uint64_t size);

 private:
  MemoryBlock create_block(uint64_t capacity, Placement placement);
  // A storage buffer of `size` bytes, its memory not bound yet, and what memory it needs; `next`
  // is chained into its create info (external memory).
  BufferHandle create_buffer(uint64_t size, VkMemoryRequirements& requirements,
                             const void* next = nullptr) const;
  // vkAllocateMemory, retried once after trim() where the driver is out of memory or objects.
  MemoryHandle allocate_memory(uint64_t size, uint32_t type_index, uint64_t capacity);
  // Maps `memory` (of type type_index) where its type is host-visible (and not kept unmapped for
  // debugging).
  std::byte* map(VkDeviceMemory memory, uint32_t type_index, Placement placement,
                 bool& host_cached) const;
  std::shared_ptr<MemorySlab> slab_with_room(uint32_t type_index, Placement placement,
                                             const VkMemoryRequirements& requirements,
                                             uint64_t& offset);
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
  bool slabs_ = true;
  struct SlabCursor {
    std::shared_ptr<MemorySlab> slab;
    uint64_t used = 0;
    uint32_t slabs = 0;  // made since the last trim(): the next one's size
  };
  std::mutex slab_mutex_;
  std::map<std::pair<Placement, uint32_t>, SlabCursor> slab_cursors_;  // the slab being filled
  std::shared_ptr<std::atomic<uint64_t>> slab_bytes_ = std::make_shared<std::atomic<uint64_t>>(0);
};

constexpr uint64_t kSlabBytes = uint64_t{8} << 20;
constexpr uint64_t kSlabMostBytes = uint64_t{64} << 20;
constexpr uint64_t kSlabBlockMost = uint64_t{4} << 20;

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
  // Whether the host wrote into it (an upload): a recording graph never hands it to another op.
  bool holds_host_data() const { return holds_host_data_; }
  void mark_host_data() { holds_host_data_ = true; }

 private:
  std::shared_ptr<Device> device_;
  bool holds_host_data_ = false;
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
