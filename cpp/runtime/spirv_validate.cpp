#include "runtime/spirv_validate.hpp"

#include <spirv-tools/libspirv.h>
#include <vulkan/vulkan.h>

#include <memory>
#include <string>

#include "runtime/error.hpp"

namespace bitnet {
namespace {

// SPIRV-Tools' C interface: no C++ standard library type crosses into the static library, which
// may have been built by another compiler than this module.
struct ContextDeleter {
  void operator()(spv_context context) const { spvContextDestroy(context); }
};
struct OptionsDeleter {
  void operator()(spv_validator_options options) const { spvValidatorOptionsDestroy(options); }
};
struct DiagnosticDeleter {
  void operator()(spv_diagnostic diagnostic) const { spvDiagnosticDestroy(diagnostic); }
};

}  // namespace

void validate_spirv(std::span<const uint32_t> words, uint32_t api_version) {
  if (words.size() < 5 || words[0] != 0x07230203u)
    throw ArgumentError("not a SPIR-V module (expected the magic number 0x07230203 and a header)");
  const uint32_t minor = VK_API_VERSION_MINOR(api_version);
  const spv_target_env target = minor >= 3   ? SPV_ENV_VULKAN_1_3
                                : minor == 2 ? SPV_ENV_VULKAN_1_2
                                : minor == 1 ? SPV_ENV_VULKAN_1_1
                                             : SPV_ENV_VULKAN_1_0;
  std::unique_ptr<spv_context_t, ContextDeleter> context(spvContextCreate(target));
  std::unique_ptr<spv_validator_options_t, OptionsDeleter> options(spvValidatorOptionsCreate());
  if (!context || !options) throw std::bad_alloc();
  // Layouts the device may take (the driver checks its own features): never a reason to refuse.
  spvValidatorOptionsSetRelaxBlockLayout(options.get(), true);
  spvValidatorOptionsSetScalarBlockLayout(options.get(), true);
  spvValidatorOptionsSetUniformBufferStandardLayout(options.get(), true);
  spvValidatorOptionsSetWorkgroupScalarBlockLayout(options.get(), true);
  spv_const_binary_t binary{words.data(), words.size()};
  spv_diagnostic raw = nullptr;
  const spv_result_t result = spvValidateWithOptions(context.get(), options.get(), &binary, &raw);
  std::unique_ptr<spv_diagnostic_t, DiagnosticDeleter> diagnostic(raw);
  if (result != SPV_SUCCESS) {
    const std::string why = diagnostic && diagnostic->error ? diagnostic->error : "rejected";
    throw ArgumentError("invalid SPIR-V module: " + why);
  }
}

}  // namespace bitnet
