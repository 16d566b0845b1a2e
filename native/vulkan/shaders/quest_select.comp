// quest_select.comp: Quest's page choice (gokv_attend_desc.quest_pages), the second pass of a Quest call
// (native/gpu/gpu_attend.c), after quest_score.comp. One workgroup per (sequence, kv head) chooses what
// native/cpu/quest.c chooses: among the pages that compete (first token below vis, neither a sink page,
// first < n_sink_tokens, nor a recent page, last > vis - recent; and a bound B != -inf), the k highest
// bounds, ties to the older page. Without sorting, for any k and page count:
//   1. the k-th highest bound T: a radix select, 8 bits at a time from the top, on the bounds' float bits
//      mapped to unsigned integers of the same order (histograms in shared memory);
//   2. the pages above T are chosen, and of the pages at T the first (k - #above) in page order: a prefix
//      count of the ties gives the last one chosen (cut);
// so a page is chosen iff it competes and (B > T or (B == T and index <= cut)), a test any pass can make.
// Then it writes, as the attention pass reads them (a validity mask per kv head, in the staged inputs), the
// kv head's mask words: bit t set iff the caller's mask has it (shared or per kv head) and t lies in a
// chosen, sink or recent page or in the KIVI ring (t >= n_quant); every token of a sequence without a query
// row. Optional outputs: the bounds (quest_bounds) and the chosen indices, ascending, -1 past the last
// (quest_selected).
//
// Quest's sequence table (QSEQ_WORDS words each, inputs): first entry, entries, kv_len, n_quant, vis (the
// decode row sees [0, vis)), read_all (no query row), the caller's mask word (NONE: none) and its words per
// kv head (0: shared), the word of kv head 0's mask in the inputs (kv head h's at + h ceil(kv_len / 32)).
//
// Specialization constants: NSG_MAX (GPU_SPEC_OP2) subgroups per workgroup at most; INPUTS_STAGED (OP3)
// is 1 on every Quest call.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x_id = 28) in;

#define GOKV_READ_ONLY_POOL
#define UP_QUAL readonly
#include "common.glsl"

layout(constant_id = 32) const uint NSG_MAX = 64;

const uint NONE = 0xffffffffu;
const uint QSEQ_WORDS = 9u;

#include "gpu_push.h"
PUSH_BLOCK(GOKV_PUSH_QUEST_SELECT); // the fields: gpu_push.h

#include "attend_inputs.glsl"

shared uint hist[256];
shared uint sg_sum[NSG_MAX];
shared uint sel_state[3]; // prefix, remaining, cut

uint entry0, n_ent, vis, h;

// The bound of page i as an unsigned integer of the same order (-0 as +0), or NONE where the page does not
// compete (NONE is never a finite float's key: it would be a NaN's).
uint compete_key(uint i) {
    uint first = i * PAGE_SIZE;
    if (first >= vis || first < pc.n_sink_tokens) return NONE;
    if (pc.recent > 0u && (pc.recent >= vis || first + PAGE_SIZE > vis - pc.recent)) return NONE;
    uint u = scratch[pc.b_w + (entry0 + i) * N_KV_HEADS + h];
    if (u == 0xff800000u) return NONE; // -inf: released, no key yet, no query row
    if (u == 0x80000000u) u = 0u;
    return (u & 0x80000000u) != 0u ? ~u : u | 0x80000000u;
}

// Sink or recent page (read besides the chosen ones).
bool kept_page(uint i) {
    uint first = i * PAGE_SIZE;
    if (first >= vis) return false;
    return first < pc.n_sink_tokens || (pc.recent > 0u && (pc.recent >= vis || first + PAGE_SIZE > vis - pc.recent));
}

// Workgroup sum of x (every invocation calls it; the result is uniform).
uint wg_sum(uint x) {
    uint s = subgroupAdd(x);
    if (subgroupElect()) sg_sum[gl_SubgroupID] = s;
    barrier();
    uint t = 0u;
    for (uint g = 0u; g < gl_NumSubgroups; g++) t += sg_sum[g];
    barrier();
    return t;
}

// Exclusive prefix of x over the workgroup in rank order (rank, below: the order subgroup scans follow);
// total gets the sum.
uint wg_prefix(uint x, out uint total) {
    uint ex = subgroupExclusiveAdd(x), s = subgroupAdd(x);
    if (subgroupElect()) sg_sum[gl_SubgroupID] = s;
    barrier();
    uint before = 0u;
    total = 0u;
    for (uint g = 0u; g < gl_NumSubgroups; g++) {
        if (g < gl_SubgroupID) before += sg_sum[g];
        total += sg_sum[g];
    }
    barrier();
    return before + ex;
}

void main() {
    const uint lid = gl_LocalInvocationID.x;
    // the invocation's place in wg_prefix's order, a permutation of [0, WG_SIZE): what the scans index by
    const uint rank = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
    const uint item = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (item >= pc.n_items) return;
    const uint seq = item / N_KV_HEADS;
    h = item % N_KV_HEADS;
    const uint qs = pc.qseq_w + seq * QSEQ_WORDS;
    entry0 = in_u(qs);
    n_ent = in_u(qs + 1u);
    const uint kv_len = in_u(qs + 2u), n_quant = in_u(qs + 3u);
    vis = in_u(qs + 4u);
    const bool read_all = in_u(qs + 5u) != 0u;
    const uint um_w = in_u(qs + 6u), um_head = in_u(qs + 7u), qm_w = in_u(qs + 8u);
    const uint W = (kv_len + 31u) / 32u;

    if (pc.bounds_out_w != NONE)
        for (uint i = lid; i < n_ent; i += WG_SIZE)
            down[pc.bounds_out_w + (entry0 + i) * N_KV_HEADS + h] = scratch[pc.b_w + (entry0 + i) * N_KV_HEADS + h];

    // how many compete
    uint n_comp = 0u;
    for (uint i0 = 0u; i0 < n_ent; i0 += WG_SIZE) {
        uint i = i0 + lid;
        n_comp += wg_sum(i < n_ent && compete_key(i) != NONE ? 1u : 0u);
    }

    // 1. T, the k-th highest key (all compete when k >= n_comp: T = 0, cut = NONE)
    uint T = 0u, cut = NONE;
    if (n_comp > pc.k && pc.k > 0u) {
        uint prefix = 0u, high = 0u, remaining = pc.k; // keys whose bits above the digit equal prefix
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (uint b = lid; b < 256u; b += WG_SIZE) hist[b] = 0u;
            barrier();
            for (uint i = lid; i < n_ent; i += WG_SIZE) {
                uint key = compete_key(i);
                if (key != NONE && (key & high) == prefix) atomicAdd(hist[(key >> uint(shift)) & 255u], 1u);
            }
            barrier();
            // the digit where the count from the top reaches remaining: the invocation of rank x sums bins
            // 255 - x * per down to 255 - (x + 1) * per + 1; a prefix over x counts the keys above its bins
            const uint per = (256u + WG_SIZE - 1u) / WG_SIZE, top = 255u - min(rank * per, 256u);
            uint mine = 0u, total;
            for (uint j = 0u; j < per && rank * per + j < 256u; j++) mine += hist[top - j];
            uint above = wg_prefix(mine, total);
            if (above < remaining && remaining <= above + mine) {
                uint d = top;
                for (; above + hist[d] < remaining; d--) above += hist[d];
                sel_state[0] = prefix | (d << uint(shift));
                sel_state[1] = remaining - above;
            }
            barrier();
            prefix = sel_state[0];
            remaining = sel_state[1];
            high |= 255u << uint(shift);
            barrier();
        }
        T = prefix;
        // 2. the remaining-th page at T in page order is the last tie chosen
        uint seen = 0u;
        for (uint i0 = 0u; i0 < n_ent && seen < remaining; i0 += WG_SIZE) {
            uint i = i0 + rank, total;
            bool tie = i < n_ent && compete_key(i) == T;
            uint before = wg_prefix(tie ? 1u : 0u, total);
            if (tie && seen + before + 1u == remaining) sel_state[2] = i;
            seen += total;
        }
        barrier();
        cut = sel_state[2];
    } else if (pc.k == 0u) {
        T = NONE; // nothing is chosen: no key reaches NONE
        cut = 0u;
    }

    // quest_selected: the chosen indices in page order
    if (pc.sel_out_w != NONE) {
        const uint sel0 = pc.sel_out_w + item * pc.k;
        uint n_sel = 0u;
        for (uint i0 = 0u; i0 < n_ent; i0 += WG_SIZE) {
            uint i = i0 + rank, total, key = i < n_ent ? compete_key(i) : NONE;
            bool chosen = key != NONE && (key > T || (key == T && i <= cut));
            uint before = wg_prefix(chosen ? 1u : 0u, total);
            if (chosen) down[sel0 + n_sel + before] = i;
            n_sel += total;
        }
        for (uint j = n_sel + lid; j < pc.k; j += WG_SIZE) down[sel0 + j] = NONE;
    }

    // the kv head's mask words
    const uint um = um_w == NONE ? NONE : um_w + h * um_head;
    for (uint w = lid; w < W; w += WG_SIZE) {
        uint word = 0u, page = NONE;
        bool read = false;
        for (uint b = 0u; b < 32u; b++) {
            uint t = 32u * w + b;
            if (t >= kv_len) break;
            if (t / PAGE_SIZE != page) {
                page = t / PAGE_SIZE;
                uint key = compete_key(page);
                read = kept_page(page) || (key != NONE && (key > T || (key == T && page <= cut)));
            }
            if (read_all || t >= n_quant || read) word |= 1u << b;
        }
        if (um != NONE) word &= in_u(um + w);
        scratch[pc.in_base + qm_w + h * W + w] = word;
    }
}
