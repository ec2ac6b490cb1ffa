// Workgroup-wide sum and max of one float per invocation (local size up to 256), in a fixed order
// (subgroups in turn), so the same input gives the same result; every invocation gets it. Needs
// GL_KHR_shader_subgroup_arithmetic and GL_KHR_shader_subgroup_basic, and uniform control flow.
shared float s_partial[256];

float group_sum(float value) {
  value = subgroupAdd(value);
  if (subgroupElect()) s_partial[gl_SubgroupID] = value;
  barrier();
  float total = 0.0;
  for (uint s = 0; s < gl_NumSubgroups; ++s) total += s_partial[s];
  barrier();
  return total;
}

float group_max(float value) {
  value = subgroupMax(value);
  if (subgroupElect()) s_partial[gl_SubgroupID] = value;
  barrier();
  float result = s_partial[0];
  for (uint s = 1; s < gl_NumSubgroups; ++s) result = max(result, s_partial[s]);
  barrier();
  return result;
}
