// attend.comp: fused split-K decode and prefill attention over the pool's compressed pages; the
// algorithm is in attend_common.glsl, the work items in native/gpu/gpu_attend.c.
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 28) in;
#define GOKV_READ_ONLY_POOL
#define UP_QUAL readonly
#define DOWN_QUAL writeonly
#include "common.glsl"
#include "attend_common.glsl"

void main() { attend_main(); }
