// quest_score.metal: Quest's page bounds (gokv_attend_desc.quest_pages), the first pass of a Quest call
// (native/gpu's attention plan): for each page-table entry of a sequence with a decode row and each kv head,
//     B = max over the kv head's query heads h of Σ_c max(q_hc · min_c, q_hc · max_c)
// from the page's key bounds alone (store_bounds.metal keeps them after the pool's pages), summed over the
// channels in order as native/cpu/quest.c's scalar path does; -inf for entries the host marks NONE
// (released pages, pages with no key yet, sequences without a query row). max(q min, q max) is taken as
// q · (q < 0 ? min : max), as native/cpu/quest.c's SIMD path does: the same value for bounds that hold a
// key, and -inf (no bound) for a page whose bounds say "no key" (min = +inf, max = -inf: a page loaded
// with n_tokens 0). quest_select.metal chooses the pages from them. A port of
// native/vulkan/shaders/quest_score.comp (same push constants, inputs and thread order).
//
// One thread per (entry, kv head). Inputs (staged in scratch on a Quest call: common.h's inputs_of): 2 words
// per entry at entry_w: page (NONE: -inf), the word of query head 0 of the sequence's row (queries
// [rows][group * N_KV_HEADS][D_K]). Out: B as floats [entries][N_KV_HEADS] at scratch word out_w.
// Each product rounds before it is summed (never an fma), as on the CPU: the pragma keeps them apart as
// common.h's dequant does (the emulator's C++ build never contracts).
#include "mtl_kernel.h"
#include "store_common.h"

struct quest_score_push {
    GOKV_PUSH_QUEST_SCORE(PUSH_FIELD)
};

// One instance: every constant is read from the spec words at run time (a template only because the
// instance list names the kernel as one).
template <typename = void>
kernel void quest_score(MTL_KERNEL_PARAMS) {
    constant quest_score_push &pc = *(constant quest_score_push *)push_words;
    const kv_pool kv = kv_pool_of(pages, rings, spec);
    const uint N_KV_HEADS = kv.N_KV_HEADS, D_K = kv.D_K;
    device uint *in = inputs_of(up, scratch, spec, pc.in_base);

    const uint item = store_item(group_id, n_groups, lid, wg_dims);
    if (item >= pc.n_items) return;
    const uint e = item / N_KV_HEADS, head = item % N_KV_HEADS;
    const uint page = in[pc.entry_w + 2u * e], q0 = in[pc.entry_w + 2u * e + 1u];
    float best = as_type<float>(0xff800000u); // -inf
    if (page != 0xffffffffu) {
        const uint lo_h = (pc.bounds_w + (page * N_KV_HEADS + head) * D_K) * 2u; // half index of the min row
        const uint qw = q0 + head * pc.group * D_K;
        for (uint g = 0u; g < pc.group; g++) {
            float acc = 0.0f;
            for (uint c = 0u; c < D_K; c++) {
#if defined(__METAL_VERSION__)
#pragma clang fp contract(off)
#endif
                const float q = in_f(in, qw + g * D_K + c);
                const float x = q < 0.0f ? q * page_half(kv, lo_h + c) : q * page_half(kv, lo_h + D_K + c);
                acc += x;
            }
            // acc > best fails for a NaN (q_c = 0 against a page with no key), which stays -inf
            best = acc > best ? acc : best;
        }
    }
    scratch[pc.out_w + item] = as_type<uint>(best);
}

#define MTL_INSTANCES_QUEST_SCORE(X) X(quest_score, quest_score)
MTL_INSTANCES_QUEST_SCORE(MTL_INSTANTIATE)
