"""DLPack: tensors handed to PyTorch, CuPy, JAX and NumPy, and theirs taken in, without copies where
the memory allows it.

A host-visible Tensor is exported as CPU memory that the consumer shares (``np.from_dlpack(t)``,
``torch.from_dlpack(t)``); the consumer's array keeps the tensor alive. A tensor in device-only
memory has no CPU address: exporting it raises ``BufferError`` unless ``copy=True``.
``bg.from_dlpack(x)`` takes any CPU DLPack producer: its memory is imported for the GPU where the
device can (``VK_EXT_external_memory_host``: C-contiguous, writeable, aligned) and copied
otherwise, as ``copy=`` says (the array API standard's meaning).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._core import Device, Error, Tensor, default_device

__all__ = ["from_dlpack"]

# DLPack's device types (dlpack.h, DLDeviceType): what a host-visible tensor is exported as.
CPU = 1


def _dlpack_device(self: Tensor) -> tuple[int, int]:
    """(device type, device id) of the memory __dlpack__ exports: CPU memory, (1, 0)."""
    return (CPU, 0)


def _dlpack(
    self: Tensor,
    *,
    stream: Any = None,
    max_version: tuple[int, int] | None = None,
    dl_device: tuple[int, int] | None = None,
    copy: bool | None = None,
) -> Any:
    """A DLPack capsule of the tensor as CPU memory: shared with the consumer where the tensor is
    host-visible (copy None or False), a copy with copy=True; BufferError for device-only memory
    without copy=True, for a stream, or for a device other than the CPU."""
    if stream is not None:
        raise BufferError("stream: a bitnet_gpu tensor is exported as CPU memory, which takes None")
    if dl_device is not None and tuple(dl_device) != (CPU, 0):
        raise BufferError(
            f"dl_device: a bitnet_gpu tensor is exported as CPU memory (1, 0), not {dl_device}"
        )
    if copy is True:
        array = self.numpy()
    elif self.host_visible:
        array = np.asarray(self, copy=False)  # a view whose base keeps the tensor alive
    else:
        raise BufferError(
            "this tensor lives in device-only memory, which the CPU cannot address: pass copy=True "
            "for a copy, or create the tensor with memory='host'"
        )
    if max_version is None:
        return array.__dlpack__()
    return array.__dlpack__(max_version=max_version)


# Methods of the compiled class, written in Python (the stubs list them with the class).
setattr(Tensor, "__dlpack__", _dlpack)
setattr(Tensor, "__dlpack_device__", _dlpack_device)


def from_dlpack(x: Any, /, *, device: Device | None = None, copy: bool | None = None) -> Tensor:
    """A Tensor holding a DLPack producer's data (NumPy, PyTorch or JAX CPU arrays, ...).

    copy=None: the producer's memory is imported for the GPU where the device can (then the tensor
    and the producer share it, and the tensor keeps the producer alive), copied otherwise;
    copy=False: imported or BufferError saying why; copy=True: always a copy. A producer whose
    memory is not on the CPU raises BufferError (move it to the CPU first)."""
    if copy is not None and not isinstance(copy, bool):
        raise TypeError(f"copy: expected None, True or False, got {copy!r}")
    if device is not None and not isinstance(device, Device):
        raise TypeError(
            f"device: expected a bitnet_gpu.Device or None, got {type(device).__name__}"
        )
    device = device or default_device()
    if isinstance(x, Tensor):
        if copy is True or x.device is not device:
            if copy is False:
                raise BufferError("copy=False: the tensor lives on another device")
            return Tensor.from_numpy(x.numpy(), device)
        return x
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"from_dlpack: {type(x).__name__} is not a DLPack producer (no __dlpack__)")
    kind = x.__dlpack_device__()[0] if hasattr(x, "__dlpack_device__") else CPU
    if kind != CPU:
        raise BufferError(
            f"from_dlpack: the producer's memory is on DLPack device type {kind}, not the CPU; "
            "bitnet_gpu takes CPU memory (move the array to the CPU first)"
        )
    array = np.from_dlpack(x)
    if copy is not True:
        try:
            return Tensor.from_numpy(array, device, zero_copy=True)
        except Error as why:  # any refusal: drivers differ in the memory they take (even their own)
            if copy is False:
                raise BufferError(
                    f"copy=False, but this memory cannot be shared with the device: {why}"
                ) from None
    return Tensor.from_numpy(array, device)
