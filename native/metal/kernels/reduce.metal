// reduce.metal: the second pass of split-K attention (docs/architecture.md §5), kernels reduce and reduce_mass;
// a port of native/vulkan/shaders/reduce_common.glsl (reduce.comp, reduce_mass.comp). One threadgroup combines
// the chunk partials (m_c, l_c, o_c[D_V]) that attend wrote for one query vector:
//     M = max(max_c m_c, σ),   out = Σ_c e^(m_c - M) o_c / (Σ_c e^(m_c - M) l_c + e^(σ - M)),
// skipping chunks that saw nothing (l_c == 0); a vector no chunk saw outputs zeros, with or without σ.
// Entries (5 words of the inputs): first partial (words from part_w), chunk count, words between chunks, output
// word in down, query head (for σ).
// reduce_mass (STATS = 1) also stores the vector's softmax factors (M, 1 / den), prob_t = e^(s_t - M) / den,
// at stats_w + 2 (row * n_heads_q + head) = stats_w + 2 out_w / D_V for mass.metal.
//
// Instances: reduce (STATS 0) and reduce_mass (STATS 1); no template arguments from the spec.
#include "mtl_kernel.h"
#include "attend.h"

struct reduce_push {
    GOKV_PUSH_REDUCE(PUSH_FIELD)
};

template <uint STATS>
kernel void reduce(MTL_KERNEL_PARAMS) {
    constant reduce_push &pc = *(constant reduce_push *)push_words;
    device uint *in = inputs_of(up, scratch, spec, pc.in_base);
    const uint D_V = spec[GPU_SPEC_D_V], WG = spec[GPU_SPEC_WG_SIZE];
    const uint e = group_id.y * n_groups.x + group_id.x;
    if (e >= pc.n_entries) return;
    const uint ew = pc.entry_w + 5u * e;
    const uint part = pc.part_w + in[ew], n_chunks = in[ew + 1u], stride = in[ew + 2u], out_w = in[ew + 3u];
    const uint head = in[ew + 4u];
    const uint stats = pc.stats_w + 2u * (out_w / D_V);
    float M = NEG;
    for (uint ch = 0u; ch < n_chunks; ch++)
        if (as_type<float>(scratch[part + ch * stride + 1u]) > 0.0f)
            M = max(M, as_type<float>(scratch[part + ch * stride]));
    if (M == NEG) {
        for (uint c = lid; c < D_V; c += WG) down[out_w + c] = 0u;
        if (STATS != 0u && lid == 0u) {
            scratch[stats] = as_type<uint>(NEG);
            scratch[stats + 1u] = as_type<uint>(0.0f);
        }
        return;
    }
    const bool has_sink = pc.sink_w != NONE;
    const float sigma = has_sink ? in_f(in, pc.sink_w + head) : NEG;
    M = max(M, sigma);
    float den = has_sink ? exp(sigma - M) : 0.0f;
    for (uint ch = 0u; ch < n_chunks; ch++) {
        const float l = as_type<float>(scratch[part + ch * stride + 1u]);
        if (l > 0.0f) den += exp(as_type<float>(scratch[part + ch * stride]) - M) * l;
    }
    if (STATS != 0u && lid == 0u) {
        scratch[stats] = as_type<uint>(M);
        scratch[stats + 1u] = as_type<uint>(1.0f / den);
    }
    for (uint c = lid; c < D_V; c += WG) {
        float o = 0.0f;
        for (uint ch = 0u; ch < n_chunks; ch++) {
            const uint w = part + ch * stride;
            const float l = as_type<float>(scratch[w + 1u]);
            if (l > 0.0f) o += exp(as_type<float>(scratch[w]) - M) * as_type<float>(scratch[w + 2u + c]);
        }
        down[out_w + c] = as_type<uint>(o / den);
    }
}

#define MTL_INSTANCES_REDUCE(X) X(reduce, reduce, 0) X(reduce_mass, reduce, 1)
MTL_INSTANCES_REDUCE(MTL_INSTANTIATE)
