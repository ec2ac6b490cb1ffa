// The pybind11 module bitnet_gpu._core: converts between Python and the C++ core, nothing else.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "ops/attention.hpp"
#include "ops/bitlinear.hpp"
#include "ops/dispatch.hpp"
#include "ops/elementwise.hpp"
#include "ops/model.hpp"
#include "ops/quantize.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/fault.hpp"
#include "runtime/instance.hpp"
#include "runtime/graph.hpp"
#include "runtime/kernel.hpp"
#include "runtime/sequence.hpp"
#include "runtime/shaders.hpp"
#include "runtime/tensor.hpp"

namespace py = pybind11;
using namespace bitnet;

namespace {

struct PythonErrors {
  PyObject* error;
  PyObject* device;
  PyObject* out_of_memory;
  PyObject* unsupported;
  PyObject* shape;
  PyObject* dtype;
  PyObject* argument;
};
PythonErrors errors;

DType to_dtype(py::handle object, const char* argument = "dtype") {
  py::dtype dtype;
  try {
    dtype = py::dtype::from_args(py::reinterpret_borrow<py::object>(object));
  } catch (py::error_already_set&) {
    throw DTypeError(std::string(argument) + ": not a NumPy dtype: " + py::repr(object).cast<std::string>());
  }
  const std::string name = py::str(dtype.attr("name"));
  auto found = dtype_from_name(name);
  if (!found || !dtype.attr("isnative").cast<bool>())
    throw DTypeError(std::string(argument) + ": expected one of " + std::string(supported_dtype_list) +
                     ", got " + py::str(dtype).cast<std::string>());
  return *found;
}

py::dtype to_numpy(DType dtype) { return py::dtype(std::string(dtype_name(dtype))); }

Placement to_placement(const std::string& memory) {
  if (memory == "auto" || memory == "device") return Placement::device;
  if (memory == "host") return Placement::host;
  throw ArgumentError("memory: expected 'auto', 'device' or 'host', got '" + memory + "'");
}

std::vector<int64_t> to_shape(py::handle shape) {
  if (py::isinstance<py::int_>(shape)) return {shape.cast<int64_t>()};
  try {
    return shape.cast<std::vector<int64_t>>();
  } catch (py::cast_error&) {
    throw ShapeError("shape: expected an int or a sequence of ints, got " +
                     py::repr(shape).cast<std::string>());
  }
}

py::tuple shape_tuple(const std::vector<int64_t>& shape) {
  py::tuple result(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) result[i] = shape[i];
  return result;
}

std::vector<py::ssize_t> c_strides(const Tensor& tensor) {
  std::vector<py::ssize_t> strides(tensor.shape().size());
  py::ssize_t stride = static_cast<py::ssize_t>(dtype_size(tensor.dtype()));
  for (size_t i = strides.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= static_cast<py::ssize_t>(std::max<int64_t>(tensor.shape()[i], 1));
  }
  return strides;
}

const char* buffer_format(DType dtype) {
  switch (dtype) {
    case DType::float32: return "f";
    case DType::float16: return "e";
    case DType::int8: return "b";
    case DType::uint8: return "B";
    case DType::int32: return "i";
    case DType::uint32: return "I";
  }
  return "B";
}

py::array to_array(const Tensor& tensor) {
  py::array result(to_numpy(tensor.dtype()), tensor.shape());
  void* data = result.mutable_data();
  py::gil_scoped_release release;
  tensor.download(data, tensor.nbytes());
  return result;
}

// A zero-copy view of a host-visible tensor; the view's base keeps the tensor alive.
py::array view_array(py::object self) {
  const Tensor& tensor = self.cast<const Tensor&>();
  if (!tensor.host_visible())
    throw ArgumentError("this tensor lives in device-only memory and cannot be viewed without a "
                        "copy; use .numpy() or np.asarray(t) without copy=False");
  return py::array(to_numpy(tensor.dtype()), tensor.shape(), c_strides(tensor),
                   tensor.mapped_data(), self);
}

Tensor from_numpy(py::object source, std::shared_ptr<Device> device, const std::string& memory,
                  bool zero_copy) {
  if (!device) device = Device::default_device();
  py::array array = py::isinstance<py::array>(source)
                        ? py::reinterpret_borrow<py::array>(source)
                        : py::array(py::module_::import("numpy").attr("asarray")(source));
  const DType dtype = to_dtype(array.dtype(), "array dtype");
  std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
  if (zero_copy) {
    const int flags = py::detail::array_proxy(array.ptr())->flags;
    if (!(flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_))
      throw ArgumentError("zero_copy=True needs a C-contiguous array (this one is not; "
                          "np.ascontiguousarray would copy it)");
    if (!(flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_))
      throw ArgumentError("zero_copy=True needs a writeable array");
    if (array.nbytes() == 0) throw ArgumentError("zero_copy=True needs a non-empty array");
    const uint64_t alignment = device->info().host_import_alignment;
    if (alignment == 0)
      throw UnsupportedError("device '" + device->info().name +
                             "' does not support VK_EXT_external_memory_host, so zero_copy=True "
                             "is not available; use zero_copy=False");
    if (reinterpret_cast<uintptr_t>(array.data()) % alignment != 0)
      throw ArgumentError("zero_copy=True needs the array's data aligned to " +
                          std::to_string(alignment) +
                          " bytes (this device's minImportedHostPointerAlignment); "
                          "bitnet_gpu.aligned_empty() makes such arrays");
    auto* owner = new py::object(array);
    std::shared_ptr<void> keep(owner, [](void* object) {
      py::gil_scoped_acquire gil;
      delete static_cast<py::object*>(object);
    });
    return Tensor::import_host(device, array.mutable_data(), shape, dtype, std::move(keep));
  }
  const int flags = py::detail::array_proxy(array.ptr())->flags;
  py::array contiguous = (flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_)
                             ? array
                             : py::array(py::module_::import("numpy").attr("ascontiguousarray")(array));
  Tensor tensor = Tensor::empty(device, shape, dtype, to_placement(memory));
  const void* data = contiguous.data();
  const uint64_t bytes = tensor.nbytes();
  if (bytes < (1u << 20)) {  // a small copy costs less than handing the GIL over and back
    tensor.upload(data, bytes);
  } else {
    py::gil_scoped_release release;
    tensor.upload(data, bytes);
  }
  return tensor;
}

std::vector<BufferBinding> to_bindings(const std::vector<const Tensor*>& tensors) {
  std::vector<BufferBinding> bindings;
  for (const Tensor* tensor : tensors) {
    if (tensor == nullptr) throw ArgumentError("tensors: None is not a tensor");
    bindings.push_back(tensor->binding());
  }
  return bindings;
}

std::array<uint32_t, 3> to_groups(py::handle groups) {
  std::vector<int64_t> values = to_shape(groups);
  if (values.empty() || values.size() > 3)
    throw ShapeError("groups: expected 1 to 3 workgroup counts, got " + std::to_string(values.size()));
  std::array<uint32_t, 3> result{1, 1, 1};
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] < 0 || values[i] > 0xffffffffll)
      throw ShapeError("groups: workgroup count " + std::to_string(values[i]) + " is out of range");
    result[i] = static_cast<uint32_t>(values[i]);
  }
  return result;
}

std::vector<std::byte> to_bytes(py::handle object, const char* argument) {
  if (object.is_none()) return {};
  std::string bytes;
  try {
    py::object view = py::module_::import("builtins").attr("memoryview")(object);
    bytes = view.attr("tobytes")().cast<std::string>();
  } catch (py::error_already_set&) {
    throw DTypeError(std::string(argument) + ": expected a bytes-like object (bytes, a NumPy array "
                     "or scalar), got " + py::repr(object).cast<std::string>());
  }
  std::vector<std::byte> result(bytes.size());
  if (!bytes.empty()) std::memcpy(result.data(), bytes.data(), bytes.size());
  return result;
}

Specialization to_specialization(const std::optional<py::dict>& values) {
  Specialization result;
  if (!values) return result;
  const py::object numpy = py::module_::import("numpy");
  for (auto [key, value] : *values) {
    uint32_t id = 0;
    try {
      id = key.cast<uint32_t>();
    } catch (py::cast_error&) {
      throw ArgumentError("specialization constant id: expected an integer from 0 to 4294967295, got " +
                          py::repr(key).cast<std::string>());
    }
    const std::string name = "specialization constant " + std::to_string(id);
    // Python's and NumPy's bools, integers and floats (an integer must fit in 64 bits).
    if (py::isinstance<py::bool_>(value) || py::isinstance(value, numpy.attr("bool_"))) {
      result[id] = value.cast<bool>();
    } else if (py::isinstance<py::int_>(value) || py::isinstance(value, numpy.attr("integer"))) {
      try {
        result[id] = py::int_(py::reinterpret_borrow<py::object>(value)).cast<int64_t>();
      } catch (py::cast_error&) {
        throw ArgumentError(name + ": " + py::repr(value).cast<std::string>() + " does not fit in 64 bits");
      }
    } else if (py::isinstance<py::float_>(value) || py::isinstance(value, numpy.attr("floating"))) {
      result[id] = py::float_(py::reinterpret_borrow<py::object>(value)).cast<double>();
    } else {
      throw DTypeError(name + ": expected a bool, int or float, got " + py::repr(value).cast<std::string>());
    }
  }
  return result;
}

py::dict stats_dict(const MemoryStats& stats) {
  py::dict result;
  result["allocated_bytes"] = stats.allocated_bytes;
  result["in_use_bytes"] = stats.in_use_bytes;
  result["peak_in_use_bytes"] = stats.peak_in_use_bytes;
  result["pooled_bytes"] = stats.pooled_bytes;
  result["pool_hits"] = stats.pool_hits;
  result["pool_misses"] = stats.pool_misses;
  result["live_blocks"] = stats.live_blocks;
  result["slab_bytes"] = stats.slab_bytes;
  return result;
}

// "auto" | "matvec" | "tiled" | "coopmat" (matvec only where the op has a matvec path).
ops::BitLinearAlgorithm parse_algorithm(const std::string& name, bool matvec = true) {
  if (name == "auto") return ops::BitLinearAlgorithm::automatic;
  if (name == "matvec" && matvec) return ops::BitLinearAlgorithm::matvec;
  if (name == "tiled") return ops::BitLinearAlgorithm::tiled;
  if (name == "coopmat") return ops::BitLinearAlgorithm::coopmat;
  throw ArgumentError(std::string("algorithm: expected None, ") + (matvec ? "'matvec', " : "") +
                      "'tiled' or 'coopmat', got '" + name + "'");
}

// [(label, seconds)] from timings read without the GIL (reading them may wait for the GPU).
template <typename Read>
py::list timing_list(Read read) {
  std::vector<OpTiming> timings;
  {
    py::gil_scoped_release release;
    timings = read();
  }
  py::list result;
  for (const auto& timing : timings) result.append(py::make_tuple(timing.label, timing.seconds));
  return result;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "bitnet_gpu's C++ core (Vulkan compute), as seen from Python";

  auto make_error = [&](const char* name, py::tuple bases, const char* doc) {
    PyObject* type = PyErr_NewExceptionWithDoc((std::string("bitnet_gpu.") + name).c_str(), doc,
                                               bases.ptr(), nullptr);
    if (type == nullptr) throw py::error_already_set();
    m.add_object(name, py::handle(type));
    return type;
  };
  errors.error = make_error("Error", py::make_tuple(py::handle(PyExc_Exception)),
                            "Base class of every error bitnet_gpu raises.");
  py::handle base(errors.error);
  errors.device = make_error("DeviceError", py::make_tuple(base),
                             "The Vulkan device failed or was lost.");
  errors.out_of_memory = make_error("OutOfMemory", py::make_tuple(base, py::handle(PyExc_MemoryError)),
                                    "A Vulkan allocation did not fit.");
  errors.unsupported = make_error("UnsupportedError", py::make_tuple(base),
                                  "The device or this build cannot do what was asked.");
  errors.shape = make_error("ShapeError", py::make_tuple(base, py::handle(PyExc_ValueError)),
                            "An argument has the wrong shape or size.");
  errors.dtype = make_error("DTypeError", py::make_tuple(base, py::handle(PyExc_TypeError)),
                            "An argument has a dtype the operation does not take.");
  errors.argument = make_error("ArgumentError", py::make_tuple(base, py::handle(PyExc_ValueError)),
                               "An argument has a value the operation does not take.");
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) std::rethrow_exception(pointer);
    } catch (const OutOfMemory& e) {
      PyErr_SetString(errors.out_of_memory, e.what());
    } catch (const DeviceError& e) {
      PyErr_SetString(errors.device, e.what());
    } catch (const UnsupportedError& e) {
      PyErr_SetString(errors.unsupported, e.what());
    } catch (const ShapeError& e) {
      PyErr_SetString(errors.shape, e.what());
    } catch (const DTypeError& e) {
      PyErr_SetString(errors.dtype, e.what());
    } catch (const ArgumentError& e) {
      PyErr_SetString(errors.argument, e.what());
    } catch (const Error& e) {
      PyErr_SetString(errors.error, e.what());
    }
  });

  py::class_<DeviceInfo>(m, "DeviceInfo", "A Vulkan physical device and its capabilities.")
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
      .def("__repr__", [](const DeviceInfo& info) {
        return "<DeviceInfo " + std::to_string(info.index) + ": '" + info.name + "' (" + info.type +
               ", Vulkan " + info.vulkan_version + ", " + info.driver_name + ")>";
      });

  m.def("devices", &enumerate_devices, "Every Vulkan device, as DeviceInfo.");
  m.def("default_device", &Device::default_device,
        "The process-wide Device, created on first use (BITNET_GPU_DEVICE applies).");
  m.def("_release_default_device", &Device::release_default_device);
  m.def("validation_enabled", [] { return Instance::get()->validation_enabled(); });
  m.def("validation_messages", [] { return Instance::get()->take_validation_messages(); },
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
    return py::bytes(reinterpret_cast<const char*>(found->second.data()), found->second.size_bytes());
  });

  py::class_<Device, std::shared_ptr<Device>>(m, "Device", "A Vulkan device with one compute queue.")
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
      .def("_start_profiling", &Device::start_profiling)
      .def("_stop_profiling", &Device::stop_profiling)
      .def("synchronize", &Device::synchronize, py::call_guard<py::gil_scoped_release>())
      .def("memory_stats", [](const Device& d) { return stats_dict(d.memory_stats()); })
      .def("trim", &Device::trim)
      .def(
          "empty",
          [](std::shared_ptr<Device> d, py::handle shape, py::handle dtype, const std::string& memory) {
            return Tensor::empty(d, to_shape(shape), to_dtype(dtype), to_placement(memory));
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
        return "<bitnet_gpu.Device " + std::to_string(d.info().index) + ": '" + d.info().name + "'>";
      });

  py::class_<Tensor>(m, "Tensor", py::buffer_protocol(), "A typed, shaped array in Vulkan memory.")
      .def_static("from_numpy", &from_numpy, py::arg("array"), py::arg("device") = nullptr,
                  py::arg("memory") = "auto", py::arg("zero_copy") = false)
      .def_property_readonly("shape", [](const Tensor& t) { return shape_tuple(t.shape()); })
      .def_property_readonly("dtype", [](const Tensor& t) { return to_numpy(t.dtype()); })
      .def_property_readonly("ndim", [](const Tensor& t) { return t.shape().size(); })
      .def_property_readonly("size", &Tensor::size)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def_property_readonly("device", &Tensor::device_ptr)
      .def_property_readonly("memory", [](const Tensor& t) { return placement_name(t.placement()); })
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
            const bool same_dtype = dtype.is_none() || to_numpy(tensor.dtype()).equal(py::dtype::from_args(dtype));
            if (copy.has_value() && !*copy) {
              if (!same_dtype)
                throw ArgumentError("np.asarray(tensor, copy=False) cannot change the dtype without a copy");
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
                                 ops::shape_text(t.shape()) + ", got " + std::string(dtype_name(from.dtype())) +
                                 " " + ops::shape_text(from.shape()));
              py::gil_scoped_release release;
              const std::vector<int64_t> flat{static_cast<int64_t>(t.size())};
              ops::copy_rows(from.reshaped(flat), t.reshaped(flat), 0);
              return;
            }
            py::array array = py::array::ensure(source);
            if (!array) throw DTypeError("copy_from: expected a NumPy array or a Tensor");
            if (to_dtype(array.dtype(), "copy_from") != t.dtype())
              throw DTypeError("copy_from: expected " + std::string(dtype_name(t.dtype())) + ", got " +
                               py::str(array.dtype()).cast<std::string>());
            std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
            if (shape != t.shape())
              throw ShapeError("copy_from: expected shape " + ops::shape_text(t.shape()) + ", got " +
                               ops::shape_text(shape));
            py::array contiguous = py::array::ensure(array, py::array::c_style);
            const void* data = contiguous.data();
            py::gil_scoped_release release;
            t.upload(data, t.nbytes());
          },
          py::arg("source"),
          "Overwrites the tensor with a NumPy array or a Tensor of its dtype and shape (a Tensor "
          "is copied on the device, and inside a graph the copy is recorded).")
      .def("reshape",
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
        return "<bitnet_gpu.Tensor shape=(" + shape + ") dtype=" + std::string(dtype_name(t.dtype())) +
               " memory=" + placement_name(t.placement()) + " device='" + t.device().info().name + "'>";
      });

  py::class_<Kernel>(m, "Kernel", "A compute shader (SPIR-V) ready to dispatch over tensors.")
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
      .def_property_readonly("writable", [](const Kernel& k) { return k.interface().binding_writable; })
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
          "What the driver's compiler reports for this kernel (VK_KHR_pipeline_executable_properties), "
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
            kernel.dispatch(count, bindings, push);
          },
          py::arg("groups"), py::arg("tensors"), py::arg("push_constants") = py::none(),
          "Run now, or record into the active `with device.sequence()` on this thread.");

  py::class_<Submission, std::shared_ptr<Submission>>(m, "Submission",
                                                      "A submitted sequence running on the GPU.")
      .def("wait", &Submission::wait, py::call_guard<py::gil_scoped_release>())
      .def("done", &Submission::done, py::call_guard<py::gil_scoped_release>())
      .def("timings", [](Submission& s) { return timing_list([&] { return s.timings(); }); });

  py::class_<Sequence>(m, "Sequence", "Records ops into one command buffer and submits them once.")
      .def("__enter__", [](Sequence& s) -> Sequence& {
             s.activate();
             return s;
           }, py::return_value_policy::reference)
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
      .def("copy",
           [](Sequence& s, const Tensor& source, const Tensor& destination) {
             s.copy(source.binding(), destination.binding());
           }, py::arg("source"), py::arg("destination"))
      .def("fill", [](Sequence& s, const Tensor& destination, uint32_t word) {
             s.fill(destination.binding(), word);
           }, py::arg("destination"), py::arg("word"))
      .def("submit", &Sequence::submit)
      .def("timings", [](Sequence& s) { return timing_list([&] { return s.timings(); }); })
      .def_property_readonly("op_count", &Sequence::op_count)
      .def_property_readonly("barrier_count", &Sequence::barrier_count)
      .def_property_readonly("submitted", &Sequence::submitted)
      .def_property_readonly("timings_enabled", &Sequence::timings_enabled);

  py::class_<Graph, std::shared_ptr<Graph>>(m, "_Graph", "Ops recorded once, replayed in one submission.")
      .def(py::init([](std::shared_ptr<Device> device, const std::string& timings) {
             if (timings != "off" && timings != "per_op" && timings != "total")
               throw ArgumentError("timings: expected 'off', 'per_op' or 'total', got '" + timings + "'");
             return std::make_shared<Graph>(std::move(device), timings == "per_op" ? Timing::per_op
                                                              : timings == "total" ? Timing::total
                                                                                   : Timing::off);
           }),
           py::arg("device"), py::arg("timings") = "off")
      .def("begin", &Graph::begin)
      .def("end", &Graph::end)
      .def("replay", &Graph::replay, py::call_guard<py::gil_scoped_release>())
      .def("timings", [](Graph& g) { return timing_list([&] { return g.timings(); }); })
      .def_property_readonly("recording", &Graph::recording)
      .def_property_readonly("closed", &Graph::closed)
      .def_property_readonly("op_count", &Graph::op_count)
      .def_property_readonly("barrier_count", [](Graph& g) { return g.sequence().barrier_count(); })
      .def_property_readonly("device", &Graph::device);
  m.def("_recording", [](const std::shared_ptr<Device>& device) { return device->recording_graph() != nullptr; },
        py::arg("device"));

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
  m.def("_arm_fault", &fault::arm, py::arg("spec"),
        "Debug: arm BITNET_GPU_FAULT's switch ('' disarms it); see cpp/runtime/fault.hpp.");
  m.def("_faults_injected", &fault::injected_count);
  m.def("quantize_weights", &ops::quantize_weights, py::arg("w"), py::arg("group_size"),
        py::arg("binary"), release);
  m.def("weights_from_packed", &ops::weights_from_packed, py::arg("packed"), py::arg("scales"),
        py::arg("rows"), py::arg("cols"), py::arg("group_size"), py::arg("binary"), release);
  m.def("dequantize_weights", &ops::dequantize_weights, py::arg("weights"),
        py::arg("out") = py::none(), release);
  m.def("unpack_ternary", &ops::unpack_ternary, py::arg("packed"), py::arg("rows"),
        py::arg("cols"), py::arg("out") = py::none(), release);
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
        py::arg("kv_length"), py::arg("out") = py::none(), release);
  m.def("rope", &ops::rope, py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("out") = py::none(),
        release);
  m.def("attention_cached", &ops::attention_cached, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"),
        py::arg("start"), py::arg("causal"), py::arg("out") = py::none(), release);
  m.def("bitlinear_group", &ops::bitlinear_group, py::arg("x"), py::arg("up"), py::arg("norm_weight"),
        py::arg("norm_eps"), py::arg("weights"), py::arg("residuals"), py::arg("gated_output") = false, release);
  m.def("rope_append", &ops::rope_append, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cos"),
        py::arg("sin"), py::arg("start"), py::arg("k_cache"), py::arg("v_cache"), release);
  m.def("decode_attention", &ops::decode_attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cos"),
        py::arg("sin"), py::arg("start"), py::arg("k_cache"), py::arg("v_cache"), py::arg("split_keys") = 0,
        release);
  m.def("embedding", &ops::embedding, py::arg("table"), py::arg("ids"), py::arg("out") = py::none(), release);
  m.def("linear_rows", &ops::linear_rows, py::arg("x"), py::arg("w"), py::arg("out") = py::none(), release);
  m.def("argmax_rows", &ops::argmax_rows, py::arg("x"), py::arg("out") = py::none(), release);
  m.def("sample_rows", &ops::sample_rows, py::arg("logits"), py::arg("params"), py::arg("start"), py::arg("offset"),
        py::arg("out") = py::none(), py::arg("top_p") = false, py::arg("top_k") = true, release);
  m.def("screened_sample", &ops::screened_sample, py::arg("x"), py::arg("head"), py::arg("head_q"),
        py::arg("head_meta"), py::arg("params"), py::arg("start"), py::arg("offset"), py::arg("out") = py::none(),
        py::arg("exact") = py::none(), py::arg("top_p") = false, release);
  m.def("screened_argmax", &ops::screened_argmax, py::arg("x"), py::arg("head"), py::arg("head_q"),
        py::arg("head_meta"), py::arg("out") = py::none(), py::arg("high") = py::none(), release);
  m.def("screened_argmax_fits", [](const Device& device, int64_t k) { return ops::screened_argmax_fits(device, k); },
        py::arg("device"), py::arg("k"));
  m.def("copy_rows", &ops::copy_rows, py::arg("rows"), py::arg("destination"), py::arg("first_row"),
        release);
  py::enum_<ops::BinaryOp>(m, "BinaryOp")
      .value("add", ops::BinaryOp::add)
      .value("sub", ops::BinaryOp::sub)
      .value("mul", ops::BinaryOp::mul)
      .value("div", ops::BinaryOp::div);
  m.def("binary", &ops::binary, py::arg("a"), py::arg("b"), py::arg("op"), py::arg("out") = py::none(),
        release);
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
  m.def("reduce", &ops::reduce, py::arg("x"), py::arg("axis"), py::arg("op"), py::arg("out") = py::none(),
        release);
  m.def("transpose", &ops::transpose, py::arg("x"), py::arg("out") = py::none(), release);
  m.def("matmul", &ops::matmul, py::arg("a"), py::arg("b"), py::arg("out") = py::none(), release);
  m.def("row_op", &ops::row_op, py::arg("x"), py::arg("op"), py::arg("weight"), py::arg("bias"),
        py::arg("eps"), py::arg("out") = py::none(), release);
  m.def("bitlinear_backward_input", &ops::bitlinear_backward_input, py::arg("grad_y"),
        py::arg("w"), release);
}
