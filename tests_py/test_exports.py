"""The package's exports: __all__ names exactly what the package offers (each name there exists,
each public name the package holds is there), the submodules' __all__ likewise, and the library
does not import its test oracle (bitnet_gpu.reference) until asked for it."""

import importlib
import subprocess
import sys
import types

import pytest

import bitnet_gpu as bg

# Modules the package imports to build itself, not part of its surface (their names are theirs).
IMPLEMENTATION = {"checkpoint", "graph", "interop", "linear", "text"}
SUBMODULES = [
    "bitnet_gpu.ops",
    "bitnet_gpu.quantize",
    "bitnet_gpu.models",
    "bitnet_gpu.decoder_ops",
    "bitnet_gpu.linalg",
    "bitnet_gpu.nn",
    "bitnet_gpu.telemetry",
]


def _public(module):
    """The public names a module holds, less the modules it merely imported from elsewhere."""
    names = set()
    for name in dir(module):
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if isinstance(value, types.ModuleType) and not value.__name__.startswith("bitnet_gpu"):
            continue  # numpy, atexit, builtins, ...
        if getattr(value, "__module__", None) in ("__future__", "typing"):
            continue
        names.add(name)
    return names - {"annotations", "TYPE_CHECKING"}


def test_the_package_all_is_its_surface():
    assert len(bg.__all__) == len(set(bg.__all__)), "a name twice in bitnet_gpu.__all__"
    missing = [name for name in bg.__all__ if not hasattr(bg, name)]
    assert not missing, f"in __all__ but not in the package: {missing}"
    unlisted = _public(bg) - set(bg.__all__) - IMPLEMENTATION
    assert not unlisted, f"public names of bitnet_gpu missing from __all__: {sorted(unlisted)}"


@pytest.mark.parametrize("module", SUBMODULES)
def test_submodule_all_is_its_surface(module):
    m = importlib.import_module(module)
    assert len(m.__all__) == len(set(m.__all__))
    assert all(hasattr(m, name) for name in m.__all__)
    for name in m.__all__:
        value = getattr(m, name)
        assert not (isinstance(value, types.ModuleType) and "bitnet_gpu" not in value.__name__)


def test_the_library_does_not_import_its_oracle():
    code = (
        "import sys, numpy as np, bitnet_gpu as bg\n"
        "from bitnet_gpu.models import BitNetConfig, BitNetModel\n"
        "m = BitNetModel.random(BitNetConfig.preset('tiny'))\n"
        "m.generate(np.arange(3), 2, output_scores=True, return_dict_in_generate=True,"
        " temperature=0.5, top_p=0.9)\n"
        "assert 'bitnet_gpu.reference' not in sys.modules, 'imported'\n"
        "assert bg.reference.bitlinear is not None\n"
        "assert 'bitnet_gpu.reference' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_star_import_gives_every_name():
    scope: dict = {}
    exec("from bitnet_gpu import *", scope)
    assert set(bg.__all__) <= set(scope)
