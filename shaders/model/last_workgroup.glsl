// The ticket pattern of the sampling passes: whether this workgroup is the last of the
// gl_NumWorkGroups.x that count at tickets[slot] (called by every invocation, after the
// workgroup's writes the last one will read). The last one resets the ticket for the next run and
// sees every other workgroup's writes. Needs, declared before the include: a coherent buffer
// holding uint tickets[] and `shared bool s_last`.
bool last_workgroup(uint slot) {
  memoryBarrierBuffer();
  barrier();
  if (gl_LocalInvocationID.x == 0) {
    s_last = atomicAdd(tickets[slot], 1u) == gl_NumWorkGroups.x - 1;
    if (s_last) tickets[slot] = 0u;  // every workgroup has counted: ready for the next run
  }
  barrier();
  if (s_last) memoryBarrierBuffer();
  return s_last;
}
