#pragma once
#include <vulkan/vulkan.h>

#include <stdexcept>
#include <string>

namespace bitnet {

// The exception hierarchy users see (bitnet_gpu.Error and its subclasses in Python).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct DeviceError : Error {
  using Error::Error;
};
struct OutOfMemory : Error {
  using Error::Error;
};
struct UnsupportedError : Error {
  using Error::Error;
};
struct ShapeError : Error {
  using Error::Error;
};
struct DTypeError : Error {
  using Error::Error;
};
// A bad argument value that is neither a shape nor a dtype (also a Python ValueError).
struct ArgumentError : Error {
  using Error::Error;
};
// A decomposition that does not exist for the matrix given (not positive definite, singular):
// numpy.linalg.LinAlgError in Python too.
struct LinAlgError : Error {
  using Error::Error;
};

const char* result_name(VkResult result);

// Throws the exception that fits a failed VkResult, naming the call; returns the result otherwise
// (positive codes such as VK_TIMEOUT or VK_INCOMPLETE are not failures).
VkResult check(VkResult result, const char* call);

std::string format_bytes(unsigned long long bytes);

}  // namespace bitnet
