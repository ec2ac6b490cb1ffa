#pragma once
// Conversions between Python objects and the core's types, shared by the binding files. The
// binding layer converts arguments and results and nothing else: every check and every
// computation is the core's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ops/bitlinear.hpp"
#include "runtime/kernel.hpp"
#include "runtime/memory.hpp"
#include "runtime/sequence.hpp"
#include "runtime/tensor.hpp"

namespace bitnet::binding {

namespace py = pybind11;

// A NumPy dtype (object, type or name) as the core's DType: DTypeError naming `argument` otherwise.
DType to_dtype(py::handle object, const char* argument = "dtype");
py::dtype to_numpy(DType dtype);
// "auto" | "device" | "host".
Placement to_placement(const std::string& memory);
// An int or a sequence of ints: ShapeError otherwise.
std::vector<int64_t> to_shape(py::handle shape);
py::tuple shape_tuple(const std::vector<int64_t>& shape);
// Byte strides of a C-contiguous tensor, and its buffer-protocol format character.
std::vector<py::ssize_t> c_strides(const Tensor& tensor);
const char* buffer_format(DType dtype);
// A copy of the tensor as a NumPy array, and a zero-copy view of a host-visible one (the view's
// base keeps the tensor alive).
py::array to_array(const Tensor& tensor);
py::array view_array(py::object self);
Tensor from_numpy(py::object source, std::shared_ptr<Device> device, const std::string& memory,
                  bool zero_copy);
std::vector<BufferBinding> to_bindings(const std::vector<const Tensor*>& tensors);
// A workgroup count: an int or up to three ints.
std::array<uint32_t, 3> to_groups(py::handle groups);
// Push-constant bytes from bytes, a buffer or a NumPy array or scalar.
std::vector<std::byte> to_bytes(py::handle object, const char* argument);
Specialization to_specialization(const std::optional<py::dict>& values);
py::dict stats_dict(const MemoryStats& stats);
// "auto" | "matvec" | "tiled" | "coopmat" | "coopmat2" (matvec only where the op has a matvec
// path).
ops::BitLinearAlgorithm parse_algorithm(const std::string& name, bool matvec = true);

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

// A class declare_classes registered, to add its methods to. Every class is registered before any
// method, so that signatures name Python types (stubs and docstrings), whatever the order.
template <typename T, typename... Options>
py::class_<T, Options...> declared(py::module_& m, const char* name) {
  return py::reinterpret_borrow<py::class_<T, Options...>>(m.attr(name));
}

// The module's parts, one for each area; module.cpp calls them in this order.
void declare_classes(py::module_& m);
void bind_runtime(py::module_& m);
void bind_recording(py::module_& m);
void bind_ops(py::module_& m);
void bind_model(py::module_& m);

}  // namespace bitnet::binding
