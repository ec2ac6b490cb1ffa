#version 450
//! variant f32
//! variant f64 FLOAT64
// One step of a blocked Cholesky, for the n x n diagonal block (n <= 32, view vd of matrix b) and
// the `rows` rows below it (view vp, the panel). Every workgroup factors the diagonal block in
// shared memory (its lower triangle read; cholesky_block.glsl), or with FACTORED reads it from diag
// (view vl), where the product before this step factored it (gemm.comp's FACTOR). Where a leading
// minor is not positive definite, workgroup 0 sets info[b] = first + its order, and all leave; a
// matrix whose info is already set is left alone. Workgroup 0 writes L to diag (view vl: the
// block's own home, not the matrix, which the other workgroups are still reading).
// Each workgroup takes TILE panel rows, read into shared memory a row at a time by consecutive
// invocations (requested before the block is factored) and written back the same way; invocation
// t solves row t, x L^T = p, by forward substitution, x_c = (p_c - sum_{q < c} l_cq x_q) / l_cc.
// (Each invocation reading and writing its own row straight from the matrix, a warp's every access
// spread over 32 rows, was slower: docs/PERFORMANCE.md.)
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "linalg_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool FACTORED = false;
layout(std430, binding = 0) writeonly buffer A { SCALAR a[]; };
layout(std430, binding = 1) buffer Diag { SCALAR diag[]; };
layout(std430, binding = 2) buffer Info { int info[]; };
// Where the block and the panel are read from: a's buffer, or a copy-free first step's input.
layout(std430, binding = 3) readonly buffer Source { SCALAR source[]; };
layout(push_constant) uniform Push { uint n; uint rows; uint first; View vd; View vp; View vl; } p;

const uint NB = 32, LD = 33;  // LD: shared row stride, one of skew against bank conflicts
// Panel rows a workgroup: 64 spreads a 4096-row panel over 64 workgroups (docs/PERFORMANCE.md).
const uint TILE = 64;
shared SCALAR s[NB * LD];
shared SCALAR s_panel[TILE * LD];
#include "cholesky_block.glsl"

void main() {
  const uint b = gl_WorkGroupID.y, t = gl_LocalInvocationID.x, n = p.n;
  const bool home = gl_WorkGroupID.x == 0;
  if (info[b] != 0) return;  // an earlier block of this matrix failed
  // Loops of a fixed count, unrolled, so that every load is in flight at once.
  [[unroll]] for (uint q = 0; q < NB * NB / 256; ++q) {
    const uint e = t + 256 * q, i = e / NB, j = e % NB;
    s[i * LD + j] = i >= n || j > i ? SCALAR(0)
                    : FACTORED     ? diag[at(p.vl, b, i, j)]
                                   : source[at(p.vd, b, i, j)];
  }
  const uint first = gl_WorkGroupID.x * TILE;
  [[unroll]] for (uint q = 0; q < TILE * NB / 256; ++q) {
    const uint e = t + 256 * q, r = e / NB, c = e % NB, row = first + r;
    s_panel[r * LD + c] = c < n && row < p.rows ? source[at(p.vp, b, row, c)] : SCALAR(0);
  }
  barrier();
  const uint failed = FACTORED ? 0 : factor_block(n);
  if (failed != 0) {  // the same in every invocation: the whole workgroup leaves
    if (home && t == 0) info[b] = int(p.first + failed);
    return;
  }
  if (home && !FACTORED)
    for (uint e = t; e < n * n; e += 256) {
      const uint i = e / n, j = e % n;
      diag[at(p.vl, b, i, j)] = j <= i ? s[i * LD + j] : SCALAR(0);
    }
  if (t < TILE) {
    SCALAR x[NB];
    [[unroll]] for (uint c = 0; c < NB; ++c) x[c] = s_panel[t * LD + c];
    [[unroll]] for (uint c = 0; c < NB; ++c) {
      if (c < n) {
        SCALAR sum = x[c];
        [[unroll]] for (uint q = 0; q < NB; ++q)
          if (q < c) sum -= s[c * LD + q] * x[q];
        x[c] = sum / s[c * LD + c];
      }
    }
    [[unroll]] for (uint c = 0; c < NB; ++c) s_panel[t * LD + c] = x[c];
  }
  barrier();
  [[unroll]] for (uint q = 0; q < TILE * NB / 256; ++q) {
    const uint e = t + 256 * q, r = e / NB, c = e % NB, row = first + r;
    if (c < n && row < p.rows) a[at(p.vp, b, row, c)] = s_panel[r * LD + c];
  }
}
