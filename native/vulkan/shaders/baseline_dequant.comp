// baseline_dequant.comp: the first pass of the dequantize-then-attend baseline (GOKV_ATTEND_DEQUANT_BASELINE,
// benchmarks only): expands the visible pages of a call into f32 pages (the layout of an f32 pool of the
// same geometry, V stored separately even for MLA) at the start of the scratch buffer; baseline_attend
// then attends over that copy. Unlike the fused path this materializes every dequantized element, which
// is the point: it is the cost the fused kernels avoid.
// One workgroup per temporary page (grid x, y); its entry (5 words of the inputs): source page, first position,
// tokens to expand, residual slot (KIVI), the sequence's quantized length (KIVI: later positions are in
// the ring).
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 28) in;
#define GOKV_READ_ONLY_POOL
#define UP_QUAL readonly
#include "common.glsl"

#include "gpu_push.h"
PUSH_BLOCK(GOKV_PUSH_DEQUANT); // the fields: gpu_push.h

#include "attend_inputs.glsl"

void main() {
    const uint tp = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (tp >= pc.n_pages) return;
    const uint ew = pc.entry_w + 5u * tp;
    const uint page = in_u(ew), start = in_u(ew + 1u), n = in_u(ew + 2u), rs = in_u(ew + 3u), n_quant = in_u(ew + 4u);
    const uint base = tp * pc.f_page_w, row = D_K + D_V;
    for (uint x = gl_LocalInvocationID.x; x < N_KV_HEADS * n * row; x += WG_SIZE) {
        uint h = x / (n * row), r = x % (n * row), slot = r / row, c = r % row;
        uint t = start + slot;
        bool ring = KIVI != 0u && t >= n_quant;
        if (c < D_K) {
            float k = ring ? ring_key(rs, t, h, c) : key_elem(page, h, slot, c);
            scratch[base + h * pc.f_head_w + slot * D_K + c] = floatBitsToUint(k);
        } else {
            c -= D_K;
            float v = ring ? ring_value(rs, t, h, c) : value_elem(page, h, slot, c);
            scratch[base + h * pc.f_head_w + pc.f_v_w + slot * D_V + c] = floatBitsToUint(v);
        }
    }
}
