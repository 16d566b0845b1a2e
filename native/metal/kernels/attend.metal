// attend.metal: fused split-K decode and prefill attention over the pool's compressed pages
// (docs/architecture.md §5); the algorithm is attend.h's (a port of native/vulkan/shaders/attend.comp and
// attend_common.glsl), the work items native/gpu/gpu_attend.c's. One threadgroup per work item (grid x, y).
//
// Instances: attend_<NQ>_<CPI>_<UPI> (native/gpu/gpu_variants.c picks one for a spec): NQ and UPI powers of two,
// NQ <= 64, CPI <= 16, UPI <= 8, NQ·CPI <= 64, CPI·UPI <= 16 and NQ·CPI·UPI <= 128 (the accumulators a thread
// holds); every request of the plan with 128-thread threadgroups falls in that set.
#include "mtl_kernel.h"
#include "attend.h"

template <uint NQ, uint CPI, uint UPI>
kernel void attend(MTL_KERNEL_PARAMS) {
    const uint item = group_id.y * n_groups.x + group_id.x;
    attend_main<NQ, CPI, UPI>(pages, rings, up, scratch, down, push_words, spec, tg, item, lid, sg_id, n_sg, lane,
                              false);
}

#define MTL_INSTANCES_ATTEND(X) \
    X(attend_1_1_1, attend, 1, 1, 1) X(attend_1_1_2, attend, 1, 1, 2) X(attend_1_1_4, attend, 1, 1, 4) \
    X(attend_1_1_8, attend, 1, 1, 8) X(attend_1_2_1, attend, 1, 2, 1) X(attend_1_2_2, attend, 1, 2, 2) \
    X(attend_1_2_4, attend, 1, 2, 4) X(attend_1_2_8, attend, 1, 2, 8) X(attend_1_4_1, attend, 1, 4, 1) \
    X(attend_1_4_2, attend, 1, 4, 2) X(attend_1_4_4, attend, 1, 4, 4) X(attend_1_8_1, attend, 1, 8, 1) \
    X(attend_1_8_2, attend, 1, 8, 2) X(attend_1_16_1, attend, 1, 16, 1) X(attend_2_1_1, attend, 2, 1, 1) \
    X(attend_2_1_2, attend, 2, 1, 2) X(attend_2_1_4, attend, 2, 1, 4) X(attend_2_1_8, attend, 2, 1, 8) \
    X(attend_2_2_1, attend, 2, 2, 1) X(attend_2_2_2, attend, 2, 2, 2) X(attend_2_2_4, attend, 2, 2, 4) \
    X(attend_2_2_8, attend, 2, 2, 8) X(attend_2_4_1, attend, 2, 4, 1) X(attend_2_4_2, attend, 2, 4, 2) \
    X(attend_2_4_4, attend, 2, 4, 4) X(attend_2_8_1, attend, 2, 8, 1) X(attend_2_8_2, attend, 2, 8, 2) \
    X(attend_2_16_1, attend, 2, 16, 1) X(attend_4_1_1, attend, 4, 1, 1) X(attend_4_1_2, attend, 4, 1, 2) \
    X(attend_4_1_4, attend, 4, 1, 4) X(attend_4_1_8, attend, 4, 1, 8) X(attend_4_2_1, attend, 4, 2, 1) \
    X(attend_4_2_2, attend, 4, 2, 2) X(attend_4_2_4, attend, 4, 2, 4) X(attend_4_2_8, attend, 4, 2, 8) \
    X(attend_4_4_1, attend, 4, 4, 1) X(attend_4_4_2, attend, 4, 4, 2) X(attend_4_4_4, attend, 4, 4, 4) \
    X(attend_4_8_1, attend, 4, 8, 1) X(attend_4_8_2, attend, 4, 8, 2) X(attend_4_16_1, attend, 4, 16, 1) \
    X(attend_8_1_1, attend, 8, 1, 1) X(attend_8_1_2, attend, 8, 1, 2) X(attend_8_1_4, attend, 8, 1, 4) \
    X(attend_8_1_8, attend, 8, 1, 8) X(attend_8_2_1, attend, 8, 2, 1) X(attend_8_2_2, attend, 8, 2, 2) \
    X(attend_8_2_4, attend, 8, 2, 4) X(attend_8_2_8, attend, 8, 2, 8) X(attend_8_4_1, attend, 8, 4, 1) \
    X(attend_8_4_2, attend, 8, 4, 2) X(attend_8_4_4, attend, 8, 4, 4) X(attend_8_8_1, attend, 8, 8, 1) \
    X(attend_8_8_2, attend, 8, 8, 2) X(attend_16_1_1, attend, 16, 1, 1) X(attend_16_1_2, attend, 16, 1, 2) \
    X(attend_16_1_4, attend, 16, 1, 4) X(attend_16_1_8, attend, 16, 1, 8) X(attend_16_2_1, attend, 16, 2, 1) \
    X(attend_16_2_2, attend, 16, 2, 2) X(attend_16_2_4, attend, 16, 2, 4) X(attend_16_4_1, attend, 16, 4, 1) \
    X(attend_16_4_2, attend, 16, 4, 2) X(attend_32_1_1, attend, 32, 1, 1) X(attend_32_1_2, attend, 32, 1, 2) \
    X(attend_32_1_4, attend, 32, 1, 4) X(attend_32_2_1, attend, 32, 2, 1) X(attend_32_2_2, attend, 32, 2, 2) \
    X(attend_64_1_1, attend, 64, 1, 1) X(attend_64_1_2, attend, 64, 1, 2)
MTL_INSTANCES_ATTEND(MTL_INSTANTIATE)
