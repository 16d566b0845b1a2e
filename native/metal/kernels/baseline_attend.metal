// baseline_attend.metal: the attention of the dequantize-then-attend baseline (GOKV_ATTEND_DEQUANT_BASELINE,
// benchmarks only): attend.h over an f32 pool (the spec is the f32 layout of the same geometry) whose pages
// baseline_dequant.metal materialized at the start of the scratch buffer; a port of
// native/vulkan/shaders/baseline_attend.comp. The same instances as attend.metal
// (baseline_attend_<NQ>_<CPI>_<UPI>).
#include "mtl_kernel.h"
#include "attend.h"

template <uint NQ, uint CPI, uint UPI>
kernel void baseline_attend(MTL_KERNEL_PARAMS) {
    const uint item = group_id.y * n_groups.x + group_id.x;
    attend_main<NQ, CPI, UPI>(pages, rings, up, scratch, down, push_words, spec, tg, item, lid, sg_id, n_sg, lane,
                              true);
}

#define MTL_INSTANCES_BASELINE_ATTEND(X) \
    X(baseline_attend_1_1_1, baseline_attend, 1, 1, 1) X(baseline_attend_1_1_2, baseline_attend, 1, 1, 2) \
    X(baseline_attend_1_1_4, baseline_attend, 1, 1, 4) X(baseline_attend_1_1_8, baseline_attend, 1, 1, 8) \
    X(baseline_attend_1_2_1, baseline_attend, 1, 2, 1) X(baseline_attend_1_2_2, baseline_attend, 1, 2, 2) \
    X(baseline_attend_1_2_4, baseline_attend, 1, 2, 4) X(baseline_attend_1_2_8, baseline_attend, 1, 2, 8) \
    X(baseline_attend_1_4_1, baseline_attend, 1, 4, 1) X(baseline_attend_1_4_2, baseline_attend, 1, 4, 2) \
    X(baseline_attend_1_4_4, baseline_attend, 1, 4, 4) X(baseline_attend_1_8_1, baseline_attend, 1, 8, 1) \
    X(baseline_attend_1_8_2, baseline_attend, 1, 8, 2) X(baseline_attend_1_16_1, baseline_attend, 1, 16, 1) \
    X(baseline_attend_2_1_1, baseline_attend, 2, 1, 1) X(baseline_attend_2_1_2, baseline_attend, 2, 1, 2) \
    X(baseline_attend_2_1_4, baseline_attend, 2, 1, 4) X(baseline_attend_2_1_8, baseline_attend, 2, 1, 8) \
    X(baseline_attend_2_2_1, baseline_attend, 2, 2, 1) X(baseline_attend_2_2_2, baseline_attend, 2, 2, 2) \
    X(baseline_attend_2_2_4, baseline_attend, 2, 2, 4) X(baseline_attend_2_2_8, baseline_attend, 2, 2, 8) \
    X(baseline_attend_2_4_1, baseline_attend, 2, 4, 1) X(baseline_attend_2_4_2, baseline_attend, 2, 4, 2) \
    X(baseline_attend_2_4_4, baseline_attend, 2, 4, 4) X(baseline_attend_2_8_1, baseline_attend, 2, 8, 1) \
    X(baseline_attend_2_8_2, baseline_attend, 2, 8, 2) X(baseline_attend_2_16_1, baseline_attend, 2, 16, 1) \
    X(baseline_attend_4_1_1, baseline_attend, 4, 1, 1) X(baseline_attend_4_1_2, baseline_attend, 4, 1, 2) \
    X(baseline_attend_4_1_4, baseline_attend, 4, 1, 4) X(baseline_attend_4_1_8, baseline_attend, 4, 1, 8) \
    X(baseline_attend_4_2_1, baseline_attend, 4, 2, 1) X(baseline_attend_4_2_2, baseline_attend, 4, 2, 2) \
    X(baseline_attend_4_2_4, baseline_attend, 4, 2, 4) X(baseline_attend_4_2_8, baseline_attend, 4, 2, 8) \
    X(baseline_attend_4_4_1, baseline_attend, 4, 4, 1) X(baseline_attend_4_4_2, baseline_attend, 4, 4, 2) \
    X(baseline_attend_4_4_4, baseline_attend, 4, 4, 4) X(baseline_attend_4_8_1, baseline_attend, 4, 8, 1) \
    X(baseline_attend_4_8_2, baseline_attend, 4, 8, 2) X(baseline_attend_4_16_1, baseline_attend, 4, 16, 1) \
    X(baseline_attend_8_1_1, baseline_attend, 8, 1, 1) X(baseline_attend_8_1_2, baseline_attend, 8, 1, 2) \
    X(baseline_attend_8_1_4, baseline_attend, 8, 1, 4) X(baseline_attend_8_1_8, baseline_attend, 8, 1, 8) \
    X(baseline_attend_8_2_1, baseline_attend, 8, 2, 1) X(baseline_attend_8_2_2, baseline_attend, 8, 2, 2) \
    X(baseline_attend_8_2_4, baseline_attend, 8, 2, 4) X(baseline_attend_8_2_8, baseline_attend, 8, 2, 8) \
    X(baseline_attend_8_4_1, baseline_attend, 8, 4, 1) X(baseline_attend_8_4_2, baseline_attend, 8, 4, 2) \
    X(baseline_attend_8_4_4, baseline_attend, 8, 4, 4) X(baseline_attend_8_8_1, baseline_attend, 8, 8, 1) \
    X(baseline_attend_8_8_2, baseline_attend, 8, 8, 2) X(baseline_attend_16_1_1, baseline_attend, 16, 1, 1) \
    X(baseline_attend_16_1_2, baseline_attend, 16, 1, 2) X(baseline_attend_16_1_4, baseline_attend, 16, 1, 4) \
    X(baseline_attend_16_1_8, baseline_attend, 16, 1, 8) X(baseline_attend_16_2_1, baseline_attend, 16, 2, 1) \
    X(baseline_attend_16_2_2, baseline_attend, 16, 2, 2) X(baseline_attend_16_2_4, baseline_attend, 16, 2, 4) \
    X(baseline_attend_16_4_1, baseline_attend, 16, 4, 1) X(baseline_attend_16_4_2, baseline_attend, 16, 4, 2) \
    X(baseline_attend_32_1_1, baseline_attend, 32, 1, 1) X(baseline_attend_32_1_2, baseline_attend, 32, 1, 2) \
    X(baseline_attend_32_1_4, baseline_attend, 32, 1, 4) X(baseline_attend_32_2_1, baseline_attend, 32, 2, 1) \
    X(baseline_attend_32_2_2, baseline_attend, 32, 2, 2) X(baseline_attend_64_1_1, baseline_attend, 64, 1, 1) \
    X(baseline_attend_64_1_2, baseline_attend, 64, 1, 2)
MTL_INSTANCES_BASELINE_ATTEND(MTL_INSTANTIATE)
