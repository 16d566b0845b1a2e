// quest_select.hpp: Quest's page choice (gokv_attend_desc.quest_pages), the second pass of a Quest call
// (native/gpu's attention plan), after quest_score.hpp. One work-group per (sequence, kv head) chooses what
// native/cpu/quest.c chooses: among the pages that compete (first token below vis, neither a sink page,
// first < n_sink_tokens, nor a recent page, last > vis - recent; and a bound B != -inf), the k highest
// bounds, ties to the older page. Without sorting, for any k and page count:
//   1. the k-th highest bound T: a radix select, 8 bits at a time from the top, on the bounds' float bits
//      mapped to unsigned integers of the same order (histograms in local memory);
//   2. the pages above T are chosen, and of the pages at T the first (k - #above) in page order: a prefix
//      count of the ties gives the last one chosen (cut);
// so a page is chosen iff it competes and (B > T or (B == T and index <= cut)), a test any pass can make.
// Then it writes, as the attention pass reads them (a validity mask per kv head, in the staged inputs), the
// kv head's mask words: bit t set iff the caller's mask has it (shared or per kv head) and t lies in a
// chosen, sink or recent page or in the KIVI ring (t >= n_quant); every token of a sequence without a query
// row. Optional outputs: the bounds (quest_bounds) and the chosen indices, ascending, -1 past the last
// (quest_selected). A port of native/metal/kernels/quest_select.metal (same push constants, inputs, local
// memory and order of the scans as the Vulkan shader).
//
// Quest's sequence table (QSEQ_WORDS words each, inputs): first entry, entries, kv_len, n_quant, vis (the
// decode row sees [0, vis)), read_all (no query row), the caller's mask word (NONE: none) and its words per
// kv head (0: shared), the word of kv head 0's mask in the inputs (kv head h's at + h ceil(kv_len / 32)).
//
// Spec words: NSG_MAX (GPU_SPEC_OP2) sub-groups per work-group at most; INPUTS_STAGED (OP3) is 1 on every
// Quest call. Local memory (tg, native/gpu/gpu_variants.c sizes it): hist[256], sel_state[3] (prefix,
// remaining, cut), sg_sum[NSG_MAX]. The sub-group size is whatever the device picks (8, 16, 32 on Intel
// GPUs): the scans only need the rank below to be a permutation of the work-group.
#ifndef GOKV_SYCL_QUEST_SELECT_HPP
#define GOKV_SYCL_QUEST_SELECT_HPP

#include "store_common.hpp"

namespace gokv_sycl {

struct quest_select_push {
    GOKV_PUSH_QUEST_SELECT(PUSH_FIELD)
};

constexpr uint32_t QUEST_NONE = 0xffffffffu;
constexpr uint32_t QUEST_QSEQ_WORDS = 9u;

// What the page tests of one (sequence, kv head) read (the GLSL's globals).
struct quest_pages {
    const uint32_t *scratch;
    uint32_t b_w, n_kv_heads, page_size, n_sink_tokens, recent;
    uint32_t entry0, vis, head;

    // The bound of page i as an unsigned integer of the same order (-0 as +0), or QUEST_NONE where the page
    // does not compete (QUEST_NONE is never a finite float's key: it would be a NaN's).
    uint32_t compete_key(uint32_t i) const {
        const uint32_t first = i * page_size;
        if (first >= vis || first < n_sink_tokens) return QUEST_NONE;
        if (recent > 0u && (recent >= vis || first + page_size > vis - recent)) return QUEST_NONE;
        uint32_t u = scratch[b_w + (entry0 + i) * n_kv_heads + head];
        if (u == 0xff800000u) return QUEST_NONE; // -inf: released, no key yet, no query row
        if (u == 0x80000000u) u = 0u;
        return (u & 0x80000000u) != 0u ? ~u : u | 0x80000000u;
    }

    // Sink or recent page (read besides the chosen ones).
    bool kept_page(uint32_t i) const {
        const uint32_t first = i * page_size;
        if (first >= vis) return false;
        return first < n_sink_tokens || (recent > 0u && (recent >= vis || first + page_size > vis - recent));
    }
};

// The work-item's sub-group and the work-group's scans over it. The local memory words from sg_sum on hold
// one partial per sub-group.
struct quest_group {
    const sycl::nd_item<3> &it;
    const local_words &tg;
    uint32_t sg_sum, sg_id, n_sg, lane;

    // Work-group sum of x (every work-item calls it; the result is uniform).
    uint32_t sum(uint32_t x) const {
        const uint32_t s = sycl::reduce_over_group(it.get_sub_group(), x, sycl::plus<uint32_t>());
        if (lane == 0u) tg[sg_sum + sg_id] = s;
        sycl::group_barrier(it.get_group());
        uint32_t t = 0u;
        for (uint32_t g = 0u; g < n_sg; g++) t += tg[sg_sum + g];
        sycl::group_barrier(it.get_group());
        return t;
    }

    // Exclusive prefix of x over the work-group in rank order (sub-group by sub-group, each in lane order);
    // total gets the sum.
    uint32_t prefix(uint32_t x, uint32_t &total) const {
        const sycl::sub_group sg = it.get_sub_group();
        const uint32_t ex = sycl::exclusive_scan_over_group(sg, x, sycl::plus<uint32_t>());
        const uint32_t s = sycl::reduce_over_group(sg, x, sycl::plus<uint32_t>());
        if (lane == 0u) tg[sg_sum + sg_id] = s;
        sycl::group_barrier(it.get_group());
        uint32_t before = 0u;
        total = 0u;
        for (uint32_t g = 0u; g < n_sg; g++) {
            if (g < sg_id) before += tg[sg_sum + g];
            total += tg[sg_sum + g];
        }
        sycl::group_barrier(it.get_group());
        return before + ex;
    }
};

// One instance: the local memory is sized at run time (gpu_kernel_instance), every constant is read from the
// spec words.
struct quest_select {
    args a;
    local_words tg;

    void operator()(sycl::nd_item<3> it) const {
        const quest_select_push pc = push_of<quest_select_push>(a);
        const kv_pool kv = kv_pool_of(a.pages, a.rings, a.spec);
        const uint32_t N_KV_HEADS = kv.N_KV_HEADS, WG_SIZE = uint32_t(it.get_local_range(2));
        const uint32_t HIST = 0u, SEL_STATE = 256u; // tg words: hist[256], sel_state[3], sg_sum[NSG_MAX]
        const uint32_t *in = inputs_of(a.up, a.scratch, a.spec, pc.in_base);
        const uint32_t lid = uint32_t(it.get_local_id(2));
        const sycl::sub_group sg = it.get_sub_group();
        const quest_group G{it, tg, 259u, uint32_t(sg.get_group_linear_id()), uint32_t(sg.get_group_linear_range()),
                            uint32_t(sg.get_local_linear_id())};

        // the work-item's place in G.prefix's order, a permutation of [0, WG_SIZE) (only the last sub-group
        // may be short): what the scans index by
        const uint32_t rank = G.sg_id * uint32_t(sg.get_max_local_range()[0]) + G.lane;
        const uint32_t item = plan_workgroup(it);
        if (item >= pc.n_items) return; // the whole work-group
        const uint32_t seq = item / N_KV_HEADS;
        const uint32_t qs = pc.qseq_w + seq * QUEST_QSEQ_WORDS;
        quest_pages P;
        P.scratch = a.scratch;
        P.b_w = pc.b_w;
        P.n_kv_heads = N_KV_HEADS;
        P.page_size = kv.PAGE_SIZE;
        P.n_sink_tokens = pc.n_sink_tokens;
        P.recent = pc.recent;
        P.entry0 = in[qs];
        P.vis = in[qs + 4u];
        P.head = item % N_KV_HEADS;
        const uint32_t entry0 = P.entry0, h = P.head, n_ent = in[qs + 1u];
        const uint32_t kv_len = in[qs + 2u], n_quant = in[qs + 3u];
        const bool read_all = in[qs + 5u] != 0u;
        const uint32_t um_w = in[qs + 6u], um_head = in[qs + 7u], qm_w = in[qs + 8u];
        const uint32_t W = (kv_len + 31u) / 32u;

        if (pc.bounds_out_w != QUEST_NONE)
            for (uint32_t i = lid; i < n_ent; i += WG_SIZE)
                a.down[pc.bounds_out_w + (entry0 + i) * N_KV_HEADS + h] =
                    a.scratch[pc.b_w + (entry0 + i) * N_KV_HEADS + h];

        // how many compete
        uint32_t n_comp = 0u;
        for (uint32_t i0 = 0u; i0 < n_ent; i0 += WG_SIZE) {
            const uint32_t i = i0 + lid;
            n_comp += G.sum(i < n_ent && P.compete_key(i) != QUEST_NONE ? 1u : 0u);
        }

        // 1. T, the k-th highest key (all compete when k >= n_comp: T = 0, cut = NONE)
        uint32_t T = 0u, cut = QUEST_NONE;
        if (n_comp > pc.k && pc.k > 0u) {
            uint32_t prefix = 0u, high = 0u, remaining = pc.k; // keys whose bits above the digit equal prefix
            for (int shift = 24; shift >= 0; shift -= 8) {
                for (uint32_t b = lid; b < 256u; b += WG_SIZE) tg[HIST + b] = 0u;
                sycl::group_barrier(it.get_group());
                for (uint32_t i = lid; i < n_ent; i += WG_SIZE) {
                    const uint32_t key = P.compete_key(i);
                    if (key != QUEST_NONE && (key & high) == prefix)
                        sycl::atomic_ref<uint32_t, sycl::memory_order::relaxed, sycl::memory_scope::work_group,
                                         sycl::access::address_space::local_space>(
                            tg[HIST + ((key >> uint32_t(shift)) & 255u)])
                            .fetch_add(1u);
                }
                sycl::group_barrier(it.get_group());
                // the digit where the count from the top reaches remaining: the work-item of rank x sums bins
                // 255 - x * per down to 255 - (x + 1) * per + 1; a prefix over x counts the keys above its bins
                const uint32_t per = (256u + WG_SIZE - 1u) / WG_SIZE;
                const uint32_t top = 255u - (rank * per < 256u ? rank * per : 256u);
                uint32_t mine = 0u, total;
                for (uint32_t j = 0u; j < per && rank * per + j < 256u; j++) mine += tg[HIST + top - j];
                uint32_t above = G.prefix(mine, total);
                if (above < remaining && remaining <= above + mine) {
                    uint32_t d = top;
                    for (; above + tg[HIST + d] < remaining; d--) above += tg[HIST + d];
                    tg[SEL_STATE + 0u] = prefix | (d << uint32_t(shift));
                    tg[SEL_STATE + 1u] = remaining - above;
                }
                sycl::group_barrier(it.get_group());
                prefix = tg[SEL_STATE + 0u];
                remaining = tg[SEL_STATE + 1u];
                high |= 255u << uint32_t(shift);
                sycl::group_barrier(it.get_group());
            }
            T = prefix;
            // 2. the remaining-th page at T in page order is the last tie chosen
            uint32_t seen = 0u;
            for (uint32_t i0 = 0u; i0 < n_ent && seen < remaining; i0 += WG_SIZE) {
                const uint32_t i = i0 + rank;
                uint32_t total;
                const bool tie = i < n_ent && P.compete_key(i) == T;
                const uint32_t before = G.prefix(tie ? 1u : 0u, total);
                if (tie && seen + before + 1u == remaining) tg[SEL_STATE + 2u] = i;
                seen += total;
            }
            sycl::group_barrier(it.get_group());
            cut = tg[SEL_STATE + 2u];
        } else if (pc.k == 0u) {
            T = QUEST_NONE; // nothing is chosen: no key reaches NONE
            cut = 0u;
        }

        // quest_selected: the chosen indices in page order
        if (pc.sel_out_w != QUEST_NONE) {
            const uint32_t sel0 = pc.sel_out_w + item * pc.k;
            uint32_t n_sel = 0u;
            for (uint32_t i0 = 0u; i0 < n_ent; i0 += WG_SIZE) {
                const uint32_t i = i0 + rank, key = i < n_ent ? P.compete_key(i) : QUEST_NONE;
                uint32_t total;
                const bool chosen = key != QUEST_NONE && (key > T || (key == T && i <= cut));
                const uint32_t before = G.prefix(chosen ? 1u : 0u, total);
                if (chosen) a.down[sel0 + n_sel + before] = i;
                n_sel += total;
            }
            for (uint32_t j = n_sel + lid; j < pc.k; j += WG_SIZE) a.down[sel0 + j] = QUEST_NONE;
        }

        // the kv head's mask words
        const uint32_t um = um_w == QUEST_NONE ? QUEST_NONE : um_w + h * um_head;
        for (uint32_t w = lid; w < W; w += WG_SIZE) {
            uint32_t word = 0u, page = QUEST_NONE;
            bool read = false;
            for (uint32_t b = 0u; b < 32u; b++) {
                const uint32_t t = 32u * w + b;
                if (t >= kv_len) break;
                if (t / P.page_size != page) {
                    page = t / P.page_size;
                    const uint32_t key = P.compete_key(page);
                    read = P.kept_page(page) || (key != QUEST_NONE && (key > T || (key == T && page <= cut)));
                }
                if (read_all || t >= n_quant || read) word |= 1u << b;
            }
            if (um != QUEST_NONE) word &= in[um + w];
            a.scratch[pc.in_base + qm_w + h * W + w] = word;
        }
    }
};

} // namespace gokv_sycl

#define GOKV_SYCL_INSTANCES_QUEST_SELECT(X) X(quest_select, gokv_sycl::quest_select)
GOKV_SYCL_INSTANCES_QUEST_SELECT(GOKV_SYCL_DECLARE_INSTANCE)

#endif
