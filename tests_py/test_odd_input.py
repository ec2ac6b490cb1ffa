"""The cases a demanding user's odd input once found, one reproducer each: a crash, an abort, an
unbounded allocation, a quietly different value or an exception outside the documented set. Each
now raises a bg.Error subclass (or the documented standard one) and leaves the device usable."""

import subprocess
import sys

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu.checkpoint import load_safetensors, save_safetensors
from conftest import package_env

CAPPED = """
import resource
import numpy as np, bitnet_gpu as bg
device = bg.default_device()
bg.relu(np.ones(4, np.float32))
usage = int(open("/proc/self/statm").read().split()[0]) * 4096
resource.setrlimit(resource.RLIMIT_AS, (usage + (768 << 20), resource.RLIM_INFINITY))
held = []
try:
    for size in [16 << 20] * 100 + [1 << 16] * 100000:
        held.append(device.empty((size // 4,), np.float32))
except (bg.OutOfMemory, MemoryError):
    pass
filler = []
try:
    while True:
        filler.append(bytearray(4096))
except MemoryError:
    pass
del held  # each release with no host memory left to pool its block
del filler
device.trim()
assert bg.relu(np.array([-1, 2], np.float32)).tolist() == [0, 2]
print("usable")
"""


def test_freeing_tensors_with_host_memory_exhausted_does_not_abort():
    """Releasing memory never allocates or throws: after an OutOfMemory in a capped process,
    with no host memory left, freeing the tensors once called std::terminate."""
    done = subprocess.run(
        [sys.executable, "-c", CAPPED],
        env=package_env(BITNET_GPU_VALIDATION="0"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and "usable" in done.stdout, done.stderr[-2000:]


def test_sizes_past_the_device_raise_before_allocating(device):
    with pytest.raises(bg.OutOfMemory, match="more than the device"):
        bg.KVCache(2**63, 4, 2, 16, device=device)
    with pytest.raises(bg.OutOfMemory, match="more than the device"):
        bg.KVCache(4, 2**40, 2, 16, device=device)
    with pytest.raises(bg.ShapeError, match="sequence of ints"):  # was pybind11's RuntimeError
        device.empty(2**63)
    cache = bg.KVCache(2, 8, 2, 16, device=device)
    with pytest.raises(IndexError, match="out of range"):  # documented, as a list's
        cache.append(2, np.zeros((1, 2, 16), np.float32), np.zeros((1, 2, 16), np.float32))


def test_arguments_of_the_wrong_type_raise_type_error(device, tmp_path):
    with pytest.raises(TypeError, match="out: expected a Tensor"):
        bg.linalg.cholesky(np.eye(3, dtype=np.float32), out="x")
    with pytest.raises(TypeError, match="out: expected a Tensor"):
        bg.linalg.solve(np.eye(3, dtype=np.float32), np.ones(3, np.float32), out=[1])
    with pytest.raises(TypeError, match="metadata"):
        save_safetensors(tmp_path / "a.safetensors", {}, "x")
    with pytest.raises(TypeError, match="tensors"):
        save_safetensors(tmp_path / "a.safetensors", [("a", np.ones(2))])
    with pytest.raises(TypeError, match="device"):
        bg.profile("x")
    with pytest.raises(bg.ArgumentError, match="interval"):
        bg.profile(interval=-1)
    with pytest.raises(bg.DTypeError, match="real numbers"):
        bg.nn.BitLinear(4, 3).bias = np.ones(3, np.complex64)


def test_safetensors_keep_0d_shapes_and_match_bfloat16_names_whole(tmp_path):
    path = tmp_path / "t.safetensors"
    arrays = {"a": np.float32(2.5), "layers.0.weight": np.ones(3, np.float32)}
    arrays["weight"] = np.ones(2, np.float32)
    save_safetensors(path, arrays, bfloat16="weight")  # one name, not a substring
    loaded = load_safetensors(path)
    assert loaded["a"].shape == () and float(loaded["a"]) == 2.5
    assert loaded["layers.0.weight"].dtype == np.float32  # not caught by "weight"
    assert loaded["weight"].dtype == np.float32 and loaded["weight"].tolist() == [1, 1]


def test_text_errors_are_bitnet_gpu_errors(tmp_path):
    pytest.importorskip("tokenizers")
    pytest.importorskip("jinja2")
    from bitnet_gpu.text import Tokenizer
    from hf_checkpoint import build_tokenizer

    build_tokenizer(tmp_path / "tokenizer.json")
    templates = {
        "{{ raise_exception('no system messages') }}": "no system messages",
        "{{ 1 / 0 }}": "ZeroDivisionError",
        "{{ messages[5]['content'] }}": "chat template",
    }
    for template, message in templates.items():
        tokenizer = Tokenizer(str(tmp_path / "tokenizer.json"), {"chat_template": template})
        with pytest.raises(bg.ArgumentError, match=message):
            tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    with pytest.raises(TypeError, match="list of"):
        tokenizer.apply_chat_template("hi")
    with pytest.raises(bg.ArgumentError, match="'content'"):
        tokenizer.apply_chat_template([{"role": "user"}])
    for bad in ([-1], [2**40], [tokenizer.vocab_size]):  # OverflowError from tokenizers before
        with pytest.raises(bg.ArgumentError, match="not a token id"):
            tokenizer.decode(bad)
    with pytest.raises(TypeError):
        tokenizer.decode("ab")
    assert tokenizer.decode(np.array(tokenizer.encode("fox"))) == "fox"
    assert "vocab_size=360" in repr(tokenizer)


def test_reprs_say_what_an_object_is(device):
    kernel = bg.builtin_kernel("axpy", device)
    assert repr(kernel).startswith("<bitnet_gpu.Kernel 'axpy' local_size=")
    with device.sequence() as sequence:
        assert "recording" in repr(sequence)
    assert "submitted" in repr(sequence)
    with bg.profile(device) as profile:
        bg.relu(np.ones(8, np.float32))
    assert repr(profile).startswith("<bitnet_gpu.Profile") and "ops=" in repr(profile)
