#include "runtime/graph.hpp"

#include <cstring>

#include "runtime/device.hpp"
#include "runtime/error.hpp"

namespace bitnet {

// Allocations smaller than this are not reused: a decode step's intermediates are a few KiB, and
// reusing them would add barriers between ops that run side by side for a saving of kilobytes.
constexpr uint64_t kReusedFrom = 256 * 1024;

Graph::Graph(std::shared_ptr<Device> device, Timing timing, bool reuse_memory)
    : sequence_(std::move(device), timing, Reuse::replay), reuse_memory_(reuse_memory) {}

Graph::~Graph() {
  if (recording_) device()->pop_recording_graph(this);
}

void Graph::begin() {
  if (closed()) throw ArgumentError("this graph is already recorded; record a new one");
  if (recording_) throw ArgumentError("this graph is already recording");
  device()->push_recording_graph(this);
  recording_ = true;
}

void Graph::end() {
  if (!recording_) throw ArgumentError("this graph is not recording");
  device()->pop_recording_graph(this);
  recording_ = false;
  made_.clear();
  sequence_.close();
}

void Graph::zero_before_replay(const Tensor& counter) { counters_.push_back(counter); }

std::shared_ptr<Allocation> Graph::reusable(uint64_t size, Placement placement) {
  if (!reuse_memory_ || !recording_ || size < kReusedFrom) return nullptr;
  const uint64_t capacity = MemoryPool::size_class(size);
  for (auto it = made_.begin(); it != made_.end(); ++it) {
    std::shared_ptr<Allocation> allocation = it->lock();
    // Held by nothing but the recorded ops (the sequence's reference and this one).
    if (!allocation || allocation.use_count() != 2 || !sequence_.keeps(allocation.get()) ||
        allocation->holds_host_data() || allocation->placement() != placement ||
        allocation->capacity() != capacity)
      continue;
    made_.erase(it);
    made_.push_back(allocation);  // in use again: the last to be handed out next
    return allocation;
  }
  return nullptr;
}

void Graph::track(const std::shared_ptr<Allocation>& allocation) {
  if (reuse_memory_ && recording_ && allocation->size() >= kReusedFrom) made_.push_back(allocation);
}

Tensor Graph::zeroed_scratch(int64_t count) {
  const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(uint32_t);
  Lent* best = nullptr;
  // Sharing is always right (the op that takes it writes it, so the sequence puts a barrier
  // after the last op that used it where one is needed); these are the ones that need none: not
  // lent since the last barrier, and not used since it.
  for (Lent& lent : zeroed_)
    if (lent.barriers < sequence_.barrier_count() &&
        !sequence_.pending(lent.tensor.allocation()->buffer()) && lent.tensor.nbytes() >= bytes &&
        (!best || lent.tensor.nbytes() < best->tensor.nbytes()))
      best = &lent;
  if (!best) {
    Tensor tensor = Tensor::empty(device(), std::vector<int64_t>{count}, DType::uint32,
                                  Placement::device, false);
    const std::vector<uint32_t> zeros(static_cast<size_t>(count), 0u);
    tensor.upload(zeros.data(), tensor.nbytes());
    zeroed_.push_back({std::move(tensor), 0});
    best = &zeroed_.back();
  }
  best->barriers = sequence_.barrier_count();
  return Tensor(best->tensor.allocation(), {count}, DType::uint32);
}

void Graph::check_after_replay(std::function<void()> check) { checks_.push_back(std::move(check)); }

void Graph::spoil(const std::string& why) {
  if (spoiled_.empty()) spoiled_ = why;
}

void Graph::replay() {
  std::lock_guard lock(mutex_);
  if (!spoiled_.empty())
    throw ArgumentError("this graph cannot be replayed: an op failed while it was recorded (" +
                        spoiled_ + "); record it again");
  if (!closed()) throw ArgumentError("a graph replays once its recording has ended");
  for (const Tensor& counter : counters_)
    std::memset(counter.mapped_data(), 0, sizeof(uint32_t));  // host-coherent: no flush needed
  sequence_.replay();
  for (const auto& check : checks_) check();
}

std::vector<OpTiming> Graph::timings() {
  std::lock_guard lock(mutex_);
  return sequence_.timings();
}

}  // namespace bitnet
