// The decoder's pieces (embedding, heads, sampling, decode attention) and the tuning knobs.
#include "ops/model.hpp"

#include <map>

#include "bindings/convert.hpp"
#include "ops/attention.hpp"
#include "ops/sampling.hpp"
#include "ops/screened_head.hpp"
#include "ops/tuning.hpp"
#include "runtime/device.hpp"

namespace bitnet::binding {

void bind_model(py::module_& m) {
  auto release = py::call_guard<py::gil_scoped_release>();
  m.def("rope_append", &ops::rope_append, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cos"),
        py::arg("sin"), py::arg("start"), py::arg("k_cache"), py::arg("v_cache"), release);
  m.def("decode_attention", &ops::decode_attention, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("cos"), py::arg("sin"), py::arg("start"), py::arg("k_cache"), py::arg("v_cache"),
        py::arg("split_keys") = 0, release);
  m.def("embedding", &ops::embedding, py::arg("table"), py::arg("ids"), py::arg("out") = py::none(),
        release);
  m.def("linear_rows", &ops::linear_rows, py::arg("x"), py::arg("w"), py::arg("out") = py::none(),
        release);
  m.def("argmax_rows", &ops::argmax_rows, py::arg("x"), py::arg("out") = py::none(), release);
  m.def("sample_rows", &ops::sample_rows, py::arg("logits"), py::arg("params"), py::arg("start"),
        py::arg("offset"), py::arg("out") = py::none(), py::arg("top_p") = false,
        py::arg("top_k") = true, release);
  m.def("screened_sample", &ops::screened_sample, py::arg("x"), py::arg("head"), py::arg("head_q"),
        py::arg("head_meta"), py::arg("params"), py::arg("start"), py::arg("offset"),
        py::arg("out") = py::none(), py::arg("exact") = py::none(), py::arg("top_p") = false,
        release);
  m.def("screened_argmax", &ops::screened_argmax, py::arg("x"), py::arg("head"), py::arg("head_q"),
        py::arg("head_meta"), py::arg("out") = py::none(), py::arg("high") = py::none(), release);
  m.def(
      "screened_argmax_fits",
      [](const Device& device, int64_t k, int64_t rows) {
        return ops::screened_argmax_fits(device, k, rows);
      },
      py::arg("device"), py::arg("k"), py::arg("rows") = 1);
  m.def("tuning_knobs", [] {
    py::list knobs;
    for (const auto& knob : ops::tuning_knobs())
      knobs.append(py::make_tuple(knob.name, knob.variable, knob.values));
    return knobs;
  });
  m.def("get_tuning", [] {
    py::dict values;
    const ops::Tuning current = ops::tuning();
    for (const auto& knob : ops::tuning_knobs())
      values[py::str(knob.name)] = ops::knob_value(current, knob.name);
    return values;
  });
  m.def(
      "set_tuning",
      [](const std::map<std::string, std::optional<ops::KnobValue>>& values) {
        ops::Tuning next;
        for (const auto& [name, value] : values) next = ops::with_knob(next, name, value);
        ops::set_tuning(next);
      },
      py::arg("values"));
}

}  // namespace bitnet::binding
