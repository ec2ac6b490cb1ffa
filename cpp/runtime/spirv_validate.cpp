#include "runtime/spirv_validate.hpp"

#include <vulkan/vulkan.h>

#include <spirv-tools/libspirv.hpp>
#include <string>

#include "runtime/error.hpp"

namespace bitnet {

void validate_spirv(std::span<const uint32_t> words, uint32_t api_version) {
  if (words.size() < 5 || words[0] != 0x07230203u)
    throw ArgumentError("not a SPIR-V module (expected the magic number 0x07230203 and a header)");
  const uint32_t minor = VK_API_VERSION_MINOR(api_version);
  const spv_target_env target = minor >= 3   ? SPV_ENV_VULKAN_1_3
                                : minor == 2 ? SPV_ENV_VULKAN_1_2
                                : minor == 1 ? SPV_ENV_VULKAN_1_1
                                             : SPV_ENV_VULKAN_1_0;
  spvtools::SpirvTools tools(target);
  std::string first;
  tools.SetMessageConsumer(
      [&first](spv_message_level_t, const char*, const spv_position_t&, const char* message) {
        if (first.empty()) first = message;
      });
  // Layouts the device may take (the driver checks its own features): never a reason to refuse.
  spvtools::ValidatorOptions options;
  options.SetRelaxBlockLayout(true);
  options.SetScalarBlockLayout(true);
  options.SetUniformBufferStandardLayout(true);
  options.SetWorkgroupScalarBlockLayout(true);
  if (!tools.Validate(words.data(), words.size(), options))
    throw ArgumentError("invalid SPIR-V module: " + (first.empty() ? "rejected" : first));
}

}  // namespace bitnet
