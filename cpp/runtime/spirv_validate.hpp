#pragma once

#include <cstdint>
#include <span>

namespace bitnet {

// Checks a SPIR-V module handed in from outside (bg.Kernel) with SPIRV-Tools' validator
// (spirv-val, run as a process of its own) for Vulkan `api_version` (VK_MAKE_API_VERSION's form)
// before any driver sees it: a malformed module crashes drivers. Throws ArgumentError naming the
// first problem, UnsupportedError where spirv-val is not installed.
void validate_spirv(std::span<const uint32_t> words, uint32_t api_version);

}  // namespace bitnet
