#include <gtest/gtest.h>

#include "ops/dispatch.hpp"
#include "ops/quantize.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"

using namespace bitnet;

TEST(RowRanges, CoverEveryRowWithinTheBindingLimits) {
  auto device = Device::default_device();
  const uint64_t limit = device->limits().maxStorageBufferRange;
  const uint64_t align = device->limits().minStorageBufferOffsetAlignment;
  for (uint64_t row_bytes : {4ull, 68ull, 4097ull * 4, 1000000ull * 4}) {
    const uint64_t rows = limit / row_bytes * 3 + 7;  // needs several ranges
    auto ranges = ops::row_ranges(*device, rows, {row_bytes, row_bytes / 4 + 1});
    uint64_t next = 0;
    for (const auto& range : ranges) {
      EXPECT_EQ(range.first, next);
      EXPECT_LE(range.count * row_bytes, limit);
      EXPECT_EQ(range.first * row_bytes % align, 0u);
      EXPECT_EQ(range.first * (row_bytes / 4 + 1) % align, 0u);
      next += range.count;
    }
    EXPECT_EQ(next, rows);
    EXPECT_GT(ranges.size(), 1u);
  }
  EXPECT_EQ(ops::row_ranges(*device, 10, {16}).size(), 1u);
  EXPECT_THROW(ops::row_ranges(*device, 2, {limit + 1}), UnsupportedError);
}

TEST(TensorSegment, FillsTheGpuAndStaysBounded) {
  EXPECT_EQ(ops::tensor_segment(1), 4096u);
  EXPECT_EQ(ops::tensor_segment(4096ull * 4096), 8192u);
  EXPECT_EQ(ops::tensor_segment(16384ull * 16384), 65536u);
  EXPECT_EQ(ops::tensor_segment(1ull << 40), 65536u);
}
