// FOR_STRIDED(i, first, end, stride) BODY: for (uint i = first; i < end; i += stride) BODY, with
// LOOP_STEPS steps a pass of the loop, unrolled and in the same order (so bit for bit the same
// results). lavapipe ends every loop of an invocation once its loops have made 65535 passes in all
// (Mesa's guard against endless loops, LP_MAX_TGSI_LOOP_ITERATIONS), silently: with one step a
// pass, a 256-wide workgroup's loop over a row stopped short from 16.7M values (5.6M for softmax's
// three loops). With 16 steps a pass a 256-wide loop covers 268M values. (One step a pass on GPUs
// without the guard measured slower, so every device takes 16.)
#ifndef STRIDED_LOOP_GLSL
#define STRIDED_LOOP_GLSL
const uint LOOP_STEPS = 16;
#define FOR_STRIDED(i, first, end, stride)                                               \
  for (uint i##_pass = (first); i##_pass < (end); i##_pass += LOOP_STEPS * (stride))   \
    [[unroll]] for (uint i##_step = 0, i = i##_pass; i##_step < LOOP_STEPS;                \
                    ++i##_step, i += (stride))                                           \
      if (i < (end))
#endif
