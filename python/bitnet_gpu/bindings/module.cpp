// The pybind11 module bitnet_gpu._core: converts between Python and the C++ core, nothing else.
// Each area's bindings live in a file of their own (bindings/*.cpp).
#include "bindings/convert.hpp"
#include "runtime/error.hpp"

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
  PyObject* linalg;
};
PythonErrors errors;

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
  errors.device =
      make_error("DeviceError", py::make_tuple(base), "The Vulkan device failed or was lost.");
  errors.out_of_memory =
      make_error("OutOfMemory", py::make_tuple(base, py::handle(PyExc_MemoryError)),
                 "A Vulkan allocation did not fit.");
  errors.unsupported = make_error("UnsupportedError", py::make_tuple(base),
                                  "The device or this build cannot do what was asked.");
  errors.shape = make_error("ShapeError", py::make_tuple(base, py::handle(PyExc_ValueError)),
                            "An argument has the wrong shape or size.");
  errors.dtype = make_error("DTypeError", py::make_tuple(base, py::handle(PyExc_TypeError)),
                            "An argument has a dtype the operation does not take.");
  errors.argument = make_error("ArgumentError", py::make_tuple(base, py::handle(PyExc_ValueError)),
                               "An argument has a value the operation does not take.");
  errors.linalg = make_error(
      "LinAlgError", py::make_tuple(base, py::module_::import("numpy.linalg").attr("LinAlgError")),
      "A decomposition does not exist for the matrix given (numpy.linalg.LinAlgError too).");
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
    } catch (const LinAlgError& e) {
      PyErr_SetString(errors.linalg, e.what());
    } catch (const Error& e) {
      PyErr_SetString(errors.error, e.what());
    }
  });

  binding::declare_classes(m);
  binding::bind_runtime(m);
  binding::bind_recording(m);
  binding::bind_ops(m);
  binding::bind_model(m);
}
