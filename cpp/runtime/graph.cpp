#include "runtime/graph.hpp"

#include <cstring>

#include "runtime/device.hpp"
#include "runtime/error.hpp"

namespace bitnet {

Graph::Graph(std::shared_ptr<Device> device, Timing timing)
    : sequence_(std::move(device), timing, Reuse::replay) {}

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
  sequence_.close();
}

void Graph::zero_before_replay(const Tensor& counter) { counters_.push_back(counter); }

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
