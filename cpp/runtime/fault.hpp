#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <string>

// A debug switch that makes chosen Vulkan calls fail, to prove every failure becomes the
// documented exception, leaks nothing and leaves the next call working (tests_py/test_faults.py).
//   BITNET_GPU_FAULT=<site>:<n>[:<count>[:<result>]]
// fails calls n .. n + count - 1 (1-based, counted from when the switch is read or armed) at one
// site with one VkResult. Sites and their default results:
//   allocation  vkAllocateMemory        VK_ERROR_OUT_OF_DEVICE_MEMORY
//   submission  vkQueueSubmit           VK_ERROR_DEVICE_LOST
//   wait        waiting on a fence      VK_ERROR_DEVICE_LOST (the device is lost mid-sequence)
// <result> may be out_of_device_memory, out_of_host_memory or device_lost. Off unless set.
namespace bitnet::fault {

enum class Site { allocation, submission, wait };

// Arms the switch from a "<site>:<n>[:<count>[:<result>]]" spec (ArgumentError if malformed);
// an empty spec disarms it.
void arm(const std::string& spec);
// The result a call at `site` must return instead of running, or VK_SUCCESS to run it.
VkResult injected(Site site);
// How many calls the switch has failed since it was armed.
uint64_t injected_count();

}  // namespace bitnet::fault
