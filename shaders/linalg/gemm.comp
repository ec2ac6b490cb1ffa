#version 450
//! variant f32
//! variant f64 FLOAT64
//! variant f32_factor FACTOR
//! variant f64_factor FLOAT64 FACTOR
// C = beta C + alpha A B for matrices A [M, K], B [K, N] and C [M, N] given as strided views
// (linalg_common.glsl), beta C read from c_in (C's buffer, or another of the same layout). A
// workgroup of 16 x 16 invocations takes a TILE x TILE tile of C, each invocation PER x PER of
// it, K in steps of 16 through shared memory. gl_WorkGroupID.z is batch * splits + split: with
// splits > 1 (a long K and few tiles), split s sums K from s * k_chunk only and writes its partial
// C (alpha 1, beta 0) at vc's offset + s * split_stride, for sum_splits.comp to add up. LOWER:
// only tiles that reach C's lower triangle (row >= column) are computed, and only its lower
// triangle is written (the trailing update of a blocked Cholesky).
// FACTOR (with LOWER): the workgroup of tile (0, 0) then factors the updated diagonal block of
// order fn <= 32 at C's corner (cholesky_block.glsl) into diag (view vl), or sets info[b] = first +
// the order of the first failing minor, so that the next potrf_trsm.comp step finds it factored:
// the block is factored while the other tiles are still being computed.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "linalg_common.glsl"
layout(local_size_x = 16, local_size_y = 16) in;
layout(constant_id = 0) const bool LOWER = false;
layout(std430, binding = 0) readonly buffer A { SCALAR a[]; };
layout(std430, binding = 1) readonly buffer B { SCALAR b[]; };
layout(std430, binding = 2) buffer C { SCALAR c[]; };
// Where beta C is read from: C itself, or a Cholesky's input in its first step (which then needs
// no copy of it).
layout(std430, binding = 3) readonly buffer CIn { SCALAR c_in[]; };
layout(push_constant) uniform Push {
  uint m; uint n; uint k; float alpha; float beta; View va; View vb; View vc;
  uint splits; uint k_chunk; uint split_stride;
#ifdef FACTOR
  uint fn; uint first; View vl;
#endif
} p;

const uint TILE = 64, PER = TILE / 16;
shared SCALAR s_a[16][TILE + 1];
shared SCALAR s_b[16][TILE + 1];

#ifdef FACTOR
layout(std430, binding = 4) writeonly buffer Diag { SCALAR diag[]; };
layout(std430, binding = 5) buffer Info { int info[]; };
const uint LD = 33;
shared SCALAR s[32 * LD];
#include "cholesky_block.glsl"

void factor_corner(uint b) {
  memoryBarrierBuffer();
  barrier();  // the tile's values written
  if (info[b] != 0) return;  // an earlier block of this matrix failed
  const uint t = gl_LocalInvocationIndex, n = p.fn;
  [[unroll]] for (uint q = 0; q < 4; ++q) {
    const uint e = t + 256 * q, i = e / 32, j = e % 32;
    s[i * LD + j] = i < n && j <= i ? c[at(p.vc, b, i, j)] : SCALAR(0);
  }
  barrier();
  const uint failed = factor_block(n);
  if (failed != 0) {
    if (t == 0) info[b] = int(p.first + failed);
    return;
  }
  for (uint e = t; e < n * n; e += 256) {
    const uint i = e / n, j = e % n;
    diag[at(p.vl, b, i, j)] = j <= i ? s[i * LD + j] : SCALAR(0);
  }
}
#endif

void fetch(uint k0, uint k_end, uint row0, uint col0, uint batch, uint thread, out SCALAR xa[PER],
           out SCALAR xb[PER]) {
  [[unroll]] for (uint t = 0; t < PER; ++t) {
    const uint e = thread + 256 * t;
    const bool a_along_k = p.va.cols == 1;
    const uint ar = a_along_k ? e / 16 : e % TILE, ak = a_along_k ? e % 16 : e / TILE;
    const uint row = row0 + ar, kk = k0 + ak;
    xa[t] = row < p.m && kk < k_end ? a[at(p.va, batch, row, kk)] : SCALAR(0);
    const bool b_along_k = p.vb.rows == 1 && p.vb.cols != 1;
    const uint bk = b_along_k ? e % 16 : e / TILE, bc = b_along_k ? e / 16 : e % TILE;
    const uint col = col0 + bc, kb = k0 + bk;
    xb[t] = col < p.n && kb < k_end ? b[at(p.vb, batch, kb, col)] : SCALAR(0);
  }
}

void main() {
  const uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
  const uint batch = gl_WorkGroupID.z / p.splits, split = gl_WorkGroupID.z % p.splits;
  const uint k_first = split * p.k_chunk, k_end = min(p.k, k_first + p.k_chunk);
  const uint row0 = gl_WorkGroupID.y * TILE, col0 = gl_WorkGroupID.x * TILE;
  if (LOWER && col0 > row0 + TILE - 1) return;  // the whole tile lies above the diagonal
  const uint thread = ty * 16 + tx;
  SCALAR acc[PER][PER];
  [[unroll]] for (uint i = 0; i < PER; ++i) [[unroll]] for (uint j = 0; j < PER; ++j) acc[i][j] = 0;
  const SCALAR alpha = SCALAR(p.alpha), beta = SCALAR(p.beta);
  // TILE x 16 of A and 16 x TILE of B a step, PER elements an invocation each, neighbouring
  // invocations on neighbouring addresses: along k where it is contiguous in memory (stride 1),
  // else along the rows of A and the columns of B. The next step's are requested before this
  // step's products.
  SCALAR next_a[PER], next_b[PER];
  fetch(k_first, k_end, row0, col0, batch, thread, next_a, next_b);
  for (uint k0 = k_first; k0 < k_end; k0 += 16) {
    [[unroll]] for (uint t = 0; t < PER; ++t) {
      const uint e = thread + 256 * t;
      const bool a_along_k = p.va.cols == 1, b_along_k = p.vb.rows == 1 && p.vb.cols != 1;
      s_a[a_along_k ? e % 16 : e / TILE][a_along_k ? e / 16 : e % TILE] = next_a[t];
      s_b[b_along_k ? e % 16 : e / TILE][b_along_k ? e / 16 : e % TILE] = next_b[t];
    }
    barrier();
    if (k0 + 16 < k_end) fetch(k0 + 16, k_end, row0, col0, batch, thread, next_a, next_b);
    [[unroll]] for (uint kk = 0; kk < 16; ++kk) {
      SCALAR x[PER], y[PER];
      [[unroll]] for (uint i = 0; i < PER; ++i) x[i] = s_a[kk][ty + 16 * i];
      [[unroll]] for (uint j = 0; j < PER; ++j) y[j] = s_b[kk][tx + 16 * j];
      [[unroll]] for (uint i = 0; i < PER; ++i) [[unroll]] for (uint j = 0; j < PER; ++j)
        acc[i][j] += x[i] * y[j];
    }
    barrier();
  }
  [[unroll]] for (uint i = 0; i < PER; ++i) {
    const uint row = row0 + ty + 16 * i;
    [[unroll]] for (uint j = 0; j < PER; ++j) {
      const uint col = col0 + tx + 16 * j;
      if (row < p.m && col < p.n && (!LOWER || col <= row)) {
        const uint to = at(p.vc, batch, row, col) + split * p.split_stride;
        c[to] = (beta == SCALAR(0) ? SCALAR(0) : beta * c_in[to]) + alpha * acc[i][j];
      }
    }
  }
#ifdef FACTOR
  if (gl_WorkGroupID.x == 0 && gl_WorkGroupID.y == 0) factor_corner(batch);
#endif
}
