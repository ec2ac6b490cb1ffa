#include "ops/dispatch.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "runtime/device.hpp"
#include "runtime/error.hpp"

namespace bitnet::ops {

std::vector<RowRange> row_ranges(const Device& device, uint64_t rows,
                                 std::initializer_list<uint64_t> row_bytes) {
  const uint64_t limit = device.limits().maxStorageBufferRange;
  const uint64_t align = std::max<uint64_t>(1, device.limits().minStorageBufferOffsetAlignment);
  uint64_t step = 1, most = rows;
  for (uint64_t bytes : row_bytes) {
    if (bytes == 0) continue;
    step = std::lcm(step, align / std::gcd(align, bytes));
    most = std::min(most, limit / bytes);
  }
  if (most >= rows) return {{0, rows}};
  const uint64_t chunk = most / step * step;
  if (chunk == 0)
    throw UnsupportedError("one row of this tensor is larger than this device's "
                           "maxStorageBufferRange of " + format_bytes(limit));
  std::vector<RowRange> ranges;
  for (uint64_t first = 0; first < rows; first += chunk)
    ranges.push_back({first, std::min(chunk, rows - first)});
  return ranges;
}

BufferBinding rows_of(const Tensor& tensor, const RowRange& range, uint64_t row_bytes) {
  const uint64_t offset = range.first * row_bytes;
  const uint64_t size = std::min(range.count * row_bytes, tensor.nbytes() - std::min(offset, tensor.nbytes()));
  return {tensor.allocation(), offset, size};
}

uint32_t workgroups(const Device& device, uint64_t invocations, uint32_t local_size) {
  const uint64_t needed = (invocations + local_size - 1) / local_size;
  return static_cast<uint32_t>(
      std::clamp<uint64_t>(needed, 1, device.limits().maxComputeWorkGroupCount[0]));
}

}  // namespace bitnet::ops
