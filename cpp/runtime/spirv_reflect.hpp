#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace bitnet {

enum class SpecType : uint8_t { boolean, int32, uint32, float32 };

struct SpecConstant {
  SpecType type = SpecType::uint32;
  uint32_t default_bits = 0;
};

// What a compute shader expects from the host: read directly from its SPIR-V so that a kernel's
// pipeline layout, push-constant size and hazards need no hand-written description.
struct KernelInterface {
  std::string entry;
  std::vector<bool> binding_writable;  // storage buffers at set 0, bindings 0..n-1
  uint32_t push_constant_size = 0;
  std::array<uint32_t, 3> local_size{1, 1, 1};
  std::array<std::optional<uint32_t>, 3> local_size_spec_ids;
  std::map<uint32_t, SpecConstant> spec_constants;
  std::vector<std::string> entry_points;
};

// Throws ArgumentError for malformed SPIR-V or a missing compute entry point, and
// UnsupportedError for interfaces bitnet_gpu does not bind (uniform buffers, images, set != 0).
KernelInterface reflect_spirv(std::span<const uint32_t> words, std::string_view entry);

}  // namespace bitnet
