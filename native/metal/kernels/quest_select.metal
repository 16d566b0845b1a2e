// quest_select.metal: Quest's page choice (gokv_attend_desc.quest_pages), the second pass of a Quest call
// (native/gpu's attention plan), after quest_score.metal. One threadgroup per (sequence, kv head) chooses
// what native/cpu/quest.c chooses: among the pages that compete (first token below vis, neither a sink
// page, first < n_sink_tokens, nor a recent page, last > vis - recent; and a bound B != -inf), the k highest
// bounds, ties to the older page. Without sorting, for any k and page count:
//   1. the k-th highest bound T: a radix select, 8 bits at a time from the top, on the bounds' float bits
//      mapped to unsigned integers of the same order (histograms in threadgroup memory);
//   2. the pages above T are chosen, and of the pages at T the first (k - #above) in page order: a prefix
//      count of the ties gives the last one chosen (cut);
// so a page is chosen iff it competes and (B > T or (B == T and index <= cut)), a test any pass can make.
// Then it writes, as the attention pass reads them (a validity mask per kv head, in the staged inputs), the
// kv head's mask words: bit t set iff the caller's mask has it (shared or per kv head) and t lies in a
// chosen, sink or recent page or in the KIVI ring (t >= n_quant); every token of a sequence without a query
// row. Optional outputs: the bounds (quest_bounds) and the chosen indices, ascending, -1 past the last
// (quest_selected). A port of native/vulkan/shaders/quest_select.comp (same push constants, inputs,
// threadgroup memory and order of the scans).
//
// Quest's sequence table (QSEQ_WORDS words each, inputs): first entry, entries, kv_len, n_quant, vis (the
// decode row sees [0, vis)), read_all (no query row), the caller's mask word (NONE: none) and its words per
// kv head (0: shared), the word of kv head 0's mask in the inputs (kv head h's at + h ceil(kv_len / 32)).
//
// Spec words: NSG_MAX (GPU_SPEC_OP2) simdgroups per threadgroup at most; INPUTS_STAGED (OP3) is 1 on every
// Quest call. Threadgroup memory (tg, native/gpu/gpu_variants.c sizes it): hist[256], sel_state[3] (prefix,
// remaining, cut), sg_sum[NSG_MAX].
#include "mtl_kernel.h"
#include "store_common.h"

struct quest_select_push {
    GOKV_PUSH_QUEST_SELECT(PUSH_FIELD)
};

#define QUEST_NONE 0xffffffffu
#define QUEST_QSEQ_WORDS 9u

// What the page tests of one (sequence, kv head) read (the GLSL's globals).
struct quest_pages {
    device const uint *scratch;
    uint b_w, n_kv_heads, page_size, n_sink_tokens, recent;
    uint entry0, vis, head;

    // The bound of page i as an unsigned integer of the same order (-0 as +0), or QUEST_NONE where the page
    // does not compete (QUEST_NONE is never a finite float's key: it would be a NaN's).
    uint compete_key(uint i) const {
        const uint first = i * page_size;
        if (first >= vis || first < n_sink_tokens) return QUEST_NONE;
        if (recent > 0u && (recent >= vis || first + page_size > vis - recent)) return QUEST_NONE;
        uint u = scratch[b_w + (entry0 + i) * n_kv_heads + head];
        if (u == 0xff800000u) return QUEST_NONE; // -inf: released, no key yet, no query row
        if (u == 0x80000000u) u = 0u;
        return (u & 0x80000000u) != 0u ? ~u : u | 0x80000000u;
    }

    // Sink or recent page (read besides the chosen ones).
    bool kept_page(uint i) const {
        const uint first = i * page_size;
        if (first >= vis) return false;
        return first < n_sink_tokens || (recent > 0u && (recent >= vis || first + page_size > vis - recent));
    }
};

// Threadgroup sum of x (every thread calls it; the result is uniform).
static inline uint tg_sum(uint x, threadgroup uint *sg_sum, uint sg_id, uint n_sg, uint lane) {
    const uint s = simd_sum(x);
    if (lane == 0u) sg_sum[sg_id] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint t = 0u;
    for (uint g = 0u; g < n_sg; g++) t += sg_sum[g];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return t;
}

// Exclusive prefix of x over the threadgroup in rank order (rank, below: the order simdgroup scans follow);
// total gets the sum.
static inline uint tg_prefix(uint x, thread uint &total, threadgroup uint *sg_sum, uint sg_id, uint n_sg, uint lane) {
    const uint ex = simd_prefix_exclusive_sum(x), s = simd_sum(x);
    if (lane == 0u) sg_sum[sg_id] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint before = 0u;
    total = 0u;
    for (uint g = 0u; g < n_sg; g++) {
        if (g < sg_id) before += sg_sum[g];
        total += sg_sum[g];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return before + ex;
}

// One instance: the threadgroup memory is sized at run time (gpu_kernel_instance), every constant is read
// from the spec words (a template only because the instance list names the kernel as one).
template <typename = void>
kernel void quest_select(MTL_KERNEL_PARAMS) {
    constant quest_select_push &pc = *(constant quest_select_push *)push_words;
    const kv_pool kv = kv_pool_of(pages, rings, spec);
    const uint N_KV_HEADS = kv.N_KV_HEADS, WG_SIZE = wg_dims.x;
    threadgroup uint *hist = tg;
    threadgroup uint *sel_state = tg + 256u;
    threadgroup uint *sg_sum = tg + 259u;
    device uint *in = inputs_of(up, scratch, spec, pc.in_base);

    // the thread's place in tg_prefix's order, a permutation of [0, WG_SIZE): what the scans index by
    const uint rank = sg_id * sg_size + lane;
    const uint item = group_id.y * n_groups.x + group_id.x;
    if (item >= pc.n_items) return; // the whole threadgroup
    const uint seq = item / N_KV_HEADS;
    const uint qs = pc.qseq_w + seq * QUEST_QSEQ_WORDS;
    quest_pages P;
    P.scratch = scratch;
    P.b_w = pc.b_w;
    P.n_kv_heads = N_KV_HEADS;
    P.page_size = kv.PAGE_SIZE;
    P.n_sink_tokens = pc.n_sink_tokens;
    P.recent = pc.recent;
    P.entry0 = in[qs];
    P.vis = in[qs + 4u];
    P.head = item % N_KV_HEADS;
    const uint entry0 = P.entry0, h = P.head, n_ent = in[qs + 1u];
    const uint kv_len = in[qs + 2u], n_quant = in[qs + 3u];
    const bool read_all = in[qs + 5u] != 0u;
    const uint um_w = in[qs + 6u], um_head = in[qs + 7u], qm_w = in[qs + 8u];
    const uint W = (kv_len + 31u) / 32u;

    if (pc.bounds_out_w != QUEST_NONE)
        for (uint i = lid; i < n_ent; i += WG_SIZE)
            down[pc.bounds_out_w + (entry0 + i) * N_KV_HEADS + h] = scratch[pc.b_w + (entry0 + i) * N_KV_HEADS + h];

    // how many compete
    uint n_comp = 0u;
    for (uint i0 = 0u; i0 < n_ent; i0 += WG_SIZE) {
        const uint i = i0 + lid;
        n_comp += tg_sum(i < n_ent && P.compete_key(i) != QUEST_NONE ? 1u : 0u, sg_sum, sg_id, n_sg, lane);
    }

    // 1. T, the k-th highest key (all compete when k >= n_comp: T = 0, cut = NONE)
    uint T = 0u, cut = QUEST_NONE;
    if (n_comp > pc.k && pc.k > 0u) {
        uint prefix = 0u, high = 0u, remaining = pc.k; // keys whose bits above the digit equal prefix
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (uint b = lid; b < 256u; b += WG_SIZE) hist[b] = 0u;
            threadgroup_barrier(mem_flags::mem_threadgroup);
            for (uint i = lid; i < n_ent; i += WG_SIZE) {
                const uint key = P.compete_key(i);
                if (key != QUEST_NONE && (key & high) == prefix)
                    atomic_fetch_add_explicit((threadgroup atomic_uint *)&hist[(key >> uint(shift)) & 255u], 1u,
                                              memory_order_relaxed);
            }
            threadgroup_barrier(mem_flags::mem_threadgroup);
            // the digit where the count from the top reaches remaining: the thread of rank x sums bins
            // 255 - x * per down to 255 - (x + 1) * per + 1; a prefix over x counts the keys above its bins
            const uint per = (256u + WG_SIZE - 1u) / WG_SIZE, top = 255u - min(rank * per, 256u);
            uint mine = 0u, total;
            for (uint j = 0u; j < per && rank * per + j < 256u; j++) mine += hist[top - j];
            uint above = tg_prefix(mine, total, sg_sum, sg_id, n_sg, lane);
            if (above < remaining && remaining <= above + mine) {
                uint d = top;
                for (; above + hist[d] < remaining; d--) above += hist[d];
                sel_state[0] = prefix | (d << uint(shift));
                sel_state[1] = remaining - above;
            }
            threadgroup_barrier(mem_flags::mem_threadgroup);
            prefix = sel_state[0];
            remaining = sel_state[1];
            high |= 255u << uint(shift);
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        T = prefix;
        // 2. the remaining-th page at T in page order is the last tie chosen
        uint seen = 0u;
        for (uint i0 = 0u; i0 < n_ent && seen < remaining; i0 += WG_SIZE) {
            const uint i = i0 + rank;
            uint total;
            const bool tie = i < n_ent && P.compete_key(i) == T;
            const uint before = tg_prefix(tie ? 1u : 0u, total, sg_sum, sg_id, n_sg, lane);
            if (tie && seen + before + 1u == remaining) sel_state[2] = i;
            seen += total;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        cut = sel_state[2];
    } else if (pc.k == 0u) {
        T = QUEST_NONE; // nothing is chosen: no key reaches NONE
        cut = 0u;
    }

    // quest_selected: the chosen indices in page order
    if (pc.sel_out_w != QUEST_NONE) {
        const uint sel0 = pc.sel_out_w + item * pc.k;
        uint n_sel = 0u;
        for (uint i0 = 0u; i0 < n_ent; i0 += WG_SIZE) {
            const uint i = i0 + rank, key = i < n_ent ? P.compete_key(i) : QUEST_NONE;
            uint total;
            const bool chosen = key != QUEST_NONE && (key > T || (key == T && i <= cut));
            const uint before = tg_prefix(chosen ? 1u : 0u, total, sg_sum, sg_id, n_sg, lane);
            if (chosen) down[sel0 + n_sel + before] = i;
            n_sel += total;
        }
        for (uint j = n_sel + lid; j < pc.k; j += WG_SIZE) down[sel0 + j] = QUEST_NONE;
    }

    // the kv head's mask words
    const uint um = um_w == QUEST_NONE ? QUEST_NONE : um_w + h * um_head;
    for (uint w = lid; w < W; w += WG_SIZE) {
        uint word = 0u, page = QUEST_NONE;
        bool read = false;
        for (uint b = 0u; b < 32u; b++) {
            const uint t = 32u * w + b;
            if (t >= kv_len) break;
            if (t / P.page_size != page) {
                page = t / P.page_size;
                const uint key = P.compete_key(page);
                read = P.kept_page(page) || (key != QUEST_NONE && (key > T || (key == T && page <= cut)));
            }
            if (read_all || t >= n_quant || read) word |= 1u << b;
        }
        if (um != QUEST_NONE) word &= in[um + w];
        scratch[pc.in_base + qm_w + h * W + w] = word;
    }
}

#define MTL_INSTANCES_QUEST_SELECT(X) X(quest_select, quest_select)
MTL_INSTANCES_QUEST_SELECT(MTL_INSTANTIATE)
