"""bitnet_gpu: BitNet b1.58 kernels on any Vulkan GPU, NumPy in and NumPy out.

The objects: ``Device`` (a Vulkan device and its compute queue), ``Tensor`` (a typed array in a
Vulkan buffer; NumPy sees host-visible ones without a copy), ``Kernel`` (a SPIR-V compute shader)
and ``Sequence`` (ops recorded into one command buffer, with the barriers their data needs).
"""

from __future__ import annotations

import atexit
import builtins
import math
from typing import TYPE_CHECKING

import numpy as np

from . import _core
from ._core import (
    ArgumentError,
    Device,
    DeviceError,
    DeviceInfo,
    DTypeError,
    Error,
    Kernel,
    LinAlgError,
    OutOfMemory,
    Sequence,
    ShapeError,
    Submission,
    Tensor,
    UnsupportedError,
    default_device,
    devices,
)
from . import activations, arithmetic, norms, ops, quantize, sampling, tensor_ops
from . import _recorded_calls
from ._args import integer as _integer
from ._tuning import Knob, get_tuning, tuning, tuning_knobs
from .activations import (
    gelu,
    gelu_backward,
    leaky_relu,
    leaky_relu_backward,
    relu,
    relu2,
    relu2_backward,
    relu2_mul,
    relu_backward,
    relu_dropout,
    sigmoid,
    sigmoid_backward,
    silu,
    silu_backward,
    silu_mul,
    swish,
    swish_backward,
    tanh,
    tanh_backward,
)
from .arithmetic import add, div, mul, sub
from .attention import KVCache, attention, rope, rope_tables
from .interop import from_dlpack
from .linear import bitlinear, bitlinear_backward_input, mixed_precision_matmul
from .norms import (
    layer_norm,
    layer_norm_backward,
    rms_norm,
    rms_norm_backward,
    softmax,
    softmax_backward,
)
from .quantize import (
    BinaryWeights,
    TernaryWeights,
    binarize_weights,
    dequantize_activations,
    dequantize_weights,
    pack_ternary,
    quantize_activations,
    quantize_gradients,
    quantize_weights,
    unpack_ternary,
)
from .sampling import sample_logits
from .telemetry import TelemetrySampler as _TelemetrySampler
from .telemetry import telemetry as _read_telemetry
from .tensor_ops import matmul, mean, transpose
from .tensor_ops import max as max  # noqa: A004 - NumPy's names, as np.max and np.sum
from .tensor_ops import sum as sum  # noqa: A004

if TYPE_CHECKING:
    from . import reference as reference  # imported on first use (the test oracle, not the library)

__all__ = [
    "ArgumentError",
    "BinaryWeights",
    "DTypeError",
    "Device",
    "DeviceError",
    "DeviceInfo",
    "Error",
    "Graph",
    "KVCache",
    "Kernel",
    "Knob",
    "LinAlgError",
    "OutOfMemory",
    "Profile",
    "Sequence",
    "ShapeError",
    "Submission",
    "Tensor",
    "TernaryWeights",
    "UnsupportedError",
    "activations",
    "add",
    "aligned_empty",
    "arithmetic",
    "attention",
    "binarize_weights",
    "bitlinear",
    "bitlinear_backward_input",
    "builtin_kernel",
    "decoder_ops",
    "default_device",
    "dequantize_activations",
    "dequantize_weights",
    "devices",
    "div",
    "from_dlpack",
    "gelu",
    "gelu_backward",
    "get_tuning",
    "layer_norm",
    "layer_norm_backward",
    "leaky_relu",
    "leaky_relu_backward",
    "linalg",
    "matmul",
    "max",
    "mean",
    "mixed_precision_matmul",
    "models",
    "mul",
    "nn",
    "norms",
    "ops",
    "pack_ternary",
    "profile",
    "quantize",
    "quantize_activations",
    "quantize_gradients",
    "quantize_weights",
    "reference",
    "relu",
    "relu2",
    "relu2_backward",
    "relu2_mul",
    "relu_backward",
    "relu_dropout",
    "rms_norm",
    "rms_norm_backward",
    "rope",
    "rope_tables",
    "sample_logits",
    "sampling",
    "sigmoid",
    "sigmoid_backward",
    "silu",
    "silu_backward",
    "silu_mul",
    "softmax",
    "softmax_backward",
    "sub",
    "sum",
    "swish",
    "swish_backward",
    "tanh",
    "tanh_backward",
    "telemetry",
    "tensor_ops",
    "transpose",
    "tuning",
    "tuning_knobs",
    "unpack_ternary",
]

__version__ = "0.1.0"


def aligned_empty(shape, dtype=np.float32, device: Device | None = None) -> np.ndarray:
    """An uninitialised NumPy array that ``Tensor.from_numpy(a, zero_copy=True)`` can import.

    Its data starts on the device's minImportedHostPointerAlignment (4096 bytes where the
    device does not say) and the memory behind it extends to a whole multiple of it.
    """
    device = device or default_device()
    dtype = np.dtype(dtype)
    alignment = device.info.host_import_alignment or 4096
    if isinstance(shape, (str, bytes)) or not (np.isscalar(shape) or np.ndim(shape) == 1):
        raise TypeError(f"shape: expected an int or a sequence of ints, got {shape!r}")
    shape = (shape,) if np.isscalar(shape) else tuple(shape)
    shape = tuple(_integer(d, "shape") for d in shape)
    if any(d < 0 for d in shape):
        raise ShapeError(f"shape: negative dimension in {shape}")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= 2**62:  # NumPy's sizes are signed 64-bit
        raise ShapeError(f"shape: {shape} of {dtype} is more memory than can be addressed")
    padded = builtins.max(alignment, -(-nbytes // alignment) * alignment)
    raw = np.empty(padded + alignment, dtype=np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


def builtin_kernel(name: str, device: Device | None = None, specialization=None) -> Kernel:
    """A Kernel from one of the shaders compiled into bitnet_gpu (see
    ``_core.builtin_shaders()``)."""
    device = device or default_device()
    return Kernel(device, _core.builtin_spirv(name), specialization=specialization, name=name)


from . import decoder_ops, linalg, models, nn, telemetry  # noqa: E402
from .graph import Graph  # noqa: E402


if TYPE_CHECKING:
    import bitnet_gpu.graph


def _device_graph(self: Device, *, timings: bool | str = False) -> bitnet_gpu.graph.Graph:
    """A new Graph on this device: ``with device.graph() as g: ...`` records, ``g.run()``
    replays."""
    return Graph(self, timings=timings)


setattr(Device, "graph", _device_graph)  # a method of the compiled class, written in Python


@atexit.register
def _shutdown() -> None:
    # Destroy the default device (saving its pipeline cache) while the driver is still loaded;
    # recorded calls hold it.
    _recorded_calls.clear_all()
    _core.release_default_device()


def _device_telemetry(self: Device) -> dict:
    """The device's temperature, power, clocks, utilization and throttle reasons now (None where
    the platform does not say): NVML for NVIDIA GPUs, hwmon for AMD and Intel ones."""
    return _read_telemetry(self)


setattr(Device, "telemetry", _device_telemetry)  # a method of the compiled class, written in Python


class Profile:
    """GPU time of every kernel, copy and fill that completes on a device inside the block:
    ``with bg.profile(device) as p: ...`` then ``p.timings`` [(label, seconds)] and
    ``p.total(label=None)``. Each op gets a timestamp after it, so ops do not overlap while
    profiling. With telemetry=True a thread reads ``device.telemetry()`` every `interval` seconds
    during the block: ``p.samples`` [(seconds since the block began, reading)]."""

    def __init__(
        self, device: Device | None = None, telemetry: bool = False, interval: float = 0.01
    ) -> None:
        if device is not None and not isinstance(device, Device):
            raise TypeError(f"device: expected a bitnet_gpu.Device, got {type(device).__name__}")
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
            raise ArgumentError(
                f"interval: expected a positive number of seconds, got {interval!r}"
            )
        self.device = device or default_device()
        self.timings: list = []
        self.samples: list = []
        self._sampler = _TelemetrySampler(self.device, interval) if telemetry else None

    def __enter__(self):
        if self._sampler is not None:
            self._sampler.start()
        self.device.start_profiling()
        return self

    def __exit__(self, *exc):
        try:
            self.timings = self.device.stop_profiling()
        finally:
            if self._sampler is not None:
                self.samples = self._sampler.stop()
        return False

    def total(self, label: str | None = None) -> float:
        """Seconds of every op timed, or of those labelled `label`."""
        return builtins.sum(t for name, t in self.timings if label is None or name == label)

    def __repr__(self) -> str:
        return (
            f"<bitnet_gpu.Profile device={self.device.info.index} ops={len(self.timings)} "
            f"total={self.total() * 1e3:.3f} ms samples={len(self.samples)}>"
        )


def profile(
    device: Device | None = None, telemetry: bool = False, interval: float = 0.01
) -> Profile:
    """``with bg.profile(device) as p:``: see Profile."""
    return Profile(device, telemetry, interval)


def __getattr__(name: str) -> object:
    """bitnet_gpu.reference, the NumPy reference (the tests' oracle), imported on first use."""
    if name == "reference":
        import importlib

        return importlib.import_module(".reference", __name__)
    raise AttributeError(f"module 'bitnet_gpu' has no attribute {name!r}")
