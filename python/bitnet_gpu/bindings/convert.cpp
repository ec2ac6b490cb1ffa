#include "bindings/convert.hpp"

#include <array>
#include <cstring>
#include <iterator>

#include "runtime/device.hpp"
#include "runtime/error.hpp"

namespace bitnet::binding {

namespace {

// The common case without NumPy's Python-level `name` property (a few microseconds a call): a
// native-order dtype of a kind and size bitnet_gpu has.
std::optional<DType> native_dtype(const py::dtype& dtype) {
  const char order = dtype.byteorder();
  if (order != '=' && order != '|') return std::nullopt;
  const auto size = dtype.itemsize();
  switch (dtype.kind()) {
    case 'f':
      if (size == 2) return DType::float16;
      if (size == 4) return DType::float32;
      if (size == 8) return DType::float64;
      return std::nullopt;
    case 'i':
      if (size == 1) return DType::int8;
      if (size == 4) return DType::int32;
      return std::nullopt;
    case 'u':
      if (size == 1) return DType::uint8;
      if (size == 4) return DType::uint32;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

}  // namespace

DType to_dtype(py::handle object, const char* argument) {
  py::dtype dtype;
  try {
    dtype = py::isinstance<py::dtype>(object)
                ? py::reinterpret_borrow<py::dtype>(object)
                : py::dtype::from_args(py::reinterpret_borrow<py::object>(object));
  } catch (py::error_already_set&) {
    throw DTypeError(std::string(argument) +
                     ": not a NumPy dtype: " + py::repr(object).cast<std::string>());
  }
  if (auto found = native_dtype(dtype)) return *found;
  const std::string name = py::str(dtype.attr("name"));
  auto found = dtype_from_name(name);
  if (!found || !dtype.attr("isnative").cast<bool>())
    throw DTypeError(std::string(argument) + ": expected one of " +
                     std::string(supported_dtype_list) + ", got " +
                     py::str(dtype).cast<std::string>());
  return *found;
}

py::dtype to_numpy(DType dtype) {
  // Made once a dtype (each is NumPy's own singleton; kept for the process, under the GIL): a
  // dtype from its name costs a parse every call.
  static std::array<PyObject*, std::size(all_dtypes)> made{};
  const auto index = static_cast<size_t>(dtype);
  if (index >= made.size()) return py::dtype(std::string(dtype_name(dtype)));
  if (made[index] == nullptr)
    made[index] = py::dtype(std::string(dtype_name(dtype))).release().ptr();
  return py::reinterpret_borrow<py::dtype>(made[index]);
}

Placement to_placement(const std::string& memory) {
  if (memory == "auto" || memory == "device") return Placement::device;
  if (memory == "host") return Placement::host;
  throw ArgumentError("memory: expected 'auto', 'device' or 'host', got '" + memory + "'");
}

std::vector<int64_t> to_shape(py::handle shape) {
  try {
    if (py::isinstance<py::int_>(shape)) return {shape.cast<int64_t>()};
    return shape.cast<std::vector<int64_t>>();
  } catch (py::cast_error&) {  // not ints, or an int past 64 bits
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
    case DType::float32:
      return "f";
    case DType::float16:
      return "e";
    case DType::int8:
      return "b";
    case DType::uint8:
      return "B";
    case DType::int32:
      return "i";
    case DType::uint32:
      return "I";
    case DType::float64:
      return "d";
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
    throw ArgumentError(
        "this tensor lives in device-only memory and cannot be viewed without a "
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
      throw ArgumentError(
          "zero_copy=True needs a C-contiguous array (this one is not; "
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
  py::array contiguous =
      (flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_)
          ? array
          : py::array(py::module_::import("numpy").attr("ascontiguousarray")(array));
  Tensor tensor = Tensor::empty(device, shape, dtype, to_placement(memory), false);
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
    throw ShapeError("groups: expected 1 to 3 workgroup counts, got " +
                     std::to_string(values.size()));
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
    throw DTypeError(std::string(argument) +
                     ": expected a bytes-like object (bytes, a NumPy array "
                     "or scalar), got " +
                     py::repr(object).cast<std::string>());
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
      throw ArgumentError(
          "specialization constant id: expected an integer from 0 to 4294967295, got " +
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
        throw ArgumentError(name + ": " + py::repr(value).cast<std::string>() +
                            " does not fit in 64 bits");
      }
    } else if (py::isinstance<py::float_>(value) || py::isinstance(value, numpy.attr("floating"))) {
      result[id] = py::float_(py::reinterpret_borrow<py::object>(value)).cast<double>();
    } else {
      throw DTypeError(name + ": expected a bool, int or float, got " +
                       py::repr(value).cast<std::string>());
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

ops::BitLinearAlgorithm parse_algorithm(const std::string& name, bool matvec) {
  if (name == "auto") return ops::BitLinearAlgorithm::automatic;
  if (name == "matvec" && matvec) return ops::BitLinearAlgorithm::matvec;
  if (name == "tiled") return ops::BitLinearAlgorithm::tiled;
  if (name == "coopmat") return ops::BitLinearAlgorithm::coopmat;
  if (name == "coopmat_khr") return ops::BitLinearAlgorithm::coopmat_khr;
  if (name == "coopmat2") return ops::BitLinearAlgorithm::coopmat2;
  throw ArgumentError(std::string("algorithm: expected None, ") + (matvec ? "'matvec', " : "") +
                      "'tiled', 'coopmat', 'coopmat_khr' or 'coopmat2', got '" + name + "'");
}

}  // namespace bitnet::binding
