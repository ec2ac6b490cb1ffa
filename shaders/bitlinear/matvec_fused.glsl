// The fused matvecs' activation pre-pass (bitlinear_matvec's FUSED, bitlinear_chain): every
// workgroup quantizes the M activation rows itself into shared memory, as bitlinear_prepare does
// (optionally relu(x)^2 * up, then an RMS norm, then absmax int8 in the interleaved layout).
// Needs quantize_common.glsl, prepare_common.glsl, GL_KHR_shader_subgroup_quad, and before it:
// the constants M, WG_SIZE, PREPASS_SIZE (the invocations that hold the rows, the first of the
// workgroup: the sums follow PREPASS_SIZE, not WG_SIZE), CACHED (ceil(Kp / 4 / PREPASS_SIZE)),
// SHARED_WORDS, NORM and GATED, and the macros
// INPUT4(source, index), UP4(index) and NORM_WEIGHT4(source, index) (float32 vec4 loads).
// The quantized rows, interleaved as bitlinear_prepare writes them, a 16-value block a uvec4.
shared uvec4 s_x4[(SHARED_WORDS + 3) / 4];
int row_sums[M];      // each row's sum and scale, the same in every invocation
float row_scales[M];
shared float s_reduce[256];
shared float s_reduce_max[256];
shared int s_reduce_int[256];
shared uint s_bad[256];
shared uint s_sink[WG_SIZE];

// The workgroup's sum (float, fixed order) or max of one value per invocation. One barrier each:
// the sum, the max and the rows' integer sums use scratch of their own, and each is written again
// (the next row) only after a later barrier that every invocation reaches after reading it.
float workgroup_sum(float v) {
  v = subgroupAdd(v);
  if (subgroupElect()) s_reduce[gl_SubgroupID] = v;
  barrier();
  float total = 0.0;
  for (uint s = 0; s < gl_NumSubgroups; ++s) total += s_reduce[s];
  return total;
}

// The max and the rows' integer sums, whose order does not matter: in workgroups of more than 16
// subgroups (the strided grid's 1024 invocations on the H100; lavapipe's subgroups of 8 from 256)
// the subgroups' values are read by the lanes of every subgroup (every gl_SubgroupSize-th value a
// lane) and reduced by subgroup operations, instead of a loop in every invocation over every
// subgroup's value: faster from 32 subgroups a workgroup, not at 16 (docs/PERFORMANCE.md).
bool subgroup_reductions() { return gl_NumSubgroups > 16; }
float workgroup_max(float v) {
  v = subgroupMax(v);
  if (subgroupElect()) s_reduce_max[gl_SubgroupID] = v;
  barrier();
  float result = 0.0;
  if (subgroup_reductions()) {
    for (uint s = gl_SubgroupInvocationID; s < gl_NumSubgroups; s += gl_SubgroupSize)
      result = max(result, s_reduce_max[s]);
    return subgroupMax(result);
  }
  for (uint s = 0; s < gl_NumSubgroups; ++s) result = max(result, s_reduce_max[s]);
  return result;
}

// The total of the subgroups' integer sums in s_reduce_int (after a barrier).
int workgroup_int_total() {
  int total = 0;
  if (subgroup_reductions()) {
    for (uint s = gl_SubgroupInvocationID; s < gl_NumSubgroups; s += gl_SubgroupSize)
      total += s_reduce_int[s];
    return subgroupAdd(total);
  }
  for (uint s = 0; s < gl_NumSubgroups; ++s) total += s_reduce_int[s];
  return total;
}

// The M rows of k values (rows of `words` interleaved words) from INPUT4(source, index) quantized
// into s_x4, row_sums and row_scales; returns the subgroup's count of NaN/Inf values. sink: a
// value made of weights requested before (with keep_sink), stored once the rows are requested so
// that the weights are waited for while the rows' loads are in flight, not after the pre-pass.
uint quantize_rows(uint source, uint k, uint words, float norm_eps, float eps, bool keep_sink,
                   uint sink) {
  const uint lane = gl_LocalInvocationID.x;
  // The rows' vectors this invocation holds: lane, lane + PREPASS_SIZE, ... below these ends.
  const uint vectors = lane < PREPASS_SIZE ? k / 4 : 0;
  const uint padded_vectors = words * 4, padded_end = lane < PREPASS_SIZE ? padded_vectors : 0;
  uint bad = 0;
  for (uint m = 0; m < M; ++m) {
    vec4 cache[CACHED];
    [[unroll]] for (uint c = 0; c < CACHED; ++c) {
      const uint v = lane + c * PREPASS_SIZE;
      cache[c] = v < vectors ? INPUT4(source, m * vectors + v) : vec4(0.0);
      if (GATED && v < vectors) {
        const vec4 g = max(cache[c], vec4(0.0));
        cache[c] = g * g * UP4(m * vectors + v);
      }
    }
    if (keep_sink && m == 0) s_sink[lane] = sink;
    if (NORM) {
      float squares = 0.0;
      [[unroll]] for (uint c = 0; c < CACHED; ++c) squares += dot(cache[c], cache[c]);
      const float r = 1.0 / sqrt(workgroup_sum(squares) / float(k) + norm_eps);
      [[unroll]] for (uint c = 0; c < CACHED; ++c)
        if (lane + c * PREPASS_SIZE < vectors)
          cache[c] = cache[c] * r * NORM_WEIGHT4(source, lane + c * PREPASS_SIZE);
    }
    float absmax = 0.0;
    [[unroll]] for (uint c = 0; c < CACHED; ++c)
      if (lane + c * PREPASS_SIZE < vectors)
        [[unroll]] for (uint e = 0; e < 4; ++e) accumulate(cache[c][e], absmax, bad);
    const float scale = divide(127.0, max(workgroup_max(absmax), eps));
    int sum = 0;
    [[unroll]] for (uint c = 0; c < CACHED; ++c) {
      const uint v = lane + c * PREPASS_SIZE;
      if (c * PREPASS_SIZE < padded_vectors) {  // uniform: whole quads stay together
        const uint word = interleaved_word(cache[c], scale, sum);
        if (v < padded_end) s_x4[(m * padded_vectors + v) >> 2][v & 3u] = word;
      }
    }
    sum = subgroupAdd(sum);  // integer sums: exact in any order
    if (subgroupElect()) s_reduce_int[gl_SubgroupID] = sum;
    barrier();  // s_x4 and the subgroups' sums are written
    row_sums[m] = workgroup_int_total();
    row_scales[m] = scale;
  }
  return subgroupAdd(bad);
}
