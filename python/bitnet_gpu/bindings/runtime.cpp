// Devices, tensors and the fault switch.
#include "bindings/convert.hpp"
#include "ops/attention.hpp"
#include "ops/dispatch.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/fault.hpp"
#include "runtime/graph.hpp"
#include "runtime/instance.hpp"
#include "runtime/kernel.hpp"
#include "runtime/sequence.hpp"
#include "runtime/shaders.hpp"
#include "runtime/tensor.hpp"

namespace bitnet::binding {

void declare_classes(py::module_& m) {
  py::class_<DeviceInfo>(m, "DeviceInfo", "A Vulkan physical device and its capabilities.");
  py::class_<Device, std::shared_ptr<Device>>(m, "Device",
                                              "A Vulkan device with one compute queue.");
  py::class_<Tensor>(m, "Tensor", py::buffer_protocol(), "A typed, shaped array in Vulkan memory.");
  py::class_<Kernel>(m, "Kernel", "A compute shader (SPIR-V) ready to dispatch over tensors.");
  py::class_<Submission, std::shared_ptr<Submission>>(m, "Submission",
                                                      "A submitted sequence running on the GPU.");
  py::class_<Sequence>(m, "Sequence", "Records ops into one command buffer and submits them once.");
  py::class_<Graph, std::shared_ptr<Graph>>(m, "RecordedGraph",
                                            "Ops recorded once, replayed in one submission.");
}

void bind_runtime(py::module_& m) {
  declared<DeviceInfo>(m, "DeviceInfo")
      .def_readonly("index", &DeviceInfo::index)
      .def_readonly("name", &DeviceInfo::name)
      .def_readonly("type", &DeviceInfo::type)
      .def_readonly("vendor_id", &DeviceInfo::vendor_id)
      .def_readonly("device_id", &DeviceInfo::device_id)
      .def_readonly("driver_name", &DeviceInfo::driver_name)
      .def_readonly("driver_id", &DeviceInfo::driver_id)
      .def_readonly("driver_info", &DeviceInfo::driver_info)
      .def_readonly("driver_version", &DeviceInfo::driver_version)
      .def_readonly("vulkan_version", &DeviceInfo::vulkan_version)
      .def_property_readonly("memory_heaps",
                             [](const DeviceInfo& info) {
                               py::list heaps;
                               for (const auto& heap : info.memory_heaps) {
                                 py::dict entry;
                                 entry["size"] = heap.size;
                                 entry["device_local"] = heap.device_local;
                                 heaps.append(entry);
                               }
                               return heaps;
                             })
      .def_readonly("subgroup_size", &DeviceInfo::subgroup_size)
      .def_readonly("max_workgroup_invocations", &DeviceInfo::max_workgroup_invocations)
      .def_readonly("max_workgroup_size", &DeviceInfo::max_workgroup_size)
      .def_readonly("max_workgroup_count", &DeviceInfo::max_workgroup_count)
      .def_readonly("max_shared_memory", &DeviceInfo::max_shared_memory)
      .def_readonly("multiprocessors", &DeviceInfo::multiprocessors)
      .def_readonly("max_storage_buffer_range", &DeviceInfo::max_storage_buffer_range)
      .def_readonly("max_allocation_size", &DeviceInfo::max_allocation_size)
      .def_readonly("max_push_constants_size", &DeviceInfo::max_push_constants_size)
      .def_readonly("host_import_alignment", &DeviceInfo::host_import_alignment)
      .def_readonly("timestamp_period_ns", &DeviceInfo::timestamp_period_ns)
      .def_readonly("features", &DeviceInfo::features)
      .def_readonly("uuid", &DeviceInfo::uuid)
      .def_readonly("pci_address", &DeviceInfo::pci_address)
      .def_readonly("cooperative_matrices", &DeviceInfo::cooperative_matrices)
      .def("__repr__", [](const DeviceInfo& info) {
        return "<DeviceInfo " + std::to_string(info.index) + ": '" + info.name + "' (" + info.type +
               ", Vulkan " + info.vulkan_version + ", " + info.driver_name + ")>";
      });

  m.def("devices", &enumerate_devices, "Every Vulkan device, as DeviceInfo.");
  m.def("default_device", &Device::default_device,
        "The process-wide Device, created on first use (BITNET_GPU_DEVICE applies).");
  m.def("release_default_device", &Device::release_default_device);
  m.def("validation_enabled", [] { return Instance::get()->validation_enabled(); });
  m.def(
      "validation_messages", [] { return Instance::get()->take_validation_messages(); },
      "Validation-layer messages since the last call (and forgets them).");
  m.def("builtin_shaders", [] {
    std::vector<std::string> names;
    for (const auto& [name, code] : shaders::registry()) names.push_back(name);
    return names;
  });
  m.def("builtin_spirv", [](const std::string& name) {
    auto found = shaders::registry().find(name);
    if (found == shaders::registry().end())
      throw ArgumentError("no built-in shader named '" + name + "'");
    return py::bytes(reinterpret_cast<const char*>(found->second.data()),
                     found->second.size_bytes());
  });

  declared<Device, std::shared_ptr<Device>>(m, "Device")
      .def(py::init([](std::optional<uint32_t> index) { return Device::create(index); }),
           py::arg("index") = py::none())
      .def_property_readonly("info", &Device::info)
      .def_property_readonly("name", [](const Device& d) { return d.info().name; })
      .def_property_readonly("lost", &Device::lost)
      .def_property_readonly("pipeline_cache_path",
                             [](Device& d) { return d.pipeline_cache().path(); })
      .def_property_readonly("pipeline_cache_loaded_bytes",
                             [](Device& d) { return d.pipeline_cache().loaded_bytes(); })
      .def("save_pipeline_cache", [](Device& d) { d.pipeline_cache().save(); })
      .def("start_profiling", &Device::start_profiling)
      .def("stop_profiling", &Device::stop_profiling)
      .def("synchronize", &Device::synchronize, py::call_guard<py::gil_scoped_release>())
      .def("memory_stats",
           [](const Device& d) {
             py::dict stats = stats_dict(d.memory_stats());
             py::list heaps;
             const bool known = d.feature("memory_budget");
             for (const HeapBudget& heap : d.heap_budgets()) {
               py::dict entry;
               entry["size"] = heap.size;
               entry["device_local"] = heap.device_local;
               entry["budget"] = known ? py::cast(heap.budget) : py::none();
               entry["usage"] = known ? py::cast(heap.usage) : py::none();
               heaps.append(entry);
             }
             stats["heaps"] = heaps;
             return stats;
           })
      .def("trim", &Device::trim)
      .def(
          "empty",
          [](std::shared_ptr<Device> d, py::handle shape, py::handle dtype,
             const std::string& memory) {
            return Tensor::empty(d, to_shape(shape), to_dtype(dtype), to_placement(memory), false);
          },
          py::arg("shape"), py::arg("dtype") = py::str("float32"), py::arg("memory") = "auto")
      .def(
          "sequence",
          [](std::shared_ptr<Device> d, py::object timings) {
            Timing timing = d->has_timestamps() ? Timing::per_op : Timing::off;
            if (py::isinstance<py::str>(timings)) {
              if (timings.cast<std::string>() != "total")
                throw ArgumentError("timings: expected None, True, False or 'total'");
              timing = Timing::total;
            } else if (!timings.is_none()) {
              timing = timings.cast<bool>() ? Timing::per_op : Timing::off;
            }
            return std::make_unique<Sequence>(d, timing);
          },
          py::arg("timings") = py::none(),
          "Record ops into one command buffer. timings: None (per op where the device has "
          "timestamps), True, False, or 'total' (one figure for the whole sequence).")
      .def("__repr__", [](const Device& d) {
        return "<bitnet_gpu.Device " + std::to_string(d.info().index) + ": '" + d.info().name +
               "'>";
      });

  declared<Tensor>(m, "Tensor")
      .def_static("from_numpy", &from_numpy, py::arg("array"), py::arg("device") = nullptr,
                  py::arg("memory") = "auto", py::arg("zero_copy") = false)
      .def_property_readonly("shape", [](const Tensor& t) { return shape_tuple(t.shape()); })
      .def_property_readonly("dtype", [](const Tensor& t) { return to_numpy(t.dtype()); })
      .def_property_readonly("ndim", [](const Tensor& t) { return t.shape().size(); })
      .def_property_readonly("size", &Tensor::size)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def_property_readonly("device", &Tensor::device_ptr)
      .def_property_readonly("memory",
                             [](const Tensor& t) { return placement_name(t.placement()); })
      .def_property_readonly("host_visible", &Tensor::host_visible)
      .def(
          "numpy",
          [](const Tensor& t, std::optional<py::array> out) -> py::array {
            if (!out) return to_array(t);
            const int flags = py::detail::array_proxy(out->ptr())->flags;
            std::vector<int64_t> shape(out->shape(), out->shape() + out->ndim());
            if (to_dtype(out->dtype(), "out dtype") != t.dtype())
              throw DTypeError("out: expected dtype " + std::string(dtype_name(t.dtype())) +
                               ", got " + py::str(out->dtype()).cast<std::string>());
            if (shape != t.shape()) throw ShapeError("out: shape does not match the tensor's");
            if (!(flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_) ||
                !(flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_))
              throw ArgumentError("out: expected a writeable C-contiguous array");
            void* data = out->mutable_data();
            {
              py::gil_scoped_release release;
              t.download(data, t.nbytes());
            }
            return *out;
          },
          py::arg("out") = py::none(), "A NumPy copy of the tensor (into `out` if given).")
      .def(
          "__array__",
          [](py::object self, py::object dtype, std::optional<bool> copy) -> py::object {
            const Tensor& tensor = self.cast<const Tensor&>();
            const bool same_dtype =
                dtype.is_none() || to_numpy(tensor.dtype()).equal(py::dtype::from_args(dtype));
            if (copy.has_value() && !*copy) {
              if (!same_dtype)
                throw ArgumentError(
                    "np.asarray(tensor, copy=False) cannot change the dtype without a copy");
              return view_array(self);
            }
            py::array result = (tensor.host_visible() && !(copy.value_or(false)) && same_dtype)
                                   ? view_array(self)
                                   : to_array(tensor);
            if (!same_dtype) return result.attr("astype")(dtype);
            return std::move(result);
          },
          py::arg("dtype") = py::none(), py::arg("copy") = py::none())
      .def_buffer([](Tensor& t) -> py::buffer_info {
        if (!t.host_visible())
          throw py::buffer_error("tensor is in device-only memory; use .numpy()");
        std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
        return py::buffer_info(t.mapped_data(), static_cast<py::ssize_t>(dtype_size(t.dtype())),
                               buffer_format(t.dtype()), static_cast<py::ssize_t>(shape.size()),
                               shape, c_strides(t), false);
      })
      .def(
          "copy_from",
          [](Tensor& t, py::object source) {
            if (py::isinstance<Tensor>(source)) {
              const Tensor& from = source.cast<const Tensor&>();
              if (from.dtype() != t.dtype() || from.shape() != t.shape())
                throw ShapeError("copy_from: expected " + std::string(dtype_name(t.dtype())) + " " +
                                 ops::shape_text(t.shape()) + ", got " +
                                 std::string(dtype_name(from.dtype())) + " " +
                                 ops::shape_text(from.shape()));
              py::gil_scoped_release release;
              const std::vector<int64_t> flat{static_cast<int64_t>(t.size())};
              ops::copy_rows(from.reshaped(flat), t.reshaped(flat), 0);
              return;
            }
            py::array array = py::array::ensure(source);
            if (!array) throw DTypeError("copy_from: expected a NumPy array or a Tensor");
            if (to_dtype(array.dtype(), "copy_from") != t.dtype())
              throw DTypeError("copy_from: expected " + std::string(dtype_name(t.dtype())) +
                               ", got " + py::str(array.dtype()).cast<std::string>());
            std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
            if (shape != t.shape())
              throw ShapeError("copy_from: expected shape " + ops::shape_text(t.shape()) +
                               ", got " + ops::shape_text(shape));
            py::array contiguous = py::array::ensure(array, py::array::c_style);
            const void* data = contiguous.data();
            py::gil_scoped_release release;
            t.upload(data, t.nbytes());
          },
          py::arg("source"),
          "Overwrites the tensor with a NumPy array or a Tensor of its dtype and shape (a Tensor "
          "is copied on the device, and inside a graph the copy is recorded).")
      .def(
          "reshape",
          [](const Tensor& t, py::args args) {
            const bool one_sequence = args.size() == 1 && py::isinstance<py::sequence>(args[0]);
            return t.reshaped(to_shape(one_sequence ? py::handle(args[0]) : py::handle(args)));
          },
          "A view of the same memory with another shape (one dimension may be -1), as "
          "ndarray.reshape of a C-contiguous array; writes through either are seen by both.")
      .def("__len__",
           [](const Tensor& t) {
             if (t.shape().empty()) throw py::type_error("len() of a 0-d tensor");
             return t.shape()[0];
           })
      .def("__repr__", [](const Tensor& t) {
        std::string shape;
        for (int64_t dim : t.shape()) shape += (shape.empty() ? "" : ", ") + std::to_string(dim);
        if (t.shape().size() == 1) shape += ",";
        return "<bitnet_gpu.Tensor shape=(" + shape +
               ") dtype=" + std::string(dtype_name(t.dtype())) +
               " memory=" + placement_name(t.placement()) + " device='" + t.device().info().name +
               "'>";
      });
  m.def("arm_fault", &fault::arm, py::arg("spec"),
        "Debug: arm BITNET_GPU_FAULT's switch ('' disarms it); see cpp/runtime/fault.hpp.");
  m.def("faults_injected", &fault::injected_count);
}

}  // namespace bitnet::binding
