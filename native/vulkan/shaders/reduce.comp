// reduce.comp: the split-K combine (reduce_common.glsl), without attention mass.
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 28) in;
#include "reduce_common.glsl"
