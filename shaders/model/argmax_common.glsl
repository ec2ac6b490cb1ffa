// The order argmax.comp and head_verify.comp pick by, as np.argmax: NaN first, then the larger
// value, then the lower index. Picking is order-independent, so any reduction gives the same pair.
// Needs a local size of 256.
shared float s_value[256];
shared uint s_index[256];

// Whether (a, ai) comes before (b, bi).
bool before(float a, uint ai, float b, uint bi) {
  if (isnan(a) != isnan(b)) return isnan(a);
  if (!isnan(a) && a != b) return a > b;
  return ai < bi;
}

// The first of the workgroup's (value, index) pairs, one an invocation, into s_value[0] and
// s_index[0] (called by every invocation; a barrier follows the last step).
void workgroup_best(float value, uint index) {
  const uint id = gl_LocalInvocationID.x;
  s_value[id] = value;
  s_index[id] = index;
  barrier();
  for (uint s = 128; s > 0; s >>= 1) {
    if (id < s && before(s_value[id + s], s_index[id + s], s_value[id], s_index[id])) {
      s_value[id] = s_value[id + s];
      s_index[id] = s_index[id + s];
    }
    barrier();
  }
}

// Offers a chunk's best, packed as (value bits, index), to a running best.
void offer(uvec2 pair, inout float best, inout uint best_index) {
  if (before(uintBitsToFloat(pair.x), pair.y, best, best_index)) {
    best = uintBitsToFloat(pair.x);
    best_index = pair.y;
  }
}

// workgroup_best's pair, packed for a chunk's partial.
uvec2 packed_best() { return uvec2(floatBitsToUint(s_value[0]), s_index[0]); }
