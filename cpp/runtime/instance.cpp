#include "runtime/instance.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "runtime/coopmat2.hpp"
#include "runtime/error.hpp"

namespace bitnet {
namespace {

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

VKAPI_ATTR VkBool32 VKAPI_CALL on_validation_message(
    VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT,
    const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
  const char* level =
      (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) ? "error" : "warning";
  std::string message = std::string("[vulkan validation ") + level + "] " +
                        (data->pMessageIdName ? data->pMessageIdName : "") + ": " +
                        (data->pMessage ? data->pMessage : "");
  std::fprintf(stderr, "%s\n", message.c_str());
  static_cast<Instance*>(user)->add_validation_message(std::move(message));
  return VK_FALSE;
}

// The layer's Vulkan version, or 0 where it is not installed.
uint32_t layer_version(const char* name) {
  uint32_t count = 0;
  check(vkEnumerateInstanceLayerProperties(&count, nullptr), "vkEnumerateInstanceLayerProperties");
  std::vector<VkLayerProperties> layers(count);
  check(vkEnumerateInstanceLayerProperties(&count, layers.data()),
        "vkEnumerateInstanceLayerProperties");
  for (const VkLayerProperties& l : layers)
    if (std::strcmp(l.layerName, name) == 0) return l.specVersion;
  return 0;
}

// The validation layers from Vulkan 1.4.304 on know cooperative matrices 2; older ones (Debian
// bookworm's 1.3.239) reject their structures, so under those the kernels are not offered.
constexpr uint32_t kCoopmat2ValidationVersion = VK_MAKE_API_VERSION(0, 1, 4, 304);
// The first validation layer that knows VK_KHR_cooperative_matrix.
constexpr uint32_t kKhrCoopmatValidationVersion = VK_MAKE_API_VERSION(0, 1, 3, 255);

std::string version_string(uint32_t version) {
  return std::to_string(VK_API_VERSION_MAJOR(version)) + "." +
         std::to_string(VK_API_VERSION_MINOR(version)) + "." +
         std::to_string(VK_API_VERSION_PATCH(version));
}

const char* type_name(VkPhysicalDeviceType type) {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return "cpu";
    default:
      return "other";
  }
}

int type_rank(const std::string& type) {
  static const char* order[] = {"discrete", "integrated", "virtual", "cpu", "other"};
  for (int i = 0; i < 5; ++i)
    if (type == order[i]) return i;
  return 5;
}

// The structures a vkGetPhysicalDevice*Properties{NV,KHR} call lists for `physical` (`blank`
// carries each one's sType).
template <typename T, typename Call>
std::vector<T> listed(Call properties_of, VkPhysicalDevice physical, const char* name,
                      const T& blank = T{}) {
  uint32_t count = 0;
  check(properties_of(physical, &count, nullptr), name);
  std::vector<T> items(count, blank);
  check(properties_of(physical, &count, items.data()), name);
  return items;
}

// Whether a listed multiply (NV or KHR properties; the result type is D in NV's, ResultType in
// KHR's) is the int8 x int8 -> int32, 16 x 16 x 32, subgroup-scope one that
// shaders/bitlinear/bitlinear_coopmat.glsl is written for.
template <typename Properties>
bool int8_16x16x32(const Properties& s, VkComponentTypeNV result) {
  return s.MSize == 16 && s.NSize == 16 && s.KSize == 32 && s.AType == VK_COMPONENT_TYPE_SINT8_NV &&
         s.BType == VK_COMPONENT_TYPE_SINT8_NV && s.CType == VK_COMPONENT_TYPE_SINT32_NV &&
         result == VK_COMPONENT_TYPE_SINT32_NV && s.scope == VK_SCOPE_SUBGROUP_NV;
}

// The multiplies VK_NV_cooperative_matrix lists for `physical`, which has the extension.
std::vector<VkCooperativeMatrixPropertiesNV> nv_cooperative_matrices(VkPhysicalDevice physical) {
  auto properties_of =
      reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(vkGetInstanceProcAddr(
          Instance::get()->handle(), "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
  if (!properties_of) return {};
  return listed(
      properties_of, physical, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV",
      VkCooperativeMatrixPropertiesNV{VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
}

// Whether the NV cooperative-matrix extension offers that multiply.
bool has_int8_cooperative_matrix(const std::vector<VkCooperativeMatrixPropertiesNV>& shapes) {
  return std::any_of(shapes.begin(), shapes.end(), [](const VkCooperativeMatrixPropertiesNV& s) {
    return int8_16x16x32(s, s.DType);
  });
}

// The multiplies VK_KHR_cooperative_matrix lists for `physical` (none before Vulkan 1.3, whose
// SPIR-V 1.6 the KHR kernels need, or under a validation layer too old for the extension).
std::vector<CooperativeMatrixPropertiesKhr> khr_cooperative_matrices(VkPhysicalDevice physical,
                                                                     bool vulkan13) {
  const auto instance = Instance::get();
  if (instance->validation_enabled() &&
      instance->validation_layer_version() < kKhrCoopmatValidationVersion)
    return {};
  if (!vulkan13 || !has_extension(physical, kKhrCooperativeMatrix)) return {};
  CooperativeMatrixFeaturesKhr coopmat;
  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  features.pNext = &coopmat;
  vkGetPhysicalDeviceFeatures2(physical, &features);
  if (!coopmat.cooperativeMatrix) return {};
  auto properties_of = reinterpret_cast<GetCooperativeMatrixProperties>(vkGetInstanceProcAddr(
      instance->handle(), "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"));
  if (!properties_of) return {};
  return listed<CooperativeMatrixPropertiesKhr>(
      properties_of, physical, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR");
}

// Whether VK_KHR_cooperative_matrix offers the int8 multiply (not saturating), for
// shaders/bitlinear/bitlinear_coopmat_khr.comp.
bool has_int8_cooperative_matrix_khr(const std::vector<CooperativeMatrixPropertiesKhr>& shapes) {
  return std::any_of(shapes.begin(), shapes.end(), [](const CooperativeMatrixPropertiesKhr& s) {
    return int8_16x16x32(s, s.ResultType) && !s.saturatingAccumulation;
  });
}

// Whether it offers float16 x float16 -> float32 at 16 x 16 x 16 in subgroups, for
// shaders/ops/attention_coopmat.comp.
bool has_float16_cooperative_matrix_khr(const std::vector<CooperativeMatrixPropertiesKhr>& shapes) {
  return std::any_of(shapes.begin(), shapes.end(), [](const CooperativeMatrixPropertiesKhr& s) {
    return s.MSize == 16 && s.NSize == 16 && s.KSize == 16 &&
           s.AType == VK_COMPONENT_TYPE_FLOAT16_NV && s.BType == VK_COMPONENT_TYPE_FLOAT16_NV &&
           s.CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
           s.ResultType == VK_COMPONENT_TYPE_FLOAT32_NV && s.scope == VK_SCOPE_SUBGROUP_NV;
  });
}

// The component types and multiples of a cooperative-matrix-2 kernel: A x B -> C, at workgroup
// scope for 256 invocations, the device's granularities dividing m x n x k.
struct Coopmat2Shape {
  VkComponentTypeNV a, c;
  uint32_t m, n, k;
};

// Whether the device offers cooperative matrices 2 with workgroup scope, tensor addressing,
// per-element operations, conversions and reductions, and the products of `shape`, on Vulkan 1.3
// (their SPIR-V is 1.6): what shaders/bitlinear/bitlinear_coopmat2.comp (int8, tiles of multiples
// of 32) is written for.
bool has_coopmat2(VkPhysicalDevice physical, bool vulkan13, const Coopmat2Shape& shape) {
  const auto instance = Instance::get();
  if (instance->validation_enabled() &&
      instance->validation_layer_version() < kCoopmat2ValidationVersion)
    return false;
  if (!vulkan13 || !has_extension(physical, kKhrCooperativeMatrix) ||
      !has_extension(physical, kNvCooperativeMatrix2))
    return false;
  CooperativeMatrix2FeaturesNv coopmat2;
  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  features.pNext = &coopmat2;
  vkGetPhysicalDeviceFeatures2(physical, &features);
  if (!coopmat2.cooperativeMatrixWorkgroupScope || !coopmat2.cooperativeMatrixFlexibleDimensions ||
      !coopmat2.cooperativeMatrixTensorAddressing ||
      !coopmat2.cooperativeMatrixPerElementOperations || !coopmat2.cooperativeMatrixConversions ||
      !coopmat2.cooperativeMatrixReductions)
    return false;
  auto properties_of = reinterpret_cast<GetFlexibleDimensionsProperties>(vkGetInstanceProcAddr(
      instance->handle(), "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV"));
  if (!properties_of) return false;
  const auto shapes = listed<FlexibleDimensionsPropertiesNv>(
      properties_of, physical,
      "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV");
  return std::any_of(shapes.begin(), shapes.end(), [&](const FlexibleDimensionsPropertiesNv& s) {
    return s.AType == shape.a && s.BType == shape.a && s.CType == shape.c &&
           s.ResultType == shape.c && s.scope == VK_SCOPE_WORKGROUP_NV &&
           s.workgroupInvocations == 256 && s.MGranularity && shape.m % s.MGranularity == 0 &&
           s.NGranularity && shape.n % s.NGranularity == 0 && s.KGranularity &&
           shape.k % s.KGranularity == 0 && !s.saturatingAccumulation;
  });
}

}  // namespace

bool has_extension(VkPhysicalDevice physical, const char* name) {
  uint32_t count = 0;
  check(vkEnumerateDeviceExtensionProperties(physical, nullptr, &count, nullptr),
        "vkEnumerateDeviceExtensionProperties");
  std::vector<VkExtensionProperties> extensions(count);
  check(vkEnumerateDeviceExtensionProperties(physical, nullptr, &count, extensions.data()),
        "vkEnumerateDeviceExtensionProperties");
  return std::any_of(extensions.begin(), extensions.end(), [&](const VkExtensionProperties& e) {
    return std::strcmp(e.extensionName, name) == 0;
  });
}

std::shared_ptr<Instance> Instance::get() {
  static std::mutex mutex;
  // Never destroyed: drivers (NVIDIA's among them) tear themselves down during static
  // destruction, and a vkDestroyInstance after that crashes the process at exit.
  static auto* instance = new std::shared_ptr<Instance>();
  std::lock_guard lock(mutex);
  if (!*instance) instance->reset(new Instance());
  return *instance;
}

Instance::Instance() {
  const bool validation = env_flag("BITNET_GPU_VALIDATION");
  if (validation) validation_layer_version_ = layer_version("VK_LAYER_KHRONOS_validation");
  if (validation && validation_layer_version_ == 0)
    throw UnsupportedError(
        "BITNET_GPU_VALIDATION is set but VK_LAYER_KHRONOS_validation is not installed "
        "(Debian: vulkan-validationlayers)");

  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "bitnet_gpu";
  app.pEngineName = "bitnet_gpu";
  app.apiVersion = VK_API_VERSION_1_3;

  std::vector<const char*> layers, extensions;
  VkValidationFeatureEnableEXT enables[] = {
      VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
  VkValidationFeaturesEXT features{VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT};
  features.enabledValidationFeatureCount = 1;
  features.pEnabledValidationFeatures = enables;

  VkDebugUtilsMessengerCreateInfoEXT messenger_info{
      VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
  messenger_info.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                                   VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  messenger_info.messageType =
      VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT;
  messenger_info.pfnUserCallback = on_validation_message;
  messenger_info.pUserData = this;

  VkInstanceCreateInfo info{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  info.pApplicationInfo = &app;
  if (validation) {
    layers.push_back("VK_LAYER_KHRONOS_validation");
    extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    features.pNext = &messenger_info;  // also catches messages from instance creation itself
    info.pNext = &features;
  }
  info.enabledLayerCount = static_cast<uint32_t>(layers.size());
  info.ppEnabledLayerNames = layers.data();
  info.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  info.ppEnabledExtensionNames = extensions.data();
  VkResult result = vkCreateInstance(&info, nullptr, &instance_);
  if (result == VK_ERROR_INCOMPATIBLE_DRIVER)
    throw UnsupportedError(
        "no Vulkan driver found (vkCreateInstance: VK_ERROR_INCOMPATIBLE_DRIVER)");
  check(result, "vkCreateInstance");

  if (validation) {
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
    if (create == nullptr) {
      vkDestroyInstance(instance_, nullptr);
      throw UnsupportedError("VK_EXT_debug_utils is not available for validation messages");
    }
    check(create(instance_, &messenger_info, nullptr, &messenger_),
          "vkCreateDebugUtilsMessengerEXT");
  }
}

Instance::~Instance() {
  if (messenger_ != VK_NULL_HANDLE) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy) destroy(instance_, messenger_, nullptr);
  }
  vkDestroyInstance(instance_, nullptr);
}

std::vector<VkPhysicalDevice> Instance::physical_devices() const {
  uint32_t count = 0;
  check(vkEnumeratePhysicalDevices(instance_, &count, nullptr), "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDevice> devices(count);
  check(vkEnumeratePhysicalDevices(instance_, &count, devices.data()),
        "vkEnumeratePhysicalDevices");
  devices.resize(count);
  return devices;
}

std::vector<std::string> Instance::take_validation_messages() {
  std::lock_guard lock(messages_mutex_);
  return std::exchange(messages_, {});
}

void Instance::add_validation_message(std::string message) {
  std::lock_guard lock(messages_mutex_);
  messages_.push_back(std::move(message));
}

std::string describe_cooperative_matrix(const char* extension, uint32_t m, uint32_t n, uint32_t k,
                                        VkComponentTypeNV a, VkComponentTypeNV b,
                                        VkComponentTypeNV c, VkComponentTypeNV result,
                                        bool saturating, VkScopeNV scope) {
  // The component types by their NumPy names where NumPy has one; the registry's values, those
  // newer than the headers Debian ships as numbers.
  const auto type_name = [](VkComponentTypeNV type) -> std::string {
    static const char* basic[] = {"float16", "float32", "float64", "int8",   "int16", "int32",
                                  "int64",   "uint8",   "uint16",  "uint32", "uint64"};
    const auto value = static_cast<uint32_t>(type);
    if (value < std::size(basic)) return basic[value];
    switch (value) {
      case 1000141000:
        return "bfloat16";
      case 1000491000:
        return "int8x4";
      case 1000491001:
        return "uint8x4";
      case 1000491002:
        return "float8_e4m3";
      case 1000491003:
        return "float8_e5m2";
      default:
        return "type " + std::to_string(value);
    }
  };
  const auto scope_name = [](VkScopeNV scope) -> std::string {
    switch (static_cast<uint32_t>(scope)) {
      case 1:
        return "device";
      case 2:
        return "workgroup";
      case 3:
        return "subgroup";
      case 5:
        return "queue family";
      default:
        return "scope " + std::to_string(scope);
    }
  };
  return std::string(extension) + " " + std::to_string(m) + "x" + std::to_string(n) + "x" +
         std::to_string(k) + " " + type_name(a) + " x " + type_name(b) + " + " + type_name(c) +
         " -> " + type_name(result) + ", " + scope_name(scope) + (saturating ? ", saturating" : "");
}

DeviceInfo describe_device(VkPhysicalDevice physical, uint32_t index) {
  VkPhysicalDeviceDriverProperties driver{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  VkPhysicalDeviceSubgroupProperties subgroup{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceMaintenance3Properties maintenance3{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  VkPhysicalDeviceExternalMemoryHostPropertiesEXT host_memory{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
  VkPhysicalDeviceShaderIntegerDotProductProperties dot{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES};
  VkPhysicalDeviceShaderSMBuiltinsPropertiesNV sm_builtins{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV};
  VkPhysicalDeviceIDProperties ids{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES};
  VkPhysicalDevicePCIBusInfoPropertiesEXT pci{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PCI_BUS_INFO_PROPERTIES_EXT};
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  const bool pci_available = has_extension(physical, VK_EXT_PCI_BUS_INFO_EXTENSION_NAME);
  const bool external_host = has_extension(physical, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
  const bool sm_builtins_available =
      has_extension(physical, VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME);
  VkPhysicalDeviceProperties basic;
  vkGetPhysicalDeviceProperties(physical, &basic);
  const bool vulkan13 = basic.apiVersion >= VK_API_VERSION_1_3;
  props.pNext = &driver;
  driver.pNext = &subgroup;
  subgroup.pNext = &maintenance3;
  maintenance3.pNext = &ids;
  void** tail = &ids.pNext;
  if (pci_available) {
    *tail = &pci;
    tail = &pci.pNext;
  }
  if (external_host) {
    *tail = &host_memory;
    tail = &host_memory.pNext;
  }
  if (sm_builtins_available) {
    *tail = &sm_builtins;
    tail = &sm_builtins.pNext;
  }
  if (vulkan13) *tail = &dot;
  vkGetPhysicalDeviceProperties2(physical, &props);

  VkPhysicalDeviceVulkan13Features f13{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES};
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  features.pNext = &f11;
  f11.pNext = &f12;
  if (vulkan13) f12.pNext = &f13;
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR executables{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  const bool executables_available =
      has_extension(physical, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  if (executables_available) {
    executables.pNext = features.pNext;
    features.pNext = &executables;
  }
  VkPhysicalDeviceShaderClockFeaturesKHR clock{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CLOCK_FEATURES_KHR};
  const bool clock_available = has_extension(physical, VK_KHR_SHADER_CLOCK_EXTENSION_NAME);
  if (clock_available) {
    clock.pNext = features.pNext;
    features.pNext = &clock;
  }
  vkGetPhysicalDeviceFeatures2(physical, &features);

  VkPhysicalDeviceMemoryProperties memory;
  vkGetPhysicalDeviceMemoryProperties(physical, &memory);

  uint32_t family_count = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &family_count, nullptr);
  std::vector<VkQueueFamilyProperties> families(family_count);
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &family_count, families.data());
  bool timestamps = false;
  for (const auto& family : families)
    if ((family.queueFlags & VK_QUEUE_COMPUTE_BIT) && family.timestampValidBits > 0)
      timestamps = true;

  const VkPhysicalDeviceLimits& limits = props.properties.limits;
  DeviceInfo info;
  info.index = index;
  info.name = props.properties.deviceName;
  info.type = type_name(props.properties.deviceType);
  info.vendor_id = props.properties.vendorID;
  info.device_id = props.properties.deviceID;
  info.driver_name = driver.driverName;
  info.driver_id = static_cast<uint32_t>(driver.driverID);
  info.driver_info = driver.driverInfo;
  info.driver_version = props.properties.driverVersion;
  info.vulkan_version = version_string(props.properties.apiVersion);
  for (uint32_t i = 0; i < memory.memoryHeapCount; ++i)
    info.memory_heaps.push_back(
        {memory.memoryHeaps[i].size,
         (memory.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0});
  info.subgroup_size = subgroup.subgroupSize;
  info.max_workgroup_invocations = limits.maxComputeWorkGroupInvocations;
  for (int i = 0; i < 3; ++i) {
    info.max_workgroup_size[i] = limits.maxComputeWorkGroupSize[i];
    info.max_workgroup_count[i] = limits.maxComputeWorkGroupCount[i];
  }
  info.max_shared_memory = limits.maxComputeSharedMemorySize;
  info.multiprocessors = sm_builtins_available ? sm_builtins.shaderSMCount : 0;
  info.max_storage_buffer_range = limits.maxStorageBufferRange;
  info.max_allocation_size = maintenance3.maxMemoryAllocationSize;
  info.max_push_constants_size = limits.maxPushConstantsSize;
  info.host_import_alignment = external_host ? host_memory.minImportedHostPointerAlignment : 0;
  info.timestamp_period_ns = limits.timestampPeriod;
  for (uint8_t byte : ids.deviceUUID) {
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", byte);
    info.uuid += hex;
  }
  if (pci_available) {
    char address[32];
    std::snprintf(address, sizeof address, "%04x:%02x:%02x.%x", pci.pciDomain, pci.pciBus,
                  pci.pciDevice, pci.pciFunction);
    info.pci_address = address;
  }

  const bool nv_coopmat = has_extension(physical, "VK_NV_cooperative_matrix");
  const bool khr_coopmat = has_extension(physical, "VK_KHR_cooperative_matrix");
  const auto nv_shapes = nv_coopmat ? nv_cooperative_matrices(physical)
                                    : std::vector<VkCooperativeMatrixPropertiesNV>{};
  const auto khr_shapes = khr_cooperative_matrices(physical, vulkan13);
  for (const auto& s : nv_shapes)
    info.cooperative_matrices.push_back(describe_cooperative_matrix(
        "NV", s.MSize, s.NSize, s.KSize, s.AType, s.BType, s.CType, s.DType, false, s.scope));
  for (const auto& s : khr_shapes)
    info.cooperative_matrices.push_back(
        describe_cooperative_matrix("KHR", s.MSize, s.NSize, s.KSize, s.AType, s.BType, s.CType,
                                    s.ResultType, s.saturatingAccumulation == VK_TRUE, s.scope));
  info.features = {
      {"float16", f12.shaderFloat16 == VK_TRUE},
      {"float64", features.features.shaderFloat64 == VK_TRUE},
      {"int8", f12.shaderInt8 == VK_TRUE},
      {"storage8", f12.storageBuffer8BitAccess == VK_TRUE},
      {"storage16", f11.storageBuffer16BitAccess == VK_TRUE},
      {"integer_dot_product", vulkan13 && f13.shaderIntegerDotProduct == VK_TRUE},
      {"integer_dot_product_accelerated",
       vulkan13 && dot.integerDotProduct4x8BitPackedSignedAccelerated == VK_TRUE},
      {"cooperative_matrix", nv_coopmat || khr_coopmat},
      {"cooperative_matrix_nv", nv_coopmat},
      // The int8 tensor-core BitLinear path: NV 16 x 16 x 32 int8, subgroups of 32, Int8 and the
      // Vulkan memory model (the shader's scopes need it).
      {"cooperative_matrix_int8",
       nv_coopmat && subgroup.subgroupSize == 32 && f12.shaderInt8 == VK_TRUE &&
           f12.vulkanMemoryModel == VK_TRUE && has_int8_cooperative_matrix(nv_shapes)},
      // The same multiply through VK_KHR_cooperative_matrix.
      {"cooperative_matrix_khr_int8", subgroup.subgroupSize == 32 && f12.shaderInt8 == VK_TRUE &&
                                          f12.vulkanMemoryModel == VK_TRUE &&
                                          has_int8_cooperative_matrix_khr(khr_shapes)},
      // Float16 products with float32 sums in subgroups of 32 (with shuffles): prefill attention
      // in float16.
      {"cooperative_matrix_khr_float16",
       subgroup.subgroupSize == 32 && f12.shaderFloat16 == VK_TRUE &&
           f12.vulkanMemoryModel == VK_TRUE &&
           (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) != 0 &&
           (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_VOTE_BIT) != 0 &&
           has_float16_cooperative_matrix_khr(khr_shapes)},
      // The same on cooperative matrices 2 (workgroup scope, tensor addressing; the ternary codes
      // decoded in the load), with buffer device addresses (the decode function's argument).
      {"cooperative_matrix2_int8",
       f12.shaderInt8 == VK_TRUE && f12.storageBuffer8BitAccess == VK_TRUE &&
           f12.vulkanMemoryModel == VK_TRUE && f12.bufferDeviceAddress == VK_TRUE &&
           f13.maintenance4 == VK_TRUE &&
           has_coopmat2(physical, vulkan13,
                        {VK_COMPONENT_TYPE_SINT8_NV, VK_COMPONENT_TYPE_SINT32_NV, 32, 32, 32})},
      {"external_memory_host", external_host},
      // 64-bit integers with atomics on storage buffers (top-p sampling's mass sums).
      {"int64_atomics",
       features.features.shaderInt64 == VK_TRUE && f12.shaderBufferInt64Atomics == VK_TRUE},
      // Kernel statistics (registers, shared and spilled memory, ...) from the driver's compiler.
      {"pipeline_statistics",
       executables_available && executables.pipelineExecutableInfo == VK_TRUE},
      {"timestamps", timestamps},
      // The device clock in shaders (GL_EXT_shader_realtime_clock): in-dispatch timelines of
      // probe kernels (benchmarks/investigations/dispatch_timeline.py).
      {"device_clock", clock_available && clock.shaderDeviceClock == VK_TRUE},
      // Each heap's budget and this process's usage of it (memory_stats()["heaps"]).
      {"memory_budget", has_extension(physical, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME)},
      {"subgroup_arithmetic",
       (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) != 0 &&
           (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0},
      // Butterfly reductions over 8 invocations (prefill attention's query rows): shuffles, on
      // subgroups of a power of two from 8.
      {"subgroup_shuffle8", (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) != 0 &&
                                (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0 &&
                                subgroup.subgroupSize >= 8 &&
                                (subgroup.subgroupSize & (subgroup.subgroupSize - 1)) == 0},
  };
  return info;
}

std::vector<DeviceInfo> enumerate_devices() {
  auto instance = Instance::get();
  std::vector<DeviceInfo> infos;
  auto physical = instance->physical_devices();
  for (uint32_t i = 0; i < physical.size(); ++i) infos.push_back(describe_device(physical[i], i));
  return infos;
}

uint32_t choose_device_index(std::optional<uint32_t> requested) {
  auto infos = enumerate_devices();
  if (infos.empty()) throw UnsupportedError("no Vulkan device found");
  if (requested) {
    if (*requested >= infos.size())
      throw ArgumentError("device index " + std::to_string(*requested) + " is out of range: " +
                          std::to_string(infos.size()) + " Vulkan device(s) found");
    return *requested;
  }
  if (const char* wanted = std::getenv("BITNET_GPU_DEVICE"); wanted && *wanted) {
    std::string text(wanted);
    if (std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      unsigned long index = std::stoul(text);
      if (index >= infos.size())
        throw ArgumentError("BITNET_GPU_DEVICE=" + text + " is out of range: " +
                            std::to_string(infos.size()) + " Vulkan device(s) found");
      return static_cast<uint32_t>(index);
    }
    auto lower = [](std::string s) {
      std::transform(s.begin(), s.end(), s.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      return s;
    };
    for (const auto& info : infos)
      if (lower(info.name).find(lower(text)) != std::string::npos) return info.index;
    std::string names;
    for (const auto& info : infos) names += (names.empty() ? "" : ", ") + info.name;
    throw ArgumentError("BITNET_GPU_DEVICE='" + text + "' matches no device; devices: " + names);
  }
  auto best = std::min_element(infos.begin(), infos.end(), [](const auto& a, const auto& b) {
    return type_rank(a.type) < type_rank(b.type);
  });
  return best->index;
}

}  // namespace bitnet
