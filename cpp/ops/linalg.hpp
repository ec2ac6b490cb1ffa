#pragma once
#include <optional>

#include "runtime/tensor.hpp"

// Matrix decompositions on the GPU (shaders/linalg), float32 or float64 (where the device has
// shaderFloat64), over a batch of matrices [B, M, N] (row-major). Blocked: the work of large
// matrices is mostly in the matrix products of shaders/linalg/gemm.comp.
namespace bitnet::ops {

// L with L L^T = a for each symmetric positive definite matrix of a [B, N, N] (its lower triangle
// read), or L^T where upper; zeros in the other triangle. Up to 32 x 32: one pass a matrix
// (cholesky_small.comp). Larger: right-looking in blocks of 32 columns,
// two dispatches a block: the diagonal block factored in shared memory and the panel below it
// solved against it (potrf_trsm.comp), then the trailing lower triangle updated by one product
// (gemm.comp). LinAlgError after
// the run (or each replay of a graph) where a matrix is not positive definite, naming the first
// such matrix and the order of its first leading minor that is not.
Tensor cholesky(const Tensor& a, bool upper, const std::optional<Tensor>& out = {});

// Householder QR of each matrix of a [B, M, N]: (q, r) with q [B, M, K] and r [B, K, N], K = min(M,
// N) ("reduced"), K = M ("complete", q square), or r alone ("r": q is empty). Blocked in panels of
// 32 columns: each panel factored by one workgroup a matrix (geqr2.comp, which also writes the
// panel's reflectors V explicitly), their compact WY form I - V T V^T (T from V^T V by larft.comp)
// applied to the rest of the matrix, and to the identity for q, by matrix products. R's diagonal
// has LAPACK's signs (each reflector maps x to -sign(x_0) ||x|| e_1), as numpy.linalg.qr's.
struct QrResult {
  Tensor q, r;
};
QrResult qr(const Tensor& a, bool complete, bool want_q);

// x with a x = b for square a [B, N, N] and b [B, N, R], through a's QR: x = R^-1 Q^T b, Q^T b by
// the reflectors, then back substitution (trsv.comp). LinAlgError where a matrix is singular (a
// zero on R's diagonal), naming the first.
Tensor solve(const Tensor& a, const Tensor& b);

// Singular values and vectors of each matrix of a [B, M, N] (M, N > 0): s [B, K] descending (K =
// min(M, N)) and, with compute_uv, u [B, M, M or K] and vh [B, N or K, N] (full_matrices or not),
// a = u diag(s) vh. One-sided Jacobi over the K columns of a (or, for M < N, its rows): sweeps of
// K' - 1 rounds of disjoint plane rotations (jacobi.comp) until a sweep rotates nothing; the
// rotations accumulate into the one set of vectors, and the other set is the normalized columns
// completed to an orthonormal basis by a QR (which also gives zero singular values their
// vectors). LinAlgError if 40 sweeps do not converge. Up to K = 32 and max(M, N) = 64 every sweep
// runs in one dispatch (jacobi_small.comp), recordable in a Graph; beyond, each sweep is a
// submission the host checks, which a Graph cannot record (UnsupportedError).
struct SvdResult {
  Tensor u, s, vh;
};
SvdResult svd(const Tensor& a, bool full_matrices, bool compute_uv);

// Eigenvalues w [B, N] (ascending) and, with compute_v, eigenvectors v [B, N, N] (columns) of the
// symmetric matrices whose lower (with upper, upper) triangles a [B, N, N] holds: the Jacobi SVD
// of S + shift I, shift = max_i sum_j |s_ij| (positive semidefinite, so its singular vectors are
// S's eigenvectors; w = sigma - shift, accurate to about eps shift). In a Graph up to N = 32, as
// svd.
struct EighResult {
  Tensor w, v;
};
EighResult eigh(const Tensor& a, bool compute_v, bool upper);

}  // namespace bitnet::ops
