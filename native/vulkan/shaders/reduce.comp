// reduce.comp: the second pass of split-K attention (docs/architecture.md §5). One workgroup combines the chunk
// partials (m_c, l_c, o_c[D_V]) that attend.comp wrote for one query vector:
//     M = max(max_c m_c, σ),   out = Σ_c e^(m_c - M) o_c / (Σ_c e^(m_c - M) l_c + e^(σ - M)),
// skipping chunks that saw nothing (l_c == 0); a vector no chunk saw outputs zeros, with or without σ.
// Entries (5 words of the inputs): first partial (words from part_w), chunk count, words between chunks, output
// word in down, query head (for σ).
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 28) in;
#define GOKV_READ_ONLY_POOL
#define UP_QUAL readonly
#define SCRATCH_QUAL readonly
#define DOWN_QUAL writeonly
#include "common.glsl"

const uint NONE = 0xffffffffu;
const float NEG = -3.0e38;

#include "push.glsl"
PUSH_BLOCK(GOKV_PUSH_REDUCE); // the fields: push.glsl

#include "attend_inputs.glsl"

float part_f(uint w) { return uintBitsToFloat(scratch[w]); }

void main() {
    const uint e = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (e >= pc.n_entries) return;
    const uint ew = pc.entry_w + 5u * e;
    const uint part = pc.part_w + in_u(ew), n_chunks = in_u(ew + 1u), stride = in_u(ew + 2u), out_w = in_u(ew + 3u);
    const uint head = in_u(ew + 4u);
    float M = NEG;
    for (uint ch = 0u; ch < n_chunks; ch++)
        if (part_f(part + ch * stride + 1u) > 0.0) M = max(M, part_f(part + ch * stride));
    if (M == NEG) {
        for (uint c = gl_LocalInvocationID.x; c < D_V; c += WG_SIZE) down[out_w + c] = 0u;
        return;
    }
    const bool has_sink = pc.sink_w != NONE;
    const float sigma = has_sink ? in_f(pc.sink_w + head) : NEG;
    M = max(M, sigma);
    float den = has_sink ? exp(sigma - M) : 0.0;
    for (uint ch = 0u; ch < n_chunks; ch++) {
        float l = part_f(part + ch * stride + 1u);
        if (l > 0.0) den += exp(part_f(part + ch * stride) - M) * l;
    }
    for (uint c = gl_LocalInvocationID.x; c < D_V; c += WG_SIZE) {
        float o = 0.0;
        for (uint ch = 0u; ch < n_chunks; ch++) {
            uint w = part + ch * stride;
            float l = part_f(w + 1u);
            if (l > 0.0) o += exp(part_f(w) - M) * part_f(w + 2u + c);
        }
        down[out_w + c] = floatBitsToUint(o / den);
    }
}
