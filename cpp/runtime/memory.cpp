#include "runtime/memory.hpp"

#include <bit>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/device.hpp"
#include "runtime/error.hpp"

namespace bitnet {
namespace {

constexpr VkBufferUsageFlags kBufferUsage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT |
                                            VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                            VK_BUFFER_USAGE_TRANSFER_DST_BIT;
constexpr VkMemoryPropertyFlags kPlainFlags =
    VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
    VK_MEMORY_PROPERTY_HOST_COHERENT_BIT | VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
constexpr uint64_t kMinCapacity = 256;

}  // namespace

const char* placement_name(Placement placement) {
  switch (placement) {
    case Placement::device:
      return "device";
    case Placement::host:
      return "host";
    case Placement::imported:
      return "imported";
  }
  return "?";
}

MemorySlab::~MemorySlab() {
  if (live_bytes) *live_bytes -= size;
}

MemoryPool::MemoryPool(Device& device) : device_(device) {
  VkMemoryRequirements requirements;
  create_buffer(kMinCapacity, requirements);  // a probe, destroyed at once
  buffer_type_bits_ = requirements.memoryTypeBits;
  const char* unmapped = std::getenv("BITNET_GPU_DEBUG_UNMAPPED_DEVICE_MEMORY");
  unmapped_device_memory_ = unmapped && std::strcmp(unmapped, "1") == 0;
  const char* slabs = std::getenv("BITNET_GPU_MEMORY_SLABS");
  slabs_ = !(slabs && std::strcmp(slabs, "0") == 0);
  device_type_ = choose_type(Placement::device);
  host_type_ = choose_type(Placement::host);
  if (!device_type_ || !host_type_)
    throw UnsupportedError("device '" + device_.info().name +
                           "' offers no memory type usable for storage buffers");
}

// Host-visible memory is only used when it is also coherent, so no flush or invalidate is needed.
std::optional<uint32_t> MemoryPool::choose_type(Placement placement) const {
  const auto& memory = device_.memory_properties();
  auto find = [&](VkMemoryPropertyFlags wanted) -> std::optional<uint32_t> {
    for (uint32_t i = 0; i < memory.memoryTypeCount; ++i) {
      VkMemoryPropertyFlags flags = memory.memoryTypes[i].propertyFlags;
      if ((buffer_type_bits_ & (1u << i)) && (flags & wanted) == wanted &&
          (flags & ~kPlainFlags) == 0)
        return i;
    }
    return std::nullopt;
  };
  constexpr VkMemoryPropertyFlags coherent =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  if (placement == Placement::device) {
    if (auto type = find(VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | coherent)) return type;
    if (auto type = find(VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) return type;
    return find(0);
  }
  if (auto type = find(coherent | VK_MEMORY_PROPERTY_HOST_CACHED_BIT)) return type;
  return find(coherent);
}

uint64_t MemoryPool::size_class(uint64_t size) {
  if (size <= kMinCapacity) return kMinCapacity;
  const uint64_t granule = std::max<uint64_t>(kMinCapacity, std::bit_floor(size) / 4);
  return (size + granule - 1) / granule * granule;
}

void MemoryPool::throw_out_of_memory(uint64_t size, uint32_t type_index, const char* why) const {
  const auto& memory = device_.memory_properties();
  const auto& heap = memory.memoryHeaps[memory.memoryTypes[type_index].heapIndex];
  throw OutOfMemory("out of memory on device '" + device_.info().name + "': cannot allocate " +
                    format_bytes(size) + " (" + why + "; heap size " + format_bytes(heap.size) +
                    ", in use " + format_bytes(stats().in_use_bytes) + ")");
}

MemoryHandle MemoryPool::allocate_memory(uint64_t size, uint32_t type_index, uint64_t capacity) {
  VkMemoryAllocateInfo allocate{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  allocate.allocationSize = size;
  allocate.memoryTypeIndex = type_index;
  VkDeviceMemory handle;
  VkResult result = device_.allocate_memory(allocate, &handle);
  if (result == VK_ERROR_OUT_OF_DEVICE_MEMORY || result == VK_ERROR_OUT_OF_HOST_MEMORY ||
      result == VK_ERROR_TOO_MANY_OBJECTS) {
    trim();
    result = device_.allocate_memory(allocate, &handle);
    if (result == VK_ERROR_OUT_OF_DEVICE_MEMORY || result == VK_ERROR_OUT_OF_HOST_MEMORY ||
        result == VK_ERROR_TOO_MANY_OBJECTS)
      throw_out_of_memory(capacity, type_index, result_name(result));
  }
  device_.check(result, "vkAllocateMemory");
  return MemoryHandle(device_.handle(), handle);
}

std::byte* MemoryPool::map(VkDeviceMemory memory, uint32_t type_index, Placement placement,
                           bool& host_cached) const {
  const VkMemoryPropertyFlags flags =
      device_.memory_properties().memoryTypes[type_index].propertyFlags;
  host_cached = false;
  if (!(flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) ||
      (unmapped_device_memory_ && placement == Placement::device))
    return nullptr;
  void* mapped;
  device_.check(vkMapMemory(device_.handle(), memory, 0, VK_WHOLE_SIZE, 0, &mapped), "vkMapMemory");
  host_cached = (flags & VK_MEMORY_PROPERTY_HOST_CACHED_BIT) != 0;
  return static_cast<std::byte*>(mapped);
}

// The slab of (placement, type) with room for `requirements` at the returned offset: the one being
// filled, or a new one (the old one then lives on in the blocks bound to it).
std::shared_ptr<MemorySlab> MemoryPool::slab_with_room(uint32_t type_index, Placement placement,
                                                       const VkMemoryRequirements& requirements,
                                                       uint64_t& offset) {
  const uint64_t alignment = std::max<uint64_t>(requirements.alignment, 1);
  const std::pair key{placement, type_index};
  uint64_t size = kSlabBytes;
  {
    std::lock_guard lock(slab_mutex_);
    SlabCursor& cursor = slab_cursors_[key];
    offset = (cursor.used + alignment - 1) / alignment * alignment;
    if (cursor.slab && offset + requirements.size <= cursor.slab->size) {
      cursor.used = offset + requirements.size;
      return cursor.slab;
    }
    size = std::min(kSlabMostBytes, kSlabBytes << std::min<uint32_t>(cursor.slabs, 3));
  }
  // A new slab, allocated without the lock (allocate_memory may trim(), which takes it).
  auto slab = std::make_shared<MemorySlab>();
  slab->memory = allocate_memory(size, type_index, requirements.size);
  slab->size = size;
  slab->mapped = map(slab->memory.get(), type_index, placement, slab->host_cached);
  slab->live_bytes = slab_bytes_;
  *slab_bytes_ += size;
  std::lock_guard lock(slab_mutex_);
  SlabCursor& cursor = slab_cursors_[key];
  cursor = SlabCursor{slab, requirements.size, cursor.slabs + 1};
  offset = 0;
  return slab;
}

MemoryBlock MemoryPool::create_block(uint64_t capacity, Placement placement) {
  const uint32_t type_index = placement == Placement::host ? *host_type_ : *device_type_;
  const auto& memory = device_.memory_properties();
  if (capacity > memory.memoryHeaps[memory.memoryTypes[type_index].heapIndex].size)
    throw_out_of_memory(capacity, type_index, "larger than the memory heap");
  if (capacity > device_.info().max_allocation_size)
    throw_out_of_memory(
        capacity, type_index,
        ("over maxMemoryAllocationSize " + format_bytes(device_.info().max_allocation_size))
            .c_str());

  MemoryBlock block;
  block.capacity = capacity;
  block.type_index = type_index;
  block.placement = placement;
  VkMemoryRequirements requirements;
  block.buffer = create_buffer(capacity, requirements);
  VkBuffer buffer = block.buffer.get();

  uint64_t offset = 0;
  if (slabs_ && requirements.size <= kSlabBlockMost &&
      (requirements.memoryTypeBits & (1u << type_index))) {
    try {
      block.slab = slab_with_room(type_index, placement, requirements, offset);
    } catch (const OutOfMemory&) {
      // No room for a new slab: the block may still fit in memory of its own (below).
    }
  }
  if (block.slab) {
    device_.check(vkBindBufferMemory(device_.handle(), buffer, block.slab->memory.get(), offset),
                  "vkBindBufferMemory");
    if (block.slab->mapped) block.mapped = block.slab->mapped + offset;
    block.host_cached = block.slab->host_cached;
    return block;
  }
  block.memory = allocate_memory(requirements.size, type_index, capacity);
  device_.check(vkBindBufferMemory(device_.handle(), buffer, block.memory.get(), 0),
                "vkBindBufferMemory");
  block.mapped = map(block.memory.get(), type_index, placement, block.host_cached);
  return block;
}

BufferHandle MemoryPool::create_buffer(uint64_t size, VkMemoryRequirements& requirements,
                                       const void* next) const {
  VkBufferCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  info.pNext = next;
  info.size = size;
  info.usage = kBufferUsage;
  VkBuffer buffer;
  device_.check(vkCreateBuffer(device_.handle(), &info, nullptr, &buffer), "vkCreateBuffer");
  BufferHandle handle(device_.handle(), buffer);
  vkGetBufferMemoryRequirements(device_.handle(), buffer, &requirements);
  return handle;
}

MemoryBlock MemoryPool::acquire(uint64_t size, Placement placement) {
  if (placement == Placement::imported)
    throw ArgumentError("imported memory comes from import_host, not from the pool");
  const uint64_t capacity = size_class(size);
  const uint32_t type_index = placement == Placement::host ? *host_type_ : *device_type_;
  {
    std::lock_guard lock(mutex_);
    auto found = free_blocks_.find({placement, type_index, capacity});
    if (found != free_blocks_.end() && !found->second.empty()) {
      MemoryBlock block = std::move(found->second.back());
      found->second.pop_back();
      stats_.pool_hits++;
      stats_.pooled_bytes -= capacity;
      stats_.in_use_bytes += size;
      stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
      return block;
    }
  }
  MemoryBlock block = create_block(capacity, placement);
  std::lock_guard lock(mutex_);
  stats_.pool_misses++;
  stats_.live_blocks++;
  stats_.allocated_bytes += capacity;
  stats_.in_use_bytes += size;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return block;
}

MemoryBlock MemoryPool::import_host(void* pointer, uint64_t size) {
  const uint64_t alignment = device_.info().host_import_alignment;
  if (alignment == 0 || device_.get_host_pointer_properties == nullptr)
    throw UnsupportedError("device '" + device_.info().name +
                           "' does not support VK_EXT_external_memory_host");
  if (reinterpret_cast<uintptr_t>(pointer) % alignment != 0 || size % alignment != 0)
    throw ArgumentError("host memory to import must start and end on a multiple of " +
                        std::to_string(alignment) + " bytes");
  VkMemoryHostPointerPropertiesEXT properties{VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT};
  device_.check(device_.get_host_pointer_properties(
                    device_.handle(), VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT,
                    pointer, &properties),
                "vkGetMemoryHostPointerPropertiesEXT");

  MemoryBlock block;
  block.capacity = size;
  block.placement = Placement::imported;
  VkExternalMemoryBufferCreateInfo external{VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO};
  external.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  VkMemoryRequirements requirements;
  block.buffer = create_buffer(size, requirements, &external);
  VkBuffer buffer = block.buffer.get();
  const uint32_t bits = requirements.memoryTypeBits & properties.memoryTypeBits;
  if (bits == 0) throw UnsupportedError("no memory type can import this host pointer");
  const uint32_t type_index = static_cast<uint32_t>(std::countr_zero(bits));
  block.type_index = type_index;

  VkImportMemoryHostPointerInfoEXT import{VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT};
  import.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  import.pHostPointer = pointer;
  VkMemoryAllocateInfo allocate{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  allocate.pNext = &import;
  allocate.allocationSize = size;
  allocate.memoryTypeIndex = type_index;
  VkDeviceMemory handle;
  device_.check(device_.allocate_memory(allocate, &handle), "vkAllocateMemory (host import)");
  block.memory = MemoryHandle(device_.handle(), handle);
  device_.check(vkBindBufferMemory(device_.handle(), buffer, handle, 0), "vkBindBufferMemory");
  block.mapped = static_cast<std::byte*>(pointer);
  block.host_cached = true;
  std::lock_guard lock(mutex_);
  stats_.live_blocks++;
  stats_.allocated_bytes += size;
  stats_.in_use_bytes += size;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return block;
}

void MemoryPool::release(MemoryBlock block, uint64_t size) noexcept {
  const uint64_t capacity = block.capacity;
  std::lock_guard lock(mutex_);
  stats_.in_use_bytes -= block.placement == Placement::imported ? capacity : size;
  if (block.placement != Placement::imported) {
    try {
      free_blocks_[{block.placement, block.type_index, capacity}].push_back(std::move(block));
      stats_.pooled_bytes += capacity;
      return;
    } catch (...) {
      // No host memory left to pool it (a capped process): the block is freed instead, by its
      // destructor once the lock is released. A release never throws.
    }
  }
  stats_.live_blocks--;
  stats_.allocated_bytes -= capacity;
  // An import's destructor frees it; the caller then releases the owner.
}

void MemoryPool::trim() {
  std::map<std::tuple<Placement, uint32_t, uint64_t>, std::vector<MemoryBlock>> dropped;
  std::map<std::pair<Placement, uint32_t>, SlabCursor>
      cursors;  // slabs are freed with their last block
  {
    std::lock_guard lock(slab_mutex_);
    cursors.swap(slab_cursors_);
  }
  {
    std::lock_guard lock(mutex_);
    for (auto& [key, blocks] : free_blocks_) {
      stats_.live_blocks -= blocks.size();
      stats_.allocated_bytes -= std::get<2>(key) * blocks.size();
    }
    stats_.pooled_bytes = 0;
    dropped.swap(free_blocks_);
  }
}

MemoryStats MemoryPool::stats() const {
  std::lock_guard lock(mutex_);
  MemoryStats stats = stats_;
  stats.slab_bytes = *slab_bytes_;
  return stats;
}

Allocation::Allocation(std::shared_ptr<Device> device, MemoryBlock block, uint64_t size,
                       std::shared_ptr<void> owner)
    : device_(std::move(device)), owner_(std::move(owner)), block_(std::move(block)), size_(size) {}

Allocation::~Allocation() { device_->memory_pool().release(std::move(block_), size_); }

}  // namespace bitnet
