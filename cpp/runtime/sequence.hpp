#pragma once
#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "runtime/memory.hpp"
#include "runtime/pointer_set.hpp"

namespace bitnet {

class Device;
class Kernel;
struct CommandContext;

// What a sequence measures with timestamp queries: nothing, each op, or only the whole sequence
// (two timestamps, so ops still overlap as they would untimed).
enum class Timing : uint8_t { off, per_op, total };

struct OpTiming {
  std::string label;
  double seconds = 0.0;
};

// Whether a sequence's command buffer is submitted once, or closed and then replayed any number
// of times (a Graph).
enum class Reuse : uint8_t { once, replay };

// The timestamps a finished command buffer wrote, as per-op (or whole-sequence) times.
std::vector<OpTiming> read_timings(Device& device, CommandContext& context,
                                   const std::vector<std::string>& labels, Timing timing);

// A recorded command buffer in flight. Waiting is the only way to observe completion; the
// buffers and pipelines it uses stay alive until then.
class Submission {
 public:
  Submission(std::shared_ptr<Device> device, std::unique_ptr<CommandContext> context,
             std::vector<std::string> labels, Timing timing);
  ~Submission();
  Submission(const Submission&) = delete;
  Submission& operator=(const Submission&) = delete;

  void wait();
  bool done();
  std::vector<OpTiming> timings();

 private:
  void finish_locked();
  std::shared_ptr<Device> device_;
  std::mutex mutex_;
  std::unique_ptr<CommandContext> context_;
  std::vector<std::string> labels_;
  Timing timing_;
  bool finished_ = false;
  std::vector<OpTiming> timings_;
};

// Records dispatches, copies and fills into one command buffer. Barriers come from the data:
// an op waits for an earlier one only when it reads what that op wrote (RAW), writes what it
// wrote (WAW) or writes what it read (WAR); independent ops may overlap on the GPU.
class Sequence {
 public:
  Sequence(std::shared_ptr<Device> device, Timing timing, Reuse reuse = Reuse::once);
  ~Sequence();
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  void dispatch(const Kernel& kernel, std::array<uint32_t, 3> groups,
                std::span<const BufferBinding> bindings, std::span<const std::byte> push_constants);
  void copy(const BufferBinding& source, const BufferBinding& destination);
  void fill(const BufferBinding& destination, uint32_t word);

  std::shared_ptr<Submission> submit();
  void run();  // submit and wait
  // Drops what was recorded; the sequence can record no more.
  void discard();
  // Timings of the submission, or of the last replay.
  std::vector<OpTiming> timings();

  // Reuse::replay only: close() ends recording; replay() then submits the recorded commands again
  // and waits for them, as often as wanted.
  void close();
  void replay();
  bool closed() const { return closed_; }

  size_t op_count() const { return labels_.size(); }
  // Names the last recorded op in the timings, where code that other ops share recorded it (the
  // screened head's int8 matmul is a BitLinear kernel).
  void name_last_op(std::string label);
  size_t barrier_count() const { return barriers_; }
  bool timings_enabled() const { return timing_ != Timing::off; }
  bool submitted() const { return submission_ != nullptr; }
  const std::shared_ptr<Device>& device() const { return device_; }

  // Whether a recorded op holds `object` alive (a binding's allocation, a pipeline).
  bool keeps(const void* object) const { return kept_.contains(object); }
  // Whether an op since the last barrier read or wrote `buffer` (the next op to write it waits).
  bool pending(VkBuffer buffer) const {
    return pending_reads_.contains(buffer) || pending_writes_.contains(buffer);
  }

  // Makes kernel calls on this thread record into this sequence until deactivate().
  void activate();
  void deactivate();

 private:
  void ensure_recording() const;
  void before_op(std::span<const VkBuffer> reads, std::span<const VkBuffer> writes, bool transfer);
  void write_timestamp();
  void after_op(std::string label);
  void keep(std::shared_ptr<const void> object);
  VkDescriptorSet allocate_descriptor_set(VkDescriptorSetLayout layout, uint32_t bindings);

  std::shared_ptr<Device> device_;
  std::unique_ptr<CommandContext> context_;
  Timing timing_;
  Reuse reuse_;
  bool closed_ = false;
  std::vector<OpTiming> replay_timings_;
  uint32_t last_replay_us_ = 0;  // submission to completion of the last replay, on the host's clock
  bool active_ = false;
  size_t barriers_ = 0;
  std::vector<std::string> labels_;
  PointerSet<VkBuffer> pending_reads_, pending_writes_;
  bool pending_transfer_ = false;  // a copy or fill since the last barrier
  PointerSet<const void*> kept_;
  std::shared_ptr<Submission> submission_;
};

}  // namespace bitnet
