#pragma once
#include <vulkan/vulkan.h>

#include <utility>

namespace bitnet {

// Owns one Vulkan object created from a VkDevice and destroys it with `Destroy`.
template <typename T, auto Destroy>
class DeviceHandle {
 public:
  DeviceHandle() = default;
  DeviceHandle(VkDevice device, T handle) : device_(device), handle_(handle) {}
  DeviceHandle(DeviceHandle&& other) noexcept
      : device_(other.device_), handle_(std::exchange(other.handle_, VK_NULL_HANDLE)) {}
  DeviceHandle& operator=(DeviceHandle&& other) noexcept {
    if (this != &other) {
      reset();
      device_ = other.device_;
      handle_ = std::exchange(other.handle_, VK_NULL_HANDLE);
    }
    return *this;
  }
  DeviceHandle(const DeviceHandle&) = delete;
  DeviceHandle& operator=(const DeviceHandle&) = delete;
  ~DeviceHandle() { reset(); }

  void reset() {
    if (handle_ != VK_NULL_HANDLE) Destroy(device_, handle_, nullptr);
    handle_ = VK_NULL_HANDLE;
  }
  T get() const { return handle_; }
  explicit operator bool() const { return handle_ != VK_NULL_HANDLE; }

 private:
  VkDevice device_ = VK_NULL_HANDLE;
  T handle_ = VK_NULL_HANDLE;
};

using BufferHandle = DeviceHandle<VkBuffer, vkDestroyBuffer>;
using MemoryHandle = DeviceHandle<VkDeviceMemory, vkFreeMemory>;
using ShaderModuleHandle = DeviceHandle<VkShaderModule, vkDestroyShaderModule>;
using DescriptorSetLayoutHandle = DeviceHandle<VkDescriptorSetLayout, vkDestroyDescriptorSetLayout>;
using PipelineLayoutHandle = DeviceHandle<VkPipelineLayout, vkDestroyPipelineLayout>;
using PipelineHandle = DeviceHandle<VkPipeline, vkDestroyPipeline>;
using PipelineCacheHandle = DeviceHandle<VkPipelineCache, vkDestroyPipelineCache>;
using CommandPoolHandle = DeviceHandle<VkCommandPool, vkDestroyCommandPool>;
using FenceHandle = DeviceHandle<VkFence, vkDestroyFence>;
using DescriptorPoolHandle = DeviceHandle<VkDescriptorPool, vkDestroyDescriptorPool>;
using QueryPoolHandle = DeviceHandle<VkQueryPool, vkDestroyQueryPool>;

}  // namespace bitnet
