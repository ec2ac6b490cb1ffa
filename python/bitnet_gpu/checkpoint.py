"""Reading and writing safetensors files with NumPy alone (no torch, no safetensors package).

The format: an 8-byte little-endian header length, a JSON header {name: {"dtype", "shape",
"data_offsets": [begin, end]}} (offsets into the data after the header), then the data. bfloat16
tensors are widened to float32 on reading (NumPy has no bfloat16).
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable, Mapping

import numpy as np

from . import _core

__all__ = ["load_safetensors", "save_safetensors"]

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "U16": np.uint16,
    "U32": np.uint32,
    "U64": np.uint64,
    "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def _files(path):
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isdir(path) and os.path.exists(index):  # shards, as transformers writes them
        import json

        try:
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise _core.ArgumentError(f"{index}: not a safetensors index ({error})") from None
        missing = [s for s in shards if not os.path.exists(os.path.join(path, str(s)))]
        if missing:
            raise _core.ArgumentError(
                f"{index} names shards that are not there: {', '.join(missing)}"
            )
        return [os.path.join(path, s) for s in shards]
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
        if not names:
            raise _core.ArgumentError(f"{path}: no .safetensors file in this directory")
        return [os.path.join(path, n) for n in names]
    return [path]


def _whole_numbers(value, count=None):
    """value as a tuple of non-negative ints (JSON integers, not floats or bools), or None."""
    if not isinstance(value, list) or (count is not None and len(value) != count):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return None
    return tuple(value)


def _entry(file, name, info, data_size):
    """(dtype name, shape, begin, end) of one header entry, checked against the format and the
    file's data size; ArgumentError naming the file and the tensor otherwise."""

    def bad(what):
        return _core.ArgumentError(f"{file}: tensor {name!r} {what}")

    if not isinstance(info, dict):
        raise bad(f"has a header entry that is not an object: {info!r}"[:200])
    kind = info.get("dtype")
    if not isinstance(kind, str):
        raise bad(f"has no dtype name (got {kind!r})"[:200])
    shape = _whole_numbers(info.get("shape"))
    if shape is None:
        raise bad(
            f"has a shape that is not a list of non-negative integers: {info.get('shape')!r}"[:200]
        )
    offsets = _whole_numbers(info.get("data_offsets"), 2)
    if offsets is None:
        raise bad(
            f"has data_offsets that are not two non-negative integers: "
            f"{info.get('data_offsets')!r}"[:200]
        )
    begin, end = offsets
    if begin > end or end > data_size:
        raise bad("lies past the end of the file")
    return kind, shape, begin, end


def load_safetensors(path) -> dict[str, np.ndarray]:
    """{name: array} from a .safetensors file, or from every one in a directory (a sharded
    checkpoint). Arrays are memory-mapped where the dtype allows; bfloat16 becomes float32.
    A file that does not follow the format raises ArgumentError (DTypeError for a dtype bitnet_gpu
    cannot read) naming the file and the tensor."""
    result = {}
    for file in _files(os.fspath(path)):
        size = os.path.getsize(file)
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise _core.ArgumentError(f"{file}: not a safetensors file (too short)")
            (length,) = struct.unpack("<Q", head)
            if length > 100 * 2**20 or 8 + length > size:
                raise _core.ArgumentError(
                    f"{file}: not a safetensors file (header of {length} bytes in a file of {size})"
                )
            try:
                header = json.loads(f.read(length))
            except ValueError as e:
                raise _core.ArgumentError(f"{file}: not a safetensors file ({e})") from None
        if not isinstance(header, dict):
            raise _core.ArgumentError(
                f"{file}: not a safetensors file (its header is not a JSON object)"
            )
        data_start = 8 + length
        for name, info in header.items():
            if name == "__metadata__":
                continue
            kind, shape, begin, end = _entry(file, name, info, size - data_start)
            count = math.prod(shape)
            if kind == "BF16":
                if end - begin != 2 * count:
                    raise _core.ArgumentError(
                        f"{file}: tensor {name!r} has {end - begin} bytes for {shape}"
                    )
                raw = (
                    np.memmap(file, np.uint16, "r", data_start + begin, (count,))
                    if count
                    else np.zeros(0, np.uint16)
                )
                result[name] = (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)
                continue
            if kind not in _DTYPES:
                raise _core.DTypeError(
                    f"{file}: tensor {name!r} has dtype {kind}, which bitnet_gpu cannot read"
                )
            dtype = np.dtype(_DTYPES[kind])
            if end - begin != dtype.itemsize * count:
                raise _core.ArgumentError(
                    f"{file}: tensor {name!r} has {end - begin} bytes for {kind} {shape}"
                )
            result[name] = (
                np.memmap(file, dtype, "r", data_start + begin, shape)
                if count
                else np.zeros(shape, dtype)
            )
    return result


def to_bfloat16_bits(a) -> np.ndarray:
    """uint16: the bfloat16 nearest each float32 value (ties to even; NaN stays NaN)."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(np.isnan(a), 0x7FC0, rounded).astype(np.uint16)


def save_safetensors(path, tensors: dict, metadata: dict | None = None, bfloat16=()) -> None:
    """Writes {name: array} as a safetensors file (the dtypes in _DTYPES; a 0-d array as shape
    []); the names in `bfloat16` (a name or a collection of names, matched whole) are written as
    BF16 (each value the nearest bfloat16, ties to even)."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors: expected a dict of arrays, got {type(tensors).__name__}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError(f"metadata: expected a dict or None, got {type(metadata).__name__}")
    if isinstance(bfloat16, str):
        bfloat16 = {bfloat16}
    elif not isinstance(bfloat16, Iterable):
        raise TypeError(f"bfloat16: expected a name or names, got {type(bfloat16).__name__}")
    wide = set(bfloat16)
    header, offset, arrays = {}, 0, []
    for name, value in tensors.items():
        a = np.asarray(value)
        a = a if a.flags.c_contiguous else np.ascontiguousarray(a)  # which would make 0-d 1-d
        kind = "BF16" if name in wide else _NAMES.get(a.dtype)
        if name in wide:
            a = to_bfloat16_bits(a)
        if kind is None:
            raise _core.DTypeError(f"{name}: dtype {a.dtype} has no safetensors name here")
        header[name] = {
            "dtype": kind,
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
        arrays.append(a)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for a in arrays:
            f.write(a.tobytes())
