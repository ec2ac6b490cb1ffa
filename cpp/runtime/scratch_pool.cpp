#include "runtime/scratch_pool.hpp"

#include <algorithm>
#include <bit>

#include "runtime/device.hpp"
#include "runtime/sequence.hpp"

namespace bitnet {

// What a lent block's references share: the device kept alive, and the block given back when the
// last of them goes (before the device reference, which may be the device's last).
struct ScratchPool::Lease {
  Lease(std::shared_ptr<Device> device, ScratchPool* pool, Entry* entry)
      : device(std::move(device)), pool(pool), entry(entry) {}
  ~Lease() { pool->give_back(entry); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  std::shared_ptr<Device> device;
  ScratchPool* pool;
  Entry* entry;
};

ScratchPool::~ScratchPool() = default;

std::shared_ptr<Allocation> ScratchPool::lend(uint64_t bytes) {
  auto lent = [this](Entry* entry) {
    entry->lent = true;
    return std::shared_ptr<Allocation>(
        std::make_shared<Lease>(device_.shared_from_this(), this, entry), entry->allocation.get());
  };
  // Sizes in powers of two from 4 KiB, so that calls of nearby shapes share blocks.
  const uint64_t size = std::bit_ceil(std::max<uint64_t>(bytes, 4096));
  {
    std::lock_guard lock(mutex_);
    Entry* best = nullptr;
    for (const auto& entry : entries_)
      if (!entry->lent && entry->allocation->size() >= bytes &&
          (!best || entry->allocation->size() < best->allocation->size()))
        best = entry.get();
    if (best) return lent(best);
    if (bytes_ + size > kMostBytes) return nullptr;
    bytes_ += size;  // taken now; the block is made and zeroed without the lock
  }
  std::unique_ptr<Allocation> allocation;
  try {
    // The pool's own blocks do not hold the device (it owns them: that would keep it alive for
    // ever); a lease does, while the block is lent.
    const std::shared_ptr<Device> unowned(std::shared_ptr<Device>(), &device_);
    allocation = std::make_unique<Allocation>(
        unowned, device_.memory_pool().acquire(size, Placement::device), size);
    Sequence sequence(device_.shared_from_this(), Timing::off);
    sequence.fill({std::shared_ptr<Allocation>(unowned, allocation.get()), 0, size}, 0u);
    sequence.run();
  } catch (...) {
    std::lock_guard lock(mutex_);
    bytes_ -= size;
    throw;
  }
  std::lock_guard lock(mutex_);
  entries_.push_back(std::make_unique<Entry>(Entry{std::move(allocation), false}));
  return lent(entries_.back().get());
}

void ScratchPool::give_back(Entry* entry) {
  std::lock_guard lock(mutex_);
  entry->lent = false;
}

void ScratchPool::trim() {
  std::lock_guard lock(mutex_);
  std::erase_if(entries_, [this](const std::unique_ptr<Entry>& entry) {
    if (entry->lent) return false;
    bytes_ -= entry->allocation->size();
    return true;
  });
}

uint64_t ScratchPool::pooled_bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace bitnet
