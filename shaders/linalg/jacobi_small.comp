#version 450
//! variant f32
//! variant f64 FLOAT64
// jacobi.comp's sweeps for small matrices, all in shared memory: the N <= 32 rows of x [B, N, LEN]
// (LEN <= 64, view vx) and of vt [B, N, N] (view vv) are loaded, swept round after round (PARTS
// invocations a pair, their partial sums added in a fixed order) until a sweep rotates nothing in
// any of the workgroup's MATS matrices or `sweeps` have run, and written back. rotations[b] =
// matrix b's rotations in the last sweep (not zero: no convergence). Matrix m of a workgroup takes
// invocations m * PAIRS * PARTS on; the host picks PARTS and MATS (docs/PERFORMANCE.md).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#include "linalg_common.glsl"
layout(local_size_x_id = 0) in;
// Specialization constants, so that the loops unroll and the index arithmetic folds.
layout(constant_id = 0) const uint THREADS = 256;  // MATS * PAIRS * PARTS
layout(constant_id = 1) const uint N = 32;
layout(constant_id = 2) const uint LEN = 32;
layout(constant_id = 3) const uint PARTS = 1;  // invocations a pair: a power of two
layout(constant_id = 4) const uint MATS = 1;
// Whether a round's barrier may be the subgroup's: each matrix's invocations lie in one subgroup.
layout(constant_id = 5) const bool SUBGROUP_ROUNDS = false;
layout(std430, binding = 0) buffer X { SCALAR x[]; };
layout(std430, binding = 1) buffer VT { SCALAR vt[]; };
layout(std430, binding = 2) writeonly buffer Rotations { uint rotations[]; };
layout(push_constant) uniform Push {
  uint sweeps; float tol; View vx; View vv; uint batch;
} p;

const uint PLAYERS = N + (N & 1u), LAST = PLAYERS - 1, PAIRS = PLAYERS / 2;
// Rows one apart in shared memory fall in different banks as the round pairs them.
// Matrices a multiple of 32 apart would share banks, so such a stride is moved by 16.
const uint LX = LEN + 1, LV = N + 1;
const uint MX = N * LX + ((N * LX) % 32 == 0 ? 16 : 0);
const uint MV = N * LV + ((N * LV) % 32 == 0 ? 16 : 0);
shared SCALAR s_x[MATS * MX];
shared SCALAR s_v[MATS * MV];
shared SCALAR s_part[THREADS * 3];
shared uint s_count[MATS];
shared uint s_any;

// The end of a round: where each matrix is one subgroup's, only that subgroup waits.
void round_barrier() {
  if (SUBGROUP_ROUNDS) {
    subgroupMemoryBarrierShared();
    subgroupBarrier();
  } else {
    barrier();
  }
}

void main() {
  const uint t = gl_LocalInvocationID.x, per = PAIRS * PARTS;
  // In subgroup rounds a matrix's invocations are found by subgroup, whatever their local ids.
  const uint r = SUBGROUP_ROUNDS ? gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID : t;
  const uint m = r / per, pair = (r % per) / PARTS, part = r % PARTS;
  const uint base = gl_WorkGroupID.x * MATS, b = base + m;
  const bool live = b < p.batch;
  const uint xm = m * MX, vm = m * MV;  // m's first rows
  for (uint e = t; e < MATS * N * LEN; e += THREADS) {
    const uint mm = e / (N * LEN), i = (e / LEN) % N, c = e % LEN, bb = base + mm;
    if (bb < p.batch) s_x[mm * MX + i * LX + c] = x[at(p.vx, bb, i, c)];
  }
  for (uint e = t; e < MATS * N * N; e += THREADS) {
    const uint mm = e / (N * N), i = (e / N) % N, c = e % N, bb = base + mm;
    if (bb < p.batch) s_v[mm * MV + i * LV + c] = vt[at(p.vv, bb, i, c)];
  }
  uint any = 1;
  for (uint sweep = 0; sweep < p.sweeps && any != 0; ++sweep) {
    if (t < MATS) s_count[t] = 0;
    if (t == 0) s_any = 0;
    barrier();  // the loads are done and the counts reset
    for (uint round = 0; round < LAST; ++round) {
      const uint i = pair == 0 ? LAST : (round + pair) % LAST;
      const uint j = pair == 0 ? round : (round + LAST - pair) % LAST;
      const bool paired = live && i < N && j < N;
      const uint ri = xm + i * LX, rj = xm + j * LX;
      // A part takes a contiguous run of the row, so that the pair's parts fall in other banks.
      const uint run = (LEN + PARTS - 1) / PARTS, first_e = part * run;
      SCALAR a = 0, bb = 0, g = 0;
      if (paired) {
        [[unroll]] for (uint k = 0; k < run; ++k) {
          const uint e = first_e + k;
          if (e < LEN) {
            const SCALAR xi = s_x[ri + e], xj = s_x[rj + e];
            a += xi * xi;
            bb += xj * xj;
            g += xi * xj;
          }
        }
      }
      SCALAR sa = a, sb = bb, sg = g;
      if (PARTS > 1) {
        s_part[3 * r] = a;
        s_part[3 * r + 1] = bb;
        s_part[3 * r + 2] = g;
        round_barrier();
        // Every invocation of the pair adds the partial sums in the same order and finds the
        // same rotation (no further barrier to share it).
        const uint first = r - part;
        sa = 0;
        sb = 0;
        sg = 0;
        [[unroll]] for (uint q = 0; q < PARTS; ++q) {
          sa += s_part[3 * (first + q)];
          sb += s_part[3 * (first + q) + 1];
          sg += s_part[3 * (first + q) + 2];
        }
      }
      SCALAR c = 1, s = 0;
      if (paired && abs(sg) > SCALAR(p.tol) * sqrt(sa * sb)) {
        const SCALAR zeta = (sb - sa) / (SCALAR(2) * sg);
        SCALAR tt = SCALAR(1);
        if (abs(zeta) > SCALAR(1e15)) tt = SCALAR(0.5) / zeta;
        else if (zeta != SCALAR(0))
          tt = sign(zeta) / (abs(zeta) + sqrt(SCALAR(1) + zeta * zeta));
        c = SCALAR(1) / sqrt(SCALAR(1) + tt * tt);
        s = c * tt;
        if (part == 0) atomicAdd(s_count[m], 1u);
      }
      if (paired && s != SCALAR(0)) {
        [[unroll]] for (uint k = 0; k < run; ++k) {
          const uint e = first_e + k;
          if (e < LEN) {
            const SCALAR xi = s_x[ri + e], xj = s_x[rj + e];
            s_x[ri + e] = c * xi - s * xj;
            s_x[rj + e] = s * xi + c * xj;
          }
        }
        const uint vi0 = vm + i * LV, vj0 = vm + j * LV, vrun = (N + PARTS - 1) / PARTS;
        [[unroll]] for (uint k = 0; k < vrun; ++k) {
          const uint e = part * vrun + k;
          if (e < N) {
            const SCALAR vi = s_v[vi0 + e], vj = s_v[vj0 + e];
            s_v[vi0 + e] = c * vi - s * vj;
            s_v[vj0 + e] = s * vi + c * vj;
          }
        }
      }
      round_barrier();  // this round's rotations (and partial sums) are done
    }
    barrier();
    if (t < MATS && s_count[t] != 0) atomicOr(s_any, 1u);
    barrier();
    any = s_any;
    barrier();  // every invocation has read it before the next sweep resets it
  }
  barrier();
  for (uint e = t; e < MATS * N * LEN; e += THREADS) {
    const uint mm = e / (N * LEN), i = (e / LEN) % N, c = e % LEN, bb = base + mm;
    if (bb < p.batch) x[at(p.vx, bb, i, c)] = s_x[mm * MX + i * LX + c];
  }
  for (uint e = t; e < MATS * N * N; e += THREADS) {
    const uint mm = e / (N * N), i = (e / N) % N, c = e % N, bb = base + mm;
    if (bb < p.batch) vt[at(p.vv, bb, i, c)] = s_v[mm * MV + i * LV + c];
  }
  if (t < MATS && base + t < p.batch) rotations[base + t] = s_count[t];
}
