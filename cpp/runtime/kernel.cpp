#include "runtime/kernel.hpp"

#include <string>
#include <vector>

#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/shaders.hpp"
#include "runtime/spirv_validate.hpp"

namespace bitnet {

std::vector<KernelStatistic> Kernel::statistics() const {
  std::vector<KernelStatistic> result;
  if (!device_->feature("pipeline_statistics")) return result;
  device_->ensure_usable();
  VkPipelineExecutableInfoKHR executable{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR};
  executable.pipeline = pipeline_->pipeline.get();
  executable.executableIndex = 0;
  uint32_t count = 0;
  device_->check(
      device_->get_executable_statistics(device_->handle(), &executable, &count, nullptr),
      "vkGetPipelineExecutableStatisticsKHR");
  std::vector<VkPipelineExecutableStatisticKHR> statistics(
      count, VkPipelineExecutableStatisticKHR{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR});
  VkResult status =
      device_->get_executable_statistics(device_->handle(), &executable, &count, statistics.data());
  if (status != VK_INCOMPLETE) device_->check(status, "vkGetPipelineExecutableStatisticsKHR");
  statistics.resize(count);
  for (const auto& s : statistics) {
    KernelStatistic out{s.name, s.description, false};
    switch (s.format) {
      case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
        out.value = s.value.b32 == VK_TRUE;
        break;
      case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
        out.value = s.value.i64;
        break;
      case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
        out.value = s.value.u64;
        break;
      case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR:
        out.value = s.value.f64;
        break;
      default:
        continue;
    }
    result.push_back(std::move(out));
  }
  return result;
}

Kernel::Kernel(std::shared_ptr<Device> device, std::shared_ptr<const Pipeline> pipeline,
               std::string name)
    : device_(std::move(device)), pipeline_(std::move(pipeline)), name_(std::move(name)) {}

namespace {

// The module checked before the pipeline cache (and so the driver) sees it.
std::span<const uint32_t> validated(const Device& device, std::span<const uint32_t> spirv) {
  validate_spirv(spirv, device.api_version());
  return spirv;
}

}  // namespace

Kernel::Kernel(std::shared_ptr<Device> device, std::span<const uint32_t> spirv, std::string entry,
               const Specialization& specialization, std::string name)
    : device_(std::move(device)),
      pipeline_(device_->pipeline_cache().get(validated(*device_, spirv), entry, specialization)),
      name_(name.empty() ? entry : std::move(name)) {}

Kernel Kernel::builtin(std::shared_ptr<Device> device, std::string_view shader,
                       const Specialization& specialization) {
  const auto& registry = shaders::registry();
  auto found = registry.find(shader);
  if (found == registry.end())
    throw ArgumentError("no built-in shader named '" + std::string(shader) + "'");
  auto pipeline = device->pipeline_cache().get_builtin(shader, found->second, specialization);
  return Kernel(std::move(device), std::move(pipeline), std::string(shader));
}

}  // namespace bitnet
