// baseline_dequant.metal: the first pass of the dequantize-then-attend baseline (GOKV_ATTEND_DEQUANT_BASELINE,
// benchmarks only): expands the visible pages of a call into f32 pages (the layout of an f32 pool of the same
// geometry, V stored separately even for MLA) at the start of the scratch buffer; baseline_attend then attends
// over that copy. Unlike the fused path this materializes every dequantized element, which is the point: it is
// the cost the fused kernels avoid. A port of native/vulkan/shaders/baseline_dequant.comp; the elements are
// common.h's (x = q·s + b unfused, as every pool read).
// One threadgroup per temporary page (grid x, y); its entry (5 words of the inputs): source page, first
// position, tokens to expand, residual slot (KIVI), the sequence's quantized length (KIVI: later positions are
// in the ring).
//
// One instance, baseline_dequant: every constant is a runtime spec word.
#include "mtl_kernel.h"
#include "common.h"

struct dequant_push {
    GOKV_PUSH_DEQUANT(PUSH_FIELD)
};

template <typename = void>
kernel void baseline_dequant(MTL_KERNEL_PARAMS) {
    constant dequant_push &pc = *(constant dequant_push *)push_words;
    const kv_pool kv = kv_pool_of(pages, rings, spec);
    device uint *in = inputs_of(up, scratch, spec, pc.in_base);
    const uint tp = group_id.y * n_groups.x + group_id.x;
    if (tp >= pc.n_pages) return;
    const uint ew = pc.entry_w + 5u * tp;
    const uint page = in[ew], start = in[ew + 1u], n = in[ew + 2u], rs = in[ew + 3u], n_quant = in[ew + 4u];
    const uint base = tp * pc.f_page_w, D_K = kv.D_K, D_V = kv.D_V, row = D_K + D_V;
    for (uint x = lid; x < kv.N_KV_HEADS * n * row; x += kv.WG_SIZE) {
        const uint h = x / (n * row), r = x % (n * row), slot = r / row;
        uint c = r % row;
        const uint t = start + slot;
        const bool ring = kv.KIVI != 0u && t >= n_quant;
        if (c < D_K) {
            const float k = ring ? ring_key(kv, rs, t, h, c) : key_elem(kv, page, h, slot, c);
            scratch[base + h * pc.f_head_w + slot * D_K + c] = as_type<uint>(k);
        } else {
            c -= D_K;
            const float v = ring ? ring_value(kv, rs, t, h, c) : value_elem(kv, page, h, slot, c);
            scratch[base + h * pc.f_head_w + pc.f_v_w + slot * D_V + c] = as_type<uint>(v);
        }
    }
}

#define MTL_INSTANCES_BASELINE_DEQUANT(X) X(baseline_dequant, baseline_dequant)
MTL_INSTANCES_BASELINE_DEQUANT(MTL_INSTANTIATE)
