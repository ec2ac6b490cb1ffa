"""Every investigation script and the decoder's benchmarks (the model, the round trip, the
server) run at their smallest sizes (--tiny) on this device, so that none of them rots: each
must exit 0 and print its table."""

import json
import pathlib
import subprocess
import sys

import pytest

from conftest import package_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks" / "investigations").glob("*.py")) + [
    ROOT / "benchmarks" / "bench_model.py",
    ROOT / "benchmarks" / "bench_roundtrip.py",
    ROOT / "benchmarks" / "bench_serve.py",
]


def run_script(script, *arguments):
    """The script's run at its smallest sizes with `arguments`, checked to exit 0."""
    done = subprocess.run(
        [sys.executable, str(script), "--tiny", *arguments],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=package_env(),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_runs_at_its_smallest_sizes(script, tmp_path):
    out = tmp_path / "results.json"
    done = run_script(script, "--json", str(out))
    assert done.stdout.strip(), "printed nothing"
    assert out.exists(), "wrote no JSON"


def test_builds_run_under_their_knobs(tmp_path):
    """builds.py gives each build's process the knobs named after its folder."""
    out = tmp_path / "builds.json"
    script = ROOT / "benchmarks" / "investigations" / "builds.py"
    run_script(
        script, "--json", str(out), "--builds", "plain=,split=@coopmat_splits=2@matvec_rows=4"
    )
    rows = {row["build"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["plain"]["knobs"] == {}
    assert rows["split"]["knobs"] == {"coopmat_splits": 2, "matvec_rows": 4}
