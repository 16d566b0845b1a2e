// baseline_dequant.hpp: the first pass of the dequantize-then-attend baseline (GOKV_ATTEND_DEQUANT_BASELINE,
// benchmarks only): expands the visible pages of a call into f32 pages (the layout of an f32 pool of the same
// geometry, V stored separately even for MLA) at the start of the scratch buffer; baseline_attend then attends
// over that copy. Unlike the fused path this materializes every dequantized element, which is the point: it is
// the cost the fused kernels avoid. A port of native/metal/kernels/baseline_dequant.metal; the elements are
// common.hpp's (x = q·s + b, rounded as every pool read).
// One work-group per temporary page (the plan's grid x, y); its entry (5 words of the inputs): source page,
// first position, tokens to expand, residual slot (KIVI), the sequence's quantized length (KIVI: later
// positions are in the ring).
//
// One instance, baseline_dequant: every constant is a runtime spec word; no local memory.
#ifndef GOKV_SYCL_BASELINE_DEQUANT_HPP
#define GOKV_SYCL_BASELINE_DEQUANT_HPP

#include "common.hpp"

namespace gokv_sycl {

struct dequant_push {
    GOKV_PUSH_DEQUANT(PUSH_FIELD)
};

struct baseline_dequant_kernel {
    args a;
    local_words tg;
    void operator()(sycl::nd_item<3> it) const {
        const dequant_push pc = push_of<dequant_push>(a);
        const kv_pool kv = kv_pool_of(a.pages, a.rings, a.spec);
        const uint32_t *in = inputs_of(a.up, a.scratch, a.spec, pc.in_base);
        uint32_t *scratch = a.scratch;
        const uint32_t lid = uint32_t(it.get_local_linear_id());
        const uint32_t tp = plan_workgroup(it);
        if (tp >= pc.n_pages) return;
        const uint32_t ew = pc.entry_w + 5u * tp;
        const uint32_t page = in[ew], start = in[ew + 1u], n = in[ew + 2u], rs = in[ew + 3u], n_quant = in[ew + 4u];
        const uint32_t base = tp * pc.f_page_w, D_K = kv.D_K, D_V = kv.D_V, row = D_K + D_V;
        for (uint32_t x = lid; x < kv.N_KV_HEADS * n * row; x += kv.WG_SIZE) {
            const uint32_t h = x / (n * row), r = x % (n * row), slot = r / row;
            uint32_t c = r % row;
            const uint32_t t = start + slot;
            const bool ring = kv.KIVI != 0u && t >= n_quant;
            if (c < D_K) {
                const float k = ring ? ring_key(kv, rs, t, h, c) : key_elem(kv, page, h, slot, c);
                scratch[base + h * pc.f_head_w + slot * D_K + c] = sycl::bit_cast<uint32_t>(k);
            } else {
                c -= D_K;
                const float v = ring ? ring_value(kv, rs, t, h, c) : value_elem(kv, page, h, slot, c);
                scratch[base + h * pc.f_head_w + pc.f_v_w + slot * D_V + c] = sycl::bit_cast<uint32_t>(v);
            }
        }
    }
};

} // namespace gokv_sycl

#define GOKV_SYCL_INSTANCES_BASELINE_DEQUANT(X) X(baseline_dequant, gokv_sycl::baseline_dequant_kernel)
GOKV_SYCL_INSTANCES_BASELINE_DEQUANT(GOKV_SYCL_DECLARE_INSTANCE)

#endif
