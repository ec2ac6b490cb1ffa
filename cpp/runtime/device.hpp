#pragma once
#include <vulkan/vulkan.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/instance.hpp"
#include "runtime/memory.hpp"
#include "runtime/scratch_pool.hpp"

namespace bitnet {

struct CommandContext;
class PipelineCache;
class Sequence;
class Graph;

// A logical Vulkan device with one compute queue: owns the memory pool, the pipeline cache and the
// recycled command contexts that sequences record into. Tensors, kernels and sequences hold a
// shared_ptr to it, so it lives until the last of them is gone.
class Device : public std::enable_shared_from_this<Device> {
 public:
  static std::shared_ptr<Device> create(std::optional<uint32_t> index = std::nullopt);
  // The lazily created process-wide device (BITNET_GPU_DEVICE applies).
  static std::shared_ptr<Device> default_device();
  static void release_default_device();
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceInfo& info() const { return info_; }
  VkDevice handle() const { return device_; }
  VkPhysicalDevice physical() const { return physical_; }
  const VkPhysicalDeviceMemoryProperties& memory_properties() const { return memory_properties_; }
  const VkPhysicalDeviceLimits& limits() const { return limits_; }
  // The Vulkan version kernels run under: the device's, at most the instance's 1.3.
  uint32_t api_version() const { return api_version_; }
  bool has_timestamps() const { return timestamp_valid_bits_ > 0; }
  uint32_t timestamp_valid_bits() const { return timestamp_valid_bits_; }
  // Whether the device has `name` (a key of info().features); ArgumentError for an unknown name.
  bool feature(const std::string& name) const;

  // Checks a VkResult from a call on this device; VK_ERROR_DEVICE_LOST marks the device lost.
  VkResult check(VkResult result, const char* call);
  // Throws DeviceError once the device has been lost, so calls fail instead of hanging.
  void ensure_usable() const;
  bool lost() const { return lost_.load(); }
  VkResult allocate_memory(const VkMemoryAllocateInfo& info, VkDeviceMemory* memory);
  // Waits for a submitted fence: polls it for up to spin_wait_us() first (a GPU's completion
  // interrupt and the thread's wake-up cost tens of microseconds, as long as a small kernel
  // runs), then blocks. `expected_us`, the time the same work took before (a graph's last
  // replay), extends the polling by that much and a quarter more, up to kMostExpectedSpinUs, where
  // spin_wait_us() > 0, as a decode step that sleeps and wakes again returns later
  // (docs/PERFORMANCE.md). Returns vkGetFenceStatus / vkWaitForFences's result, unchecked.
  VkResult wait_for_fence(VkFence fence, uint32_t expected_us = 0);
  static constexpr uint32_t kMostExpectedSpinUs = 10000;
  // 200 us on a GPU, 0 on a CPU implementation (its worker threads need the cores);
  // BITNET_GPU_SPIN_WAIT_US overrides.
  uint32_t spin_wait_us() const { return spin_wait_us_; }

  // by_op: for an op's result (Tensor::empty): a graph recording with reuse_memory may hand it an
  // intermediate's memory, and take its own later.
  std::shared_ptr<Allocation> allocate(uint64_t size, Placement placement, bool by_op = false);
  // Wraps caller-owned host memory; `owner` is released only after the Vulkan memory is freed.
  std::shared_ptr<Allocation> import_host_memory(void* pointer, uint64_t size,
                                                 std::shared_ptr<void> owner);
  MemoryPool& memory_pool() { return *pool_; }
  MemoryStats memory_stats() const { return pool_->stats(); }
  // Each memory heap's size and, where the device has VK_EXT_memory_budget, its budget and this
  // process's usage (zero where unknown).
  std::vector<HeapBudget> heap_budgets() const;
  // Frees the memory pool's free blocks and the scratch pool's blocks not lent.
  void trim() {
    scratch_->trim();
    pool_->trim();
  }
  ScratchPool& scratch_pool() { return *scratch_; }
  void synchronize();

  PipelineCache& pipeline_cache() { return *pipelines_; }

  // A context to record into; with `one_time`, one already opened for a single submission where
  // one is ready (its `open` set).
  std::unique_ptr<CommandContext> acquire_context(bool one_time = false);
  void submit(CommandContext& context);
  // Waits for a submitted context, drops what it kept alive and keeps it for reuse; its pools and
  // fence are reset by the next prepare_contexts (or acquire_context, if that comes first).
  void recycle_context(std::unique_ptr<CommandContext> context);
  // Resets the recycled contexts and opens one for the next one-time sequence: called while the
  // GPU runs a submission, so that the call after it finds its context ready.
  void prepare_contexts();

  // The sequence that kernel calls made on this thread record into (innermost `with`), if any.
  Sequence* active_sequence() const;
  void push_active_sequence(Sequence* sequence);
  void pop_active_sequence(Sequence* sequence);
  // The graph that ops on this thread record into, or null.
  Graph* recording_graph() const;
  void push_recording_graph(Graph* graph);
  void pop_recording_graph(Graph* graph);

  // While profiling, every sequence records a timestamp after each op (also the ones that
  // operations run internally), and the GPU times of everything that completes are collected.
  void start_profiling();
  std::vector<std::pair<std::string, double>> stop_profiling();
  bool profiling() const { return profiling_.load(); }
  void add_profile(const std::vector<std::pair<std::string, double>>& timings);

  PFN_vkGetMemoryHostPointerPropertiesEXT get_host_pointer_properties = nullptr;
  // Set where features()["pipeline_statistics"] is (VK_KHR_pipeline_executable_properties).
  PFN_vkGetPipelineExecutableStatisticsKHR get_executable_statistics = nullptr;

 private:
  explicit Device(uint32_t index);

  std::shared_ptr<Instance> instance_;
  DeviceInfo info_;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  uint32_t timestamp_valid_bits_ = 0;
  VkPhysicalDeviceMemoryProperties memory_properties_{};
  uint32_t api_version_ = VK_API_VERSION_1_2;
  VkPhysicalDeviceLimits limits_{};
  std::atomic<bool> lost_{false};
  uint32_t spin_wait_us_ = 0;
  std::atomic<bool> profiling_{false};
  std::mutex profile_mutex_;
  std::vector<std::pair<std::string, double>> profile_;

  std::unique_ptr<MemoryPool> pool_;
  std::unique_ptr<ScratchPool> scratch_;  // its blocks come from pool_
  std::unique_ptr<PipelineCache> pipelines_;

  std::unique_ptr<CommandContext> create_context();

  std::mutex queue_mutex_;
  std::mutex contexts_mutex_;
  std::vector<std::unique_ptr<CommandContext>> free_contexts_;
  std::vector<std::unique_ptr<CommandContext>> unreset_contexts_;  // waited for, not yet reset
  std::unique_ptr<CommandContext> open_context_;                   // opened for one submission
  mutable std::mutex active_mutex_;
  std::unordered_map<std::thread::id, std::vector<Sequence*>> active_sequences_;
  std::unordered_map<std::thread::id, std::vector<Graph*>> recording_graphs_;
};

}  // namespace bitnet
