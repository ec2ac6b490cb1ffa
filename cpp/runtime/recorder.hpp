#pragma once
#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>

#include "runtime/memory.hpp"
#include "runtime/sequence.hpp"

namespace bitnet {

class Device;
class Graph;
class Kernel;

// The one place that decides where a dispatch goes: the sequence this thread activated on the
// device (only for a user's kernel: see Joins), else the graph this thread is recording on it,
// else a sequence of the recorder's own, which run() submits and waits for.
class Recorder {
 public:
  // Whether a sequence the user activated takes the dispatches. A Kernel's dispatch joins it; the
  // built-in ops run at once inside one, since their checks (NaN counts) need their results.
  enum class Joins : bool { graph_only, active_sequence };

  explicit Recorder(const std::shared_ptr<Device>& device, Joins joins = Joins::graph_only);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  Sequence& sequence() { return *sequence_; }
  bool in_graph() const { return graph_ != nullptr; }
  // Runs the recorder's own sequence, then `check`; in a graph `check` runs after every replay
  // instead, and in an active sequence the caller's submission runs it all (no check).
  void run(std::function<void()> check = {});

 private:
  Graph* graph_ = nullptr;
  Sequence* sequence_ = nullptr;
  std::optional<Sequence> own_;
  size_t ops_before_ = 0;
  bool ran_ = false;
};

// A user's kernel over `bindings`: recorded where Recorder(Joins::active_sequence) says, or run
// now and waited for.
void dispatch(const Kernel& kernel, std::array<uint32_t, 3> groups,
              std::span<const BufferBinding> bindings,
              std::span<const std::byte> push_constants = {});

}  // namespace bitnet
