#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>

#include "runtime/handle.hpp"
#include "runtime/spirv_reflect.hpp"

namespace bitnet {

class Device;

using SpecValue = std::variant<bool, int64_t, double>;
using Specialization = std::map<uint32_t, SpecValue>;

// A compute pipeline with its layout, built from the shader's own interface.
struct Pipeline {
  KernelInterface interface;
  std::array<uint32_t, 3> local_size{1, 1, 1};  // after specialization
  ShaderModuleHandle module;
  DescriptorSetLayoutHandle set_layout;
  PipelineLayoutHandle layout;
  PipelineHandle pipeline;
};

// Pipelines by (SPIR-V, entry point, specialization), built through a VkPipelineCache that is
// loaded from and saved to the user's cache directory, so a second process starts faster.
class PipelineCache {
 public:
  explicit PipelineCache(Device& device);
  std::shared_ptr<const Pipeline> get(std::span<const uint32_t> spirv, const std::string& entry,
                                      const Specialization& specialization);
  // A built-in shader's pipeline, looked up by its name and specialization alone: the hot path of
  // every op, which must not hash the SPIR-V on each call.
  std::shared_ptr<const Pipeline> get_builtin(std::string_view name,
                                              std::span<const uint32_t> spirv,
                                              const Specialization& specialization);
  void save();
  const std::string& path() const { return path_; }
  uint64_t loaded_bytes() const { return loaded_bytes_; }

 private:
  std::shared_ptr<const Pipeline> build(std::span<const uint32_t> spirv, const std::string& entry,
                                        const Specialization& specialization);
  Device& device_;
  PipelineCacheHandle cache_;
  std::string path_;
  uint64_t loaded_bytes_ = 0;
  bool dirty_ = false;
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const Pipeline>> pipelines_;
  std::unordered_map<std::string, std::shared_ptr<const Pipeline>> builtins_;
};

}  // namespace bitnet
