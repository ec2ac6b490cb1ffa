#version 450
//! variant f32
//! variant f16 INPUT_F16
// Row-wise ops over the last axis, one workgroup per row, float32 arithmetic (docs/NUMERICS.md):
//   OP 0 softmax:    y = exp(x - max x) / sum exp(x - max x)
//   OP 1 rms_norm:   y = x / sqrt(mean(x^2) + eps) * weight
//   OP 2 layer_norm: y = (x - mean) / sqrt(var + eps) * weight + bias   (biased variance, two-pass)
//   OP 3 rms_norm backward, OP 4 layer_norm backward (xhat the normalized x, r = 1 / sqrt(...)):
//        y = grad_x = r (gw - xhat mean(gw xhat))  or  r (gw - mean(gw) - xhat mean(gw xhat)),
//        gw = grad * weight, and gxhat = grad * xhat per element (summed over rows for grad_weight)
//   OP 5 softmax backward: y = grad_x = s (grad - sum(grad s)), s = softmax(x)
// The backward norms also write the terms of the parameters' gradients, float32 [R, K], whose
// sums over R are grad_weight (of grad * xhat) and, for layer_norm, grad_bias (of grad): one row
// per row of x, or with COLUMN_PARTIALS (rows held in registers) one row per workgroup, the sum
// over the rows that workgroup took (row w, w + G, w + 2G, ... in that order).
// Rows with K % 4 == 0 and K <= 8192 are read once into registers (the backward ops: x and grad);
// others are read per pass.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "ops_common.glsl"
#include "group_reduce.glsl"
#include "../runtime/strided_loop.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint OP = 0;
layout(std430, binding = 0) readonly buffer X { ELEMENT x[]; };
layout(std430, binding = 1) readonly buffer X4 { ELEMENT4 x4[]; };  // the same tensor
layout(std430, binding = 2) readonly buffer Weight { float weight[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) writeonly buffer Y { ELEMENT y[]; };
layout(std430, binding = 5) writeonly buffer Y4 { ELEMENT4 y4[]; };
layout(std430, binding = 6) readonly buffer Grad { ELEMENT grad[]; };        // backward only
layout(std430, binding = 7) writeonly buffer GradXhat { float gxhat[]; };    // backward only
layout(std430, binding = 8) readonly buffer Grad4 { ELEMENT4 grad4[]; };      // the grad tensor
layout(std430, binding = 9) writeonly buffer GradXhat4 { vec4 gxhat4[]; };   // the gxhat tensor
layout(std430, binding = 10) writeonly buffer GradSum { float gsum[]; };     // layer_norm backward
layout(std430, binding = 11) writeonly buffer GradSum4 { vec4 gsum4[]; };    // the gsum tensor
layout(push_constant) uniform Push { uint rows; uint k; float eps; } p;

// Vectors a lane holds: rows up to CACHED * 256 * 4 values (at most 8192; the host sets the fewest
// a row needs, so short rows take fewer registers).
layout(constant_id = 1) const uint CACHED = 8;
layout(constant_id = 2) const bool COLUMN_PARTIALS = false;

// The statistics a row needs: (a, b) = (max, 1 / sum exp) for softmax, (1 / rms, 0) for
// rms_norm, (mean, 1 / std) for layer_norm. The pass functions read value i of the row.
float value_at(uint base, uint i) { return float(x[base + i]); }

vec4 weight_vector(uint i) {  // weights 4i .. 4i + 3 (the buffer is scalar floats)
  return vec4(weight[4 * i], weight[4 * i + 1], weight[4 * i + 2], weight[4 * i + 3]);
}

float transform(float v, uint col, float a, float b) {
  if (OP == 0) return exp(v - a) * b;
  if (OP == 1) return v * a * weight[col];
  return (v - a) * b * weight[col] + bias[col];
}

void main() {
  const uint lane = gl_LocalInvocationID.x;
  const bool cached = p.k % 4 == 0 && p.k / 4 <= CACHED * 256;
  const uint vectors = p.k / 4;
  const bool partials = COLUMN_PARTIALS && cached && (OP == 3 || OP == 4);
  vec4 sum_gxhat[CACHED], sum_g[CACHED];  // with partials: this workgroup's column sums
  [[unroll]] for (uint c = 0; c < CACHED; ++c) {
    sum_gxhat[c] = vec4(0.0);
    sum_g[c] = vec4(0.0);
  }
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    const uint base = row * p.k;
    float a = 0.0, b = 0.0;
    if (cached && OP >= 3) {
      // The backward ops with x and grad in registers: each read once, y (and gxhat) written once.
      // The same formulas as the passes below, vector by vector; lanes past the row hold zeros and
      // are left out wherever a zero would still count.
      vec4 v[CACHED], g[CACHED];
      [[unroll]] for (uint c = 0; c < CACHED; ++c) {
        const uint i = lane + c * 256;
        v[c] = i < vectors ? vec4(x4[base / 4 + i]) : vec4(0.0);
        g[c] = i < vectors ? vec4(grad4[base / 4 + i]) : vec4(0.0);
      }
      if (OP == 5) {
        float m = -3.402823466e38;
        [[unroll]] for (uint c = 0; c < CACHED; ++c)
          if (lane + c * 256 < vectors) m = max(m, max(max(v[c].x, v[c].y), max(v[c].z, v[c].w)));
        a = group_max(m);
        float s = 0.0;
        [[unroll]] for (uint c = 0; c < CACHED; ++c)
          if (lane + c * 256 < vectors) {
            const vec4 e = exp(v[c] - a);
            s += (e.x + e.y) + (e.z + e.w);
          }
        b = 1.0 / group_sum(s);
        float dot_gs = 0.0;
        [[unroll]] for (uint c = 0; c < CACHED; ++c)
          if (lane + c * 256 < vectors) dot_gs += dot(g[c], exp(v[c] - a) * b);
        const float total = group_sum(dot_gs);
        [[unroll]] for (uint c = 0; c < CACHED; ++c) {
          const uint i = lane + c * 256;
          if (i < vectors) y4[base / 4 + i] = ELEMENT4(exp(v[c] - a) * b * (g[c] - total));
        }
      } else {
        const float k = float(p.k);
        float mean = 0.0;
        if (OP == 4) {
          float s = 0.0;
          [[unroll]] for (uint c = 0; c < CACHED; ++c) s += (v[c].x + v[c].y) + (v[c].z + v[c].w);
          mean = group_sum(s) / k;
        }
        float q = 0.0;
        [[unroll]] for (uint c = 0; c < CACHED; ++c)
          if (lane + c * 256 < vectors) { const vec4 d = v[c] - mean; q += dot(d, d); }
        const float r = 1.0 / sqrt(group_sum(q) / k + p.eps);
        float s_gw = 0.0, s_gwx = 0.0;
        [[unroll]] for (uint c = 0; c < CACHED; ++c) {
          const uint i = lane + c * 256;
          if (i < vectors) {
            const vec4 gw = g[c] * weight_vector(i);
            s_gw += (gw.x + gw.y) + (gw.z + gw.w);
            s_gwx += dot(gw, (v[c] - mean) * r);
          }
        }
        const float mean_gw = OP == 4 ? group_sum(s_gw) / k : 0.0;
        const float mean_gwx = group_sum(s_gwx) / k;
        [[unroll]] for (uint c = 0; c < CACHED; ++c) {
          const uint i = lane + c * 256;
          if (i < vectors) {
            const vec4 xhat = (v[c] - mean) * r;
            y4[base / 4 + i] = ELEMENT4(r * (g[c] * weight_vector(i) - mean_gw - xhat * mean_gwx));
            if (partials) {
              sum_gxhat[c] += g[c] * xhat;
              if (OP == 4) sum_g[c] += g[c];
            } else {
              gxhat4[base / 4 + i] = g[c] * xhat;
              if (OP == 4) gsum4[base / 4 + i] = g[c];
            }
          }
        }
      }
    } else if (cached) {
      vec4 v[CACHED];
      [[unroll]] for (uint c = 0; c < CACHED; ++c) {
        const uint i = lane + c * 256;
        v[c] = i < vectors ? vec4(x4[base / 4 + i]) : vec4(0.0);
      }
      if (OP == 0) {
        float m = -3.402823466e38;
        [[unroll]] for (uint c = 0; c < CACHED; ++c)
          if (lane + c * 256 < vectors) m = max(m, max(max(v[c].x, v[c].y), max(v[c].z, v[c].w)));
        a = group_max(m);
        float s = 0.0;
        [[unroll]] for (uint c = 0; c < CACHED; ++c)
          if (lane + c * 256 < vectors) {
            const vec4 e = exp(v[c] - a);
            s += (e.x + e.y) + (e.z + e.w);
          }
        b = 1.0 / group_sum(s);
      } else if (OP == 1) {
        float s = 0.0;
        [[unroll]] for (uint c = 0; c < CACHED; ++c) s += dot(v[c], v[c]);
        a = 1.0 / sqrt(group_sum(s) / float(p.k) + p.eps);
      } else {
        float s = 0.0;
        [[unroll]] for (uint c = 0; c < CACHED; ++c) s += (v[c].x + v[c].y) + (v[c].z + v[c].w);
        a = group_sum(s) / float(p.k);
        float q = 0.0;
        [[unroll]] for (uint c = 0; c < CACHED; ++c)
          if (lane + c * 256 < vectors) { const vec4 d = v[c] - a; q += dot(d, d); }
        b = 1.0 / sqrt(group_sum(q) / float(p.k) + p.eps);
      }
      [[unroll]] for (uint c = 0; c < CACHED; ++c) {
        const uint i = lane + c * 256;
        if (i < vectors) {
          vec4 r;
          for (uint e = 0; e < 4; ++e) r[e] = transform(v[c][e], 4 * i + e, a, b);
          y4[base / 4 + i] = ELEMENT4(r);
        }
      }
    } else if (OP == 5) {
      float m = -3.402823466e38;
      FOR_STRIDED(i, lane, p.k, 256) m = max(m, value_at(base, i));
      a = group_max(m);
      float s = 0.0;
      FOR_STRIDED(i, lane, p.k, 256) s += exp(value_at(base, i) - a);
      b = 1.0 / group_sum(s);
      float dot_gs = 0.0;
      FOR_STRIDED(i, lane, p.k, 256)
          dot_gs += float(grad[base + i]) * exp(value_at(base, i) - a) * b;
      const float total = group_sum(dot_gs);
      FOR_STRIDED(i, lane, p.k, 256) {
        const float soft = exp(value_at(base, i) - a) * b;
        y[base + i] = ELEMENT(soft * (float(grad[base + i]) - total));
      }
    } else if (OP >= 3) {
      const float k = float(p.k);
      float mean = 0.0;
      if (OP == 4) {
        float s = 0.0;
        FOR_STRIDED(i, lane, p.k, 256) s += value_at(base, i);
        mean = group_sum(s) / k;
      }
      float q = 0.0;
      FOR_STRIDED(i, lane, p.k, 256) { const float d = value_at(base, i) - mean; q += d * d; }
      const float r = 1.0 / sqrt(group_sum(q) / k + p.eps);
      float s_gw = 0.0, s_gwx = 0.0;
      FOR_STRIDED(i, lane, p.k, 256) {
        const float gw = float(grad[base + i]) * weight[i];
        s_gw += gw;
        s_gwx += gw * (value_at(base, i) - mean) * r;
      }
      const float mean_gw = OP == 4 ? group_sum(s_gw) / k : 0.0;
      const float mean_gwx = group_sum(s_gwx) / k;
      FOR_STRIDED(i, lane, p.k, 256) {
        const float g = float(grad[base + i]), xhat = (value_at(base, i) - mean) * r;
        y[base + i] = ELEMENT(r * (g * weight[i] - mean_gw - xhat * mean_gwx));
        gxhat[base + i] = g * xhat;
        if (OP == 4) gsum[base + i] = g;
      }
    } else {
      if (OP == 0) {
        float m = -3.402823466e38;
        FOR_STRIDED(i, lane, p.k, 256) m = max(m, value_at(base, i));
        a = group_max(m);
        float s = 0.0;
        FOR_STRIDED(i, lane, p.k, 256) s += exp(value_at(base, i) - a);
        b = 1.0 / group_sum(s);
      } else if (OP == 1) {
        float s = 0.0;
        FOR_STRIDED(i, lane, p.k, 256) { const float v = value_at(base, i); s += v * v; }
        a = 1.0 / sqrt(group_sum(s) / float(p.k) + p.eps);
      } else {
        float s = 0.0;
        FOR_STRIDED(i, lane, p.k, 256) s += value_at(base, i);
        a = group_sum(s) / float(p.k);
        float q = 0.0;
        FOR_STRIDED(i, lane, p.k, 256) { const float d = value_at(base, i) - a; q += d * d; }
        b = 1.0 / sqrt(group_sum(q) / float(p.k) + p.eps);
      }
      FOR_STRIDED(i, lane, p.k, 256) y[base + i] = ELEMENT(transform(value_at(base, i), i, a, b));
    }
  }
  if (partials) {
    const uint first = gl_WorkGroupID.x * vectors;
    [[unroll]] for (uint c = 0; c < CACHED; ++c) {
      const uint i = lane + c * 256;
      if (i < vectors) {
        gxhat4[first + i] = sum_gxhat[c];
        if (OP == 4) gsum4[first + i] = sum_g[c];
      }
    }
  }
}
