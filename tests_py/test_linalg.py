"""bitnet_gpu.linalg against numpy.linalg in float64, as docs/NUMERICS.md states the bounds:
reconstructions ||A - QR||, ||A - U S Vh||, ||A - L L^T|| relative to ||A||, and the
orthonormality of Q, U, V, within C n eps (C = 20, n the larger dimension, eps the dtype's), on
fresh random matrices of awkward sizes, ill-conditioned and rank-deficient ones and repeated
singular values; then the exceptions numpy.linalg raises, and inputs left untouched."""

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import linalg
from conftest import rel

C = 20
DTYPES = [np.float32, np.float64]
SIZES = [(1, 1), (7, 7), (33, 17), (17, 33), (64, 64), (257, 257)]


def eps(dtype):
    return float(np.finfo(dtype).eps)


def bound(dtype, *dims):
    return C * max(dims) * eps(dtype)


def orthonormal_error(q):
    """max |Q^T Q - I| over a batch [..., M, K]."""
    q = np.asarray(q, np.float64)
    return np.abs(np.swapaxes(q, -1, -2) @ q - np.eye(q.shape[-1])).max()


def spd(rng, shape, dtype, condition=None):
    """Symmetric positive definite matrices [..., n, n], with the given condition number."""
    n = shape[-1]
    q, _ = np.linalg.qr(rng.standard_normal(shape))
    if condition is None:
        values = rng.uniform(1, 10, shape[:-1])
    else:
        values = np.broadcast_to(np.logspace(0, -np.log10(condition), n), shape[:-1])
    return ((q * values[..., None, :]) @ np.swapaxes(q, -1, -2)).astype(dtype)


def with_singular_values(rng, m, n, values, dtype):
    u, _ = np.linalg.qr(rng.standard_normal((m, m)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    k = min(m, n)
    return ((u[:, :k] * np.asarray(values, np.float64)) @ v[:, :k].T).astype(dtype)


@pytest.fixture(autouse=True)
def float64_device(device):
    if not device.info.features["float64"]:
        pytest.skip("float64 needs shaderFloat64")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 31, 33, 100, 257])
def test_cholesky(rng, dtype, n):
    a = spd(rng, (2, n, n), dtype)
    before = a.copy()
    lower = linalg.cholesky(a)
    assert lower.dtype == dtype and lower.shape == a.shape
    np.testing.assert_array_equal(a, before)  # the input is not touched
    assert (np.triu(lower, 1) == 0).all() and (np.diagonal(lower, axis1=1, axis2=2) > 0).all()
    assert rel(lower @ np.swapaxes(lower, -1, -2), a) <= bound(dtype, n)
    assert rel(lower, np.linalg.cholesky(a.astype(np.float64))) <= 10 * bound(dtype, n)
    upper = linalg.cholesky(a, upper=True)
    np.testing.assert_array_equal(upper, np.swapaxes(lower, -1, -2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n,order",
    # blocks factored by the panel step itself (1, 32), by the product before it (33, 64 by the
    # second block's update, 65 and 129 by the trailing one), and within them (70, 97, 13)
    [
        (100, 1),
        (100, 32),
        (100, 33),
        (100, 64),
        (100, 65),
        (100, 70),
        (130, 97),
        (130, 129),
        (20, 13),
    ],
)
def test_cholesky_names_the_first_failing_minor(rng, dtype, n, order):
    a = spd(rng, (2, n, n), dtype)
    a[1, order - 1, order - 1] = -1e3  # minors up to order - 1 stay positive definite
    with pytest.raises(bg.LinAlgError, match=f"matrix 1 of the batch, order {order}"):
        linalg.cholesky(a)
    assert rel(linalg.cholesky(a[:1]), np.linalg.cholesky(a[:1].astype(np.float64))) <= 10 * bound(
        dtype, n
    )


@pytest.mark.parametrize("dtype,condition", [(np.float32, 1e6), (np.float64, 1e12)])
def test_ill_conditioned_cholesky(rng, dtype, condition):
    a = spd(rng, (65, 65), dtype, condition)
    lower = linalg.cholesky(a)
    assert rel(lower @ lower.T, a) <= bound(dtype, 65)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n", SIZES)
@pytest.mark.parametrize("mode", ["reduced", "complete"])
def test_qr(rng, dtype, m, n, mode):
    a = rng.standard_normal((2, m, n)).astype(dtype)
    q, r = linalg.qr(a, mode)
    k = min(m, n) if mode == "reduced" else m
    assert q.shape == (2, m, k) and r.shape == (2, k, n) and q.dtype == dtype
    assert (np.tril(r, -1) == 0).all()
    assert rel(q @ r, a) <= bound(dtype, m, n)
    assert orthonormal_error(q) <= bound(dtype, m, n)
    # LAPACK's signs: R's diagonal as numpy's (where it is not near zero)
    expected = np.linalg.qr(a.astype(np.float64), mode="r")
    diagonal = np.diagonal(r, axis1=1, axis2=2)[:, : min(m, n)]
    want = np.diagonal(expected, axis1=1, axis2=2)
    assert rel(np.abs(diagonal), np.abs(want)) <= 10 * bound(dtype, m, n)
    clear = np.abs(want) > 1e-3
    np.testing.assert_array_equal(np.sign(diagonal[clear]), np.sign(want[clear]))
    np.testing.assert_array_equal(linalg.qr(a, "r"), r[:, : min(m, n)] if mode == "complete" else r)


@pytest.mark.parametrize("m,n", [(257, 257), (1000, 300)])
def test_big_svds(rng, m, n):
    _check_svd(rng.standard_normal((m, n)), np.float64, full_matrices=False)


def test_a_tall_qr(rng):
    a = rng.standard_normal((1000, 300))
    q, r = linalg.qr(a)
    assert rel(q @ r, a) <= bound(np.float64, 1000) and orthonormal_error(q) <= bound(
        np.float64, 1000
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_batch_of_tall_qrs(rng, dtype):
    """Panels of 128 rows or more are factored a column a dispatch over many workgroups, and the
    products with V^T split their long K: both across a batch."""
    a = rng.standard_normal((3, 700, 50)).astype(dtype)
    q, r = linalg.qr(a)
    assert rel(q @ r, a) <= bound(dtype, 700) and orthonormal_error(q) <= bound(dtype, 700)
    expected = np.abs(np.diagonal(np.linalg.qr(a.astype(np.float64), mode="r"), axis1=1, axis2=2))
    assert rel(np.abs(np.diagonal(r, axis1=1, axis2=2)), expected) <= 10 * bound(dtype, 700)
    np.testing.assert_array_equal(linalg.qr(a, "r"), r)


@pytest.mark.parametrize(
    "dtype,values",
    [
        (np.float32, np.logspace(0, -6, 40)),  # condition 1e6
        (np.float64, np.logspace(0, -12, 40)),  # condition 1e12
        (np.float64, [4, 4, 4, 1] + [0] * 36),  # repeated, and rank 4 of 40
    ],
)
def test_tall_qr_of_hard_matrices(rng, dtype, values):
    a = with_singular_values(rng, 300, 40, values, dtype)
    a[:, 7] = 0  # a zero column: no reflection (tau = 0)
    q, r = linalg.qr(a)
    assert rel(q @ r, a) <= bound(dtype, 300) and orthonormal_error(q) <= bound(dtype, 300)
    assert (np.tril(r, -1) == 0).all()


def _check_svd(a, dtype, full_matrices=True):
    m, n = a.shape[-2:]
    k = min(m, n)
    u, s, vh = linalg.svd(a, full_matrices=full_matrices)
    assert u.shape[-2:] == (m, m if full_matrices else k)
    assert vh.shape[-2:] == (n if full_matrices else k, n) and s.shape[-1] == k
    assert (np.diff(s, axis=-1) <= 0).all()  # descending
    expected = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    largest = expected[..., :1]
    assert (np.abs(s - expected) <= bound(dtype, m, n) * largest).all()
    restored = (u[..., :k] * s[..., None, :]) @ vh[..., :k, :]
    assert rel(restored, a) <= bound(dtype, m, n)
    assert orthonormal_error(u) <= bound(dtype, m, n)
    assert orthonormal_error(np.swapaxes(vh, -1, -2)) <= bound(dtype, m, n)
    np.testing.assert_array_equal(linalg.svd(a, compute_uv=False), s)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n", SIZES[:-1] + [(100, 70)])
@pytest.mark.parametrize("full_matrices", [True, False])
def test_svd(rng, dtype, m, n, full_matrices):
    _check_svd(rng.standard_normal((2, m, n)).astype(dtype), dtype, full_matrices)


@pytest.mark.parametrize(
    "dtype,values",
    [
        (np.float32, np.logspace(0, -6, 20)),  # condition 1e6
        (np.float64, np.logspace(0, -12, 20)),  # condition 1e12
        (np.float64, [5, 5, 5, 2, 2, 1] + [0] * 14),  # repeated, and rank 6 of 20
        (np.float32, [3] * 20),  # all equal
    ],
)
def test_svd_of_hard_matrices(rng, dtype, values):
    _check_svd(with_singular_values(rng, 30, 20, values, dtype), dtype)
    _check_svd(with_singular_values(rng, 20, 30, values, dtype).copy(), dtype)


def test_a_batch_of_small_matrices(rng):
    """1000 3 x 3 matrices: each decomposition against numpy's."""
    a = rng.standard_normal((1000, 3, 3))
    _check_svd(a, np.float64)
    sym = spd(rng, (1000, 3, 3), np.float64)
    assert rel(linalg.cholesky(sym), np.linalg.cholesky(sym)) <= bound(np.float64, 3)
    w, v = linalg.eigh(sym)
    assert rel(w, np.linalg.eigvalsh(sym)) <= bound(np.float64, 3)
    q, r = linalg.qr(a)
    assert rel(q @ r, a) <= bound(np.float64, 3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [5, 8, 13])
def test_batches_of_small_matrices_share_workgroups(rng, dtype, n):
    """Up to 16 small matrices a workgroup, a batch that does not fill the last one: each matrix
    its own values and vectors."""
    x = rng.standard_normal((37, n, n))
    a = (x + np.swapaxes(x, -1, -2)).astype(dtype)
    w, v = linalg.eigh(a)
    expected = np.linalg.eigvalsh(a.astype(np.float64))
    assert np.abs(w - expected).max() <= bound(dtype, n) * n * np.abs(a).max()
    assert orthonormal_error(v) <= bound(dtype, n)
    _check_svd(x.astype(dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 5, 32, 60])
def test_eigh(rng, dtype, n):
    x = rng.standard_normal((2, n, n))
    a = (x + np.swapaxes(x, -1, -2)).astype(dtype)
    w, v = linalg.eigh(a)
    expected = np.linalg.eigvalsh(a.astype(np.float64))
    scale = np.abs(expected).max()
    # lambda = sigma - shift: accurate to eps shift, shift <= n max |a|
    assert np.abs(w - expected).max() <= bound(dtype, n) * n * np.abs(a).max()
    assert (np.diff(w, axis=-1) >= 0).all()
    assert orthonormal_error(v) <= bound(dtype, n)
    restored = (v * w[..., None, :]) @ np.swapaxes(v, -1, -2)
    assert np.abs(restored - a).max() <= bound(dtype, n) * n * scale
    np.testing.assert_array_equal(linalg.eigvalsh(a), w)
    lower_only = np.tril(a) + np.triu(rng.standard_normal((n, n)), 1).astype(dtype)  # UPLO="L"
    np.testing.assert_array_equal(linalg.eigh(lower_only).eigenvalues, w)
    upper_only = np.swapaxes(lower_only, -1, -2)
    np.testing.assert_array_equal(linalg.eigh(upper_only, UPLO="U").eigenvalues, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,rhs", [(1, 1), (9, 3), (40, 1), (130, 5)])
def test_solve(rng, dtype, n, rhs):
    a = (rng.standard_normal((3, n, n)) + n * np.eye(n)).astype(dtype)
    b = rng.standard_normal((3, n, rhs)).astype(dtype)
    x = linalg.solve(a, b)
    assert x.shape == b.shape and x.dtype == dtype
    assert rel(a.astype(np.float64) @ x, b) <= bound(dtype, n) * 10
    vector = linalg.solve(a[0], b[0, :, 0])  # a 1-D b is one vector
    assert vector.shape == (n,)
    assert rel(vector, np.linalg.solve(a[0].astype(np.float64), b[0, :, 0])) <= bound(dtype, n) * 10
    broadcast = linalg.solve(a, b[0])  # b's batch dimensions broadcast against a's
    assert rel(broadcast, np.linalg.solve(a.astype(np.float64), b[0])) <= bound(dtype, n) * 10


def test_tensors_in_and_out(rng):
    a = spd(rng, (4, 6, 6), np.float32)
    t = bg.Tensor.from_numpy(a)
    lower = linalg.cholesky(t)
    assert isinstance(lower, bg.Tensor) and lower.shape == (4, 6, 6)
    np.testing.assert_array_equal(lower.numpy(), linalg.cholesky(a))
    out = bg.Tensor.from_numpy(np.full((4, 6, 6), np.nan, np.float32))
    assert linalg.cholesky(t, out=out) is out
    np.testing.assert_array_equal(out.numpy(), lower.numpy())
    q, r = linalg.qr(t)
    assert isinstance(q, bg.Tensor) and isinstance(linalg.svd(t).S, bg.Tensor)
    x = linalg.solve(t, bg.Tensor.from_numpy(np.ones((4, 6, 1), np.float32)))
    assert isinstance(x, bg.Tensor) and x.shape == (4, 6, 1)


@pytest.mark.parametrize("n", [40, 150])  # 150: QR panels a column a dispatch
def test_cholesky_and_solve_record_in_a_graph(rng, n):
    a = spd(rng, (2, n, n), np.float32)
    graph = bg.Graph()
    with graph:
        given = graph.input("a", a.shape, np.float32)
        graph.output("l", linalg.cholesky(given))
        graph.output("x", linalg.solve(given, bg.Tensor.from_numpy(np.ones((2, n, 2), np.float32))))
    for _ in range(2):
        a = spd(rng, (2, n, n), np.float32)
        result = graph.run(a=a, numpy=True)
        assert rel(result["l"], np.linalg.cholesky(a.astype(np.float64))) <= 10 * bound(
            np.float32, n
        )
        assert (
            rel(a.astype(np.float64) @ result["x"], np.ones((2, n, 2)))
            <= 10 * bound(np.float32, n) * np.linalg.cond(a.astype(np.float64)).max()
        )
    with pytest.raises(linalg.LinAlgError, match="matrix 1 of the batch, order 3"):
        bad = a.copy()
        bad[1, 2, 2] = -100
        graph.run(a=bad)


# (svd shape, eigh order): every sweep in one dispatch (up to 32 x 64), or a dispatch a round,
# with all the sweeps recorded.
@pytest.mark.parametrize("svd_shape,order", [((5, 20, 30), 16), ((2, 37, 70), 33)])
def test_svd_and_eigh_record_in_a_graph(rng, svd_shape, order):
    """A Graph records svd and eigh, and each replay decomposes the matrices it is given (past
    32 x 64 with every Jacobi sweep recorded, the converged matrices skipping theirs)."""
    graph = bg.Graph()
    batch, k = svd_shape[0], min(svd_shape[1:])
    with graph:
        u, s, vh = linalg.svd(graph.input("a", svd_shape, np.float32), full_matrices=False)
        w, v = linalg.eigh(graph.input("sym", (batch, order, order), np.float32), UPLO="U")
        for name, result in dict(u=u, s=s, vh=vh, w=w, v=v).items():
            graph.output(name, result)
    for _ in range(2):
        a = rng.standard_normal(svd_shape).astype(np.float32)
        x = rng.standard_normal((batch, order, order))
        upper = np.triu(x + np.swapaxes(x, -1, -2))
        sym = (upper + np.tril(rng.standard_normal((order, order)), -1)).astype(np.float32)
        result = graph.run(a=a, sym=sym, numpy=True)
        expected_s = np.linalg.svd(a.astype(np.float64), compute_uv=False)
        assert rel(result["s"], expected_s) <= bound(np.float32, max(svd_shape[1:]))
        assert rel((result["u"] * result["s"][..., None, :]) @ result["vh"], a) <= bound(
            np.float32, max(svd_shape[1:])
        )
        assert orthonormal_error(result["u"]) <= bound(np.float32, k)
        expected_w = np.linalg.eigvalsh(sym.astype(np.float64), UPLO="U")
        assert (
            np.abs(result["w"] - expected_w).max()
            <= bound(np.float32, order) * order * np.abs(upper).max()
        )
        assert orthonormal_error(result["v"]) <= bound(np.float32, order)


def test_errors_as_numpy_raises_them(rng, device):
    a = spd(rng, (3, 5, 5), np.float64)
    bad = a.copy()
    bad[2, 3, 3] = -1e3  # the leading minor of order 4 of matrix 2 is not positive
    with pytest.raises(np.linalg.LinAlgError, match="matrix 2 of the batch, order 4"):
        linalg.cholesky(bad)
    assert issubclass(bg.LinAlgError, bg.Error) and issubclass(
        bg.LinAlgError, np.linalg.LinAlgError
    )
    singular = np.ones((4, 4))
    with pytest.raises(bg.LinAlgError, match="Singular matrix"):
        linalg.solve(singular, np.ones(4))
    with pytest.raises(bg.LinAlgError, match="square"):
        linalg.cholesky(np.ones((3, 4)))
    with pytest.raises(bg.LinAlgError, match="two-dimensional"):
        linalg.qr(np.ones(3))
    with pytest.raises(bg.LinAlgError, match="two-dimensional"):
        linalg.svd(np.float64(3))
    for kind in (np.int32, np.complex64, np.float16):
        with pytest.raises(bg.DTypeError):
            linalg.qr(np.ones((3, 3), kind))
    with pytest.raises(bg.ShapeError, match="empty"):
        linalg.svd(np.ones((0, 3)))
    for value in (np.nan, np.inf):
        broken = a.copy()
        broken[0, 1, 1] = value
        with pytest.raises(bg.ArgumentError, match="NaN or Inf"):
            linalg.eigh(broken)
    with pytest.raises(bg.ArgumentError, match="mode"):
        linalg.qr(a, mode="economic")
    with pytest.raises(bg.ShapeError, match="do not fit"):
        linalg.solve(a, np.ones((3, 4, 1)))
    # the device works after every one of them
    assert rel(linalg.cholesky(a), np.linalg.cholesky(a)) <= bound(np.float64, 5)
