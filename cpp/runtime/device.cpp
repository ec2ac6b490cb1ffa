#include "runtime/device.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "runtime/command_context.hpp"
#include "runtime/coopmat2.hpp"
#include "runtime/error.hpp"
#include "runtime/fault.hpp"
#include "runtime/graph.hpp"
#include "runtime/kernel.hpp"

namespace bitnet {
namespace {

std::mutex default_mutex;
// Released explicitly (Python does it at exit), never by a static destructor: see Instance::get.
auto* default_device_instance = new std::shared_ptr<Device>();

}  // namespace

std::shared_ptr<Device> Device::create(std::optional<uint32_t> index) {
  return std::shared_ptr<Device>(new Device(choose_device_index(index)));
}

std::shared_ptr<Device> Device::default_device() {
  std::lock_guard lock(default_mutex);
  if (!*default_device_instance || (*default_device_instance)->lost())
    *default_device_instance = create();
  return *default_device_instance;
}

void Device::release_default_device() {
  std::shared_ptr<Device> released;
  std::lock_guard lock(default_mutex);
  released.swap(*default_device_instance);
}

Device::Device(uint32_t index) : instance_(Instance::get()) {
  physical_ = instance_->physical_devices().at(index);
  info_ = describe_device(physical_, index);
  VkPhysicalDeviceProperties properties;
  vkGetPhysicalDeviceProperties(physical_, &properties);
  if (properties.apiVersion < VK_API_VERSION_1_2)
    throw UnsupportedError("device '" + info_.name + "' supports Vulkan " + info_.vulkan_version +
                           "; bitnet_gpu needs Vulkan 1.2 or newer");
  limits_ = properties.limits;
  api_version_ = std::min<uint32_t>(properties.apiVersion, VK_API_VERSION_1_3);
  vkGetPhysicalDeviceMemoryProperties(physical_, &memory_properties_);

  uint32_t family_count = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &family_count, nullptr);
  std::vector<VkQueueFamilyProperties> families(family_count);
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &family_count, families.data());
  std::optional<uint32_t> family;
  for (uint32_t i = 0; i < family_count; ++i) {
    if (!(families[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) continue;
    if (!family ||
        (families[i].timestampValidBits > 0 && families[*family].timestampValidBits == 0))
      family = i;
  }
  if (!family) throw UnsupportedError("device '" + info_.name + "' has no compute queue");
  queue_family_ = *family;
  timestamp_valid_bits_ = families[queue_family_].timestampValidBits;

  // Enable the features kernels may use, where the device has them.
  const bool vulkan13 = properties.apiVersion >= VK_API_VERSION_1_3;
  VkPhysicalDeviceVulkan13Features have13{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES};
  VkPhysicalDeviceVulkan12Features have12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceVulkan11Features have11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  VkPhysicalDeviceFeatures2 have{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  have.pNext = &have11;
  have11.pNext = &have12;
  if (vulkan13) have12.pNext = &have13;
  vkGetPhysicalDeviceFeatures2(physical_, &have);

  VkPhysicalDeviceVulkan13Features want13{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES};
  VkPhysicalDeviceVulkan12Features want12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceVulkan11Features want11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  VkPhysicalDeviceFeatures2 want{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  want.features.shaderInt16 = have.features.shaderInt16;
  want.features.shaderInt64 = have.features.shaderInt64;
  want.features.shaderFloat64 = have.features.shaderFloat64;  // bitnet_gpu.linalg in float64
  want11.storageBuffer16BitAccess = have11.storageBuffer16BitAccess;
  want12.storageBuffer8BitAccess = have12.storageBuffer8BitAccess;
  want12.shaderInt8 = have12.shaderInt8;
  want12.shaderFloat16 = have12.shaderFloat16;
  want12.vulkanMemoryModel = have12.vulkanMemoryModel;
  want12.vulkanMemoryModelDeviceScope = have12.vulkanMemoryModelDeviceScope;
  want12.scalarBlockLayout = have12.scalarBlockLayout;
  want12.shaderBufferInt64Atomics = have12.shaderBufferInt64Atomics;
  want13.shaderIntegerDotProduct = have13.shaderIntegerDotProduct;
  want13.subgroupSizeControl = have13.subgroupSizeControl;
  want13.computeFullSubgroups = have13.computeFullSubgroups;
  want13.maintenance4 = have13.maintenance4;
  want.pNext = &want11;
  want11.pNext = &want12;
  if (vulkan13) want12.pNext = &want13;

  std::vector<const char*> extensions;
  if (has_extension(physical_, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME))
    extensions.push_back(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
  if (feature("memory_budget")) extensions.push_back(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  // Turns an extension on and links its features structure into the chain.
  auto enable = [&](const char* extension, auto& features) {
    extensions.push_back(extension);
    features.pNext = want.pNext;
    want.pNext = &features;
  };
  VkPhysicalDeviceCooperativeMatrixFeaturesNV coopmat{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  if (has_extension(physical_, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME)) {
    coopmat.cooperativeMatrix = VK_TRUE;
    enable(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME, coopmat);
  }

  // The KHR BitLinear and attention kernels, and cooperative matrices 2, which build on the KHR
  // extension; the BitLinear kernel of the latter takes a buffer device address in its decode
  // function.
  CooperativeMatrixFeaturesKhr coopmat_khr;
  CooperativeMatrix2FeaturesNv coopmat2;
  const bool with_coopmat2 = feature("cooperative_matrix2_int8");
  if (with_coopmat2 || feature("cooperative_matrix_khr_int8") ||
      feature("cooperative_matrix_khr_float16")) {
    coopmat_khr.cooperativeMatrix = VK_TRUE;
    enable(kKhrCooperativeMatrix, coopmat_khr);
  }
  if (with_coopmat2) {
    coopmat2.cooperativeMatrixWorkgroupScope = VK_TRUE;
    coopmat2.cooperativeMatrixFlexibleDimensions = VK_TRUE;
    coopmat2.cooperativeMatrixConversions = VK_TRUE;
    coopmat2.cooperativeMatrixPerElementOperations = VK_TRUE;
    coopmat2.cooperativeMatrixTensorAddressing = VK_TRUE;
    coopmat2.cooperativeMatrixReductions = VK_TRUE;
    want12.bufferDeviceAddress = VK_TRUE;
    enable(kNvCooperativeMatrix2, coopmat2);
  }

  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR executables{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  if (feature("pipeline_statistics")) {
    executables.pipelineExecutableInfo = VK_TRUE;
    enable(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME, executables);
  }
  // The device clock for probe kernels' timelines: a shader capability, with no cost to others.
  VkPhysicalDeviceShaderClockFeaturesKHR clock{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CLOCK_FEATURES_KHR};
  if (feature("device_clock")) {
    clock.shaderDeviceClock = VK_TRUE;
    enable(VK_KHR_SHADER_CLOCK_EXTENSION_NAME, clock);
  }

  const float priority = 1.0f;
  VkDeviceQueueCreateInfo queue_info{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  queue_info.queueFamilyIndex = queue_family_;
  queue_info.queueCount = 1;
  queue_info.pQueuePriorities = &priority;
  VkDeviceCreateInfo device_info{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  device_info.pNext = &want;
  device_info.queueCreateInfoCount = 1;
  device_info.pQueueCreateInfos = &queue_info;
  device_info.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  device_info.ppEnabledExtensionNames = extensions.data();
  check(vkCreateDevice(physical_, &device_info, nullptr, &device_), "vkCreateDevice");
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
  if (feature("external_memory_host"))
    get_host_pointer_properties = reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
        vkGetDeviceProcAddr(device_, "vkGetMemoryHostPointerPropertiesEXT"));
  if (feature("pipeline_statistics")) {
    get_executable_statistics = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
        vkGetDeviceProcAddr(device_, "vkGetPipelineExecutableStatisticsKHR"));
    if (!get_executable_statistics) info_.features["pipeline_statistics"] = false;
  }

  spin_wait_us_ = info_.type == "cpu" ? 0 : 200;
  if (const char* text = std::getenv("BITNET_GPU_SPIN_WAIT_US"); text && *text) {
    char* end = nullptr;
    const unsigned long value = std::strtoul(text, &end, 10);
    if (*end == '\0' && value <= 1000000) spin_wait_us_ = static_cast<uint32_t>(value);
  }

  try {
    pool_ = std::make_unique<MemoryPool>(*this);
    scratch_ = std::make_unique<ScratchPool>(*this);
    pipelines_ = std::make_unique<PipelineCache>(*this);
  } catch (...) {
    pipelines_.reset();
    pool_.reset();
    vkDestroyDevice(device_, nullptr);
    throw;
  }
}

Device::~Device() {
  vkDeviceWaitIdle(device_);  // nothing may be in flight while its objects are destroyed
  if (pipelines_) pipelines_->save();
  open_context_.reset();
  unreset_contexts_.clear();
  free_contexts_.clear();
  pipelines_.reset();
  scratch_.reset();
  pool_.reset();
  vkDestroyDevice(device_, nullptr);
}

VkResult Device::wait_for_fence(VkFence fence, uint32_t expected_us) {
  if (VkResult failure = fault::injected(fault::Site::wait); failure != VK_SUCCESS) {
    // The work really runs to its end first, so nothing the caller then frees is still in use.
    vkWaitForFences(device_, 1, &fence, VK_TRUE, UINT64_MAX);
    return failure;
  }
  if (spin_wait_us_ > 0) {
    const uint32_t extra = std::min(kMostExpectedSpinUs, expected_us + expected_us / 4);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::microseconds(spin_wait_us_ + extra);
    do {
      const VkResult status = vkGetFenceStatus(device_, fence);
      if (status != VK_NOT_READY) return status;
    } while (std::chrono::steady_clock::now() < deadline);
  }
  return vkWaitForFences(device_, 1, &fence, VK_TRUE, UINT64_MAX);
}

bool Device::feature(const std::string& name) const {
  auto found = info_.features.find(name);
  if (found == info_.features.end()) {
    std::string known;
    for (const auto& [feature, _] : info_.features) known += (known.empty() ? "" : ", ") + feature;
    throw ArgumentError("unknown device feature '" + name + "' (features: " + known + ")");
  }
  return found->second;
}

VkResult Device::check(VkResult result, const char* call) {
  if (result == VK_ERROR_DEVICE_LOST) lost_ = true;
  return bitnet::check(result, call);
}

void Device::ensure_usable() const {
  if (lost_)
    throw DeviceError("device '" + info_.name +
                      "' was lost (VK_ERROR_DEVICE_LOST); create a new Device to continue");
}

VkResult Device::allocate_memory(const VkMemoryAllocateInfo& info, VkDeviceMemory* memory) {
  if (VkResult failure = fault::injected(fault::Site::allocation); failure != VK_SUCCESS)
    return failure;
  return vkAllocateMemory(device_, &info, nullptr, memory);
}

std::shared_ptr<Allocation> Device::allocate(uint64_t size, Placement placement, bool by_op) {
  ensure_usable();
  Graph* graph = by_op ? recording_graph() : nullptr;
  if (graph)
    if (auto reused = graph->reusable(size, placement)) return reused;
  auto allocation =
      std::make_shared<Allocation>(shared_from_this(), pool_->acquire(size, placement), size);
  if (graph) graph->track(allocation);
  return allocation;
}

std::shared_ptr<Allocation> Device::import_host_memory(void* pointer, uint64_t size,
                                                       std::shared_ptr<void> owner) {
  ensure_usable();
  return std::make_shared<Allocation>(shared_from_this(), pool_->import_host(pointer, size), size,
                                      std::move(owner));
}

void Device::synchronize() {
  ensure_usable();
  std::lock_guard lock(queue_mutex_);
  check(vkQueueWaitIdle(queue_), "vkQueueWaitIdle");
}

namespace {

// A waited-for context made ready to record again: false where the driver refused a reset (the
// context is then dropped, never reused).
bool reset_context(VkDevice device, CommandContext& context) {
  VkFence fence = context.fence.get();
  if (context.submitted && vkResetFences(device, 1, &fence) != VK_SUCCESS) return false;
  if (vkResetCommandPool(device, context.command_pool.get(), 0) != VK_SUCCESS) return false;
  for (auto& pool : context.descriptor_pools)
    if (vkResetDescriptorPool(device, pool.get(), 0) != VK_SUCCESS) return false;
  context.descriptor_pool_index = 0;
  context.queries_used = 0;
  context.submitted = false;
  context.open = false;
  return true;
}

}  // namespace

std::unique_ptr<CommandContext> Device::acquire_context(bool one_time) {
  ensure_usable();
  {
    std::lock_guard lock(contexts_mutex_);
    if (one_time && open_context_) return std::move(open_context_);
    while (free_contexts_.empty() && !unreset_contexts_.empty()) {
      auto context = std::move(unreset_contexts_.back());
      unreset_contexts_.pop_back();
      if (reset_context(device_, *context)) free_contexts_.push_back(std::move(context));
    }
    if (!free_contexts_.empty()) {
      auto context = std::move(free_contexts_.back());
      free_contexts_.pop_back();
      return context;
    }
  }
  return create_context();
}

std::unique_ptr<CommandContext> Device::create_context() {
  auto context = std::make_unique<CommandContext>();
  VkCommandPoolCreateInfo pool_info{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pool_info.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
  pool_info.queueFamilyIndex = queue_family_;
  VkCommandPool pool;
  check(vkCreateCommandPool(device_, &pool_info, nullptr, &pool), "vkCreateCommandPool");
  context->command_pool = CommandPoolHandle(device_, pool);
  VkCommandBufferAllocateInfo buffer_info{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  buffer_info.commandPool = pool;
  buffer_info.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  buffer_info.commandBufferCount = 1;
  check(vkAllocateCommandBuffers(device_, &buffer_info, &context->commands),
        "vkAllocateCommandBuffers");
  VkFenceCreateInfo fence_info{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  VkFence fence;
  check(vkCreateFence(device_, &fence_info, nullptr, &fence), "vkCreateFence");
  context->fence = FenceHandle(device_, fence);
  return context;
}

void Device::submit(CommandContext& context) {
  ensure_usable();
  VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &context.commands;
  std::lock_guard lock(queue_mutex_);  // VkQueue access must be externally synchronized
  if (VkResult failure = fault::injected(fault::Site::submission); failure != VK_SUCCESS)
    check(failure, "vkQueueSubmit (BITNET_GPU_FAULT)");
  check(vkQueueSubmit(queue_, 1, &submit, context.fence.get()), "vkQueueSubmit");
  context.submitted = true;
}

void Device::recycle_context(std::unique_ptr<CommandContext> context) {
  if (!context) return;
  if (context->submitted && !lost_) {
    VkFence fence = context->fence.get();
    VkResult waited = wait_for_fence(fence);
    if (waited == VK_ERROR_DEVICE_LOST) lost_ = true;
  }
  context->keep_alive.clear();
  if (lost_) return;  // a lost device's objects are only destroyed, never reused
  std::lock_guard lock(contexts_mutex_);
  unreset_contexts_.push_back(std::move(context));
}

void Device::prepare_contexts() {
  std::lock_guard lock(contexts_mutex_);
  if (lost_) return;
  for (auto& context : unreset_contexts_)
    if (reset_context(device_, *context)) free_contexts_.push_back(std::move(context));
  unreset_contexts_.clear();
  if (open_context_) return;
  std::unique_ptr<CommandContext> context;
  if (!free_contexts_.empty()) {
    context = std::move(free_contexts_.back());
    free_contexts_.pop_back();
  } else {
    try {  // the one in flight is the only one: a second lets the next call find one open
      context = create_context();
    } catch (const Error&) {
      return;  // out of memory, say: the next call makes its own
    }
  }
  // A context that would not open is left closed for an ordinary acquire to begin.
  if (open_commands(*context, true) == VK_SUCCESS)
    open_context_ = std::move(context);
  else if (reset_context(device_, *context))
    free_contexts_.push_back(std::move(context));
}

void Device::start_profiling() {
  std::lock_guard lock(profile_mutex_);
  if (!has_timestamps())
    throw UnsupportedError("device '" + info_.name + "' has no timestamp queries to profile with");
  profile_.clear();
  profiling_ = true;
}

std::vector<std::pair<std::string, double>> Device::stop_profiling() {
  std::lock_guard lock(profile_mutex_);
  profiling_ = false;
  return std::exchange(profile_, {});
}

void Device::add_profile(const std::vector<std::pair<std::string, double>>& timings) {
  std::lock_guard lock(profile_mutex_);
  if (profiling_) profile_.insert(profile_.end(), timings.begin(), timings.end());
}

namespace {

// The top of this thread's stack in a per-thread map of stacks (active sequences, recording
// graphs).
template <typename T>
T* top_of_thread(const std::unordered_map<std::thread::id, std::vector<T*>>& stacks) {
  auto found = stacks.find(std::this_thread::get_id());
  return found == stacks.end() || found->second.empty() ? nullptr : found->second.back();
}

template <typename T>
void remove_everywhere(std::unordered_map<std::thread::id, std::vector<T*>>& stacks, T* item) {
  for (auto& [thread, stack] : stacks) {
    auto found = std::find(stack.begin(), stack.end(), item);
    if (found != stack.end()) stack.erase(found);
  }
}

}  // namespace

Sequence* Device::active_sequence() const {
  std::lock_guard lock(active_mutex_);
  return top_of_thread(active_sequences_);
}

void Device::push_active_sequence(Sequence* sequence) {
  std::lock_guard lock(active_mutex_);
  active_sequences_[std::this_thread::get_id()].push_back(sequence);
}

void Device::pop_active_sequence(Sequence* sequence) {
  std::lock_guard lock(active_mutex_);
  remove_everywhere(active_sequences_, sequence);
}

Graph* Device::recording_graph() const {
  std::lock_guard lock(active_mutex_);
  return top_of_thread(recording_graphs_);
}

void Device::push_recording_graph(Graph* graph) {
  std::lock_guard lock(active_mutex_);
  recording_graphs_[std::this_thread::get_id()].push_back(graph);
}

void Device::pop_recording_graph(Graph* graph) {
  std::lock_guard lock(active_mutex_);
  remove_everywhere(recording_graphs_, graph);
}

std::vector<HeapBudget> Device::heap_budgets() const {
  VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
  VkPhysicalDeviceMemoryProperties2 properties{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2};
  const bool known = feature("memory_budget");
  if (known) properties.pNext = &budget;
  vkGetPhysicalDeviceMemoryProperties2(physical_, &properties);
  std::vector<HeapBudget> heaps;
  for (uint32_t i = 0; i < properties.memoryProperties.memoryHeapCount; ++i) {
    const VkMemoryHeap& heap = properties.memoryProperties.memoryHeaps[i];
    heaps.push_back({heap.size, known ? budget.heapBudget[i] : 0, known ? budget.heapUsage[i] : 0,
                     (heap.flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0});
  }
  return heaps;
}

}  // namespace bitnet
