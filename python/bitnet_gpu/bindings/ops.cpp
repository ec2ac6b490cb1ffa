// Quantization, BitLinear, element-wise ops, norms, reductions and attention.
#include "bindings/convert.hpp"
#include "ops/attention.hpp"
#include "ops/bitlinear.hpp"
#include "ops/elementwise.hpp"
#include "ops/linalg.hpp"
#include "ops/quantize.hpp"
#include "runtime/error.hpp"

namespace bitnet::binding {

void bind_ops(py::module_& m) {
  py::class_<ops::QuantizedWeights>(m, "QuantizedWeights",
                                    "Packed ternary or binary weights and their scales.")
      .def_readonly("packed", &ops::QuantizedWeights::packed)
      .def_readonly("scales", &ops::QuantizedWeights::scales)
      .def_readonly("means", &ops::QuantizedWeights::means)
      .def_readonly("rows", &ops::QuantizedWeights::rows)
      .def_readonly("cols", &ops::QuantizedWeights::cols)
      .def_readonly("group_size", &ops::QuantizedWeights::group_size)
      .def_readonly("binary", &ops::QuantizedWeights::binary);
  py::class_<ops::QuantizedRows>(m, "QuantizedRows")
      .def_readonly("q", &ops::QuantizedRows::q)
      .def_readonly("scales", &ops::QuantizedRows::scales)
      .def_readonly("zero_points", &ops::QuantizedRows::zero_points);
  py::class_<ops::QuantizedTensor>(m, "QuantizedTensor")
      .def_readonly("q", &ops::QuantizedTensor::q)
      .def_readonly("scale", &ops::QuantizedTensor::scale);
  auto release = py::call_guard<py::gil_scoped_release>();
  m.def("quantize_weights", &ops::quantize_weights, py::arg("w"), py::arg("group_size"),
        py::arg("binary"), release);
  m.def("weights_from_packed", &ops::weights_from_packed, py::arg("packed"), py::arg("scales"),
        py::arg("rows"), py::arg("cols"), py::arg("group_size"), py::arg("binary"), release);
  m.def("dequantize_weights", &ops::dequantize_weights, py::arg("weights"),
        py::arg("out") = py::none(), release);
  m.def("unpack_ternary", &ops::unpack_ternary, py::arg("packed"), py::arg("rows"), py::arg("cols"),
        py::arg("out") = py::none(), release);
  m.def("pack_ternary", &ops::pack_ternary, py::arg("values"), py::arg("out") = py::none(),
        release);
  m.def(
      "quantize_rows",
      [](const Tensor& x, int bits, bool symmetric, std::optional<Tensor> q,
         std::optional<Tensor> scales, std::optional<Tensor> zero_points) {
        return ops::quantize_rows(x, bits, symmetric, {q, scales, zero_points});
      },
      py::arg("x"), py::arg("bits"), py::arg("symmetric"), py::arg("out_q") = py::none(),
      py::arg("out_scales") = py::none(), py::arg("out_zero_points") = py::none(), release);
  m.def("dequantize_rows", &ops::dequantize_rows, py::arg("q"), py::arg("scales"),
        py::arg("zero_points"), py::arg("out") = py::none(), release);
  m.def("quantize_tensor", &ops::quantize_tensor, py::arg("g"), py::arg("bits"),
        py::arg("stochastic"), py::arg("seed"), py::arg("out_q") = py::none(),
        py::arg("out_scale") = py::none(), release);

  py::class_<ops::BitLinearResult>(m, "BitLinearResult")
      .def_readonly("y", &ops::BitLinearResult::y)
      .def_readonly("accumulators", &ops::BitLinearResult::accumulators);
  m.def(
      "bitlinear",
      [](const Tensor& x, const ops::QuantizedWeights& w, std::optional<Tensor> bias,
         bool with_accumulators, const std::string& algorithm, std::optional<bool> hardware_dot,
         std::optional<Tensor> out_y, std::optional<Tensor> out_accumulators) {
        return ops::bitlinear(x, w, bias, with_accumulators, parse_algorithm(algorithm),
                              hardware_dot, out_y, out_accumulators);
      },
      py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("with_accumulators"),
      py::arg("algorithm"), py::arg("hardware_dot"), py::arg("out_y") = py::none(),
      py::arg("out_accumulators") = py::none(), release);
  m.def(
      "int8_matmul",
      [](const Tensor& a, const Tensor& b, const std::string& algorithm,
         std::optional<bool> hardware_dot) {
        return ops::int8_matmul(a, b, parse_algorithm(algorithm, false), hardware_dot);
      },
      py::arg("a"), py::arg("b"), py::arg("algorithm"), py::arg("hardware_dot"), release);
  m.def(
      "ternary_matmul",
      [](const Tensor& a, const ops::QuantizedWeights& w, const std::string& algorithm,
         std::optional<bool> hardware_dot) {
        return ops::ternary_matmul(a, w, parse_algorithm(algorithm, false), hardware_dot);
      },
      py::arg("a"), py::arg("w"), py::arg("algorithm"), py::arg("hardware_dot"), release);
  py::enum_<ops::Activation>(m, "Activation")
      .value("relu", ops::Activation::relu)
      .value("leaky_relu", ops::Activation::leaky_relu)
      .value("relu2", ops::Activation::relu2)
      .value("gelu", ops::Activation::gelu)
      .value("gelu_tanh", ops::Activation::gelu_tanh)
      .value("silu", ops::Activation::silu)
      .value("sigmoid", ops::Activation::sigmoid)
      .value("tanh", ops::Activation::tanh);
  py::enum_<ops::RowOp>(m, "RowOp")
      .value("softmax", ops::RowOp::softmax)
      .value("rms_norm", ops::RowOp::rms_norm)
      .value("layer_norm", ops::RowOp::layer_norm);
  m.def("activation", &ops::activation, py::arg("x"), py::arg("op"), py::arg("alpha"),
        py::arg("out") = py::none(), release);
  m.def("activation_backward", &ops::activation_backward, py::arg("grad_y"), py::arg("x"),
        py::arg("op"), py::arg("alpha"), py::arg("out") = py::none(), release);
  m.def("gated_activation", &ops::gated_activation, py::arg("gate"), py::arg("up"), py::arg("op"),
        py::arg("out") = py::none(), release);
  m.def("relu_dropout", &ops::relu_dropout, py::arg("x"), py::arg("p"), py::arg("seed"),
        py::arg("out") = py::none(), release);
  m.def("attention", &ops::attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal"),
        py::arg("kv_length"), py::arg("out") = py::none(), py::arg("float16") = false, release);
  m.def("rope", &ops::rope, py::arg("x"), py::arg("cos"), py::arg("sin"),
        py::arg("out") = py::none(), release);
  m.def("attention_cached", &ops::attention_cached, py::arg("q"), py::arg("k_cache"),
        py::arg("v_cache"), py::arg("start"), py::arg("causal"), py::arg("out") = py::none(),
        py::arg("float16") = false, release);
  m.def("gated_output_fuses", &ops::gated_output_fuses, py::arg("x"), py::arg("gate"),
        py::arg("norm"));
  m.def("bitlinear_group", &ops::bitlinear_group, py::arg("x"), py::arg("up"),
        py::arg("norm_weight"), py::arg("norm_eps"), py::arg("weights"), py::arg("residuals"),
        py::arg("gated_output") = false, release);
  m.def("copy_rows", &ops::copy_rows, py::arg("rows"), py::arg("destination"), py::arg("first_row"),
        release);
  py::enum_<ops::BinaryOp>(m, "BinaryOp")
      .value("add", ops::BinaryOp::add)
      .value("sub", ops::BinaryOp::sub)
      .value("mul", ops::BinaryOp::mul)
      .value("div", ops::BinaryOp::div);
  m.def("binary", &ops::binary, py::arg("a"), py::arg("b"), py::arg("op"),
        py::arg("out") = py::none(), release);
  py::class_<ops::NormGradients>(m, "NormGradients")
      .def_readonly("grad_x", &ops::NormGradients::grad_x)
      .def_readonly("grad_times_xhat", &ops::NormGradients::grad_times_xhat)
      .def_readonly("grad_sum", &ops::NormGradients::grad_sum);
  m.def("softmax_backward", &ops::softmax_backward, py::arg("grad_y"), py::arg("x"),
        py::arg("out") = py::none(), release);
  m.def("norm_backward", &ops::norm_backward, py::arg("grad_y"), py::arg("x"), py::arg("weight"),
        py::arg("eps"), py::arg("layer_norm"), release);
  py::enum_<ops::ReduceOp>(m, "ReduceOp")
      .value("sum", ops::ReduceOp::sum)
      .value("mean", ops::ReduceOp::mean)
      .value("max", ops::ReduceOp::max);
  m.def("reduce", &ops::reduce, py::arg("x"), py::arg("axis"), py::arg("op"),
        py::arg("out") = py::none(), release);
  m.def("transpose", &ops::transpose, py::arg("x"), py::arg("out") = py::none(), release);
  m.def("matmul", &ops::matmul, py::arg("a"), py::arg("b"), py::arg("out") = py::none(), release);
  m.def("cholesky", &ops::cholesky, py::arg("a"), py::arg("upper"), py::arg("out") = py::none(),
        release);
  m.def(
      "qr",
      [](const Tensor& a, bool complete, bool want_q) {
        ops::QrResult result = ops::qr(a, complete, want_q);
        return std::make_pair(result.q, result.r);
      },
      py::arg("a"), py::arg("complete"), py::arg("want_q"), release);
  m.def("solve", &ops::solve, py::arg("a"), py::arg("b"), release);
  m.def(
      "svd",
      [](const Tensor& a, bool full_matrices, bool compute_uv) {
        ops::SvdResult result = ops::svd(a, full_matrices, compute_uv);
        return std::make_tuple(result.u, result.s, result.vh);
      },
      py::arg("a"), py::arg("full_matrices"), py::arg("compute_uv"), release);
  m.def(
      "eigh",
      [](const Tensor& a, bool compute_v, bool upper) {
        ops::EighResult result = ops::eigh(a, compute_v, upper);
        return std::make_pair(result.w, result.v);
      },
      py::arg("a"), py::arg("compute_v"), py::arg("upper"), release);
  m.def("row_op", &ops::row_op, py::arg("x"), py::arg("op"), py::arg("weight"), py::arg("bias"),
        py::arg("eps"), py::arg("out") = py::none(), release);
  m.def("bitlinear_backward_input", &ops::bitlinear_backward_input, py::arg("grad_y"), py::arg("w"),
        release);
}

}  // namespace bitnet::binding
