#pragma once
#include <vulkan/vulkan.h>

#include <memory>
#include <vector>

#include "runtime/handle.hpp"

namespace bitnet {

// Everything one recorded submission needs: a command buffer and its pool, a fence, descriptor
// and timestamp-query pools that grow as ops are recorded, and references that keep the
// buffers and pipelines it uses alive until the GPU is done with them.
struct CommandContext {
  CommandPoolHandle command_pool;
  VkCommandBuffer commands = VK_NULL_HANDLE;
  FenceHandle fence;
  std::vector<DescriptorPoolHandle> descriptor_pools;
  size_t descriptor_pool_index = 0;
  std::vector<QueryPoolHandle> query_pools;
  uint32_t queries_used = 0;
  std::vector<std::shared_ptr<const void>> keep_alive;
  bool submitted = false;
  bool open = false;  // begun for one submission, its opening barrier recorded (open_commands)

  static constexpr uint32_t kQueriesPerPool = 256;
  static constexpr uint32_t kSetsPerDescriptorPool = 256;
};

// Begins the context's command buffer (for one submission, or for replays) and records the
// barrier every sequence opens with (sequence.cpp).
VkResult open_commands(CommandContext& context, bool one_time);

}  // namespace bitnet
