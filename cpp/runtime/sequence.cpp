#include "runtime/sequence.hpp"

#include <algorithm>
#include <chrono>

#include "runtime/command_context.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/kernel.hpp"

namespace bitnet {
namespace {

constexpr VkPipelineStageFlags kWorkStages =
    VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;

void memory_barrier(VkCommandBuffer commands, VkPipelineStageFlags src_stages,
                    VkAccessFlags src_access, VkPipelineStageFlags dst_stages,
                    VkAccessFlags dst_access) {
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = src_access;
  barrier.dstAccessMask = dst_access;
  vkCmdPipelineBarrier(commands, src_stages, dst_stages, 0, 1, &barrier, 0, nullptr, 0, nullptr);
}

// `what()` names the binding in an error: a callable, so that the text is built only for a binding
// that fails (a dispatch checks every binding of every op).
template <typename Name>
void check_binding(const Device& device, const BufferBinding& binding, const Name& what) {
  if (!binding.allocation) throw ArgumentError(what() + " is not a tensor");
  if (&binding.allocation->device() != &device)
    throw ArgumentError(what() + " lives on device '" + binding.allocation->device().info().name +
                        "', not on the device that runs this sequence");
  if (binding.offset + binding.size > binding.allocation->capacity())
    throw ShapeError(what() + ": range past the end of its buffer");
}

auto named(const char* name) {
  return [name] { return std::string(name); };
}

}  // namespace

Submission::Submission(std::shared_ptr<Device> device, std::unique_ptr<CommandContext> context,
                       std::vector<std::string> labels, Timing timing)
    : device_(std::move(device)),
      context_(std::move(context)),
      labels_(std::move(labels)),
      timing_(timing) {}

Submission::~Submission() {
  std::lock_guard lock(mutex_);
  device_->recycle_context(std::move(context_));
}

std::vector<OpTiming> read_timings(Device& device, CommandContext& context,
                                   const std::vector<std::string>& labels, Timing timing) {
  std::vector<OpTiming> timings;
  if (timing == Timing::off || labels.empty()) return timings;
  const uint32_t count = context.queries_used;
  std::vector<uint64_t> stamps(count);
  for (uint32_t first = 0; first < count; first += CommandContext::kQueriesPerPool) {
    const uint32_t n = std::min(CommandContext::kQueriesPerPool, count - first);
    device.check(
        vkGetQueryPoolResults(device.handle(),
                              context.query_pools[first / CommandContext::kQueriesPerPool].get(), 0,
                              n, n * sizeof(uint64_t), stamps.data() + first, sizeof(uint64_t),
                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
        "vkGetQueryPoolResults");
  }
  const uint32_t bits = device.timestamp_valid_bits();
  const uint64_t mask = bits >= 64 ? ~0ull : ((1ull << bits) - 1);
  const double period = device.info().timestamp_period_ns * 1e-9;
  auto seconds = [&](size_t from, size_t to) {
    return static_cast<double>(((stamps[to] & mask) - (stamps[from] & mask)) & mask) * period;
  };
  if (timing == Timing::total && stamps.size() == 2) {
    timings.push_back({"sequence of " + std::to_string(labels.size()) + " ops", seconds(0, 1)});
  } else {
    // Query 0 is written before the first op; query i+1 after op i.
    for (size_t i = 0; i < labels.size() && i + 1 < stamps.size(); ++i)
      timings.push_back({labels[i], seconds(i, i + 1)});
  }
  if (device.profiling() && timing == Timing::per_op) {
    std::vector<std::pair<std::string, double>> collected;
    for (const auto& t : timings) collected.emplace_back(t.label, t.seconds);
    device.add_profile(collected);
  }
  return timings;
}

void Submission::finish_locked() {
  if (finished_) return;
  device_->ensure_usable();
  VkFence fence = context_->fence.get();
  device_->check(device_->wait_for_fence(fence), "vkWaitForFences");
  timings_ = read_timings(*device_, *context_, labels_, timing_);
  context_->keep_alive.clear();  // the GPU is done: give buffers back to the pool now
  finished_ = true;
}

void Submission::wait() {
  std::lock_guard lock(mutex_);
  finish_locked();
}

bool Submission::done() {
  std::lock_guard lock(mutex_);
  if (finished_) return true;
  device_->ensure_usable();
  VkResult status = device_->check(vkGetFenceStatus(device_->handle(), context_->fence.get()),
                                   "vkGetFenceStatus");
  if (status != VK_SUCCESS) return false;
  finish_locked();
  return true;
}

std::vector<OpTiming> Submission::timings() {
  if (timing_ == Timing::off)
    throw UnsupportedError(
        "this sequence was recorded without timings (timings=False, or the "
        "device has no timestamp queries)");
  std::lock_guard lock(mutex_);
  finish_locked();
  return timings_;
}

VkResult open_commands(CommandContext& context, bool one_time) {
  VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  begin.flags = one_time ? VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT : 0;
  const VkResult result = vkBeginCommandBuffer(context.commands, &begin);
  if (result != VK_SUCCESS) return result;
  // Earlier submissions on this queue may have written what this one touches.
  memory_barrier(context.commands, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_MEMORY_WRITE_BIT,
                 kWorkStages, VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT);
  context.open = true;
  return VK_SUCCESS;
}

Sequence::Sequence(std::shared_ptr<Device> device, Timing timing, Reuse reuse)
    : device_(std::move(device)),
      timing_(timing == Timing::off && device_->profiling() ? Timing::per_op : timing),
      reuse_(reuse) {
  if (timing_ != Timing::off && !device_->has_timestamps())
    throw UnsupportedError("device '" + device_->info().name + "' has no timestamp queries");
  // An untimed one-time sequence takes the context opened while the last submission ran.
  const bool one_time = reuse == Reuse::once;
  context_ = device_->acquire_context(one_time && timing_ == Timing::off);
  if (!context_->open) {
    try {
      device_->check(open_commands(*context_, one_time), "vkBeginCommandBuffer");
    } catch (...) {
      device_->recycle_context(std::move(context_));
      throw;
    }
  }
  if (timing_ != Timing::off) write_timestamp();
}

Sequence::~Sequence() {
  deactivate();
  if (context_) device_->recycle_context(std::move(context_));  // recorded but never submitted
}

void Sequence::activate() {
  ensure_recording();
  if (!active_) device_->push_active_sequence(this);
  active_ = true;
}

void Sequence::deactivate() {
  if (active_) device_->pop_active_sequence(this);
  active_ = false;
}

void Sequence::ensure_recording() const {
  if (!context_)
    throw ArgumentError("this sequence was already submitted or discarded; record into a new one");
  if (closed_) throw ArgumentError("this graph is closed: it can be replayed, not recorded into");
  device_->ensure_usable();
}

void Sequence::keep(std::shared_ptr<const void> object) {
  if (kept_.insert(object.get())) context_->keep_alive.push_back(std::move(object));
}

void Sequence::before_op(std::span<const VkBuffer> reads, std::span<const VkBuffer> writes,
                         bool transfer) {
  bool hazard = false;
  for (VkBuffer buffer : reads) hazard = hazard || pending_writes_.contains(buffer);
  for (VkBuffer buffer : writes)
    hazard = hazard || pending_writes_.contains(buffer) || pending_reads_.contains(buffer);
  if (hazard) {
    // The source: only the stages that ran since the last barrier (compute alone is the common
    // case and the cheapest wait). The destination: every later op, copies too, since the
    // barrier clears what is tracked (a copy after a dispatch that read its source's producer
    // would otherwise find no hazard and read unsynchronized).
    const VkPipelineStageFlags src = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT |
                                     (pending_transfer_ ? VK_PIPELINE_STAGE_TRANSFER_BIT : 0);
    const VkAccessFlags src_access =
        VK_ACCESS_SHADER_WRITE_BIT | (pending_transfer_ ? VK_ACCESS_TRANSFER_WRITE_BIT : 0);
    memory_barrier(context_->commands, src, src_access, kWorkStages,
                   VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                       VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
    ++barriers_;
    pending_reads_.clear();
    pending_writes_.clear();
    pending_transfer_ = false;
  }
  for (VkBuffer buffer : reads) pending_reads_.insert(buffer);
  for (VkBuffer buffer : writes) pending_writes_.insert(buffer);
  pending_transfer_ = pending_transfer_ || transfer;
}

void Sequence::write_timestamp() {
  const uint32_t pool_index = context_->queries_used / CommandContext::kQueriesPerPool;
  if (pool_index == context_->query_pools.size()) {
    VkQueryPoolCreateInfo info{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    info.queryType = VK_QUERY_TYPE_TIMESTAMP;
    info.queryCount = CommandContext::kQueriesPerPool;
    VkQueryPool pool;
    device_->check(vkCreateQueryPool(device_->handle(), &info, nullptr, &pool),
                   "vkCreateQueryPool");
    context_->query_pools.emplace_back(device_->handle(), pool);
  }
  VkQueryPool pool = context_->query_pools[pool_index].get();
  const uint32_t query = context_->queries_used % CommandContext::kQueriesPerPool;
  if (query == 0) vkCmdResetQueryPool(context_->commands, pool, 0, CommandContext::kQueriesPerPool);
  // Bottom of pipe: written once everything recorded before it has finished.
  vkCmdWriteTimestamp(context_->commands, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, query);
  context_->queries_used++;
}

void Sequence::name_last_op(std::string label) {
  ensure_recording();
  if (labels_.empty()) throw ArgumentError("name_last_op: nothing has been recorded yet");
  labels_.back() = std::move(label);
}

void Sequence::after_op(std::string label) {
  labels_.push_back(std::move(label));
  if (timing_ == Timing::per_op) write_timestamp();
}

VkDescriptorSet Sequence::allocate_descriptor_set(VkDescriptorSetLayout layout, uint32_t bindings) {
  VkDescriptorSetAllocateInfo info{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  info.descriptorSetCount = 1;
  info.pSetLayouts = &layout;
  auto& pools = context_->descriptor_pools;
  while (true) {
    if (context_->descriptor_pool_index == pools.size()) {
      VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                CommandContext::kSetsPerDescriptorPool * std::max(bindings, 8u)};
      VkDescriptorPoolCreateInfo pool_info{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
      pool_info.maxSets = CommandContext::kSetsPerDescriptorPool;
      pool_info.poolSizeCount = 1;
      pool_info.pPoolSizes = &size;
      VkDescriptorPool pool;
      device_->check(vkCreateDescriptorPool(device_->handle(), &pool_info, nullptr, &pool),
                     "vkCreateDescriptorPool");
      pools.emplace_back(device_->handle(), pool);
    }
    info.descriptorPool = pools[context_->descriptor_pool_index].get();
    VkDescriptorSet set;
    VkResult result = vkAllocateDescriptorSets(device_->handle(), &info, &set);
    if (result == VK_ERROR_OUT_OF_POOL_MEMORY || result == VK_ERROR_FRAGMENTED_POOL) {
      context_->descriptor_pool_index++;  // this pool is full: move on to the next
      continue;
    }
    device_->check(result, "vkAllocateDescriptorSets");
    return set;
  }
}

void Sequence::dispatch(const Kernel& kernel, std::array<uint32_t, 3> groups,
                        std::span<const BufferBinding> bindings,
                        std::span<const std::byte> push_constants) {
  ensure_recording();
  const auto& interface = kernel.interface();
  const auto& limits = device_->limits();
  if (kernel.device() != device_)
    throw ArgumentError("kernel '" + kernel.name() + "' was built for device '" +
                        kernel.device()->info().name + "', not for this sequence's device");
  if (bindings.size() != interface.binding_writable.size())
    throw ShapeError("kernel '" + kernel.name() + "' takes " +
                     std::to_string(interface.binding_writable.size()) + " tensors (bindings 0.." +
                     std::to_string(static_cast<int>(interface.binding_writable.size()) - 1) +
                     "), got " + std::to_string(bindings.size()));
  if (push_constants.size() != interface.push_constant_size)
    throw ShapeError("kernel '" + kernel.name() + "' takes " +
                     std::to_string(interface.push_constant_size) +
                     " bytes of push constants, got " + std::to_string(push_constants.size()));
  for (int axis = 0; axis < 3; ++axis)
    if (groups[axis] > limits.maxComputeWorkGroupCount[axis])
      throw UnsupportedError(
          "dispatch of " + std::to_string(groups[axis]) + " workgroups along axis " +
          std::to_string(axis) + " is over this device's maxComputeWorkGroupCount[" +
          std::to_string(axis) + "] = " + std::to_string(limits.maxComputeWorkGroupCount[axis]));
  std::vector<VkBuffer> reads, writes;
  std::vector<VkDescriptorBufferInfo> infos(bindings.size());
  for (size_t i = 0; i < bindings.size(); ++i) {
    const BufferBinding& binding = bindings[i];
    auto what = [&] { return "kernel '" + kernel.name() + "' tensor " + std::to_string(i); };
    check_binding(*device_, binding, what);
    // A zero-size tensor still binds a valid (pool-minimum) range; kernels must not touch it.
    const uint64_t range = std::max<uint64_t>(binding.size, 4);
    if (range > limits.maxStorageBufferRange)
      throw UnsupportedError(what() + " is " + format_bytes(range) +
                             ", over this device's maxStorageBufferRange of " +
                             format_bytes(limits.maxStorageBufferRange));
    if (binding.offset % limits.minStorageBufferOffsetAlignment != 0)
      throw ArgumentError(what() + ": offset is not a multiple of minStorageBufferOffsetAlignment");
    infos[i] = {binding.allocation->buffer(), binding.offset, range};
    (interface.binding_writable[i] ? writes : reads).push_back(infos[i].buffer);
  }

  VkCommandBuffer commands = context_->commands;
  const Pipeline& pipeline = *kernel.pipeline();
  VkDescriptorSet set = VK_NULL_HANDLE;
  if (!bindings.empty()) {
    set =
        allocate_descriptor_set(pipeline.set_layout.get(), static_cast<uint32_t>(bindings.size()));
    std::vector<VkWriteDescriptorSet> descriptor_writes(bindings.size());
    for (size_t i = 0; i < bindings.size(); ++i) {
      descriptor_writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
      descriptor_writes[i].dstSet = set;
      descriptor_writes[i].dstBinding = static_cast<uint32_t>(i);
      descriptor_writes[i].descriptorCount = 1;
      descriptor_writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      descriptor_writes[i].pBufferInfo = &infos[i];
    }
    vkUpdateDescriptorSets(device_->handle(), static_cast<uint32_t>(descriptor_writes.size()),
                           descriptor_writes.data(), 0, nullptr);
  }
  before_op(reads, writes, false);
  vkCmdBindPipeline(commands, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.pipeline.get());
  if (set != VK_NULL_HANDLE)
    vkCmdBindDescriptorSets(commands, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout.get(), 0, 1,
                            &set, 0, nullptr);
  if (!push_constants.empty())
    vkCmdPushConstants(commands, pipeline.layout.get(), VK_SHADER_STAGE_COMPUTE_BIT, 0,
                       static_cast<uint32_t>(push_constants.size()), push_constants.data());
  vkCmdDispatch(commands, groups[0], groups[1], groups[2]);
  keep(kernel.pipeline());
  for (const auto& binding : bindings) keep(binding.allocation);
  after_op(kernel.name());
}

void Sequence::copy(const BufferBinding& source, const BufferBinding& destination) {
  ensure_recording();
  check_binding(*device_, source, named("copy source"));
  check_binding(*device_, destination, named("copy destination"));
  if (source.size != destination.size)
    throw ShapeError("copy of " + std::to_string(source.size) + " bytes into a destination of " +
                     std::to_string(destination.size) + " bytes");
  if (source.size == 0) return;
  VkBuffer reads[] = {source.allocation->buffer()};
  VkBuffer writes[] = {destination.allocation->buffer()};
  before_op(reads, writes, true);
  VkBufferCopy region{source.offset, destination.offset, source.size};
  vkCmdCopyBuffer(context_->commands, reads[0], writes[0], 1, &region);
  keep(source.allocation);
  keep(destination.allocation);
  after_op("copy");
}

void Sequence::fill(const BufferBinding& destination, uint32_t word) {
  ensure_recording();
  check_binding(*device_, destination, named("fill destination"));
  if (destination.size == 0) return;
  if (destination.offset % 4 != 0)
    throw ArgumentError("fill destination offset must be a multiple of 4");
  VkBuffer writes[] = {destination.allocation->buffer()};
  before_op({}, writes, true);
  // vkCmdFillBuffer writes whole words: round the size up inside the block's capacity.
  const uint64_t size = std::min((destination.size + 3) / 4 * 4,
                                 destination.allocation->capacity() - destination.offset);
  vkCmdFillBuffer(context_->commands, writes[0], destination.offset, size, word);
  keep(destination.allocation);
  after_op("fill");
}

namespace {

void end_commands(Device& device, VkCommandBuffer commands) {
  // Make every write visible to the host, which may read mapped memory after the fence.
  memory_barrier(commands, kWorkStages, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                 VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
  device.check(vkEndCommandBuffer(commands), "vkEndCommandBuffer");
}

}  // namespace

void Sequence::close() {
  if (reuse_ != Reuse::replay)
    throw ArgumentError("only a replayable sequence (a graph) can be closed");
  ensure_recording();
  deactivate();
  if (timing_ == Timing::total) write_timestamp();
  end_commands(*device_, context_->commands);
  closed_ = true;
}

void Sequence::replay() {
  if (!closed_ || !context_) throw ArgumentError("a graph replays once its recording is closed");
  device_->ensure_usable();
  device_->submit(*context_);
  const auto submitted = std::chrono::steady_clock::now();
  VkFence fence = context_->fence.get();
  device_->check(device_->wait_for_fence(fence, last_replay_us_), "vkWaitForFences");
  const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - submitted);
  last_replay_us_ =
      static_cast<uint32_t>(std::min<int64_t>(waited.count(), Device::kMostExpectedSpinUs));
  context_->submitted = false;
  device_->check(vkResetFences(device_->handle(), 1, &fence), "vkResetFences");
  replay_timings_ = read_timings(*device_, *context_, labels_, timing_);
}

std::shared_ptr<Submission> Sequence::submit() {
  if (reuse_ == Reuse::replay)
    throw ArgumentError("a graph is replayed (close(), then replay()), not submitted");
  ensure_recording();
  if (timing_ == Timing::total) write_timestamp();
  end_commands(*device_, context_->commands);
  device_->submit(*context_);
  device_->prepare_contexts();  // while the GPU runs this submission
  // The labels name the timings; without timings the submission needs none (no copy).
  submission_ = std::make_shared<Submission>(
      device_, std::move(context_), timing_ == Timing::off ? std::vector<std::string>{} : labels_,
      timing_);
  return submission_;
}

void Sequence::run() { submit()->wait(); }

void Sequence::discard() {
  deactivate();
  if (context_) device_->recycle_context(std::move(context_));
}

std::vector<OpTiming> Sequence::timings() {
  if (reuse_ == Reuse::replay) {
    if (timing_ == Timing::off) throw UnsupportedError("this graph was recorded without timings");
    return replay_timings_;
  }
  if (!submission_) throw ArgumentError("timings are available after the sequence is submitted");
  return submission_->timings();
}

}  // namespace bitnet
