#include "runtime/pipeline_cache.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "runtime/device.hpp"
#include "runtime/error.hpp"

namespace bitnet {
namespace {

uint64_t fnv1a(const void* data, size_t size, uint64_t hash = 1469598103934665603ull) {
  auto bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

std::string cache_directory() {
  namespace fs = std::filesystem;
  if (const char* dir = std::getenv("BITNET_GPU_CACHE_DIR")) return dir;  // "" disables it
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return (fs::path(xdg) / "bitnet_gpu").string();
  if (const char* home = std::getenv("HOME"); home && *home)
    return (fs::path(home) / ".cache" / "bitnet_gpu").string();
  return {};
}

uint32_t spec_bits(uint32_t id, const SpecConstant& constant, const SpecValue& value) {
  auto fail = [&](const std::string& why) -> uint32_t {
    throw DTypeError("specialization constant " + std::to_string(id) + ": " + why);
  };
  switch (constant.type) {
    case SpecType::boolean:
      if (!std::holds_alternative<bool>(value)) return fail("expected a bool");
      return std::get<bool>(value) ? 1u : 0u;
    case SpecType::float32: {
      double v = std::holds_alternative<double>(value) ? std::get<double>(value)
                 : std::holds_alternative<int64_t>(value)
                     ? static_cast<double>(std::get<int64_t>(value))
                     : fail("expected a float");
      float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      return bits;
    }
    case SpecType::int32:
    case SpecType::uint32: {
      if (!std::holds_alternative<int64_t>(value)) return fail("expected an int");
      int64_t v = std::get<int64_t>(value);
      const bool is_signed = constant.type == SpecType::int32;
      const int64_t lo = is_signed ? std::numeric_limits<int32_t>::min() : 0;
      const int64_t hi =
          is_signed ? std::numeric_limits<int32_t>::max() : std::numeric_limits<uint32_t>::max();
      if (v < lo || v > hi)
        throw ArgumentError("specialization constant " + std::to_string(id) + " = " +
                            std::to_string(v) + " is out of range for " +
                            (is_signed ? "int32" : "uint32"));
      return static_cast<uint32_t>(v);
    }
  }
  return 0;
}

}  // namespace

PipelineCache::PipelineCache(Device& device) : device_(device) {
  namespace fs = std::filesystem;
  std::vector<char> initial;
  const std::string dir = cache_directory();
  if (!dir.empty()) {
    VkPhysicalDeviceProperties properties;
    vkGetPhysicalDeviceProperties(device_.physical(), &properties);
    char name[96];
    std::snprintf(name, sizeof name, "pipelines-%08x-%08x-%08x-", properties.vendorID,
                  properties.deviceID, properties.driverVersion);
    std::string file = name;
    for (uint8_t byte : properties.pipelineCacheUUID) {
      char hex[3];
      std::snprintf(hex, sizeof hex, "%02x", byte);
      file += hex;
    }
    path_ = (fs::path(dir) / (file + ".bin")).string();
    std::ifstream in(path_, std::ios::binary);
    if (in) initial.assign(std::istreambuf_iterator<char>(in), {});
    // The header must name this device's cache UUID, or the data is another driver's.
    if (initial.size() < 32 ||
        std::memcmp(initial.data() + 16, properties.pipelineCacheUUID, VK_UUID_SIZE) != 0)
      initial.clear();
  }
  VkPipelineCacheCreateInfo info{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  info.initialDataSize = initial.size();
  info.pInitialData = initial.empty() ? nullptr : initial.data();
  VkPipelineCache cache;
  VkResult result = vkCreatePipelineCache(device_.handle(), &info, nullptr, &cache);
  if (result != VK_SUCCESS && !initial.empty()) {  // unusable data: start empty
    info.initialDataSize = 0;
    info.pInitialData = nullptr;
    initial.clear();
    result = vkCreatePipelineCache(device_.handle(), &info, nullptr, &cache);
  }
  device_.check(result, "vkCreatePipelineCache");
  cache_ = PipelineCacheHandle(device_.handle(), cache);
  loaded_bytes_ = initial.size();
}

void PipelineCache::save() {
  namespace fs = std::filesystem;
  std::lock_guard lock(mutex_);
  if (path_.empty() || !dirty_ || device_.lost()) return;
  size_t size = 0;
  if (vkGetPipelineCacheData(device_.handle(), cache_.get(), &size, nullptr) != VK_SUCCESS) return;
  std::vector<char> data(size);
  if (vkGetPipelineCacheData(device_.handle(), cache_.get(), &size, data.data()) != VK_SUCCESS)
    return;
  std::error_code error;
  fs::create_directories(fs::path(path_).parent_path(), error);
  if (error) return;  // an unwritable cache directory only costs start-up time
  const std::string temporary = path_ + ".tmp" + std::to_string(std::rand());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) return;
    out.write(data.data(), static_cast<std::streamsize>(size));
    if (!out) {
      fs::remove(temporary, error);
      return;
    }
  }
  fs::rename(temporary, path_, error);  // atomic: concurrent processes never see half a file
  if (error) fs::remove(temporary, error);
  dirty_ = false;
}

std::shared_ptr<const Pipeline> PipelineCache::get(std::span<const uint32_t> spirv,
                                                   const std::string& entry,
                                                   const Specialization& specialization) {
  uint64_t hash = fnv1a(spirv.data(), spirv.size_bytes());
  hash = fnv1a(entry.data(), entry.size(), hash);
  for (const auto& [id, value] : specialization) {
    hash = fnv1a(&id, sizeof id, hash);
    const uint8_t kind = static_cast<uint8_t>(value.index());
    hash = fnv1a(&kind, 1, hash);
    std::visit([&](const auto& v) { hash = fnv1a(&v, sizeof v, hash); }, value);
  }
  const std::string key = std::to_string(hash) + ":" + std::to_string(spirv.size());
  {
    std::lock_guard lock(mutex_);
    if (auto found = pipelines_.find(key); found != pipelines_.end()) return found->second;
  }
  auto pipeline = build(spirv, entry, specialization);
  std::lock_guard lock(mutex_);
  dirty_ = true;
  return pipelines_.emplace(key, std::move(pipeline)).first->second;
}

std::shared_ptr<const Pipeline> PipelineCache::get_builtin(std::string_view name,
                                                           std::span<const uint32_t> spirv,
                                                           const Specialization& specialization) {
  // The name, a NUL (no name holds one), then 13 bytes an entry: the value's kind, the id and the
  // value's bits (exact: a double's own bits). Built without formatting: this runs on every op.
  constexpr size_t kEntryBytes = 13;
  std::string key;
  key.reserve(name.size() + 1 + specialization.size() * kEntryBytes);
  key.append(name);
  key.push_back('\0');
  for (const auto& [id, value] : specialization) {
    const uint64_t bits = std::visit(
        [](auto v) -> uint64_t {
          if constexpr (std::is_same_v<decltype(v), double>) {
            uint64_t raw;
            std::memcpy(&raw, &v, sizeof raw);
            return raw;
          } else {
            return static_cast<uint64_t>(v);
          }
        },
        value);
    char entry[kEntryBytes];
    entry[0] = static_cast<char>(value.index());
    std::memcpy(entry + 1, &id, sizeof id);
    std::memcpy(entry + 5, &bits, sizeof bits);
    key.append(entry, kEntryBytes);
  }
  {
    std::lock_guard lock(mutex_);
    if (auto found = builtins_.find(key); found != builtins_.end()) return found->second;
  }
  auto pipeline = get(spirv, "main", specialization);
  std::lock_guard lock(mutex_);
  return builtins_.emplace(std::move(key), std::move(pipeline)).first->second;
}

std::shared_ptr<const Pipeline> PipelineCache::build(std::span<const uint32_t> spirv,
                                                     const std::string& entry,
                                                     const Specialization& specialization) {
  device_.ensure_usable();
  auto pipeline = std::make_shared<Pipeline>();
  try {
    pipeline->interface = reflect_spirv(spirv, entry);
  } catch (const std::out_of_range&) {  // an id the module uses but never defines
    throw ArgumentError("malformed SPIR-V: an instruction refers to an id it never defines");
  }
  const KernelInterface& interface = pipeline->interface;
  VkDevice device = device_.handle();

  if (interface.push_constant_size > device_.limits().maxPushConstantsSize)
    throw UnsupportedError("kernel uses " + std::to_string(interface.push_constant_size) +
                           " bytes of push constants; this device's maxPushConstantsSize is " +
                           std::to_string(device_.limits().maxPushConstantsSize));

  std::vector<VkSpecializationMapEntry> entries;
  std::vector<uint32_t> values;
  for (const auto& [id, value] : specialization) {
    auto constant = interface.spec_constants.find(id);
    if (constant == interface.spec_constants.end()) {
      std::string known;
      for (const auto& [known_id, c] : interface.spec_constants)
        known += (known.empty() ? "" : ", ") + std::to_string(known_id);
      throw ArgumentError("kernel has no specialization constant " + std::to_string(id) +
                          " (it has: " + (known.empty() ? "none" : known) + ")");
    }
    entries.push_back({id, static_cast<uint32_t>(values.size() * 4), 4});
    values.push_back(spec_bits(id, constant->second, value));
  }
  pipeline->local_size = interface.local_size;
  for (int axis = 0; axis < 3; ++axis)
    if (auto spec_id = interface.local_size_spec_ids[axis])
      if (auto value = specialization.find(*spec_id); value != specialization.end())
        pipeline->local_size[axis] =
            spec_bits(*spec_id, interface.spec_constants.at(*spec_id), value->second);
  const auto& limits = device_.limits();
  const uint64_t invocations =
      uint64_t(pipeline->local_size[0]) * pipeline->local_size[1] * pipeline->local_size[2];
  for (int axis = 0; axis < 3; ++axis)
    if (pipeline->local_size[axis] == 0 ||
        pipeline->local_size[axis] > limits.maxComputeWorkGroupSize[axis] ||
        invocations > limits.maxComputeWorkGroupInvocations)
      throw UnsupportedError("workgroup size " + std::to_string(pipeline->local_size[0]) + "x" +
                             std::to_string(pipeline->local_size[1]) + "x" +
                             std::to_string(pipeline->local_size[2]) +
                             " is over this device's limits (maxComputeWorkGroupInvocations " +
                             std::to_string(limits.maxComputeWorkGroupInvocations) + ")");

  VkShaderModuleCreateInfo module_info{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  module_info.codeSize = spirv.size_bytes();
  module_info.pCode = spirv.data();
  VkShaderModule module;
  device_.check(vkCreateShaderModule(device, &module_info, nullptr, &module),
                "vkCreateShaderModule");
  pipeline->module = ShaderModuleHandle(device, module);

  std::vector<VkDescriptorSetLayoutBinding> bindings;
  for (uint32_t i = 0; i < interface.binding_writable.size(); ++i)
    bindings.push_back(
        {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr});
  VkDescriptorSetLayoutCreateInfo set_info{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  set_info.bindingCount = static_cast<uint32_t>(bindings.size());
  set_info.pBindings = bindings.data();
  VkDescriptorSetLayout set_layout;
  device_.check(vkCreateDescriptorSetLayout(device, &set_info, nullptr, &set_layout),
                "vkCreateDescriptorSetLayout");
  pipeline->set_layout = DescriptorSetLayoutHandle(device, set_layout);

  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, interface.push_constant_size};
  VkPipelineLayoutCreateInfo layout_info{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  layout_info.setLayoutCount = 1;
  layout_info.pSetLayouts = &set_layout;
  layout_info.pushConstantRangeCount = interface.push_constant_size > 0 ? 1 : 0;
  layout_info.pPushConstantRanges = &range;
  VkPipelineLayout layout;
  device_.check(vkCreatePipelineLayout(device, &layout_info, nullptr, &layout),
                "vkCreatePipelineLayout");
  pipeline->layout = PipelineLayoutHandle(device, layout);

  VkSpecializationInfo spec_info{static_cast<uint32_t>(entries.size()), entries.data(),
                                 values.size() * 4, values.data()};
  VkComputePipelineCreateInfo info{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  info.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  info.stage.module = module;
  info.stage.pName = interface.entry.c_str();
  info.stage.pSpecializationInfo = entries.empty() ? nullptr : &spec_info;
  info.layout = layout;
  if (device_.feature("pipeline_statistics"))
    info.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  VkPipeline handle;
  device_.check(vkCreateComputePipelines(device, cache_.get(), 1, &info, nullptr, &handle),
                "vkCreateComputePipelines");
  pipeline->pipeline = PipelineHandle(device, handle);
  return pipeline;
}

}  // namespace bitnet
