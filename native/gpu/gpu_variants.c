/*
 * gpu_variants.c: which compiled instance of a kernel runs a pipeline request of the plan (a kernel name and
 * its GPU_SPEC_* words), and the local (threadgroup) memory it needs: for the modules whose kernel languages
 * have no specialization constants (Metal, SYCL), where what sizes a thread's register arrays is a template
 * parameter. Every module's kernels follow the same algorithms and local memory layouts (ports of one
 * another), so one answer serves them all. Words are rounded up to a multiple of 4 (Metal wants threadgroup
 * memory lengths in 16-byte steps).
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
 * else 0. That is the plan's shared_bytes (gpu_attend.c) plus NSG_MAX + NQ_MAX·Q4G words, which a module's
 * shared_budget has to leave free.
 * mass_keys: <NQ> as above; NQ_MAX (D_K + Q4G) words.
 * reduce, reduce_mass, baseline_dequant, mass: one instance each, no template arguments, no threadgroup memory.
 *
 * store_rows, store_kivi_keys, store_ring, store_read, store_bounds, quest_score, quest_select:
 * None of them needs a value at compile time: they read every GPU_SPEC_* word at run time, so each has one
 * instance, named as the kernel, and no template arguments. Only quest_select takes threadgroup memory:
 * its radix select's hist[256], sel_state[3] and sg_sum[NSG_MAX] (quest_select), NSG_MAX being the
 * plan's GPU_SPEC_OP2, the most simdgroups a threadgroup may be cut into (ceil(WG_SIZE / the smallest
 * simdgroup size)); where a spec leaves it 0, the worst case, one thread per simdgroup, is taken.
 */
#include <stdio.h>
#include <string.h>

#include "gpu_plan.h"

enum { MAX_TARGS = 4 };

static uint32_t pow2_at_least(uint32_t x) {
    uint32_t n = 1;
    while (n < x && n < 0x80000000u) n <<= 1;
    return n;
}

/* Groups of a q4 key row the pre-divided query sums over (attend.h's q4_groups), else 0. */
static uint32_t q4_groups(const uint32_t spec[GPU_SPEC_COUNT]) {
    const uint32_t g = spec[GPU_SPEC_GROUP];
    return spec[GPU_SPEC_FORMAT] == GOKV_FORMAT_Q4 && g ? spec[GPU_SPEC_D_K] / g : 0u;
}

static int attend_family(const char *name, const uint32_t spec[GPU_SPEC_COUNT],
                                     uint32_t targs[MAX_TARGS], uint32_t *tg_words) {
    const uint32_t nq_max = spec[GPU_SPEC_OP0] ? spec[GPU_SPEC_OP0] : 1u, wg = spec[GPU_SPEC_WG_SIZE];
    const uint32_t d_k = spec[GPU_SPEC_D_K], d_v = spec[GPU_SPEC_D_V], nsg = spec[GPU_SPEC_OP2];
    const uint32_t q4g = q4_groups(spec);
    *tg_words = 0;
    if (strcmp(name, "attend") == 0 || strcmp(name, "baseline_attend") == 0) {
        const uint32_t cpi = spec[GPU_SPEC_OP1] ? spec[GPU_SPEC_OP1] : 1u;
        const uint32_t nu = d_v / cpi, upi = wg ? (nu + wg - 1u) / wg : 0u;
        targs[0] = pow2_at_least(nq_max);
        targs[1] = cpi;
        targs[2] = pow2_at_least(upi ? upi : 1u);
        const uint32_t dmax = d_k > d_v ? d_k : d_v;
        const uint32_t words = nq_max * (dmax + wg + 2u * nsg + 3u + q4g) + 4u * wg + nsg;
        *tg_words = (words + 3u) & ~3u;
        return 3;
    }
    if (strcmp(name, "mass_keys") == 0) {
        targs[0] = pow2_at_least(nq_max);
        *tg_words = (nq_max * (d_k + q4g) + 3u) & ~3u;
        return 1;
    }
    if (strcmp(name, "reduce") == 0 || strcmp(name, "reduce_mass") == 0 || strcmp(name, "baseline_dequant") == 0 ||
        strcmp(name, "mass") == 0)
        return 0;
    return -1;
}

static int store_family(const char *name, const uint32_t spec[GPU_SPEC_COUNT], uint32_t targs[MAX_TARGS],
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

gokv_status gpu_kernel_instance(const gpu_device *d, const char *name, const uint32_t spec[GPU_SPEC_COUNT],
                                char instance[GPU_MAX_NAME], uint32_t *local_words) {
    uint32_t targs[MAX_TARGS] = {0};
    *local_words = 0;
    int n = attend_family(name, spec, targs, local_words);
    if (n < 0) n = store_family(name, spec, targs, local_words);
    if (n < 0) return gokv_set_error(GOKV_ENOTSUP, "%s: no kernel named \"%s\"", d->backend, name);
    size_t len = (size_t)snprintf(instance, GPU_MAX_NAME, "%s", name);
    for (int i = 0; i < n && len < GPU_MAX_NAME; i++)
        len += (size_t)snprintf(instance + len, GPU_MAX_NAME - len, "_%u", targs[i]);
    if (len >= GPU_MAX_NAME)
        return gokv_set_error(GOKV_EINTERNAL, "%s: the instance name of kernel \"%s\" is too long", d->backend, name);
    if ((uint64_t)*local_words * 4u > d->caps.max_shared_bytes)
        return gokv_set_error(GOKV_ENOTSUP, "%s: kernel %s needs %llu bytes of local memory; the device has %u", d->backend,
                              instance, (unsigned long long)*local_words * 4u, d->caps.max_shared_bytes);
    return GOKV_OK;
}
