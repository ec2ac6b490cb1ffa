#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/sequence.hpp"
#include "runtime/tensor.hpp"

namespace bitnet {

class Device;

// A recorded graph of ops: while it records (begin() .. end()), every built-in op and kernel call
// on this thread and device records into its one command buffer instead of running; replay()
// then submits that command buffer again, with whatever the input tensors hold now, and waits.
// Tensors the ops allocated while recording live as long as the graph. Checks an op makes after
// running (NaN/Inf counts) run after every replay, with their counters zeroed before it.
class Graph {
 public:
  Graph(std::shared_ptr<Device> device, Timing timing);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void begin();
  void end();
  bool recording() const { return recording_; }
  bool closed() const { return sequence_.closed(); }

  Sequence& sequence() { return sequence_; }
  const std::shared_ptr<Device>& device() const { return sequence_.device(); }
  size_t op_count() const { return sequence_.op_count(); }

  // For the ops that record into it.
  void zero_before_replay(const Tensor& counter);
  void check_after_replay(std::function<void()> check);
  // An op failed halfway through recording: the graph can no longer be replayed.
  void spoil(const std::string& why);

  void replay();
  std::vector<OpTiming> timings();

 private:
  Sequence sequence_;
  std::mutex mutex_;
  bool recording_ = false;
  std::string spoiled_;
  std::vector<Tensor> counters_;
  std::vector<std::function<void()>> checks_;
};

}  // namespace bitnet
