"""`out=` on the quantization functions: NumPy's conventions (targets filled and returned, checked
before anything runs, untouched when the call raises) for NumPy arrays and Tensors."""

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import reference as ref


def poisoned(shape, dtype):
    a = np.empty(shape, dtype)
    a.view(np.uint8)[...] = 0xAB
    return a


def poisoned_tensor(shape, dtype):
    return bg.Tensor.from_numpy(poisoned(shape, dtype))


@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (3, 5, 4097), (2, 1028)])
def test_activations_into_numpy_arrays(device, rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    q_out, s_out = poisoned(shape, np.int8), poisoned(shape[:-1], np.float32)
    q, s = bg.quantize_activations(x, out=(q_out, s_out))
    assert q is q_out and s is s_out
    q_new, s_new = bg.quantize_activations(x)
    assert np.array_equal(q, q_new) and np.array_equal(s, s_new)
    rq, _ = ref.quantize_activations(x, scale=s)
    assert np.abs(q.astype(np.int32) - rq).max() <= 1


def test_asymmetric_activations_into_tensors(device, rng):
    x = rng.standard_normal((9, 130)).astype(np.float16)
    targets = (
        poisoned_tensor((9, 130), np.uint8),
        poisoned_tensor((9,), np.float32),
        poisoned_tensor((9,), np.uint8),
    )
    got = bg.quantize_activations(x, symmetric=False, out=targets)
    assert all(a is b for a, b in zip(got, targets))
    expected = bg.quantize_activations(x, symmetric=False)
    for t, e in zip(got, expected):
        assert np.array_equal(t.numpy(), e)


def test_none_in_out_allocates_that_result(device, rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    s_out = poisoned((4,), np.float32)
    q, s = bg.quantize_activations(x, out=(None, s_out))
    assert s is s_out and q.shape == (4, 8)
    assert np.array_equal(s, bg.quantize_activations(x)[1])


def test_dequantize_and_gradients_into_out(device, rng):
    x = rng.standard_normal((5, 17)).astype(np.float32)
    q, s = bg.quantize_activations(x)
    y_out = poisoned((5, 17), np.float32)
    y = bg.dequantize_activations(q, s, out=y_out)
    assert y is y_out and np.array_equal(y, bg.dequantize_activations(q, s))
    g_q, g_s = poisoned((5, 17), np.int8), poisoned((1,), np.float32)
    got_q, got_s = bg.quantize_gradients(x, out=(g_q, g_s), stochastic=True, seed=3)
    eq, es = bg.quantize_gradients(x, stochastic=True, seed=3)
    assert got_q is g_q and got_s is g_s and np.array_equal(g_q, eq) and g_s[0] == es
    t_q, t_s = poisoned_tensor((5, 17), np.int8), poisoned_tensor((1,), np.float32)
    got = bg.quantize_gradients(bg.Tensor.from_numpy(x), out=(t_q, t_s))
    assert got[0] is t_q and got[1] is t_s
    assert np.array_equal(t_q.numpy(), bg.quantize_gradients(x)[0])


@pytest.mark.parametrize("n,k", [(1, 1), (7, 33), (3, 4097)])
def test_packing_and_weights_into_out(device, rng, n, k):
    values = rng.integers(-1, 2, size=(n, k), dtype=np.int8)
    packed_out = poisoned((n, -(-k // 16) * 4), np.uint8)
    packed = bg.pack_ternary(values, out=packed_out)
    assert packed is packed_out and np.array_equal(packed, ref.pack_ternary(values))
    values_out = poisoned_tensor((n, k), np.int8)
    assert bg.unpack_ternary(packed, (n, k), out=values_out) is values_out
    assert np.array_equal(values_out.numpy(), values)
    w = bg.quantize_weights(rng.standard_normal((n, k)).astype(np.float32))
    unpacked_out, deq_out = poisoned((n, k), np.int8), poisoned((n, k), np.float32)
    assert w.unpack(out=unpacked_out) is unpacked_out
    assert bg.dequantize_weights(w, out=deq_out) is deq_out
    assert np.array_equal(unpacked_out, w.unpack())
    assert np.array_equal(deq_out, bg.dequantize_weights(w))


def bad_targets():
    shape = (4, 8)
    return [
        ((poisoned(shape, np.uint8), poisoned((4,), np.float32)), bg.DTypeError, "int8"),
        ((poisoned((4, 9), np.int8), poisoned((4,), np.float32)), bg.ShapeError, r"\(4, 8\)"),
        ((poisoned((8, 4), np.int8).T, poisoned((4,), np.float32)), ValueError, "C-contiguous"),
        ((poisoned(shape, np.int8),), ValueError, "expected 2 target"),
        ((poisoned(shape, np.int8), [0.0] * 4), TypeError, "list"),
        ((poisoned_tensor((4, 8), np.uint8), None), bg.DTypeError, "int8"),
        ((poisoned_tensor((2, 8), np.int8), None), bg.ShapeError, r"\(4, 8\)"),
    ]


@pytest.mark.parametrize("case", range(len(bad_targets())))
def test_bad_out_raises_before_running_and_leaves_targets_alone(device, rng, case):
    out, error, match = bad_targets()[case]
    snapshots = [np.array(t) for t in out if isinstance(t, (np.ndarray, bg.Tensor))]
    with pytest.raises(error, match=match):
        bg.quantize_activations(rng.standard_normal((4, 8)).astype(np.float32), out=out)
    after = [np.array(t) for t in out if isinstance(t, (np.ndarray, bg.Tensor))]
    assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(snapshots, after))
    q, s = bg.quantize_activations(np.ones((2, 3), np.float32))  # the device is still usable
    assert q.tolist() == [[127] * 3] * 2


def test_read_only_and_overlapping_targets(device):
    x = np.ones((4, 8), np.float32)
    q = poisoned((4, 8), np.int8)
    q.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        bg.quantize_activations(x, out=(q, None))
    buffer = poisoned((64,), np.uint8)
    with pytest.raises(ValueError, match="overlap"):
        bg.quantize_activations(
            x, symmetric=False, out=(buffer[:32].reshape(4, 8), None, buffer[28:32])
        )


def test_numpy_target_untouched_when_input_holds_nan(device):
    x = np.ones((3, 5), np.float32)
    x[1, 2] = np.nan
    q_out, s_out = poisoned((3, 5), np.int8), poisoned((3,), np.float32)
    with pytest.raises(ValueError, match="1 NaN or Inf"):
        bg.quantize_activations(x, out=(q_out, s_out))
    assert (q_out.view(np.uint8) == 0xAB).all() and (s_out.view(np.uint8) == 0xAB).all()


def test_out_on_symmetric_call_rejects_a_zero_point(device):
    with pytest.raises(ValueError, match="expected 2 target"):
        bg.quantize_activations(np.ones((2, 2), np.float32), out=(None, None, None))
