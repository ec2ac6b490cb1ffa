#include "runtime/fault.hpp"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <vector>

#include "runtime/error.hpp"

namespace bitnet::fault {
namespace {

struct Switch {
  bool armed = false;
  Site site = Site::allocation;
  uint64_t first = 0, count = 0, seen = 0, failed = 0;
  VkResult result = VK_SUCCESS;
};

std::mutex mutex;
Switch state;
bool read_environment = false;
// false once the switch is known to be off: every allocation, submission and wait asks, so the
// common case must not take the mutex.
std::atomic<bool> may_fail{true};

Switch parse(const std::string& spec) {
  Switch s;
  if (spec.empty()) return s;
  std::vector<std::string> parts;
  std::stringstream stream(spec);
  for (std::string part; std::getline(stream, part, ':');) parts.push_back(part);
  auto fail = [&]() {
    return ArgumentError("BITNET_GPU_FAULT=" + spec +
                         ": expected <allocation|submission|wait>:<n>[:<count>[:<result>]], "
                         "n and count positive, result out_of_device_memory, "
                         "out_of_host_memory or device_lost");
  };
  if (parts.size() < 2 || parts.size() > 4) throw fail();
  if (parts[0] == "allocation")
    s.site = Site::allocation, s.result = VK_ERROR_OUT_OF_DEVICE_MEMORY;
  else if (parts[0] == "submission")
    s.site = Site::submission, s.result = VK_ERROR_DEVICE_LOST;
  else if (parts[0] == "wait")
    s.site = Site::wait, s.result = VK_ERROR_DEVICE_LOST;
  else
    throw fail();
  auto number = [&](const std::string& text) {
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || value == 0) throw fail();
    return static_cast<uint64_t>(value);
  };
  s.first = number(parts[1]);
  s.count = parts.size() >= 3 ? number(parts[2]) : 1;
  if (parts.size() == 4) {
    if (parts[3] == "out_of_device_memory")
      s.result = VK_ERROR_OUT_OF_DEVICE_MEMORY;
    else if (parts[3] == "out_of_host_memory")
      s.result = VK_ERROR_OUT_OF_HOST_MEMORY;
    else if (parts[3] == "device_lost")
      s.result = VK_ERROR_DEVICE_LOST;
    else
      throw fail();
  }
  s.armed = true;
  return s;
}

}  // namespace

void arm(const std::string& spec) {
  Switch parsed = parse(spec);
  std::lock_guard lock(mutex);
  read_environment = true;
  state = parsed;
  may_fail = state.armed;
}

VkResult injected(Site site) {
  if (!may_fail.load(std::memory_order_relaxed)) return VK_SUCCESS;
  std::lock_guard lock(mutex);
  if (!read_environment) {
    read_environment = true;
    if (const char* text = std::getenv("BITNET_GPU_FAULT"); text && *text) state = parse(text);
    may_fail = state.armed;
  }
  if (!state.armed || state.site != site) return VK_SUCCESS;
  const uint64_t call = ++state.seen;
  if (call < state.first || call >= state.first + state.count) return VK_SUCCESS;
  ++state.failed;
  return state.result;
}

uint64_t injected_count() {
  std::lock_guard lock(mutex);
  return state.failed;
}

}  // namespace bitnet::fault
