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
  // reuse_memory: an allocation the graph's ops made while it recorded, bound by a recorded op and
  // held by nothing else any more, is handed to a later allocation of its size class while it
  // records (the later op writes over it; the sequence orders the two uses with a barrier), so a
  // graph holds about one layer's intermediates instead of every layer's. Only for graphs whose
  // every tensor an op reads is written by an earlier op of the graph, or held by the caller.
  Graph(std::shared_ptr<Device> device, Timing timing, bool reuse_memory = false);
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
  // With reuse_memory: an allocation of `size` bytes and `placement` that nothing but the recorded
  // ops holds, or null; track() registers a new allocation made while recording.
  std::shared_ptr<Allocation> reusable(uint64_t size, Placement placement);
  void track(const std::shared_ptr<Allocation>& allocation);
  // A tensor of `count` uint32 zeros that the op using it leaves zero (self-resetting counters and
  // sums): one the graph already has whose earlier users a recorded barrier has ordered before
  // this point, else a new one.
  Tensor zeroed_scratch(int64_t count);
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
  bool reuse_memory_;
  std::vector<std::weak_ptr<Allocation>> made_;  // allocations made while recording, oldest first
  struct Lent {
    Tensor tensor;
    size_t barriers;  // the sequence's barrier count when it was last lent
  };
  std::vector<Lent> zeroed_;
  std::vector<std::function<void()>> checks_;
};

}  // namespace bitnet
