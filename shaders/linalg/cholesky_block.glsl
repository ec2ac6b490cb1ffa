// The Cholesky factorization of an n x n block (n <= 32) held in shared memory: the includer
// declares `shared SCALAR s[32 * LD]` with the block's lower triangle at s[i * LD + j], and every
// invocation of a workgroup of 256 calls factor_block. Invocation t owns column t % 32 of rows
// t / 32 + 8 r (r < 4), so a step touches no element twice and reads no element another writes:
// for column j, with d = a_jj, every element below and right of it takes a_ik -= a_ij a_kj / d
// (the unscaled columns: l_ij l_kj = a_ij a_kj / d), one barrier a column instead of a scaling
// pass between two more. The columns are scaled at the end: l_ik = a_ik / sqrt(a_kk), l_kk =
// sqrt(a_kk). Returns 0, or j + 1 where d is not positive (or NaN): the order of the first leading
// minor that fails, the same in every invocation (s then holds no factor).
uint factor_block(uint n) {
  const uint t = gl_LocalInvocationIndex, k = t % 32, first_row = t / 32;
  for (uint j = 0; j < n; ++j) {
    if (k > j && k < n) {
      const SCALAR f = s[k * LD + j] / s[j * LD + j];
      [[unroll]] for (uint r = 0; r < 4; ++r) {
        const uint i = first_row + 8 * r;
        if (i >= k && i < n) s[i * LD + k] -= s[i * LD + j] * f;
      }
    }
    barrier();
  }
  // Each pivot stays on the diagonal once used: the first that is not positive is found after the
  // loop, which then needs no exit.
  for (uint j = 0; j < n; ++j)
    if (!(s[j * LD + j] > SCALAR(0))) return j + 1;
  SCALAR scaled[4];
  const SCALAR root = k < n ? sqrt(s[k * LD + k]) : SCALAR(1);
  [[unroll]] for (uint r = 0; r < 4; ++r) {
    const uint i = first_row + 8 * r;
    scaled[r] = i == k ? root : s[i * LD + k] / root;
  }
  barrier();  // every invocation has read its column's diagonal
  [[unroll]] for (uint r = 0; r < 4; ++r) {
    const uint i = first_row + 8 * r;
    if (k <= i && i < n) s[i * LD + k] = scaled[r];
  }
  barrier();
  return 0;
}
