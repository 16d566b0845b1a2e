// emu_test.metal: small kernels for the emulator's own tests (test_emu_launch.cc), written as the module's
// kernels are (MTL_KERNEL_PARAMS, an MTL_INSTANCES list) and compiled the same way.
//
// group_sum: each threadgroup sums n values of up (push word 0: n) through simd_sum and threadgroup memory,
// and writes its sum to down[group]: float, one value per thread of a grid-stride over the group's share.
// Template: the words of threadgroup memory it uses (one per simdgroup).
// broken_*: the mistakes the emulator must report (push word 0 picks the thread that misbehaves).
#include "mtl_kernel.h"

template <uint NSG>
kernel void group_sum(MTL_KERNEL_PARAMS) {
    const uint n = push_words[0];
    const uint g = group_id.y * n_groups.x + group_id.x;
    const uint i = g * wg_dims.x + lid;
    float x = i < n ? as_type<float>(up[i]) : 0.0f;
    float s = simd_sum(x);
    threadgroup float *part = (threadgroup float *)tg;
    if (lane == 0) part[sg_id] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (lid == 0) {
        float total = 0.0f;
        for (uint k = 0; k < n_sg && k < NSG; k++) total += part[k];
        down[g] = as_type<uint>(total);
    }
    (void)pages, (void)rings, (void)scratch, (void)spec, (void)sg_size;
}

// A thread returns before the barrier the others wait at.
template <typename = void>
kernel void broken_barrier(MTL_KERNEL_PARAMS) {
    if (lid == push_words[0]) return;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    down[lid] = 1u;
}

// One lane of a simdgroup skips the reduction.
template <typename = void>
kernel void broken_simd(MTL_KERNEL_PARAMS) {
    float s = 0.0f;
    if (lid != push_words[0]) s = simd_sum(1.0f);
    down[lid] = as_type<uint>(s);
}

// Threads of one group wait at two different barriers.
template <typename = void>
kernel void broken_divergent(MTL_KERNEL_PARAMS) {
    if (lid < push_words[0]) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    } else {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    down[lid] = 2u;
}

#define MTL_INSTANCES_EMU_TEST(X)                                                                           \
    X(group_sum_4, group_sum, 4)                                                                            \
    X(broken_barrier, broken_barrier)                                                                       \
    X(broken_simd, broken_simd)                                                                             \
    X(broken_divergent, broken_divergent)
MTL_INSTANCES_EMU_TEST(MTL_INSTANTIATE)
