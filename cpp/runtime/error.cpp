#include "runtime/error.hpp"

#include <cstdio>

namespace bitnet {

const char* result_name(VkResult result) {
  switch (result) {
#define BITNET_RESULT(name) \
  case name:                \
    return #name;
    BITNET_RESULT(VK_SUCCESS)
    BITNET_RESULT(VK_NOT_READY)
    BITNET_RESULT(VK_TIMEOUT)
    BITNET_RESULT(VK_EVENT_SET)
    BITNET_RESULT(VK_EVENT_RESET)
    BITNET_RESULT(VK_INCOMPLETE)
    BITNET_RESULT(VK_ERROR_OUT_OF_HOST_MEMORY)
    BITNET_RESULT(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    BITNET_RESULT(VK_ERROR_INITIALIZATION_FAILED)
    BITNET_RESULT(VK_ERROR_DEVICE_LOST)
    BITNET_RESULT(VK_ERROR_MEMORY_MAP_FAILED)
    BITNET_RESULT(VK_ERROR_LAYER_NOT_PRESENT)
    BITNET_RESULT(VK_ERROR_EXTENSION_NOT_PRESENT)
    BITNET_RESULT(VK_ERROR_FEATURE_NOT_PRESENT)
    BITNET_RESULT(VK_ERROR_INCOMPATIBLE_DRIVER)
    BITNET_RESULT(VK_ERROR_TOO_MANY_OBJECTS)
    BITNET_RESULT(VK_ERROR_FORMAT_NOT_SUPPORTED)
    BITNET_RESULT(VK_ERROR_FRAGMENTED_POOL)
    BITNET_RESULT(VK_ERROR_UNKNOWN)
    BITNET_RESULT(VK_ERROR_OUT_OF_POOL_MEMORY)
    BITNET_RESULT(VK_ERROR_INVALID_EXTERNAL_HANDLE)
    BITNET_RESULT(VK_ERROR_FRAGMENTATION)
    BITNET_RESULT(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS)
    BITNET_RESULT(VK_PIPELINE_COMPILE_REQUIRED)
    BITNET_RESULT(VK_ERROR_INVALID_SHADER_NV)
#undef BITNET_RESULT
    default:
      return "VK_RESULT_UNKNOWN";
  }
}

VkResult check(VkResult result, const char* call) {
  if (result >= 0) return result;
  std::string message = std::string(call) + " failed: " + result_name(result);
  switch (result) {
    case VK_ERROR_OUT_OF_HOST_MEMORY:
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
    case VK_ERROR_TOO_MANY_OBJECTS:
    case VK_ERROR_OUT_OF_POOL_MEMORY:
    case VK_ERROR_FRAGMENTATION:
      throw OutOfMemory(message);
    case VK_ERROR_LAYER_NOT_PRESENT:
    case VK_ERROR_EXTENSION_NOT_PRESENT:
    case VK_ERROR_FEATURE_NOT_PRESENT:
    case VK_ERROR_INCOMPATIBLE_DRIVER:
    case VK_ERROR_FORMAT_NOT_SUPPORTED:
    case VK_ERROR_INVALID_EXTERNAL_HANDLE:
      throw UnsupportedError(message);
    default:
      throw DeviceError(message);
  }
}

std::string format_bytes(unsigned long long bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return std::string(text) + " (" + std::to_string(bytes) + " bytes)";
}

}  // namespace bitnet
