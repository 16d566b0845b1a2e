// reduce_common.glsl: the body of reduce.comp and reduce_mass.comp, the second pass of split-K attention
// (docs/architecture.md §5). One workgroup combines the chunk partials (m_c, l_c, o_c[D_V]) that attend.comp
// wrote for one query vector:
//     M = max(max_c m_c, σ),   out = Σ_c e^(m_c - M) o_c / (Σ_c e^(m_c - M) l_c + e^(σ - M)),
// skipping chunks that saw nothing (l_c == 0); a vector no chunk saw outputs zeros, with or without σ.
// Entries (5 words of the inputs): first partial (words from part_w), chunk count, words between chunks, output
// word in down, query head (for σ).
// reduce_mass.comp (REDUCE_MASS) also stores the vector's softmax factors (M, 1 / den), prob_t =
// e^(s_t - M) / den, at stats_w + 2 (row * n_heads_q + head) = stats_w + 2 out_w / D_V for mass.comp
// (attend_common.glsl); reduce.comp, for calls without mass, keeps scratch readonly.
#define GOKV_READ_ONLY_POOL
#define UP_QUAL readonly
#ifndef REDUCE_MASS
#define SCRATCH_QUAL readonly
#endif
#define DOWN_QUAL writeonly
#include "common.glsl"

const uint NONE = 0xffffffffu;
const float NEG = -3.0e38;

#include "gpu_push.h"
PUSH_BLOCK(GOKV_PUSH_REDUCE); // the fields: gpu_push.h

#include "attend_inputs.glsl"

// Stores the softmax factors (a, b) of the entry whose output starts at out_w (REDUCE_MASS only).
void store_stats(uint out_w, float a, float b) {
#ifdef REDUCE_MASS
    if (gl_LocalInvocationID.x == 0u) {
        const uint w = pc.stats_w + 2u * (out_w / D_V);
        scratch[w] = floatBitsToUint(a);
        scratch[w + 1u] = floatBitsToUint(b);
    }
#endif
}

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
        store_stats(out_w, NEG, 0.0);
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
    store_stats(out_w, M, 1.0 / den);
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
