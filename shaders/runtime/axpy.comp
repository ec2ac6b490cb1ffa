#version 450
// y = a * x + y over float32 vectors of `count` elements (grid-stride loop). `precise` forbids
// fusing into an FMA, so results equal NumPy's a * x + y bit for bit on every driver.
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) buffer Y { float y[]; };
layout(push_constant) uniform Push { uint count; float a; } push;
void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < push.count; i += stride) {
    precise float product = push.a * x[i];
    precise float sum = product + y[i];
    y[i] = sum;
  }
}
