#pragma once
#include <cstdint>
#include <optional>

#include "runtime/tensor.hpp"

// The BitNet quantizers (docs/NUMERICS.md): ternary and binary weights, per-token activations,
// per-tensor gradients, and the packed ternary layout. Every function runs on the tensor's
// device now and raises ArgumentError if its float input holds NaN or Inf (counted in the same
// GPU pass). Reductions use a fixed order: the same input gives bit-identical output every run.
namespace bitnet::ops {

inline constexpr float kEps = 1e-5f;
// Elements one workgroup sums for a global mean: enough segments to fill a large GPU (about 2048),
// each between 4096 and 65536 elements so the final combine stays short.
uint64_t tensor_segment(uint64_t elements);

constexpr uint64_t ternary_row_bytes(int64_t cols) { return (cols + 15) / 16 * 4; }
constexpr uint64_t binary_row_bytes(int64_t cols) { return (cols + 31) / 32 * 4; }

struct QuantizedWeights {
  Tensor packed;                // uint8 [rows, row_bytes], the public packed layout
  Tensor scales;                // float32 [groups]: gamma (ternary) or beta (binary)
  std::optional<Tensor> means;  // float32 [groups]: alpha = mean(W), from quantization only
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;  // 0: one scale for the whole tensor
  bool binary = false;

  int64_t groups() const { return group_size == 0 ? 1 : rows * (cols / group_size); }
};

// Absmean ternary (binary = false) or sign (binary = true) quantization of a float32/float16
// matrix [rows, cols], per tensor (group_size 0) or per group of group_size along cols.
QuantizedWeights quantize_weights(const Tensor& w, int64_t group_size, bool binary);
// Wraps packed weights and their scales (validated: shapes, dtypes, no code 3).
QuantizedWeights weights_from_packed(const Tensor& packed, const Tensor& scales, int64_t rows,
                                     int64_t cols, int64_t group_size, bool binary);
// `out` arguments: a tensor to write the result into (checked by ops::output), or a new one.
// When the op raises after its kernel ran (NaN or Inf found), `out` holds unspecified values.
Tensor dequantize_weights(const QuantizedWeights& weights, const std::optional<Tensor>& out = {});
Tensor unpack_ternary(const Tensor& packed, int64_t rows, int64_t cols,
                      const std::optional<Tensor>& out = {});
Tensor pack_ternary(const Tensor& values, const std::optional<Tensor>& out = {});

struct QuantizedRows {
  Tensor q;                           // int8 (symmetric) or uint8, the input's shape
  Tensor scales;                      // float32, the input's shape without its last axis
  std::optional<Tensor> zero_points;  // uint8, asymmetric only
};
struct RowOutputs {
  std::optional<Tensor> q, scales, zero_points;
};
QuantizedRows quantize_rows(const Tensor& x, int bits, bool symmetric, const RowOutputs& out = {});
Tensor dequantize_rows(const Tensor& q, const Tensor& scales,
                       const std::optional<Tensor>& zero_points,
                       const std::optional<Tensor>& out = {});

struct QuantizedTensor {
  Tensor q;      // int8, the input's shape
  Tensor scale;  // float32 [1]: s = qmax / max(max|g|, eps)
};
QuantizedTensor quantize_tensor(const Tensor& g, int bits, bool stochastic, uint64_t seed,
                                const std::optional<Tensor>& out_q = {},
                                const std::optional<Tensor>& out_scale = {});

}  // namespace bitnet::ops
