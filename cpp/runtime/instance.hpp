#pragma once
#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace bitnet {

struct MemoryHeapInfo {
  uint64_t size = 0;
  bool device_local = false;
};

// What a user needs to know about a physical device before choosing it.
struct DeviceInfo {
  uint32_t index = 0;
  std::string name;
  std::string type;  // "discrete", "integrated", "virtual", "cpu", "other"
  uint32_t vendor_id = 0;
  uint32_t device_id = 0;
  std::string driver_name;
  uint32_t driver_id = 0;  // VkDriverId: which driver this is, sturdier than its name
  std::string driver_info;
  uint32_t driver_version = 0;
  std::string vulkan_version;
  std::vector<MemoryHeapInfo> memory_heaps;
  uint32_t subgroup_size = 0;
  uint32_t max_workgroup_invocations = 0;
  std::array<uint32_t, 3> max_workgroup_size{};
  std::array<uint32_t, 3> max_workgroup_count{};
  uint32_t max_shared_memory = 0;
  uint32_t multiprocessors = 0;  // streaming multiprocessors (VK_NV_shader_sm_builtins); 0: unknown
  uint64_t max_storage_buffer_range = 0;
  uint64_t max_allocation_size = 0;
  uint32_t max_push_constants_size = 0;
  uint64_t host_import_alignment = 0;  // 0 where external host memory is not supported
  double timestamp_period_ns = 0.0;
  std::map<std::string, bool> features;
  // VkPhysicalDeviceIDProperties::deviceUUID as 32 hex digits, which matches NVML's "GPU-..."
  // UUID on NVIDIA devices.
  std::string uuid;
  // "dddd:bb:dd.f" (VK_EXT_pci_bus_info), as sysfs names the device; empty where not known.
  std::string pci_address;
  // The multiplies VK_NV_cooperative_matrix and VK_KHR_cooperative_matrix list (the tensor cores'
  // shapes and types), as describe_cooperative_matrix writes them.
  std::vector<std::string> cooperative_matrices;
};

// One listed cooperative-matrix multiply: "KHR 16x16x32 int8 x int8 + int32 -> int32, subgroup"
// (", saturating" where it saturates).
std::string describe_cooperative_matrix(const char* extension, uint32_t m, uint32_t n, uint32_t k,
                                        VkComponentTypeNV a, VkComponentTypeNV b,
                                        VkComponentTypeNV c, VkComponentTypeNV result,
                                        bool saturating, VkScopeNV scope);

// Each memory heap's budget and this process's usage of it (VK_EXT_memory_budget), in bytes.
struct HeapBudget {
  uint64_t size = 0, budget = 0, usage = 0;
  bool device_local = false;
};

// The process-wide VkInstance. With BITNET_GPU_VALIDATION=1 in the environment it enables the
// Khronos validation layer with synchronization validation and collects every message it sends.
class Instance {
 public:
  static std::shared_ptr<Instance> get();
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  VkInstance handle() const { return instance_; }
  bool validation_enabled() const { return messenger_ != VK_NULL_HANDLE; }
  // The validation layer's Vulkan version where it is enabled, else 0.
  uint32_t validation_layer_version() const { return validation_layer_version_; }
  std::vector<VkPhysicalDevice> physical_devices() const;

  // Returns the validation messages received since the last call and forgets them.
  std::vector<std::string> take_validation_messages();
  void add_validation_message(std::string message);

 private:
  Instance();
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  uint32_t validation_layer_version_ = 0;
  std::mutex messages_mutex_;
  std::vector<std::string> messages_;
};

DeviceInfo describe_device(VkPhysicalDevice physical, uint32_t index);
// Whether the physical device offers the device extension `name`.
bool has_extension(VkPhysicalDevice physical, const char* name);
std::vector<DeviceInfo> enumerate_devices();

// The index to open: `requested` if given, else BITNET_GPU_DEVICE (an index or a name substring),
// else the first of discrete > integrated > virtual > cpu > other.
uint32_t choose_device_index(std::optional<uint32_t> requested);

}  // namespace bitnet
