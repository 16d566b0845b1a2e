// quest_score.hpp: Quest's page bounds (gokv_attend_desc.quest_pages), the first pass of a Quest call
// (native/gpu's attention plan): for each page-table entry of a sequence with a decode row and each kv head,
//     B = max over the kv head's query heads h of Σ_c max(q_hc · min_c, q_hc · max_c)
// from the page's key bounds alone (store_bounds.hpp keeps them after the pool's pages), summed over the
// channels in order as native/cpu/quest.c's scalar path does; -inf for entries the host marks NONE
// (released pages, pages with no key yet, sequences without a query row). max(q min, q max) is taken as
// q · (q < 0 ? min : max), as native/cpu/quest.c's SIMD path does: the same value for bounds that hold a
// key, and -inf (no bound) for a page whose bounds say "no key" (min = +inf, max = -inf: a page loaded
// with n_tokens 0). quest_select.hpp chooses the pages from them. A port of
// native/metal/kernels/quest_score.metal (same push constants, inputs and thread order as the Vulkan shader).
//
// One work-item per (entry, kv head). Inputs (staged in scratch on a Quest call: common.hpp's inputs_of): 2
// words per entry at entry_w: page (NONE: -inf), the word of query head 0 of the sequence's row (queries
// [rows][group * N_KV_HEADS][D_K]). Out: B as floats [entries][N_KV_HEADS] at scratch word out_w.
// Each product rounds before it is summed (never an fma), as on the CPU: unlike common.hpp's dequant, q (24
// significant bits) times an fp16 bound (11) is not exact, so a fused sum would round differently. Product
// and sum are separate statements, which only "fast" contraction joins, and the module never builds with it
// (native/sycl/CMakeLists.txt: -ffp-contract=off, and -fp-model=precise for icpx). No pragma: clang
// disregards `fp contract(off)` under "fast" anyway, and g++ would warn about it.
#ifndef GOKV_SYCL_QUEST_SCORE_HPP
#define GOKV_SYCL_QUEST_SCORE_HPP

#include "store_common.hpp"

namespace gokv_sycl {

struct quest_score_push {
    GOKV_PUSH_QUEST_SCORE(PUSH_FIELD)
};

// One instance: every constant is read from the spec words at run time.
struct quest_score {
    args a;
    local_words tg;

    void operator()(sycl::nd_item<3> it) const {
        const quest_score_push pc = push_of<quest_score_push>(a);
        const kv_pool kv = kv_pool_of(a.pages, a.rings, a.spec);
        const uint32_t N_KV_HEADS = kv.N_KV_HEADS, D_K = kv.D_K;
        const uint32_t *in = inputs_of(a.up, a.scratch, a.spec, pc.in_base);

        const uint32_t item = store_item(it);
        if (item >= pc.n_items) return;
        const uint32_t e = item / N_KV_HEADS, head = item % N_KV_HEADS;
        const uint32_t page = in[pc.entry_w + 2u * e], q0 = in[pc.entry_w + 2u * e + 1u];
        float best = sycl::bit_cast<float>(0xff800000u); // -inf
        if (page != 0xffffffffu) {
            const uint32_t lo_h = (pc.bounds_w + (page * N_KV_HEADS + head) * D_K) * 2u; // half index of the min row
            const uint32_t qw = q0 + head * pc.group * D_K;
            for (uint32_t g = 0u; g < pc.group; g++) {
                float acc = 0.0f;
                for (uint32_t c = 0u; c < D_K; c++) {
                    const float q = in_f(in, qw + g * D_K + c);
                    const float x = q < 0.0f ? q * page_half(kv, lo_h + c) : q * page_half(kv, lo_h + D_K + c);
                    acc += x;
                }
                // acc > best fails for a NaN (q_c = 0 against a page with no key), which stays -inf
                best = acc > best ? acc : best;
            }
        }
        a.scratch[pc.out_w + item] = sycl::bit_cast<uint32_t>(best);
    }
};

} // namespace gokv_sycl

#define GOKV_SYCL_INSTANCES_QUEST_SCORE(X) X(quest_score, gokv_sycl::quest_score)
GOKV_SYCL_INSTANCES_QUEST_SCORE(GOKV_SYCL_DECLARE_INSTANCE)

#endif
