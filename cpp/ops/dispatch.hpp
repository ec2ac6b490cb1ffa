#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/memory.hpp"
#include "runtime/recorder.hpp"
#include "runtime/sequence.hpp"
#include "runtime/tensor.hpp"

namespace bitnet {
class Device;
}

namespace bitnet::ops {

struct RowRange {
  uint64_t first = 0;
  uint64_t count = 0;
};

// Splits `rows` rows into ranges whose bytes in every tensor (row_bytes[i] bytes a row) fit the
// device's maxStorageBufferRange and start on minStorageBufferOffsetAlignment, so a kernel can
// walk tensors larger than one binding may cover. UnsupportedError if one row is already too big.
std::vector<RowRange> row_ranges(const Device& device, uint64_t rows,
                                 std::initializer_list<uint64_t> row_bytes);

// The part of `tensor` holding rows [range.first, range.first + range.count), rows of row_bytes
// bytes (the last row may be short).
BufferBinding rows_of(const Tensor& tensor, const RowRange& range, uint64_t row_bytes);

// Workgroups for `invocations` invocations of `local_size`, capped at the device's limit (the
// kernels loop grid-stride over what is left).
uint32_t workgroups(const Device& device, uint64_t invocations, uint32_t local_size = 256);
// Whether the device's driver ends a shader invocation's loops after 65535 passes in all
// (lavapipe; see shaders/runtime/strided_loop.glsl), so kernels must keep their loops' passes few.
bool guards_loop_passes(const Device& device);

// A dispatch grid from 64-bit workgroup counts; UnsupportedError "<what> is over this device's
// workgroup-count limits" where one is over maxComputeWorkGroupCount (rather than letting the
// conversion to 32 bits wrap it).
std::array<uint32_t, 3> checked_grid(const Device& device, std::array<uint64_t, 3> groups,
                                     const std::string& what);

// Subgroups in a workgroup of local_size invocations on this device (at least 1).
uint32_t subgroups_in(const Device& device, uint32_t local_size = 256);

// "(2, 3)", "(4,)": shapes in error messages, as NumPy prints them.
std::string shape_text(const std::vector<int64_t>& shape);

// DTypeError unless `t` is float32 or float16.
void require_float(const Tensor& t, const char* name);
// DTypeError unless a and b have one dtype, ArgumentError unless they live on one device.
void require_same_kind(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name);

// The tensor an op writes: `given` (an `out=` argument) once checked against the device, dtype
// and shape the op produces and for sharing memory with any of `inputs`; else a new tensor.
Tensor output(const std::shared_ptr<Device>& device, const std::optional<Tensor>& given,
              const std::vector<int64_t>& shape, DType dtype, const char* name,
              std::initializer_list<const Tensor*> inputs = {});

// The built-in shader variant for a float input: base + "_f32" or "_f16".
std::string float_variant(const char* base, DType dtype);

// Attention's keys and values: of q's dtype, or float16 beside float32 q (a float16 KV cache).
// DTypeError for any other pair, or where k and v differ; ArgumentError off q's device.
void require_keys_values(const Tensor& q, const Tensor& k, const char* k_name, const Tensor& v,
                         const char* v_name);
// The attention shader variant for q's and the keys' dtypes: float_variant's, or base +
// "_f32_kv16" for float16 keys and values beside float32 q.
std::string attention_variant(const char* base, DType q, DType kv);

// A uint32 counter in host memory, zeroed by the CPU (a host write before the submission is
// visible to it, so no GPU fill and no barrier), for the integer atomics that count NaN/Inf (or
// invalid) values; read it once the sequence has run. In a graph it is zeroed before every replay.
Tensor zeroed_counter(const std::shared_ptr<Device>& device);
uint32_t read_counter(const Tensor& counter);
// uint32 counters in device memory for kernels whose last workgroup resets its counter for the
// next run (or graph replay). In a graph, scratch an earlier op left zero; else a block of the
// device's ScratchPool (zero since it was made), or where the pool is full one zeroed by a fill
// recorded into `sequence` ahead of the op that uses them.
Tensor self_resetting_counters(Sequence& sequence, int64_t count);
// ArgumentError "<name> contains N NaN or Inf value(s)" when the counter is not zero.
void raise_if_nonfinite(const Tensor& counter, const char* name);

template <typename T>
std::vector<std::byte> push_bytes(const T& value) {
  std::vector<std::byte> bytes(sizeof(T));
  std::memcpy(bytes.data(), &value, sizeof(T));
  return bytes;
}

}  // namespace bitnet::ops
