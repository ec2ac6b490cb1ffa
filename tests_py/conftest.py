import contextlib
import os
import secrets

# Every test runs under the Khronos validation layer (synchronization validation on) unless the
# caller says otherwise; tests do not read or write the user's pipeline cache.
os.environ.setdefault("BITNET_GPU_VALIDATION", "1")
os.environ.setdefault("BITNET_GPU_CACHE_DIR", "")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import bitnet_gpu as bg  # noqa: E402
from bitnet_gpu import _core  # noqa: E402
from bitnet_gpu import reference as ref  # noqa: E402


@pytest.fixture(autouse=True)
def no_validation_messages():
    """A validation-layer message during a test fails that test."""
    _core.validation_messages()
    yield
    messages = _core.validation_messages()
    assert not messages, "Vulkan validation messages:\n" + "\n".join(messages)


@pytest.fixture
def tune():
    """tune(knob=value, ...) sets tuning knobs for the rest of the test through bg.tuning (tests
    never set them through the environment); the settings before the test come back after it."""
    with contextlib.ExitStack() as stack:
        yield lambda **knobs: stack.enter_context(bg.tuning(**knobs))


@pytest.fixture
def unmapped_device(monkeypatch):
    """A device whose 'device' placement is not mapped: the path discrete GPUs without
    resizable BAR take, reproduced on devices whose memory is all host-visible."""
    monkeypatch.setenv("BITNET_GPU_DEBUG_UNMAPPED_DEVICE_MEMORY", "1")
    device = bg.Device()
    monkeypatch.delenv("BITNET_GPU_DEBUG_UNMAPPED_DEVICE_MEMORY")
    return device


@pytest.fixture(scope="session")
def device():
    return bg.default_device()


@pytest.fixture
def rng():
    """Fresh random inputs on every run; the seed is printed so a failure can be replayed."""
    seed = int(os.environ.get("BITNET_GPU_TEST_SEED", secrets.randbits(64)))
    print(f"BITNET_GPU_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def random_array(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


ALL_DTYPES = [np.float32, np.float16, np.int8, np.uint8, np.int32, np.uint32, np.float64]
AWKWARD_SHAPES = [(1,), (7,), (33,), (4097,), (3, 5), (2, 3, 7), (), (0,), (4, 0, 3)]


def rel(a, b):
    """||a - b|| / ||b|| in float64: the parity tests' relative error."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def check_draws(logits, drawn, temperature, top_k, seed, step, top_p=None, first_row=0):
    """drawn is reference.sample_rows's draw, row for row, except where the reference's best two
    kept scores lie within float32 rounding of each other (the kernel's scores are float32, its
    logs within a few ulps: 1e-6 relative plus 4e-5 min(t, 1)) or, with top_p, where the nucleus
    rule lies within reference.NUCLEUS_MARGIN of keeping a value more or fewer; a drawn index is
    always a kept one. Returns how many rows differed."""
    from bitnet_gpu import reference

    differences = reference.sampling_differences(
        logits, drawn, temperature, top_k, seed, step, top_p, first_row
    )
    for m, got, want, kept, best, gap in differences:
        assert kept, f"row {m}: drew {got}, not a kept index"
        slack = 1e-6 * (1 + abs(best)) + 4e-5 * min(float(np.float32(temperature)), 1.0)
        assert gap <= slack, (
            f"row {m}: drew {got} instead of {want}, its score {gap!r} below the best ({best!r})"
        )
    return len(differences)


def device_tensor(a):
    """A Tensor holding a copy of the array (made contiguous)."""
    return bg.Tensor.from_numpy(np.ascontiguousarray(a))


def poisoned(shape, dtype):
    """A Tensor of NaN (floats) or -7 (integers): an output a kernel must overwrite."""
    return device_tensor(np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -7, dtype))


TIE_WINDOW = ref.TIE_WINDOW


def check_logits(logits, expected, ties):
    """Each sequence's logits against bitnet_forward's (reference.logits_agreement): 1e-4 over
    the tokens before its first near tie, 5e-2 over all. Returns how many sequences had a strictly
    checked prefix."""
    strict = 0
    for b in range(expected.shape[0]):
        clean, error, whole = ref.logits_agreement(logits[b], expected[b], ties[b])
        if clean > 0:
            assert error <= 1e-4, (
                f"sequence {b}: relative error {error:.2e} over its {clean} tokens before a near "
                f"tie"
            )
            strict += 1
        assert whole <= 5e-2, f"sequence {b}: relative error {whole:.2e}"
    return strict


def package_env(**variables):
    """os.environ with `variables`, and PYTHONPATH leading to this very build of bitnet_gpu, for a
    test's subprocess."""
    root = os.path.dirname(os.path.dirname(bg.__file__))
    return dict(
        os.environ,
        **variables,
        PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
    )
