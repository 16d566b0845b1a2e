// baseline_attend.comp: the attention of the dequantize-then-attend baseline (GOKV_ATTEND_DEQUANT_BASELINE):
// attend_common.glsl specialized for an f32 pool whose pages baseline_dequant.comp materialized at the
// start of the scratch buffer.
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 28) in;
#define GOKV_READ_ONLY_POOL
#define UP_QUAL readonly
#define DOWN_QUAL writeonly
#define ATTEND_KV_IN_SCRATCH
#include "common.glsl"
#include "attend_common.glsl"

void main() { attend_main(); }
