/*
 * mtl_store_variants.h: the store and Quest kernels' instances (mtl_variants.h): store_rows, store_kivi_keys,
 * store_ring, store_read, store_bounds, quest_score, quest_select (kernels/store_*.metal, quest_*.metal).
 *
 * None of them needs a value at compile time: they read every GPU_SPEC_* word at run time, so each has one
 * instance, named as the kernel, and no template arguments. Only quest_select takes threadgroup memory:
 * its radix select's hist[256], sel_state[3] and sg_sum[NSG_MAX] (quest_select.metal), NSG_MAX being the
 * plan's GPU_SPEC_OP2, the most simdgroups a threadgroup may be cut into (ceil(WG_SIZE / the smallest
 * simdgroup size)); where a spec leaves it 0, the worst case, one thread per simdgroup, is taken. Metal
 * wants a threadgroup memory length that is a multiple of 16 bytes, so the words are rounded up to 4.
 */
#ifndef GOKV_MTL_STORE_VARIANTS_H
#define GOKV_MTL_STORE_VARIANTS_H

#include <stdint.h>
#include <string.h>

#include "gpu_plan.h"
#include "mtl_variants.h"

static inline int mtl_variant_store(const char *name, const uint32_t spec[GPU_SPEC_COUNT], uint32_t targs[MTL_MAX_TARGS],
                                    uint32_t *tg_words) {
    static const char *const kernels[] = {"store_rows",   "store_kivi_keys", "store_ring", "store_read",
                                          "store_bounds", "quest_score",     "quest_select"};
    int known = 0;
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        if (strcmp(name, kernels[i]) == 0) known = 1;
    if (!known) return -1;
    (void)targs;
    *tg_words = 0;
    if (strcmp(name, "quest_select") == 0) {
        const uint32_t nsg_max = spec[GPU_SPEC_OP2] ? spec[GPU_SPEC_OP2] : spec[GPU_SPEC_WG_SIZE];
        *tg_words = (256u + nsg_max + 3u + 3u) & ~3u;
    }
    return 0;
}

#endif
