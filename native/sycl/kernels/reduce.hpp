// reduce.hpp: the second pass of split-K attention (docs/architecture.md §5), kernels reduce and reduce_mass;
// a port of native/metal/kernels/reduce.metal (reduce_common.glsl of the Vulkan module). One work-group
// combines the chunk partials (m_c, l_c, o_c[D_V]) that attend wrote for one query vector:
//     M = max(max_c m_c, σ),   out = Σ_c e^(m_c - M) o_c / (Σ_c e^(m_c - M) l_c + e^(σ - M)),
// skipping chunks that saw nothing (l_c == 0); a vector no chunk saw outputs zeros, with or without σ.
// Entries (5 words of the inputs): first partial (words from part_w), chunk count, words between chunks, output
// word in down, query head (for σ).
// reduce_mass (STATS = 1) also stores the vector's softmax factors (M, 1 / den), prob_t = e^(s_t - M) / den,
// at stats_w + 2 (row * n_heads_q + head) = stats_w + 2 out_w / D_V for mass.hpp.
//
// Instances: reduce (STATS 0) and reduce_mass (STATS 1); no template arguments from the spec, no local memory.
#ifndef GOKV_SYCL_REDUCE_HPP
#define GOKV_SYCL_REDUCE_HPP

#include "attend_common.hpp"

namespace gokv_sycl {

struct reduce_push {
    GOKV_PUSH_REDUCE(PUSH_FIELD)
};

template <uint32_t STATS> struct reduce_kernel {
    args a;
    local_words tg;
    void operator()(sycl::nd_item<3> it) const {
        const reduce_push pc = push_of<reduce_push>(a);
        const uint32_t *in = inputs_of(a.up, a.scratch, a.spec, pc.in_base);
        uint32_t *scratch = a.scratch, *down = a.down;
        const uint32_t D_V = a.spec[GPU_SPEC_D_V], WG = a.spec[GPU_SPEC_WG_SIZE];
        const uint32_t lid = uint32_t(it.get_local_linear_id());
        const uint32_t e = plan_workgroup(it);
        if (e >= pc.n_entries) return;
        const uint32_t ew = pc.entry_w + 5u * e;
        const uint32_t part = pc.part_w + in[ew], n_chunks = in[ew + 1u], stride = in[ew + 2u], out_w = in[ew + 3u];
        const uint32_t head = in[ew + 4u];
        const uint32_t stats = pc.stats_w + 2u * (out_w / D_V);
        float M = NEG;
        for (uint32_t ch = 0u; ch < n_chunks; ch++)
            if (sycl::bit_cast<float>(scratch[part + ch * stride + 1u]) > 0.0f)
                M = sycl::fmax(M, sycl::bit_cast<float>(scratch[part + ch * stride]));
        if (M == NEG) {
            for (uint32_t c = lid; c < D_V; c += WG) down[out_w + c] = 0u;
            if (STATS != 0u && lid == 0u) {
                scratch[stats] = sycl::bit_cast<uint32_t>(NEG);
                scratch[stats + 1u] = sycl::bit_cast<uint32_t>(0.0f);
            }
            return;
        }
        const bool has_sink = pc.sink_w != NONE;
        const float sigma = has_sink ? in_f(in, pc.sink_w + head) : NEG;
        M = sycl::fmax(M, sigma);
        float den = has_sink ? sycl::exp(sigma - M) : 0.0f;
        for (uint32_t ch = 0u; ch < n_chunks; ch++) {
            const float l = sycl::bit_cast<float>(scratch[part + ch * stride + 1u]);
            if (l > 0.0f) den += sycl::exp(sycl::bit_cast<float>(scratch[part + ch * stride]) - M) * l;
        }
        if (STATS != 0u && lid == 0u) {
            scratch[stats] = sycl::bit_cast<uint32_t>(M);
            scratch[stats + 1u] = sycl::bit_cast<uint32_t>(1.0f / den);
        }
        for (uint32_t c = lid; c < D_V; c += WG) {
            float o = 0.0f;
            for (uint32_t ch = 0u; ch < n_chunks; ch++) {
                const uint32_t w = part + ch * stride;
                const float l = sycl::bit_cast<float>(scratch[w + 1u]);
                if (l > 0.0f)
                    o += sycl::exp(sycl::bit_cast<float>(scratch[w]) - M) * sycl::bit_cast<float>(scratch[w + 2u + c]);
            }
            down[out_w + c] = sycl::bit_cast<uint32_t>(o / den);
        }
    }
};

} // namespace gokv_sycl

#define GOKV_SYCL_INSTANCES_REDUCE(X) X(reduce, gokv_sycl::reduce_kernel<0>) X(reduce_mass, gokv_sycl::reduce_kernel<1>)
GOKV_SYCL_INSTANCES_REDUCE(GOKV_SYCL_DECLARE_INSTANCE)

#endif
