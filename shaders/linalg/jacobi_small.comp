#version 450
//! variant f32
//! variant f64 FLOAT64
// jacobi.comp's sweeps for small matrices, all in shared memory: the n <= 32 rows of x [B, n, len]
// (len <= 64, view vx) and of vt [B, n, n] (view vv) are loaded, swept round after round (PARTS
// invocations a pair, their partial sums added in a fixed order) until a sweep rotates nothing in
// any of the workgroup's `mats` matrices or MOST_SWEEPS have run, and written back. rotations[b] =
// matrix b's rotations in the last sweep (not zero: no convergence). Small matrices share a
// workgroup (matrix m's invocations from m * pairs * PARTS) so that few invocations idle.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "linalg_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint PARTS = 16;  // at most 16; a constant, so its loops unroll
layout(std430, binding = 0) buffer X { SCALAR x[]; };
layout(std430, binding = 1) buffer VT { SCALAR vt[]; };
layout(std430, binding = 2) writeonly buffer Rotations { uint rotations[]; };
layout(push_constant) uniform Push {
  uint n; uint len; uint sweeps; float tol; View vx; View vv; uint batch; uint mats;
} p;

// A matrix's rows at s_x[(m n + i) (len + 1) + e] and s_v[(m n + i) (n + 1) + e]; the host sizes
// mats to fit.
shared SCALAR s_x[32 * 65];
shared SCALAR s_v[1184];
shared SCALAR s_part[256][3];
shared uint s_count[16];
shared uint s_any;

void main() {
  const uint t = gl_LocalInvocationID.x, n = p.n, len = p.len, parts = PARTS;
  const uint players = n + (n & 1u), last = players - 1, pairs = players / 2;
  const uint per = pairs * parts, m = t / per, pair = (t % per) / parts, part = t % parts;
  const uint base = gl_WorkGroupID.x * p.mats, b = base + m;
  const bool live = m < p.mats && b < p.batch;
  const uint xr = m * n, lx = len + 1, lv = n + 1;  // m's first row; row strides
  for (uint e = t; e < p.mats * n * len; e += 256) {
    const uint mm = e / (n * len), i = (e / len) % n, c = e % len, bb = base + mm;
    if (bb < p.batch) s_x[(mm * n + i) * lx + c] = x[at(p.vx, bb, i, c)];
  }
  for (uint e = t; e < p.mats * n * n; e += 256) {
    const uint mm = e / (n * n), i = (e / n) % n, c = e % n, bb = base + mm;
    if (bb < p.batch) s_v[(mm * n + i) * lv + c] = vt[at(p.vv, bb, i, c)];
  }
  uint any = 1;
  for (uint sweep = 0; sweep < p.sweeps && any != 0; ++sweep) {
    if (t < p.mats) s_count[t] = 0;
    if (t == 0) s_any = 0;
    for (uint round = 0; round + 1 < players; ++round) {
      const uint i = pair == 0 ? last : (round + pair) % last;
      const uint j = pair == 0 ? round : (round + last - pair) % last;
      const bool paired = live && i < n && j < n;
      const uint ri = (xr + i) * lx, rj = (xr + j) * lx;
      barrier();  // the last round's rotations and partial sums (and the counts' reset) are done
      SCALAR a = 0, bb = 0, g = 0;
      if (paired)
        for (uint e = part; e < len; e += parts) {
          const SCALAR xi = s_x[ri + e], xj = s_x[rj + e];
          a += xi * xi;
          bb += xj * xj;
          g += xi * xj;
        }
      s_part[t][0] = a;
      s_part[t][1] = bb;
      s_part[t][2] = g;
      barrier();
      // Every invocation of the pair adds its partial sums in the same order and finds the same
      // rotation (no third barrier to share it).
      const uint first = t - part;
      SCALAR sa = 0, sb = 0, sg = 0;
      [[unroll]] for (uint q = 0; q < PARTS; ++q) {
        sa += s_part[first + q][0];
        sb += s_part[first + q][1];
        sg += s_part[first + q][2];
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
        for (uint e = part; e < len; e += parts) {
          const SCALAR xi = s_x[ri + e], xj = s_x[rj + e];
          s_x[ri + e] = c * xi - s * xj;
          s_x[rj + e] = s * xi + c * xj;
        }
        const uint vi0 = (xr + i) * lv, vj0 = (xr + j) * lv;
        for (uint e = part; e < n; e += parts) {
          const SCALAR vi = s_v[vi0 + e], vj = s_v[vj0 + e];
          s_v[vi0 + e] = c * vi - s * vj;
          s_v[vj0 + e] = s * vi + c * vj;
        }
      }
    }
    barrier();
    if (t < p.mats && s_count[t] != 0) atomicOr(s_any, 1u);
    barrier();
    any = s_any;
    barrier();  // every invocation has read it before the next sweep resets it
  }
  barrier();
  for (uint e = t; e < p.mats * n * len; e += 256) {
    const uint mm = e / (n * len), i = (e / len) % n, c = e % len, bb = base + mm;
    if (bb < p.batch) x[at(p.vx, bb, i, c)] = s_x[(mm * n + i) * lx + c];
  }
  for (uint e = t; e < p.mats * n * n; e += 256) {
    const uint mm = e / (n * n), i = (e / n) % n, c = e % n, bb = base + mm;
    if (bb < p.batch) vt[at(p.vv, bb, i, c)] = s_v[(mm * n + i) * lv + c];
  }
  if (t < p.mats && base + t < p.batch) rotations[base + t] = s_count[t];
}
