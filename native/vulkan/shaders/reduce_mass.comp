// reduce_mass.comp: the split-K combine (reduce_common.glsl) that also stores each vector's softmax factors
// for mass.comp.
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 28) in;
#define REDUCE_MASS
#include "reduce_common.glsl"
