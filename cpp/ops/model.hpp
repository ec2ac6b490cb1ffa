#pragma once
#include <optional>

#include "runtime/tensor.hpp"

// The pieces of a decoder that are not BitLinear, norms or attention (shaders/model).
namespace bitnet::ops {

// out[t, :] = table[ids[t], :] as float32: table [V, H] float32 or float16, ids int32 [T].
// ArgumentError (after the run, or after each replay of a graph) when an id is outside [0, V).
Tensor embedding(const Tensor& table, const Tensor& ids, const std::optional<Tensor>& out = {});

// y = x w^T for a float weight w [N, K] (float32 or float16) and float32 x [M, K]: y float32
// [M, N]. Meant for few rows (a language-model head at decode); w is read once per 4 rows of x.
Tensor linear_rows(const Tensor& x, const Tensor& w, const std::optional<Tensor>& out = {});

// np.argmax along the last axis of float32 x [M, N] (N > 0): int32 [M].
Tensor argmax_rows(const Tensor& x, const std::optional<Tensor>& out = {});

}  // namespace bitnet::ops
