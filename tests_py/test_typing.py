"""Type information ships with the package: py.typed, stubs of the compiled module that match the
built module, and a type checker that passes over the package and reports a user's type error."""

import pathlib
import subprocess
import sys

import pytest

import bitnet_gpu as bg
from conftest import package_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = pathlib.Path(bg.__file__).parent  # this very build of bitnet_gpu


def run(args, **kwargs):
    env = package_env()
    if PACKAGE.parent == ROOT / "python":  # a build in the source tree; installed, mypy finds it
        env["MYPYPATH"] = str(PACKAGE.parent)
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=600, **kwargs
    )


def user_mypy(tmp_path, script, *options):
    """mypy over a user's script as a user runs it: outside the project, no config file."""
    command = ["-m", "mypy", *options, "--cache-dir", str(tmp_path / "cache")]
    return run([*command, "--config-file", "/dev/null", str(script)], cwd=tmp_path)


def test_the_package_ships_its_types():
    assert (PACKAGE / "py.typed").is_file()
    assert (PACKAGE / "_core.pyi").is_file()


def test_the_stubs_match_the_built_module():
    pytest.importorskip("pybind11_stubgen")
    result = run([str(ROOT / ".ci" / "stubs.py"), "--check"])
    assert result.returncode == 0, result.stderr


def test_mypy_passes_over_the_package_and_a_typed_example(tmp_path):
    pytest.importorskip("mypy")
    result = run(["-m", "mypy", "--cache-dir", str(tmp_path)], cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_reports_a_type_error_in_user_code(tmp_path):
    pytest.importorskip("mypy")
    snippet = tmp_path / "wrong.py"
    snippet.write_text(
        "import bitnet_gpu as bg\n"
        "device: bg.Device = bg.default_device()\n"
        "name: int = device.info.name\n"  # a str
        "bg.Tensor.from_numpy(None, device, memory=3)\n"  # memory is a str
    )
    result = user_mypy(tmp_path, snippet)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        'wrong.py:3: error: Incompatible types in assignment (expression has type "str"'
        in result.stdout
    )
    assert "wrong.py:4: error: Argument" in result.stdout and '"memory"' in result.stdout


def test_a_user_script_passes_mypy_strict(tmp_path):
    """The public API is annotated and re-exported explicitly: a correct user script passes
    `mypy --strict` (no untyped calls, no implicit re-exports)."""
    pytest.importorskip("mypy")
    result = user_mypy(tmp_path, ROOT / "tests_py" / "typing" / "strict_example.py", "--strict")
    assert result.returncode == 0, result.stdout + result.stderr
