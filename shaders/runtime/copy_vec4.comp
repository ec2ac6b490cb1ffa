#version 450
// Copies `count` 16-byte words, each invocation moving one uvec4 per grid-stride step.
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Source { uvec4 source[]; };
layout(std430, binding = 1) writeonly buffer Destination { uvec4 destination[]; };
layout(push_constant) uniform Push { uint count; } push;
void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < push.count; i += stride) destination[i] = source[i];
}
