#pragma once
#include <cstdint>
#include <optional>

#include "runtime/tensor.hpp"

// Activations (forward, backward, fused with a gate or dropout) and row-wise softmax / norms
// (docs/NUMERICS.md). Inputs float32 or float16; outputs have the input's dtype; arithmetic is
// float32. `out`: a tensor to write into (ops::output checks it), else a new one.
namespace bitnet::ops {

enum class Activation : uint32_t { relu, leaky_relu, relu2, gelu, gelu_tanh, silu, sigmoid, tanh };

// y = act(x).
Tensor activation(const Tensor& x, Activation op, float alpha,
                  const std::optional<Tensor>& out = {});
// grad_x = grad_y * act'(x); grad_y and x of one shape and dtype.
Tensor activation_backward(const Tensor& grad_y, const Tensor& x, Activation op, float alpha,
                           const std::optional<Tensor>& out = {});
// y = act(gate) * up (silu_mul, relu2_mul); gate and up of one shape and dtype.
Tensor gated_activation(const Tensor& gate, const Tensor& up, Activation op,
                        const std::optional<Tensor>& out = {});
// y = relu(x) * keep / (1 - p), keep = uniform01(seed, index) >= p; p in [0, 1].
Tensor relu_dropout(const Tensor& x, double p, uint64_t seed,
                    const std::optional<Tensor>& out = {});

enum class RowOp : uint32_t { softmax, rms_norm, layer_norm };
// Over the last axis. weight / bias: float32 [K] (rms_norm: weight; layer_norm: both).
Tensor row_op(const Tensor& x, RowOp op, const std::optional<Tensor>& weight,
              const std::optional<Tensor>& bias, float eps, const std::optional<Tensor>& out = {});

enum class BinaryOp : uint32_t { add, sub, mul, div };
// y = a OP b with NumPy broadcasting (up to 6 axes); a and b of one float dtype. ShapeError names
// both shapes when they do not broadcast.
Tensor binary(const Tensor& a, const Tensor& b, BinaryOp op, const std::optional<Tensor>& out = {});

struct NormGradients {
  Tensor grad_x;  // x's shape and dtype
  // float32 [R, K] whose sum over R is the weight's gradient (of grad * xhat): R is the row count,
  // or where the kernel holds rows in registers, the count of workgroups that each summed theirs.
  Tensor grad_times_xhat;
  std::optional<Tensor>
      grad_sum;  // layer_norm: float32 [R, K] summing to the bias's gradient (of grad)
};
// grad_x of softmax over the last axis: s (grad_y - sum(grad_y s)), s = softmax(x).
Tensor softmax_backward(const Tensor& grad_y, const Tensor& x,
                        const std::optional<Tensor>& out = {});
// Backward of rms_norm (layer_norm = false) or layer_norm over the last axis.
NormGradients norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, float eps,
                            bool layer_norm);

enum class ReduceOp : uint32_t { sum, mean, max };
// Over one axis (negative counts from the end), float32 accumulation in a fixed order; the
// result drops that axis and keeps x's dtype.
Tensor reduce(const Tensor& x, int64_t axis, ReduceOp op, const std::optional<Tensor>& out = {});
// y [N, M] = x [M, N]^T.
Tensor transpose(const Tensor& x, const std::optional<Tensor>& out = {});
// c [M, N] = a [M, K] b [K, N], float32 accumulation.
Tensor matmul(const Tensor& a, const Tensor& b, const std::optional<Tensor>& out = {});

}  // namespace bitnet::ops
