#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>

namespace bitnet::shaders {

// The SPIR-V of every shader under shaders/, compiled at build time, by file stem.
const std::map<std::string, std::span<const uint32_t>, std::less<>>& registry();

}  // namespace bitnet::shaders
