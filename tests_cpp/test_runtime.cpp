#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/command_context.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/fault.hpp"
#include "runtime/instance.hpp"
#include "runtime/kernel.hpp"
#include "runtime/pointer_set.hpp"
#include "runtime/recorder.hpp"
#include "runtime/sequence.hpp"
#include "runtime/shaders.hpp"
#include "runtime/spirv_reflect.hpp"
#include "runtime/tensor.hpp"

using namespace bitnet;

namespace {

// Any validation-layer message during a test fails that test.
class ValidationListener : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo&) override {
    for (const auto& message : Instance::get()->take_validation_messages())
      ADD_FAILURE() << "Vulkan validation: " << message;
  }
};

std::shared_ptr<Device> device() {
  static auto* shared = new std::shared_ptr<Device>(Device::create());  // see Instance::get
  return *shared;
}

std::vector<std::byte> push(uint32_t count, float a) {
  std::vector<std::byte> bytes(8);
  std::memcpy(bytes.data(), &count, 4);
  std::memcpy(bytes.data() + 4, &a, 4);
  return bytes;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> values(n);
  for (auto& v : values) v = normal(rng);
  return values;
}

std::vector<float> read(const Tensor& tensor) {
  std::vector<float> values(tensor.size());
  tensor.download(values.data(), tensor.nbytes());
  return values;
}

Tensor upload(const std::vector<float>& values, Placement placement = Placement::device) {
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor tensor = Tensor::empty(device(), std::vector<int64_t>{n}, DType::float32, placement);
  tensor.upload(values.data(), tensor.nbytes());
  return tensor;
}

uint32_t groups_for(uint64_t n) { return static_cast<uint32_t>((n + 255) / 256); }

}  // namespace

TEST(DeviceSelection, PicksAValidDeviceAndHonoursTheEnvironment) {
  auto infos = enumerate_devices();
  ASSERT_FALSE(infos.empty());
  EXPECT_LT(choose_device_index(std::nullopt), infos.size());
  EXPECT_EQ(choose_device_index(0u), 0u);
  EXPECT_THROW(choose_device_index(static_cast<uint32_t>(infos.size())), ArgumentError);

  const std::string name = infos.back().name;
  setenv("BITNET_GPU_DEVICE", name.substr(0, 4).c_str(), 1);
  EXPECT_LT(choose_device_index(std::nullopt), infos.size());
  setenv("BITNET_GPU_DEVICE", "no device is called this", 1);
  EXPECT_THROW(choose_device_index(std::nullopt), ArgumentError);
  setenv("BITNET_GPU_DEVICE", std::to_string(infos.size() + 3).c_str(), 1);
  EXPECT_THROW(choose_device_index(std::nullopt), ArgumentError);
  setenv("BITNET_GPU_DEVICE", "0", 1);
  EXPECT_EQ(choose_device_index(std::nullopt), 0u);
  unsetenv("BITNET_GPU_DEVICE");
}

TEST(DeviceSelection, DescribesCapabilities) {
  const DeviceInfo& info = device()->info();
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.subgroup_size, 0u);
  EXPECT_GT(info.max_storage_buffer_range, 0u);
  EXPECT_FALSE(info.memory_heaps.empty());
  for (const char* feature : {"float16", "int8", "storage8", "storage16", "integer_dot_product",
                              "cooperative_matrix", "external_memory_host", "timestamps"})
    EXPECT_TRUE(info.features.count(feature)) << feature;
}

TEST(DeviceSelection, DescribesCooperativeMatrices) {
  // The listed multiplies, as DeviceInfo::cooperative_matrices writes them: one that a device
  // without tensor cores lists none of (lavapipe), and the registry's types newer than the headers.
  EXPECT_EQ(describe_cooperative_matrix("NV", 16, 16, 32, VK_COMPONENT_TYPE_SINT8_NV,
                                        VK_COMPONENT_TYPE_SINT8_NV, VK_COMPONENT_TYPE_SINT32_NV,
                                        VK_COMPONENT_TYPE_SINT32_NV, false, VK_SCOPE_SUBGROUP_NV),
            "NV 16x16x32 int8 x int8 + int32 -> int32, subgroup");
  EXPECT_EQ(describe_cooperative_matrix(
                "KHR", 16, 8, 16, static_cast<VkComponentTypeNV>(1000141000),
                static_cast<VkComponentTypeNV>(1000141000), VK_COMPONENT_TYPE_FLOAT32_NV,
                VK_COMPONENT_TYPE_FLOAT32_NV, true, VK_SCOPE_WORKGROUP_NV),
            "KHR 16x8x16 bfloat16 x bfloat16 + float32 -> float32, workgroup, saturating");
  EXPECT_EQ(
      describe_cooperative_matrix("KHR", 8, 8, 4, static_cast<VkComponentTypeNV>(77),
                                  VK_COMPONENT_TYPE_UINT8_NV, VK_COMPONENT_TYPE_UINT32_NV,
                                  VK_COMPONENT_TYPE_UINT32_NV, false, static_cast<VkScopeNV>(9)),
      "KHR 8x8x4 type 77 x uint8 + uint32 -> uint32, scope 9");
  const DeviceInfo& info = device()->info();
  if (!info.features.at("cooperative_matrix")) EXPECT_TRUE(info.cooperative_matrices.empty());
  for (const std::string& shape : info.cooperative_matrices)
    EXPECT_TRUE(shape.rfind("NV ", 0) == 0 || shape.rfind("KHR ", 0) == 0) << shape;
}

TEST(MemoryPool, SizeClassesBoundTheSlack) {
  uint64_t previous = 0;
  for (uint64_t size = 1; size < (1ull << 34); size = size * 3 / 2 + 1) {
    const uint64_t capacity = MemoryPool::size_class(size);
    EXPECT_GE(capacity, size);
    EXPECT_GE(capacity, previous);
    if (size > 256) EXPECT_LE(capacity, size + size / 4 + 256) << size;
    previous = capacity;
  }
}

TEST(MemoryPool, ReusesFreedBlocksAndTrims) {
  auto dev = Device::create();
  VkBuffer first;
  {
    auto a = dev->allocate(100000, Placement::device);
    first = a->buffer();
  }
  MemoryStats before = dev->memory_stats();
  EXPECT_EQ(before.in_use_bytes, 0u);
  EXPECT_GT(before.pooled_bytes, 0u);
  auto b = dev->allocate(99000, Placement::device);  // same size class
  MemoryStats after = dev->memory_stats();
  EXPECT_EQ(b->buffer(), first);
  EXPECT_EQ(after.pool_hits, before.pool_hits + 1);
  EXPECT_EQ(after.in_use_bytes, 99000u);
  b.reset();
  dev->trim();
  EXPECT_EQ(dev->memory_stats().live_blocks, 0u);
  EXPECT_EQ(dev->memory_stats().allocated_bytes, 0u);
}

TEST(ScratchPool, LendsZeroBlocksOneHolderAtATimeAndLetsTheDeviceGo) {
  std::weak_ptr<Device> gone;
  {
    auto dev = Device::create();
    gone = dev;
    ScratchPool& pool = dev->scratch_pool();
    auto a = pool.lend(100);
    auto b = pool.lend(100);
    ASSERT_TRUE(a && b);
    EXPECT_NE(a->buffer(), b->buffer());  // both lent at once: two blocks
    EXPECT_GE(a->size(), 100u);
    {
      std::vector<uint32_t> words(a->size() / 4, 7u);
      Tensor lent(a, std::vector<int64_t>{static_cast<int64_t>(words.size())}, DType::uint32);
      lent.download(words.data(), lent.nbytes());
      EXPECT_EQ(std::count(words.begin(), words.end(), 0u), static_cast<long>(words.size()));
    }
    const VkBuffer first = a->buffer();
    a.reset();
    auto c = pool.lend(64);  // given back: lent again, not a new block
    EXPECT_EQ(c->buffer(), first);
    EXPECT_EQ(pool.pooled_bytes(), 2u * 4096u);              // sizes in powers of two from 4 KiB
    EXPECT_EQ(pool.lend(ScratchPool::kMostBytes), nullptr);  // past what the pool keeps
    c.reset();
    b.reset();
    dev->trim();
    EXPECT_EQ(pool.pooled_bytes(), 0u);
    auto d = pool.lend(8);  // holds the device while lent
    dev.reset();
    EXPECT_FALSE(gone.expired());
  }
  EXPECT_TRUE(gone.expired());  // the pool's own blocks do not keep it alive
}

TEST(Tensor, RoundTripsEveryDtypeAndPlacement) {
  std::mt19937 rng(7);
  for (DType dtype : all_dtypes)
    for (Placement placement : {Placement::device, Placement::host})
      for (int64_t n : {1, 7, 33, 4097}) {
        Tensor tensor = Tensor::empty(device(), std::vector<int64_t>{n, 3}, dtype, placement);
        std::vector<uint8_t> data(tensor.nbytes()), back(tensor.nbytes(), 0xAB);
        for (auto& byte : data) byte = static_cast<uint8_t>(rng());
        tensor.upload(data.data(), data.size());
        tensor.download(back.data(), back.size());
        EXPECT_EQ(data, back) << dtype_name(dtype) << " " << placement_name(placement) << " " << n;
      }
}

TEST(Tensor, RejectsBadShapesAndSizes) {
  EXPECT_THROW(Tensor::empty(device(), std::vector<int64_t>{-1}, DType::float32), ShapeError);
  EXPECT_THROW(Tensor::empty(device(), std::vector<int64_t>{1ll << 40, 1ll << 40}, DType::float32),
               ShapeError);
  EXPECT_THROW(Tensor::empty(device(), std::vector<int64_t>{1ll << 50}, DType::float32),
               OutOfMemory);
  Tensor tensor = Tensor::empty(device(), std::vector<int64_t>{4}, DType::float32);
  float values[3] = {};
  EXPECT_THROW(tensor.upload(values, sizeof values), ShapeError);
  Tensor empty = Tensor::empty(device(), std::vector<int64_t>{0, 5}, DType::int8);
  EXPECT_EQ(empty.nbytes(), 0u);
  empty.upload(nullptr, 0);
}

TEST(Reflection, ReadsTheShaderInterface) {
  auto words = shaders::registry().at("axpy");
  KernelInterface interface = reflect_spirv(words, "main");
  ASSERT_EQ(interface.binding_writable.size(), 2u);
  EXPECT_FALSE(interface.binding_writable[0]);
  EXPECT_TRUE(interface.binding_writable[1]);
  EXPECT_EQ(interface.push_constant_size, 8u);
  ASSERT_TRUE(interface.local_size_spec_ids[0].has_value());
  EXPECT_EQ(*interface.local_size_spec_ids[0], 0u);
  EXPECT_THROW(reflect_spirv(words, "not_main"), ArgumentError);
  // Blocks aliasing bindings 5, 6 and 7 (float and vec4 views): still 10 bindings, the outputs
  // and the split-K partial sums and tickets written.
  KernelInterface coopmat = reflect_spirv(shaders::registry().at("bitlinear_coopmat"), "main");
  EXPECT_EQ(coopmat.binding_writable,
            (std::vector<bool>{false, false, false, false, false, false, true, true, true, true}));
  std::vector<uint32_t> garbage = {1, 2, 3, 4, 5, 6};
  EXPECT_THROW(reflect_spirv(garbage, "main"), ArgumentError);
  std::vector<uint32_t> truncated(words.begin(), words.begin() + words.size() / 2);
  truncated.push_back(0xFFFF0001u);  // an instruction claiming 65535 words
  EXPECT_THROW(reflect_spirv(truncated, "main"), ArgumentError);
}

TEST(Kernel, DispatchesAxpy) {
  for (uint64_t n : {1u, 7u, 33u, 4097u, 100000u}) {
    auto x = random_floats(n, 1), y = random_floats(n, 2);
    Tensor tx = upload(x), ty = upload(y);
    Kernel axpy = Kernel::builtin(device(), "axpy", {{0, int64_t{256}}});
    BufferBinding bindings[] = {tx.binding(), ty.binding()};
    dispatch(axpy, {groups_for(n), 1, 1}, bindings, push(static_cast<uint32_t>(n), 2.5f));
    auto out = read(ty);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.5f * x[i] + y[i]) << i;
  }
}

TEST(Kernel, BuiltinPipelinesAreCachedByNameAndExactSpecialization) {
  auto same = [](const Kernel& a, const Kernel& b) { return &a.interface() == &b.interface(); };
  Kernel a = Kernel::builtin(device(), "quantize_rows_f32", {{2, 1e-7}});
  EXPECT_TRUE(same(a, Kernel::builtin(device(), "quantize_rows_f32", {{2, 1e-7}})));
  EXPECT_FALSE(same(a, Kernel::builtin(device(), "quantize_rows_f32", {{2, 2e-7}})));
  EXPECT_FALSE(same(a, Kernel::builtin(device(), "quantize_rows_f32", {{0, false}, {2, 1e-7}})));
  EXPECT_FALSE(same(a, Kernel::builtin(device(), "quantize_rows_f16", {{2, 1e-7}})));
}

TEST(Kernel, ReportsTheDriversStatisticsWhereItHasThem) {
  Kernel axpy = Kernel::builtin(device(), "axpy", {{0, int64_t{256}}});
  const auto statistics = axpy.statistics();
  EXPECT_EQ(statistics.empty(), !device()->feature("pipeline_statistics"));
  for (const auto& s : statistics) EXPECT_FALSE(s.name.empty());
}

TEST(Sequence, HundredDependentKernelsGiveTheRightAnswer) {
  const uint32_t n = 10007;
  auto x = random_floats(n, 3), y = random_floats(n, 4);
  Tensor tx = upload(x), ty = upload(y);
  Kernel axpy = Kernel::builtin(device(), "axpy", {{0, int64_t{64}}});
  BufferBinding bindings[] = {tx.binding(), ty.binding()};
  Sequence sequence(device(), device()->has_timestamps() ? Timing::per_op : Timing::off);
  for (int step = 0; step < 100; ++step)
    sequence.dispatch(axpy, {groups_for(n), 1, 1}, bindings, push(n, 0.25f));
  EXPECT_EQ(sequence.op_count(), 100u);
  EXPECT_EQ(sequence.barrier_count(), 99u);  // each dispatch reads what the previous one wrote
  sequence.run();
  auto out = read(ty);
  for (uint32_t i = 0; i < n; ++i) {
    float expected = y[i];
    for (int step = 0; step < 100; ++step) expected = 0.25f * x[i] + expected;
    ASSERT_EQ(out[i], expected) << i;
  }
  if (device()->has_timestamps()) {
    auto timings = sequence.timings();
    ASSERT_EQ(timings.size(), 100u);
    for (const auto& t : timings) EXPECT_GE(t.seconds, 0.0);
  }
}

TEST(Sequence, IndependentOpsNeedNoBarrier) {
  Kernel axpy = Kernel::builtin(device(), "axpy");
  std::vector<Tensor> tensors;
  for (int i = 0; i < 8; ++i) tensors.push_back(upload(random_floats(64, i)));
  Sequence sequence(device(), Timing::off);
  for (int i = 0; i < 8; i += 2) {
    BufferBinding bindings[] = {tensors[i].binding(), tensors[i + 1].binding()};
    sequence.dispatch(axpy, {1, 1, 1}, bindings, push(64, 1.0f));
  }
  EXPECT_EQ(sequence.barrier_count(), 0u);
  // Reading tensors[1] (written above) needs one barrier; the write-after-read on [0] too.
  BufferBinding chained[] = {tensors[1].binding(), tensors[0].binding()};
  sequence.dispatch(axpy, {1, 1, 1}, chained, push(64, 1.0f));
  EXPECT_EQ(sequence.barrier_count(), 1u);
  sequence.run();
}

TEST(Sequence, CopiesAndFills) {
  auto values = random_floats(1000, 9);
  Tensor source = upload(values);
  Tensor middle = Tensor::empty(device(), std::vector<int64_t>{1000}, DType::float32);
  Tensor result =
      Tensor::empty(device(), std::vector<int64_t>{1000}, DType::float32, Placement::host);
  Sequence sequence(device(), Timing::off);
  sequence.fill(middle.binding(), 0x7fc00000u);
  sequence.copy(source.binding(), middle.binding());
  sequence.copy(middle.binding(), result.binding());
  EXPECT_EQ(sequence.barrier_count(), 2u);
  sequence.run();
  EXPECT_EQ(read(result), values);
}

TEST(Sequence, OpensTheNextContextWhileASubmissionRunsAndTakesItOnlyOnce) {
  Tensor t = upload(random_floats(64, 10));
  Kernel axpy = Kernel::builtin(device(), "axpy", {{0, int64_t{64}}});
  Tensor ones = upload(std::vector<float>(64, 1.0f));
  BufferBinding bindings[] = {ones.binding(), t.binding()};
  auto fill = [&](Timing timing, Reuse reuse, float value) {
    Sequence sequence(device(), timing, reuse);
    uint32_t word;
    std::memcpy(&word, &value, sizeof word);
    sequence.fill(t.binding(), word);
    sequence.dispatch(axpy, {1, 1, 1}, bindings, push(64, 0.5f));  // t = value + 0.5
    if (reuse == Reuse::once) {
      sequence.run();
    } else {
      sequence.close();
      sequence.replay();
      sequence.replay();  // replays the fill too: value + 0.5 again
    }
    EXPECT_EQ(read(t), std::vector<float>(64, value + 0.5f));
  };
  fill(Timing::off, Reuse::once, 1.0f);
  // The submission above opened a context for the next untimed one-time sequence.
  auto open = device()->acquire_context(true);
  EXPECT_TRUE(open->open);
  device()->recycle_context(std::move(open));  // unused: reset before it is lent again
  EXPECT_FALSE(device()->acquire_context(false)->open);
  // Replayable and timed sequences open their own; every kind still computes the same.
  fill(Timing::off, Reuse::replay, 2.0f);
  if (device()->has_timestamps()) fill(Timing::per_op, Reuse::once, 3.0f);
  fill(Timing::off, Reuse::once, 4.0f);
  fill(Timing::off, Reuse::once, 5.0f);
}

TEST(PointerSet, FindsItemsBeforeAndAfterItIndexesThem) {
  std::vector<int> storage(40);
  PointerSet<const int*> set;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 40; ++i) {
      EXPECT_FALSE(set.contains(&storage[i])) << i;
      EXPECT_TRUE(set.insert(&storage[i])) << i;
      EXPECT_FALSE(set.insert(&storage[i])) << i;  // already there
      for (int j = 0; j <= i; ++j) ASSERT_TRUE(set.contains(&storage[j])) << i << " " << j;
      if (i + 1 < 40) EXPECT_FALSE(set.contains(&storage[i + 1])) << i;
    }
    set.clear();
    for (int i = 0; i < 40; ++i) EXPECT_FALSE(set.contains(&storage[i])) << i;
  }
}

// The fault switch's error paths, here so that the sanitizer build checks them for leaks too.
TEST(Faults, InjectedFailuresThrowAndTheNextCallWorks) {
  auto local = Device::create(device()->info().index);
  local->trim();
  // A new slab and its retry after trim() fail, then memory of the block's own and its retry.
  fault::arm("allocation:1:4");
  EXPECT_THROW(Tensor::empty(local, std::vector<int64_t>{123457}, DType::uint8), OutOfMemory);
  EXPECT_EQ(local->memory_stats().in_use_bytes, 0u);
  fault::arm("");
  Tensor x = Tensor::empty(local, std::vector<int64_t>{16}, DType::float32);
  Tensor y = Tensor::empty(local, std::vector<int64_t>{16}, DType::float32);
  Kernel axpy = Kernel::builtin(local, "axpy");
  BufferBinding two[] = {x.binding(), y.binding()};
  fault::arm("submission:1:1:out_of_host_memory");
  EXPECT_THROW(dispatch(axpy, {1, 1, 1}, two, push(16, 1.0f)), OutOfMemory);
  EXPECT_FALSE(local->lost());
  dispatch(axpy, {1, 1, 1}, two, push(16, 1.0f));
  fault::arm("wait:1");
  EXPECT_THROW(dispatch(axpy, {1, 1, 1}, two, push(16, 1.0f)), DeviceError);
  fault::arm("");
  EXPECT_TRUE(local->lost());
  EXPECT_THROW(Tensor::empty(local, std::vector<int64_t>{4}, DType::float32), DeviceError);
  EXPECT_THROW(fault::arm("wait:0"), ArgumentError);
}

TEST(Errors, BadDispatchesThrowAndLeaveTheDeviceUsable) {
  Kernel axpy = Kernel::builtin(device(), "axpy");
  Tensor x = upload(random_floats(16, 1)), y = upload(random_floats(16, 2));
  BufferBinding one[] = {x.binding()};
  BufferBinding two[] = {x.binding(), y.binding()};
  EXPECT_THROW(dispatch(axpy, {1, 1, 1}, one, push(16, 1.0f)), ShapeError);
  EXPECT_THROW(dispatch(axpy, {1, 1, 1}, two, {}), ShapeError);
  const uint32_t too_many = device()->limits().maxComputeWorkGroupCount[0];
  if (too_many < 0xffffffffu)
    EXPECT_THROW(dispatch(axpy, {too_many + 1, 1, 1}, two, push(16, 1.0f)), UnsupportedError);
  EXPECT_THROW(Kernel::builtin(device(), "no_such_shader"), ArgumentError);
  EXPECT_THROW(Kernel::builtin(device(), "axpy", {{7, int64_t{1}}}), ArgumentError);
  EXPECT_THROW(Kernel::builtin(device(), "axpy", {{0, int64_t{1} << 20}}), UnsupportedError);

  Sequence sequence(device(), Timing::off);
  sequence.dispatch(axpy, {1, 1, 1}, two, push(16, 1.0f));
  sequence.run();
  EXPECT_THROW(sequence.dispatch(axpy, {1, 1, 1}, two, push(16, 1.0f)), ArgumentError);

  const uint64_t range = device()->limits().maxStorageBufferRange;
  if (range < device()->info().max_allocation_size && range < (1ull << 31)) {
    Tensor big = Tensor::empty(device(), std::vector<int64_t>{static_cast<int64_t>(range / 4 + 4)},
                               DType::float32);
    BufferBinding over[] = {x.binding(), big.binding()};
    EXPECT_THROW(dispatch(axpy, {1, 1, 1}, over, push(16, 1.0f)), UnsupportedError);
  }
  auto expected = read(y);
  dispatch(axpy, {1, 1, 1}, two, push(16, 0.0f));  // still usable: y unchanged by a = 0
  EXPECT_EQ(read(y), expected);
}

TEST(Lifetimes, TensorsKeepTheirDeviceAlive) {
  Tensor tensor = [] {
    auto dev = Device::create();
    return Tensor::empty(dev, std::vector<int64_t>{256}, DType::int32);
  }();
  std::vector<int32_t> values(256, 42), back(256);
  tensor.upload(values.data(), 1024);
  tensor.download(back.data(), 1024);
  EXPECT_EQ(values, back);
}

TEST(Validation, IsOnAndCapturesMessages) {
  ASSERT_TRUE(Instance::get()->validation_enabled()) << "run with BITNET_GPU_VALIDATION=1";
  VkBufferCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  info.size = 0;  // invalid on purpose: VUID-VkBufferCreateInfo-size-00912
  info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
  VkBuffer buffer = VK_NULL_HANDLE;
  if (vkCreateBuffer(device()->handle(), &info, nullptr, &buffer) == VK_SUCCESS)
    vkDestroyBuffer(device()->handle(), buffer, nullptr);
  EXPECT_FALSE(Instance::get()->take_validation_messages().empty());
}

int main(int argc, char** argv) {
  setenv("BITNET_GPU_VALIDATION", "1", 0);
  setenv("BITNET_GPU_CACHE_DIR", "", 0);
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new ValidationListener);
  return RUN_ALL_TESTS();
}
