#version 450
// Appends rows to batched caches at a position read from a tensor (a graph input):
//   cache row (b * CACHE_ROWS + start[0] + t) = source row r,   b = r / PERIOD, t = r % PERIOD,
// for caches [B, CACHE_ROWS, ...] and source rows of ROW_WORDS 32-bit words. Rows that would land
// past a cache's end are not written.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Source { uint source[]; };
layout(std430, binding = 1) writeonly buffer Cache { uint cache[]; };
layout(std430, binding = 2) readonly buffer Start { uint start[]; };
layout(push_constant) uniform Push { uint rows; uint row_words; uint period; uint cache_rows; } p;

void main() {
  const uint total = p.rows * p.row_words, first = start[0];
  for (uint index = gl_GlobalInvocationID.x; index < total; index += gl_NumWorkGroups.x * 256) {
    const uint r = index / p.row_words, word = index % p.row_words;
    const uint b = r / p.period, position = first + r % p.period;
    if (position < p.cache_rows) cache[(b * p.cache_rows + position) * p.row_words + word] = source[index];
  }
}
