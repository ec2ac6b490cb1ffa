#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/memory.hpp"

namespace bitnet {

class Device;

// Device-local uint32 scratch kept zero between uses, for kernels whose last workgroup resets what
// they counted (self-resetting counters): a call then records no fill of its own. A block is
// zeroed once, when made, and lent to one holder at a time: it comes back when the last reference
// to what lend() returned goes, which the ops that bound it hold until their command buffer has
// run (or was dropped unrun). A graph keeps scratch of its own (Graph::zeroed_scratch).
class ScratchPool {
 public:
  // Blocks the pool keeps at most, in all; past it a caller makes and fills its own.
  static constexpr uint64_t kMostBytes = 64ull << 20;

  explicit ScratchPool(Device& device) : device_(device) {}
  ~ScratchPool();
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;

  // A zero block of at least `bytes` that keeps the device alive while lent, or null where none
  // is free and a new one would take the pool past kMostBytes.
  std::shared_ptr<Allocation> lend(uint64_t bytes);
  // Frees the blocks not lent (Device::trim).
  void trim();
  uint64_t pooled_bytes() const;

 private:
  struct Entry {
    std::unique_ptr<Allocation> allocation;
    bool lent = false;
  };
  struct Lease;
  void give_back(Entry* entry);

  Device& device_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Entry>> entries_;
  uint64_t bytes_ = 0;
};

}  // namespace bitnet
