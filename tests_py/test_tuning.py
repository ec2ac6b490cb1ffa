"""The tuning knobs: one place that reads them, a Python API that sets them for a block, the
environment for whole processes, and docs/TUNING.md listing exactly what the code reads."""

import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import bitnet_gpu as bg
from conftest import package_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
VARIABLE = re.compile(r"BITNET_GPU_[A-Z0-9][A-Z0-9_]*")


def variables_read_by_the_library():
    """Every BITNET_GPU_* name written in the library's sources, and every knob's variable (built
    from its name in cpp/ops/tuning.cpp, so not a literal there)."""
    names = {knob.variable for knob in bg.tuning_knobs()}
    for folder, patterns in [("cpp", ("*.cpp", "*.hpp")), ("python/bitnet_gpu", ("*.py", "*.cpp"))]:
        for pattern in patterns:
            for path in (ROOT / folder).rglob(pattern):
                names |= set(VARIABLE.findall(path.read_text()))
    return names


def variables_documented():
    rows = [
        line
        for line in (ROOT / "docs/TUNING.md").read_text().splitlines()
        if line.startswith("| `")
    ]
    return {name for row in rows for name in VARIABLE.findall(row.split("|")[1])}


def test_docs_list_exactly_the_variables_the_code_reads():
    read, documented = variables_read_by_the_library(), variables_documented()
    assert read - documented == set(), "read by the code but not listed in docs/TUNING.md"
    assert documented - read == set(), "listed in docs/TUNING.md but read nowhere"


def test_every_knob_has_its_variable_and_values():
    knobs = bg.tuning_knobs()
    assert len({k.name for k in knobs}) == len(knobs) > 20
    for knob in knobs:
        assert knob.variable == "BITNET_GPU_" + knob.name.upper() and knob.values
    assert set(bg.get_tuning()) == {k.name for k in knobs}


def test_a_block_sets_knobs_and_restores_them_even_on_error():
    before = bg.get_tuning()
    assert before["matvec_rows"] is None
    with bg.tuning(matvec_rows=3, fused_matvec=False, coopmat_tile=(128, 64)) as inside:
        assert inside["matvec_rows"] == 3 and inside["fused_matvec"] is False
        assert inside["coopmat_tile"] == "128x64x64" and bg.get_tuning() == inside
        with bg.tuning(coopmat_tile=(16, 128, 256)) as few_rows:  # the rule's tile of 16 rows
            assert few_rows["coopmat_tile"] == "16x128x256"
        with bg.tuning(matvec_rows=None):  # None: the op's own rule again, for the inner block
            assert bg.get_tuning()["matvec_rows"] is None
        assert bg.get_tuning()["matvec_rows"] == 3
    assert bg.get_tuning() == before
    with pytest.raises(RuntimeError, match="inside"):
        with bg.tuning(verify_chunk=64):
            raise RuntimeError("inside")
    assert bg.get_tuning() == before


@pytest.mark.parametrize(
    "knobs,message",
    [
        ({"matvec_rows": 17}, "matvec_rows=17: expected 1 to 16"),
        ({"matvec_rows": True}, "matvec_rows=True"),
        ({"decode_split": 48}, "decode_split=48: expected 16, 32 or 64"),
        ({"fused_attention": 2}, "fused_attention=2: expected 0 or 1"),
        ({"coopmat_tile": "96x64"}, "coopmat_tile=96x64"),
        ({"coopmat_tile": 128}, "coopmat_tile=128"),
        ({"coopmat_tile": (16, 128, 128)}, "coopmat_tile=16x128x128"),
        ({"screen_rows": -1}, "screen_rows=-1"),
        ({"verify_chunk": "8"}, "verify_chunk='8'"),
    ],
)
def test_bad_values_raise_naming_the_knob_and_change_nothing(knobs, message):
    before = bg.get_tuning()
    with pytest.raises(bg.ArgumentError, match=re.escape(message)):
        with bg.tuning(matvec_unroll=2, **knobs):
            pass
    assert bg.get_tuning() == before


def test_an_unknown_knob_is_a_type_error():
    with pytest.raises(TypeError, match="matvec_rowz"):
        with bg.tuning(matvec_rowz=4):
            pass


def test_a_knob_changes_the_path_and_not_the_result(device, rng, tune):
    """fused_matvec=False puts the separate pre-pass in front of the matvec: two kernels instead of
    one, the same bits."""
    x = rng.standard_normal((1, 300)).astype(np.float32)
    w = bg.quantize_weights(rng.standard_normal((17, 300)).astype(np.float32))
    kernels = {}
    results = {}
    for fused in (True, False):
        tune(fused_matvec=fused)
        with bg.profile(device) as p:
            results[fused] = bg.bitlinear(x, w)
        kernels[fused] = [name for name, _ in p.timings if name.startswith("bitlinear")]
    assert len(kernels[True]) == 1 and len(kernels[False]) == 2
    np.testing.assert_array_equal(results[True], results[False])


def run_python(code, **env):
    return subprocess.run(
        [sys.executable, "-c", code],
        env=package_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_environment_sets_knobs_for_the_process():
    code = (
        "import bitnet_gpu as bg; t = bg.get_tuning(); print(t['matvec_rows'], "
        "t['coopmat_tile'], t['fused_matvec'])"
    )
    result = run_python(
        code,
        BITNET_GPU_MATVEC_ROWS="3",
        BITNET_GPU_COOPMAT_TILE="64x128",
        BITNET_GPU_FUSED_MATVEC="0",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "64x128x64", "False"]


def test_a_malformed_variable_raises_naming_it():
    code = """
import numpy as np, bitnet_gpu as bg
try:
    bg.bitlinear(np.ones((1, 8), np.float32), bg.quantize_weights(np.ones((2, 8), np.float32)))
except bg.ArgumentError as e:
    print(e)
"""
    result = run_python(code, BITNET_GPU_MATVEC_ROWS="4x")
    assert result.returncode == 0, result.stderr
    assert "BITNET_GPU_MATVEC_ROWS=4x: expected 1 to 16" in result.stdout
