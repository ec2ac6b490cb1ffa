#version 450
//! variant f32
//! variant f64 FLOAT64
// jacobi.comp's sweeps for a small matrix, one workgroup a matrix, all in shared memory: the n <=
// 32 rows of x [B, n, len] (len <= 64, view vx) and of vt [B, n, n] (view vv) are loaded, swept
// round after round (16 invocations a pair, their partial sums added in a fixed order) until a
// sweep rotates nothing or MOST_SWEEPS have run, and written back. rotations[b] = the rotations
// of the last sweep (not zero: no convergence).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "linalg_common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer X { SCALAR x[]; };
layout(std430, binding = 1) buffer VT { SCALAR vt[]; };
layout(std430, binding = 2) writeonly buffer Rotations { uint rotations[]; };
layout(push_constant) uniform Push {
  uint n; uint len; uint sweeps; float tol; View vx; View vv;
} p;

shared SCALAR s_x[32][65];
shared SCALAR s_v[32][33];
shared SCALAR s_part[16][16][3];
shared uint s_count;

void main() {
  const uint b = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
  const uint pair = t / 16, part = t % 16;
  for (uint e = t; e < p.n * p.len; e += 256)
    s_x[e / p.len][e % p.len] = x[at(p.vx, b, e / p.len, e % p.len)];
  for (uint e = t; e < p.n * p.n; e += 256)
    s_v[e / p.n][e % p.n] = vt[at(p.vv, b, e / p.n, e % p.n)];
  const uint players = p.n + (p.n & 1u), last = players - 1;
  uint count = 1;
  for (uint sweep = 0; sweep < p.sweeps && count != 0; ++sweep) {
    if (t == 0) s_count = 0;
    for (uint round = 0; round + 1 < players; ++round) {
      const uint i = pair == 0 ? last : (round + pair) % last;
      const uint j = pair == 0 ? round : (round + last - pair) % last;
      const bool paired = pair < players / 2 && i < p.n && j < p.n;
      barrier();  // the last round's rotations and partial sums (and s_count's reset) are done
      SCALAR a = 0, bb = 0, g = 0;
      if (paired)
        for (uint e = part; e < p.len; e += 16) {
          const SCALAR xi = s_x[i][e], xj = s_x[j][e];
          a += xi * xi;
          bb += xj * xj;
          g += xi * xj;
        }
      s_part[pair][part][0] = a;
      s_part[pair][part][1] = bb;
      s_part[pair][part][2] = g;
      barrier();
      // Every invocation of the pair adds the 16 partial sums in the same order and finds the
      // same rotation (no third barrier to share it).
      SCALAR sa = 0, sb = 0, sg = 0;
      [[unroll]] for (uint q = 0; q < 16; ++q) {
        sa += s_part[pair][q][0];
        sb += s_part[pair][q][1];
        sg += s_part[pair][q][2];
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
        if (part == 0) atomicAdd(s_count, 1u);
      }
      if (paired && s != SCALAR(0)) {
        for (uint e = part; e < p.len; e += 16) {
          const SCALAR xi = s_x[i][e], xj = s_x[j][e];
          s_x[i][e] = c * xi - s * xj;
          s_x[j][e] = s * xi + c * xj;
        }
        for (uint e = part; e < p.n; e += 16) {
          const SCALAR vi = s_v[i][e], vj = s_v[j][e];
          s_v[i][e] = c * vi - s * vj;
          s_v[j][e] = s * vi + c * vj;
        }
      }
    }
    barrier();
    count = s_count;
    barrier();  // every invocation has read it before the next sweep resets it
  }
  barrier();
  for (uint e = t; e < p.n * p.len; e += 256)
    x[at(p.vx, b, e / p.len, e % p.len)] = s_x[e / p.len][e % p.len];
  for (uint e = t; e < p.n * p.n; e += 256)
    vt[at(p.vv, b, e / p.n, e % p.n)] = s_v[e / p.n][e % p.n];
  if (t == 0) rotations[b] = count;
}
