"""The README runs as written: its runnable Python blocks (```python) in order in a fresh
interpreter on this device, with a small checkpoint written here where they name one; its API
listings (```python listing, over names they do not define) parse as Python."""

import ast
import pathlib
import subprocess
import sys

import pytest

from bitnet_gpu.models import BitNetConfig
from conftest import package_env
from hf_checkpoint import write_checkpoint

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
CHECKPOINT_NAMES = ("path/to/bitnet-b1.58-2B-4T", "path/to/checkpoint")


def blocks(kind):
    """The code of each README block whose fence reads ```<kind>, in order."""
    found, inside, wanted, lines = [], False, False, []
    for line in README.read_text().splitlines():
        if line.startswith("```") and not inside:
            inside, wanted, lines = True, line[3:].strip() == kind, []
        elif line.startswith("```"):
            inside = False
            if wanted:
                found.append("\n".join(lines))
        elif inside:
            lines.append(line)
    return found


def test_the_listings_parse_as_python():
    listings = blocks("python listing")
    assert len(listings) >= 8
    for code in listings:
        ast.parse(code)  # no pseudo-syntax such as a | b between strings


def test_the_runnable_blocks_run_in_a_fresh_interpreter(tmp_path):
    pytest.importorskip("tokenizers")
    pytest.importorskip("jinja2")
    folder = tmp_path / "checkpoint"
    write_checkpoint(folder, BitNetConfig.preset("tiny", vocab_size=360, tie_word_embeddings=True))
    code = "\n\n".join(blocks("python"))
    assert "import bitnet_gpu" in code
    for name in CHECKPOINT_NAMES:
        code = code.replace(name, str(folder))
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=package_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
