/*
 * mtl_attend_variants.h: the attention family's instances (mtl_variants.h): attend, baseline_attend,
 * mass_keys, reduce, reduce_mass, baseline_dequant, mass (kernels/attend.metal, baseline_attend.metal,
 * mass_keys.metal, reduce.metal, baseline_dequant.metal, mass.metal; the algorithm in kernels/attend.h).
 *
 * attend, baseline_attend: <NQ, CPI, UPI>, the register arrays of a thread. NQ holds the plan's NQ_MAX query
 * vectors (GPU_SPEC_OP0), rounded up to a power of two; CPI is the plan's value channels per unit (OP1);
 * UPI the value units a thread owns, ceil(D_V / CPI / WG_SIZE), rounded up to a power of two. The instances
 * are every such triple with NQ <= 64, CPI <= 16, UPI <= 8, NQ·CPI <= 64, CPI·UPI <= 16 and NQ·CPI·UPI <= 128,
 * which holds whatever the plan asks of 128-thread threadgroups (its NQ_LIMIT, ACC_BUDGET and pick_cpi keep
 * NQ_MAX·CPI·units <= 64 before rounding). A spec outside them (much smaller threadgroups) still gets its
 * instance's name, which the kernel lists lack: the module's lookup then fails naming it.
 * Threadgroup memory (attend.h's attend_layout_of, for the spec's NQ_MAX, not the rounded one):
 *     NQ_MAX (max(D_K, D_V) + WG_SIZE + 2 NSG_MAX + 3 + Q4G) + 4 WG_SIZE + NSG_MAX words,
 * NSG_MAX = OP2, Q4G = D_K / GROUP for q4 pools (the per-group query sums of the pre-divided q4 dot product),
 * else 0. That is the plan's shared_bytes (gpu_attend.c) plus NSG_MAX + NQ_MAX·Q4G words, which a Metal
 * module's shared_budget has to leave free.
 * mass_keys: <NQ> as above; NQ_MAX (D_K + Q4G) words.
 * reduce, reduce_mass, baseline_dequant, mass: one instance each, no template arguments, no threadgroup memory.
 * Words are rounded up to a multiple of 4 (Metal wants threadgroup memory lengths in 16-byte steps).
 */
#ifndef GOKV_MTL_ATTEND_VARIANTS_H
#define GOKV_MTL_ATTEND_VARIANTS_H

#include <stdint.h>
#include <string.h>

#include "gpu_plan.h"
#include "mtl_variants.h"

static inline uint32_t mtl_attend_pow2(uint32_t x) {
    uint32_t n = 1;
    while (n < x && n < 0x80000000u) n <<= 1;
    return n;
}

/* Groups of a q4 key row the pre-divided query sums over (attend.h's q4_groups), else 0. */
static inline uint32_t mtl_attend_q4_groups(const uint32_t spec[GPU_SPEC_COUNT]) {
    const uint32_t g = spec[GPU_SPEC_GROUP];
    return spec[GPU_SPEC_FORMAT] == GOKV_FORMAT_Q4 && g ? spec[GPU_SPEC_D_K] / g : 0u;
}

static inline int mtl_variant_attend(const char *name, const uint32_t spec[GPU_SPEC_COUNT],
                                     uint32_t targs[MTL_MAX_TARGS], uint32_t *tg_words) {
    const uint32_t nq_max = spec[GPU_SPEC_OP0] ? spec[GPU_SPEC_OP0] : 1u, wg = spec[GPU_SPEC_WG_SIZE];
    const uint32_t d_k = spec[GPU_SPEC_D_K], d_v = spec[GPU_SPEC_D_V], nsg = spec[GPU_SPEC_OP2];
    const uint32_t q4g = mtl_attend_q4_groups(spec);
    *tg_words = 0;
    if (strcmp(name, "attend") == 0 || strcmp(name, "baseline_attend") == 0) {
        const uint32_t cpi = spec[GPU_SPEC_OP1] ? spec[GPU_SPEC_OP1] : 1u;
        const uint32_t nu = d_v / cpi, upi = wg ? (nu + wg - 1u) / wg : 0u;
        targs[0] = mtl_attend_pow2(nq_max);
        targs[1] = cpi;
        targs[2] = mtl_attend_pow2(upi ? upi : 1u);
        const uint32_t dmax = d_k > d_v ? d_k : d_v;
        const uint32_t words = nq_max * (dmax + wg + 2u * nsg + 3u + q4g) + 4u * wg + nsg;
        *tg_words = (words + 3u) & ~3u;
        return 3;
    }
    if (strcmp(name, "mass_keys") == 0) {
        targs[0] = mtl_attend_pow2(nq_max);
        *tg_words = (nq_max * (d_k + q4g) + 3u) & ~3u;
        return 1;
    }
    if (strcmp(name, "reduce") == 0 || strcmp(name, "reduce_mass") == 0 || strcmp(name, "baseline_dequant") == 0 ||
        strcmp(name, "mass") == 0)
        return 0;
    return -1;
}

#endif
