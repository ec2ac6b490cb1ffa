#pragma once
#include <optional>
#include <vector>

#include "ops/quantize.hpp"
#include "runtime/sequence.hpp"
#include "runtime/tensor.hpp"

// BitLinear (docs/NUMERICS.md): y = (x_q . W_q) * gamma / s + bias with exact int32 accumulators.
namespace bitnet::ops {

// automatic: matvec for up to kMatvecMaxRows rows (5 where the device has tensor cores: above
// that their matmul with K split over workgroups is faster, docs/PERFORMANCE.md; matvec_takes);
// above, coopmat (int8 tensor cores through
// VK_NV_cooperative_matrix) where the device has the "cooperative_matrix_int8" feature, else
// coopmat_khr (the same kernel through VK_KHR_cooperative_matrix, "cooperative_matrix_khr_int8"),
// else tiled (integer dot products). coopmat2 (VK_NV_cooperative_matrix2,
// "cooperative_matrix2_int8") only when asked for: slower on the H100.
enum class BitLinearAlgorithm { automatic, matvec, tiled, coopmat, coopmat_khr, coopmat2 };

// The most rows the matvec kernel takes (automatic: matvec_takes).
inline constexpr int64_t kMatvecMaxRows = 8;

struct BitLinearResult {
  Tensor y;                            // float32 [..., N]
  std::optional<Tensor> accumulators;  // int32 [..., N], when asked for
};

// x: float32/float16 [..., K]; w: ternary weights [N, K] with one scale; bias: float32 [N].
// hardware_dot chooses the packed int8 dot-product instruction (default: where accelerated).
// out_y / out_accumulators: tensors to write into (ops::output checks them), else new ones.
BitLinearResult bitlinear(const Tensor& x, const QuantizedWeights& w,
                          const std::optional<Tensor>& bias, bool with_accumulators,
                          BitLinearAlgorithm algorithm,
                          std::optional<bool> hardware_dot = std::nullopt,
                          const std::optional<Tensor>& out_y = {},
                          const std::optional<Tensor>& out_accumulators = {});

// A decoder's projections that share one input, in one pre-pass: v = x (or relu(x)^2 * up), then
// v = rms_norm(v, norm_weight, norm_eps) when a norm weight is given; y_i = bitlinear(v, W_i) (+
// residual_i, float32 [..., N_i]). The norm and the gating are fused into the activation pre-pass
// where K % 4 == 0 and K <= 16384, and the residual into the matvec for up to kMatvecMaxRows rows.
// gated_output: weights are (gate, up) of one shape and the one result is relu(y_0)^2 * y_1 (an
// FFN's gated product), in a single dispatch for decode-sized x.
std::vector<Tensor> bitlinear_group(const Tensor& x, const std::optional<Tensor>& up,
                                    const std::optional<Tensor>& norm_weight, double norm_eps,
                                    const std::vector<const QuantizedWeights*>& weights,
                                    const std::vector<std::optional<Tensor>>& residuals,
                                    bool gated_output = false);

// Whether bitlinear_group(x, None, norm, ..., {gate, up}, ..., gated_output=true) writes
// relu(gate)^2 * up in the products' own dispatch. Where it does not, the gating is an op of its
// own, and handing gate and up to the next bitlinear_group's `up` instead fuses it into that
// pre-pass (a decode step of several sequences on tensor cores).
bool gated_output_fuses(const Tensor& x, const QuantizedWeights& gate, bool norm);

// int8 [M, K] x int8 [K, N] -> int32 [M, N], exactly.
// algorithm: automatic, tiled, coopmat, coopmat_khr or coopmat2 (matvec is taken as automatic).
Tensor int8_matmul(const Tensor& a, const Tensor& b,
                   BitLinearAlgorithm algorithm = BitLinearAlgorithm::automatic,
                   std::optional<bool> hardware_dot = std::nullopt);
// products int32 [m, n] = a int8 [m, Kp] . b int8 [n, Kp]^T, exactly, recorded into `sequence` on
// the matmul path `algorithm` picks (int8_matmul's, and the screened head's matmul with its int8
// copy): rows of Kp values (a multiple of 16, zero-padded) in any order of each 16-value block
// that a and b share.
void record_int8_products(Sequence& sequence, const Tensor& a, const Tensor& b,
                          const Tensor& products,
                          BitLinearAlgorithm algorithm = BitLinearAlgorithm::automatic,
                          std::optional<bool> hardware_dot = std::nullopt);
// int8 [M, K] x ternary [N, K]^T -> int32 [M, N], exactly.
Tensor ternary_matmul(const Tensor& a, const QuantizedWeights& w,
                      BitLinearAlgorithm algorithm = BitLinearAlgorithm::automatic,
                      std::optional<bool> hardware_dot = std::nullopt);
// grad_x = grad_y @ (W_q * gamma): float32 [..., N] -> float32 [..., K].
Tensor bitlinear_backward_input(const Tensor& grad_y, const QuantizedWeights& w);

}  // namespace bitnet::ops
