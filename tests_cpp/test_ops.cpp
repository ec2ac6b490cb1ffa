#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ops/dispatch.hpp"
#include "ops/elementwise.hpp"
#include "ops/model.hpp"
#include "ops/quantize.hpp"
#include "ops/sampling.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/graph.hpp"

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

namespace {

Tensor from_values(const std::shared_ptr<Device>& device, const std::vector<float>& values) {
  Tensor t = Tensor::empty(device, std::vector<int64_t>{static_cast<int64_t>(values.size())},
                           DType::float32);
  t.upload(values.data(), values.size() * sizeof(float));
  return t;
}

template <typename T = float>
std::vector<T> values_of(const Tensor& t) {
  std::vector<T> values(t.size());
  t.download(values.data(), values.size() * sizeof(T));
  return values;
}

}  // namespace

TEST(Graph, RecordsOpsOnceAndReplaysThemWithNewInputs) {
  auto device = Device::default_device();
  Tensor a = from_values(device, {1, 2, 3});
  Tensor b = from_values(device, {10, 20, 30});
  Graph graph(device, Timing::off);
  graph.begin();
  EXPECT_EQ(device->recording_graph(), &graph);
  Tensor sum = ops::binary(a, b, ops::BinaryOp::add);
  Tensor product = ops::binary(sum, b, ops::BinaryOp::mul);  // depends on the first op
  graph.end();
  EXPECT_EQ(device->recording_graph(), nullptr);
  EXPECT_EQ(graph.op_count(), 2u);
  graph.replay();
  EXPECT_EQ(values_of(product), (std::vector<float>{110, 440, 990}));
  const std::vector<float> next{-1, 0, 1};
  a.upload(next.data(), next.size() * sizeof(float));
  graph.replay();
  EXPECT_EQ(values_of(product), (std::vector<float>{90, 400, 930}));
  EXPECT_THROW(graph.begin(), ArgumentError);  // recorded once
}

TEST(Graph, ChecksRunAfterEveryReplayWithCountersZeroedBefore) {
  auto device = Device::default_device();
  Tensor x = from_values(device, {1, 2, 3, 4});
  Graph graph(device, Timing::off);
  graph.begin();
  ops::quantize_rows(x.reshaped({1, 4}), 8, true);
  graph.end();
  graph.replay();
  const std::vector<float> bad{1, NAN, 3, 4};
  x.upload(bad.data(), bad.size() * sizeof(float));
  EXPECT_THROW(graph.replay(), ArgumentError);
  const std::vector<float> good{4, 3, 2, 1};
  x.upload(good.data(), good.size() * sizeof(float));
  EXPECT_NO_THROW(graph.replay());
}

TEST(Graph, AnOpThatFailsHalfwaySpoilsTheGraph) {
  auto device = Device::default_device();
  Tensor a = from_values(device, {1, 2, 3});
  Graph graph(device, Timing::off);
  graph.begin();
  {
    Recorder op(device);
    op.sequence().fill(a.binding(), 0);
    // leaves without run(): as when an op throws after recording part of its work
  }
  graph.end();
  EXPECT_THROW(graph.replay(), ArgumentError);
  // Ops outside the graph run at once again.
  EXPECT_EQ(values_of(ops::binary(a, a, ops::BinaryOp::add)), (std::vector<float>{2, 4, 6}));
}

namespace {

// Writes sample_rows' params: temperature t, 1 / t where t >= 1, top_k, seed, top-p's p 2^32.
void set_sampling(Tensor& params, float t, uint32_t top_k, uint32_t seed, uint32_t top_p = 0) {
  const float inverse = t >= 1.0f ? 1.0f / t : 0.0f;
  uint32_t words[6] = {0, 0, top_k, seed, 0, top_p};
  std::memcpy(&words[0], &t, 4);
  std::memcpy(&words[1], &inverse, 4);
  params.upload(words, sizeof words);
}

}  // namespace

TEST(Sampling, ReplaysReuseTheirSelfResettingScratch) {
  auto device = Device::default_device();
  // Two rows of 3000 values (three chunks each): row 0's largest at 2500, row 1's at 7.
  std::vector<float> values(6000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.37f * static_cast<float>(i));
  values[2500] = 5.0f;
  values[3007] = 6.0f;
  Tensor logits = from_values(device, values).reshaped({2, 3000});
  Tensor start = Tensor::empty(device, std::vector<int64_t>{1}, DType::int32);
  const int32_t zero = 0;
  start.upload(&zero, sizeof zero);
  Tensor params = Tensor::empty(device, std::vector<int64_t>{6}, DType::uint32);
  set_sampling(params, 1.0f, 1, 7);
  Graph graph(device, Timing::off);
  graph.begin();
  Tensor drawn = ops::sample_rows(logits, params, start, 0);
  graph.end();
  // top_k 1 keeps the largest alone, whatever the noise: every replay's counting passes start
  // from bins and tickets the replay before left at zero.
  for (int32_t step = 0; step < 5; ++step) {
    start.upload(&step, sizeof step);
    graph.replay();
    EXPECT_EQ(values_of<int32_t>(drawn), (std::vector<int32_t>{2500, 7}));
  }
  // Temperature 0 is the argmax too; a high temperature without top_k draws other indices.
  set_sampling(params, 0.0f, 0, 7);
  graph.replay();
  EXPECT_EQ(values_of<int32_t>(drawn), (std::vector<int32_t>{2500, 7}));
  set_sampling(params, 100.0f, 0, 7);
  graph.replay();
  EXPECT_NE(values_of<int32_t>(drawn)[0], 2500);
  EXPECT_NE(values_of<int32_t>(drawn)[1], 7);
  // NaN raises after the replay; the next replay works again.
  set_sampling(params, 1.0f, 1, 7);
  std::vector<float> bad = values;
  bad[10] = NAN;
  logits.upload(bad.data(), bad.size() * sizeof(float));
  EXPECT_THROW(graph.replay(), ArgumentError);
  EXPECT_EQ(values_of<int32_t>(drawn)[0], -1);
  logits.upload(values.data(), values.size() * sizeof(float));
  graph.replay();
  EXPECT_EQ(values_of<int32_t>(drawn), (std::vector<int32_t>{2500, 7}));
  EXPECT_THROW(ops::sample_rows(logits, start, start, 0), DTypeError);
}

TEST(Sampling, TopPReplaysResetTheLargestKey) {
  auto device = Device::default_device();
  if (!device->feature("int64_atomics")) GTEST_SKIP() << "no 64-bit integer atomics";
  // Row 0: 3000 values in [-1, 1] and 5 at 2500; row 1 the same values shifted by 100, its 5 at 7.
  std::vector<float> values(6000);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = std::sin(0.37f * static_cast<float>(i)) + (i >= 3000 ? 100.0f : 0.0f);
  values[2500] = 5.0f;
  values[3007] = 105.0f;
  Tensor logits = from_values(device, values).reshaped({2, 3000});
  Tensor start = Tensor::empty(device, std::vector<int64_t>{1}, DType::int32);
  Tensor params = Tensor::empty(device, std::vector<int64_t>{6}, DType::uint32);
  // p = 1/128: the largest value holds about 1/20 of the mass at t = 1, so it alone is kept.
  set_sampling(params, 1.0f, 0, 3, 1u << 25);
  Graph graph(device, Timing::off);
  graph.begin();
  Tensor drawn = ops::sample_rows(logits, params, start, 0, std::nullopt, true);
  graph.end();
  for (int32_t step = 0; step < 4; ++step) {
    start.upload(&step, sizeof step);
    graph.replay();
    EXPECT_EQ(values_of<int32_t>(drawn), (std::vector<int32_t>{2500, 7}));
  }
  // P = 0 is no top-p: at t = 100 other indices win.
  set_sampling(params, 100.0f, 0, 3, 0);
  graph.replay();
  EXPECT_NE(values_of<int32_t>(drawn)[0], 2500);
  EXPECT_NE(values_of<int32_t>(drawn)[1], 7);
  // Back to p = 1/128 after a replay that left the largest key alone.
  set_sampling(params, 1.0f, 0, 3, 1u << 25);
  graph.replay();
  EXPECT_EQ(values_of<int32_t>(drawn), (std::vector<int32_t>{2500, 7}));
}
