#pragma once
#include <optional>

#include "ops/quantize.hpp"
#include "runtime/tensor.hpp"

// BitLinear (docs/NUMERICS.md): y = (x_q . W_q) * gamma / s + bias with exact int32 accumulators.
namespace bitnet::ops {

enum class BitLinearAlgorithm { automatic, matvec, tiled };

// Rows up to this many use the matvec kernel when the algorithm is automatic.
inline constexpr int64_t kMatvecMaxRows = 8;

struct BitLinearResult {
  Tensor y;                             // float32 [..., N]
  std::optional<Tensor> accumulators;   // int32 [..., N], when asked for
};

// x: float32/float16 [..., K]; w: ternary weights [N, K] with one scale; bias: float32 [N].
// hardware_dot chooses the packed int8 dot-product instruction (default: where accelerated).
BitLinearResult bitlinear(const Tensor& x, const QuantizedWeights& w, const std::optional<Tensor>& bias,
                          bool with_accumulators, BitLinearAlgorithm algorithm,
                          std::optional<bool> hardware_dot = std::nullopt);

// int8 [M, K] x int8 [K, N] -> int32 [M, N], exactly.
Tensor int8_matmul(const Tensor& a, const Tensor& b, std::optional<bool> hardware_dot = std::nullopt);
// int8 [M, K] x ternary [N, K]^T -> int32 [M, N], exactly.
Tensor ternary_matmul(const Tensor& a, const QuantizedWeights& w,
                      std::optional<bool> hardware_dot = std::nullopt);
// grad_x = grad_y @ (W_q * gamma): float32 [..., N] -> float32 [..., K].
Tensor bitlinear_backward_input(const Tensor& grad_y, const QuantizedWeights& w);

}  // namespace bitnet::ops
