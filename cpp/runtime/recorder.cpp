#include "runtime/recorder.hpp"

#include <utility>

#include "runtime/device.hpp"
#include "runtime/graph.hpp"
#include "runtime/kernel.hpp"

namespace bitnet {

Recorder::Recorder(const std::shared_ptr<Device>& device, Joins joins) {
  if (joins == Joins::active_sequence) sequence_ = device->active_sequence();
  if (!sequence_) {
    graph_ = device->recording_graph();
    if (graph_) {
      sequence_ = &graph_->sequence();
      ops_before_ = graph_->op_count();
    } else {
      own_.emplace(device, Timing::off);
      sequence_ = &*own_;
    }
  }
}

Recorder::~Recorder() {
  // An op that raised after recording part of its work leaves the graph unusable.
  if (graph_ && !ran_ && graph_->op_count() != ops_before_)
    graph_->spoil("an op raised after recording part of its work");
}

void Recorder::run(std::function<void()> check) {
  ran_ = true;
  if (graph_) {
    if (check) graph_->check_after_replay(std::move(check));
    return;
  }
  if (!own_) return;  // the active sequence's submission runs it
  own_->run();
  if (check) check();
}

void dispatch(const Kernel& kernel, std::array<uint32_t, 3> groups,
              std::span<const BufferBinding> bindings, std::span<const std::byte> push_constants) {
  Recorder recorder(kernel.device(), Recorder::Joins::active_sequence);
  recorder.sequence().dispatch(kernel, groups, bindings, push_constants);
  recorder.run();
}

}  // namespace bitnet
