"""Writes python/bitnet_gpu/_core.pyi, the type stubs of the compiled module, from the built module
itself (pybind11-stubgen, then the fixes below); with --check, fails where the file differs.

    python3 .ci/stubs.py [--check]

The fixes: the exceptions the module creates at run time are written as classes; the class
Sequence is not typing.Sequence; numpy is imported; a None default makes its parameter Optional.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tempfile

STUB = pathlib.Path(__file__).resolve().parents[1] / "python" / "bitnet_gpu" / "_core.pyi"

EXCEPTIONS = """class Error(Exception): ...
class DeviceError(Error): ...
class OutOfMemory(Error, MemoryError): ...
class UnsupportedError(Error): ...
class ShapeError(Error, ValueError): ...
class DTypeError(Error, TypeError): ...
class ArgumentError(Error, ValueError): ...
class LinAlgError(Error, _numpy.linalg.LinAlgError): ...
"""


def generate() -> str:
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pybind11_stubgen",
                "bitnet_gpu._core",
                "-o",
                folder,
                "--exit-code",
            ],
            check=True,
        )
        text = (pathlib.Path(folder) / "bitnet_gpu" / "_core.pyi").read_text()
    text = re.sub(r"^from bitnet_gpu import \w+\n", "", text, flags=re.M)
    # Tensor has a method named numpy: the module goes by another name.
    text = text.replace("import typing\n", "import numpy as _numpy\nimport typing\n", 1)
    text = re.sub(r"\bnumpy\.(ndarray|dtype)", r"_numpy.\1", text)
    text = re.sub(r"^(__all__: .*\n)", lambda m: m.group(1) + EXCEPTIONS, text, count=1, flags=re.M)
    text = text.replace("self: typing.Sequence", "self").replace("typing.Sequence", "Sequence")
    # name: T = None -> name: T | None = None
    text = re.sub(
        r"(\w+): ([\w.\[\], ]+?) = None",
        lambda m: (
            m.group(0) if "None" in m.group(2) else f"{m.group(1)}: {m.group(2)} | None = None"
        ),
        text,
    )
    return text


def main() -> int:
    text = generate()
    if "--check" in sys.argv:
        if STUB.read_text() != text:
            print(
                f"{STUB} is not what the built module gives: run python3 .ci/stubs.py",
                file=sys.stderr,
            )
            return 1
        return 0
    STUB.write_text(text)
    print(f"wrote {STUB}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
