"""Every investigation script and the decoder's benchmarks (the model, the round trip, the
server) run at their smallest sizes (--tiny) on this device, so that none of them rots: each
must exit 0 and print its table."""

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


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_runs_at_its_smallest_sizes(script, tmp_path):
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, str(script), "--tiny", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=package_env(),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.strip(), "printed nothing"
    assert out.exists(), "wrote no JSON"
