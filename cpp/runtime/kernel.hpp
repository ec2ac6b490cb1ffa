#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "runtime/pipeline_cache.hpp"

namespace bitnet {

class Device;

// One figure the driver's compiler reports for a pipeline (VK_KHR_pipeline_executable_properties):
// for example NVIDIA's register count, or the shared and spilled memory a workgroup takes.
struct KernelStatistic {
  std::string name;
  std::string description;
  std::variant<bool, int64_t, uint64_t, double> value;
};

// A user's (or a built-in) compute shader: a handle on its pipeline. Dispatches go through a
// Recorder (runtime/recorder.hpp), which decides where they are recorded.
class Kernel {
 public:
  Kernel(std::shared_ptr<Device> device, std::span<const uint32_t> spirv,
         std::string entry = "main", const Specialization& specialization = {},
         std::string name = {});
  Kernel(std::shared_ptr<Device> device, std::shared_ptr<const Pipeline> pipeline,
         std::string name);
  static Kernel builtin(std::shared_ptr<Device> device, std::string_view shader,
                        const Specialization& specialization = {});

  const std::string& name() const { return name_; }
  const KernelInterface& interface() const { return pipeline_->interface; }
  const std::array<uint32_t, 3>& local_size() const { return pipeline_->local_size; }
  const std::shared_ptr<Device>& device() const { return device_; }
  const std::shared_ptr<const Pipeline>& pipeline() const { return pipeline_; }

  // The statistics of the pipeline's first executable, as the driver names them; empty where the
  // device does not report them (DeviceInfo features "pipeline_statistics").
  std::vector<KernelStatistic> statistics() const;

 private:
  std::shared_ptr<Device> device_;
  std::shared_ptr<const Pipeline> pipeline_;
  std::string name_;
};

}  // namespace bitnet
