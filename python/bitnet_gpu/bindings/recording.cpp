// Kernels, sequences, submissions and graphs.
#include "bindings/convert.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/graph.hpp"
#include "runtime/kernel.hpp"
#include "runtime/recorder.hpp"
#include "runtime/sequence.hpp"

namespace bitnet::binding {

void bind_recording(py::module_& m) {
  declared<Kernel>(m, "Kernel")
      .def(py::init([](std::shared_ptr<Device> device, py::buffer spirv, const std::string& entry,
                       std::optional<py::dict> specialization, std::optional<std::string> name) {
             py::buffer_info info = spirv.request();
             const size_t bytes = static_cast<size_t>(info.size * info.itemsize);
             if (bytes % 4 != 0)
               throw ArgumentError("spirv: SPIR-V is a sequence of 32-bit words; got " +
                                   std::to_string(bytes) + " bytes");
             std::vector<uint32_t> words(bytes / 4);
             if (bytes) std::memcpy(words.data(), info.ptr, bytes);
             Specialization values = to_specialization(specialization);
             py::gil_scoped_release release;
             return Kernel(device, words, entry, values, name.value_or(""));
           }),
           py::arg("device"), py::arg("spirv"), py::kw_only(), py::arg("entry") = "main",
           py::arg("specialization") = py::none(), py::arg("name") = py::none())
      .def_property_readonly("name", &Kernel::name)
      .def_property_readonly("device", &Kernel::device)
      .def_property_readonly("binding_count",
                             [](const Kernel& k) { return k.interface().binding_writable.size(); })
      .def_property_readonly("writable",
                             [](const Kernel& k) { return k.interface().binding_writable; })
      .def_property_readonly("push_constant_size",
                             [](const Kernel& k) { return k.interface().push_constant_size; })
      .def_property_readonly("local_size",
                             [](const Kernel& k) {
                               const auto& s = k.local_size();
                               return py::make_tuple(s[0], s[1], s[2]);
                             })
      .def_property_readonly(
          "statistics",
          [](const Kernel& k) {
            py::dict out;
            for (const auto& s : k.statistics())
              std::visit([&](const auto& value) { out[py::str(s.name)] = value; }, s.value);
            return out;
          },
          "What the driver's compiler reports for this kernel "
          "(VK_KHR_pipeline_executable_properties), "
          "by the driver's names: on NVIDIA the registers a thread takes, the shared and spilled "
          "memory, and so on. Empty where the device does not report them "
          "(device.info.features['pipeline_statistics']).")
      .def(
          "dispatch",
          [](const Kernel& kernel, py::handle groups, const std::vector<const Tensor*>& tensors,
             py::handle push_constants) {
            auto count = to_groups(groups);
            auto bindings = to_bindings(tensors);
            auto push = to_bytes(push_constants, "push_constants");
            py::gil_scoped_release release;
            bitnet::dispatch(kernel, count, bindings, push);
          },
          py::arg("groups"), py::arg("tensors"), py::arg("push_constants") = py::none(),
          "Run now, or record into the active `with device.sequence()` on this thread.")
      .def("__repr__", [](const Kernel& k) {
        const auto& s = k.local_size();
        return "<bitnet_gpu.Kernel '" + k.name() + "' local_size=(" + std::to_string(s[0]) + ", " +
               std::to_string(s[1]) + ", " + std::to_string(s[2]) +
               ") bindings=" + std::to_string(k.interface().binding_writable.size()) +
               " push_constants=" + std::to_string(k.interface().push_constant_size) + ">";
      });

  declared<Submission, std::shared_ptr<Submission>>(m, "Submission")
      .def("wait", &Submission::wait, py::call_guard<py::gil_scoped_release>())
      .def("done", &Submission::done, py::call_guard<py::gil_scoped_release>())
      .def("timings", [](Submission& s) { return timing_list([&] { return s.timings(); }); });

  declared<Sequence>(m, "Sequence")
      .def(
          "__enter__",
          [](Sequence& s) -> Sequence& {
            s.activate();
            return s;
          },
          py::return_value_policy::reference)
      .def("__exit__",
           [](Sequence& s, py::handle type, py::handle, py::handle) {
             s.deactivate();
             if (!type.is_none()) {
               s.discard();
               return false;
             }
             if (!s.submitted()) {
               py::gil_scoped_release release;
               s.run();
             }
             return false;
           })
      .def(
          "dispatch",
          [](Sequence& s, const Kernel& kernel, py::handle groups,
             const std::vector<const Tensor*>& tensors, py::handle push_constants) {
            s.dispatch(kernel, to_groups(groups), to_bindings(tensors),
                       to_bytes(push_constants, "push_constants"));
          },
          py::arg("kernel"), py::arg("groups"), py::arg("tensors"),
          py::arg("push_constants") = py::none())
      .def(
          "copy",
          [](Sequence& s, const Tensor& source, const Tensor& destination) {
            s.copy(source.binding(), destination.binding());
          },
          py::arg("source"), py::arg("destination"))
      .def(
          "fill",
          [](Sequence& s, const Tensor& destination, uint32_t word) {
            s.fill(destination.binding(), word);
          },
          py::arg("destination"), py::arg("word"))
      .def("submit", &Sequence::submit)
      .def("timings", [](Sequence& s) { return timing_list([&] { return s.timings(); }); })
      .def_property_readonly("op_count", &Sequence::op_count)
      .def_property_readonly("barrier_count", &Sequence::barrier_count)
      .def_property_readonly("submitted", &Sequence::submitted)
      .def_property_readonly("timings_enabled", &Sequence::timings_enabled)
      .def("__repr__", [](const Sequence& s) {
        return "<bitnet_gpu.Sequence ops=" + std::to_string(s.op_count()) +
               " barriers=" + std::to_string(s.barrier_count()) +
               (s.submitted() ? " submitted" : " recording") + ">";
      });

  declared<Graph, std::shared_ptr<Graph>>(m, "RecordedGraph")
      .def(py::init(
               [](std::shared_ptr<Device> device, const std::string& timings, bool reuse_memory) {
                 if (timings != "off" && timings != "per_op" && timings != "total")
                   throw ArgumentError("timings: expected 'off', 'per_op' or 'total', got '" +
                                       timings + "'");
                 return std::make_shared<Graph>(std::move(device),
                                                timings == "per_op"  ? Timing::per_op
                                                : timings == "total" ? Timing::total
                                                                     : Timing::off,
                                                reuse_memory);
               }),
           py::arg("device"), py::arg("timings") = "off", py::arg("reuse_memory") = false)
      .def("begin", &Graph::begin)
      .def("end", &Graph::end)
      .def("replay", &Graph::replay, py::call_guard<py::gil_scoped_release>())
      .def(
          "replay_with",
          [](Graph& g, const std::vector<Tensor*>& inputs, const std::vector<py::array>& arrays,
             const std::vector<const Tensor*>& outputs) {
            // One crossing for a recorded call: small arrays in, a replay, fresh arrays out.
            if (inputs.size() != arrays.size())
              throw ArgumentError("replay_with: " + std::to_string(arrays.size()) + " arrays for " +
                                  std::to_string(inputs.size()) + " inputs");
            for (size_t i = 0; i < inputs.size(); ++i) {
              const py::array& array = arrays[i];
              Tensor& input = *inputs[i];
              const std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
              const int flags = py::detail::array_proxy(array.ptr())->flags;
              if (to_dtype(array.dtype(), "replay_with") != input.dtype() ||
                  shape != input.shape() || !(flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_))
                throw ArgumentError("replay_with: array " + std::to_string(i) +
                                    " does not match its input (dtype, shape, C order)");
              input.upload(array.data(), input.nbytes());
            }
            {
              py::gil_scoped_release release;
              g.replay();
            }
            py::list results;
            for (const Tensor* output : outputs) {  // small: copied without handing the GIL over
              py::array result(to_numpy(output->dtype()), output->shape());
              output->download(result.mutable_data(), output->nbytes());
              results.append(std::move(result));
            }
            return results;
          },
          py::arg("inputs"), py::arg("arrays"), py::arg("outputs"),
          "Copies each array into its input tensor, replays the graph and returns fresh NumPy "
          "copies of the output tensors.")
      .def("timings", [](Graph& g) { return timing_list([&] { return g.timings(); }); })
      .def_property_readonly("recording", &Graph::recording)
      .def_property_readonly("closed", &Graph::closed)
      .def_property_readonly("op_count", &Graph::op_count)
      .def_property_readonly("barrier_count", [](Graph& g) { return g.sequence().barrier_count(); })
      .def_property_readonly("device", &Graph::device);
  m.def(
      "recording",
      [](const std::shared_ptr<Device>& device) { return device->recording_graph() != nullptr; },
      py::arg("device"));
}

}  // namespace bitnet::binding
