// subgroup_probe.comp: the subgroup built-ins the attention shaders rely on, written out per invocation so
// that subgroup_probe.c can check them on the host. See subgroup_probe.c.
#version 450
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) buffer Out { float o[]; };
shared float red[128];

void main() {
    const uint lid = gl_LocalInvocationID.x;
    const float x = float(lid) * 0.5 + 1.0;
    const float mx = subgroupMax(x), sm = subgroupAdd(x);
    const bool elect = subgroupElect();
    const uint base = (gl_WorkGroupID.x * gl_WorkGroupSize.x + lid) * 8u;
    o[base + 0u] = mx;
    o[base + 1u] = sm;
    o[base + 2u] = float(gl_SubgroupID);
    o[base + 3u] = elect ? 1.0 : 0.0;
    o[base + 4u] = float(gl_NumSubgroups);
    o[base + 5u] = float(gl_SubgroupSize);
    if (elect) red[gl_SubgroupID] = sm; // across subgroups through shared memory, as attend_common.glsl does
    barrier();
    float total = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; g++) total += red[g];
    o[base + 6u] = total;
    float acc = 0.0; // a loop whose trip count differs between invocations
    for (uint k = lid; k < 200u; k += gl_WorkGroupSize.x) acc += float(k);
    o[base + 7u] = acc;
}
