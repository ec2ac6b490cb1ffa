#version 450
//! variant f32
//! variant f64 FLOAT64
// After Jacobi (jacobi.comp), one workgroup a matrix: sigma_i = ||x_i|| of the rows of x [B, n,
// len] (view vx), and the rank of each (descending, or ASCENDING; equal values by index). Writes
// s[b, rank_i] = sigma_i - shift[b]; WITH_W: element (rank_i, e) of view vw = vt[b, i, e] (the
// accumulated rotations, as rows or, through a transposed view, columns); WITH_Z: element
// (e, rank_i) of view vz = x_i[e] / sigma_i, or zero where sigma_i <= cutoff * max sigma (a zero
// singular value: a QR of these columns completes the basis).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "linalg_common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool ASCENDING = false;
layout(constant_id = 1) const bool WITH_W = false;
layout(constant_id = 2) const bool WITH_Z = false;
layout(std430, binding = 0) readonly buffer X { SCALAR x[]; };
layout(std430, binding = 1) readonly buffer VT { SCALAR vt[]; };
layout(std430, binding = 2) writeonly buffer S { SCALAR s_out[]; };
layout(std430, binding = 3) writeonly buffer W { SCALAR w[]; };
layout(std430, binding = 4) writeonly buffer Z { SCALAR z[]; };
// sigma [B, n] scratch
layout(std430, binding = 5) buffer Sigma { SCALAR sigma[]; };
layout(std430, binding = 6) readonly buffer Shift { SCALAR shift[]; };  // [B]
layout(push_constant) uniform Push {
  uint n; uint len; float cutoff; View vx; View vv; View vw; View vz;
} p;

shared SCALAR s_part[64];

void main() {
  const uint b = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
  for (uint i = 0; i < p.n; ++i) {  // the norms, one row at a time across the workgroup
    SCALAR sum = 0;
    for (uint e = t; e < p.len; e += 256) {
      const SCALAR value = x[at(p.vx, b, i, e)];
      sum += value * value;
    }
    sum = subgroupAdd(sum);
    if (subgroupElect()) s_part[gl_SubgroupID] = sum;
    barrier();
    if (t == 0) {
      SCALAR total = 0;
      for (uint g = 0; g < gl_NumSubgroups; ++g) total += s_part[g];
      sigma[b * p.n + i] = sqrt(total);
    }
    barrier();
  }
  memoryBarrierBuffer();
  barrier();
  for (uint i = t; i < p.n; i += 256) {
    const SCALAR mine = sigma[b * p.n + i];
    uint rank = 0;
    SCALAR largest = 0;
    for (uint j = 0; j < p.n; ++j) {
      const SCALAR other = sigma[b * p.n + j];
      const bool before = ASCENDING ? other < mine : other > mine;
      if (before || (other == mine && j < i)) ++rank;
      largest = max(largest, other);
    }
    s_out[b * p.n + rank] = mine - shift[b];
    if (WITH_W)
      for (uint e = 0; e < p.n; ++e) w[at(p.vw, b, rank, e)] = vt[at(p.vv, b, i, e)];
    if (WITH_Z) {
      const SCALAR scale = mine > SCALAR(p.cutoff) * largest ? SCALAR(1) / mine : SCALAR(0);
      for (uint e = 0; e < p.len; ++e) z[at(p.vz, b, e, rank)] = x[at(p.vx, b, i, e)] * scale;
    }
  }
}
