#pragma once
// VK_KHR_cooperative_matrix and VK_NV_cooperative_matrix2, which the Vulkan headers Debian
// bookworm ships (1.3.239) predate: the registry's structures and values, under our own names so
// that newer headers do not clash with them.
#include <vulkan/vulkan.h>

#include <cstdint>

namespace bitnet {

inline constexpr const char* kKhrCooperativeMatrix = "VK_KHR_cooperative_matrix";
inline constexpr const char* kNvCooperativeMatrix2 = "VK_NV_cooperative_matrix2";

// VkPhysicalDeviceCooperativeMatrixFeaturesKHR
struct CooperativeMatrixFeaturesKhr {
  VkStructureType sType = static_cast<VkStructureType>(1000506000);
  void* pNext = nullptr;
  VkBool32 cooperativeMatrix = VK_FALSE;
  VkBool32 cooperativeMatrixRobustBufferAccess = VK_FALSE;
};

// VkCooperativeMatrixPropertiesKHR; the component types and scopes have the values of their NV
// counterparts in the older headers.
struct CooperativeMatrixPropertiesKhr {
  VkStructureType sType = static_cast<VkStructureType>(1000506001);
  void* pNext = nullptr;
  uint32_t MSize = 0, NSize = 0, KSize = 0;
  VkComponentTypeNV AType{}, BType{}, CType{}, ResultType{};
  VkBool32 saturatingAccumulation = VK_FALSE;
  VkScopeNV scope{};
};
using GetCooperativeMatrixProperties = VkResult(VKAPI_PTR*)(VkPhysicalDevice, uint32_t*,
                                                            CooperativeMatrixPropertiesKhr*);

// VkPhysicalDeviceCooperativeMatrix2FeaturesNV
struct CooperativeMatrix2FeaturesNv {
  VkStructureType sType = static_cast<VkStructureType>(1000593000);
  void* pNext = nullptr;
  VkBool32 cooperativeMatrixWorkgroupScope = VK_FALSE;
  VkBool32 cooperativeMatrixFlexibleDimensions = VK_FALSE;
  VkBool32 cooperativeMatrixReductions = VK_FALSE;
  VkBool32 cooperativeMatrixConversions = VK_FALSE;
  VkBool32 cooperativeMatrixPerElementOperations = VK_FALSE;
  VkBool32 cooperativeMatrixTensorAddressing = VK_FALSE;
  VkBool32 cooperativeMatrixBlockLoads = VK_FALSE;
};

// VkCooperativeMatrixFlexibleDimensionsPropertiesNV; the component types and scopes have the
// values of their NV counterparts in the older headers.
struct FlexibleDimensionsPropertiesNv {
  VkStructureType sType = static_cast<VkStructureType>(1000593001);
  void* pNext = nullptr;
  uint32_t MGranularity = 0, NGranularity = 0, KGranularity = 0;
  VkComponentTypeNV AType{}, BType{}, CType{}, ResultType{};
  VkBool32 saturatingAccumulation = VK_FALSE;
  VkScopeNV scope{};
  uint32_t workgroupInvocations = 0;
};
using GetFlexibleDimensionsProperties = VkResult(VKAPI_PTR*)(VkPhysicalDevice, uint32_t*,
                                                             FlexibleDimensionsPropertiesNv*);

}  // namespace bitnet
