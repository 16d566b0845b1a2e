// mass_keys.metal: attention mass for sequences whose counted rows are many (longer prefills): instead of
// keeping every score in scratch (mass.metal), it computes the scores again from the pool with attend.h's key
// decoding, once each row's softmax factors (a, b) are known (prob = e^(s - a) b, stored by the attention pass
// or reduce_mass). For sequence i, kv head h and token t < kv_len[i]:
//     mass[off_i + h kv_len[i] + t] = Σ over the counted rows r that see t and h's query heads q of
//                                     e^(s_rqt - a_rq) b_rq.
// A port of native/vulkan/shaders/mass_keys.comp. One threadgroup per item (MASS_ITEM_WORDS words of the
// inputs: sequence, kv head, first token): thread k takes token t0 + k. The counted rows' query vectors (rows x
// the kv head's query heads) go through threadgroup memory NQ_MAX (spec OP0) at a time, scaled (and, for q4
// keys, pre-divided) as the attention pass does it, so the scores are the same. Every element of the item's
// tokens is written (0 where no counted row sees t). Push constants: attend's (n_items and item_w name this
// kernel's items; part_w is unused).
//
// Instances: mass_keys_<NQ>, NQ the plan's NQ_MAX rounded up to a power of two (<= 64). Threadgroup memory:
// NQ_MAX x (D_K + the q4 group sums) words.
#include "mtl_kernel.h"
#include "attend.h"

template <uint NQ>
kernel void mass_keys(MTL_KERNEL_PARAMS) {
    attend_engine<NQ, 1, 1> e;
    attend_setup(e, pages, rings, up, scratch, down, push_words, spec, tg, false, true);
    const uint item = group_id.y * n_groups.x + group_id.x;
    if (item >= e.pc.n_items) return;
    device uint *in = e.in;
    const uint iw = e.pc.item_w + item * MASS_ITEM_WORDS;
    const uint seq = in[iw], kvh = in[iw + 1u], t = in[iw + 2u] + lid;
    const uint sw = e.pc.seq_w + seq * SEQ_WORDS;
    const uint kv_len = in[sw], n_quant = in[sw + 1u], page_w = in[sw + 2u], rs = in[sw + 4u];
    uint mask_w = in[sw + 3u];
    if (mask_w != NONE) mask_w += kvh * in[sw + 5u];
    const uint row0 = in[sw + 6u], n_rows = in[sw + 7u], pos0 = in[sw + 8u], out_w = in[sw + 10u];
    const uint G = e.pc.n_heads_q / e.kv.N_KV_HEADS, head0 = kvh * G, n_vec = n_rows * G;

    // whether t is stored, valid for this kv head and its page not released (the rows' positions aside)
    bool ok = t < kv_len;
    int id = -1;
    if (ok) {
        id = int(in[page_w + t / e.kv.PAGE_SIZE]);
        ok = id >= 0;
        if (ok && mask_w != NONE) ok = ((in[mask_w + (t >> 5)] >> (t & 31u)) & 1u) != 0u;
    }
    float sum = 0.0f;
    for (uint v0 = 0u; v0 < n_vec; v0 += e.NQ_MAX) {
        threadgroup_barrier(mem_flags::mem_threadgroup); // the previous vectors' queries are no longer read
        e.load_queries(lid, v0, n_vec, row0, head0, G);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // some row of these vectors sees t iff the first of them at or after t does
        const uint j0 = v0 / G, j1 = min(n_rows - 1u, (v0 + e.NQ_MAX - 1u) / G);
        const uint p_first = max(t, pos0 + j0);
        if (ok && p_first <= pos0 + j1 && e.sees_pos(p_first, t)) {
            e.score_token(id, t, n_quant, rs, kvh);
            for (uint i = 0u; i < NQ; i++) {
                if (i >= e.NQ_MAX) break;
                const uint v = v0 + i;
                if (v < n_vec && e.sees_pos(pos0 + v / G, t)) {
                    const uint st = e.pc.stats_w + 2u * ((row0 + v / G) * e.pc.n_heads_q + head0 + v % G);
                    sum += exp(e.score[i] - as_type<float>(scratch[st])) * as_type<float>(scratch[st + 1u]);
                }
            }
        }
    }
    if (t < kv_len) down[out_w + kvh * kv_len + t] = as_type<uint>(sum);
}

#define MTL_INSTANCES_MASS_KEYS(X)                                                                          \
    X(mass_keys_1, mass_keys, 1) X(mass_keys_2, mass_keys, 2) X(mass_keys_4, mass_keys, 4)                    \
    X(mass_keys_8, mass_keys, 8) X(mass_keys_16, mass_keys, 16) X(mass_keys_32, mass_keys, 32)                \
    X(mass_keys_64, mass_keys, 64)
MTL_INSTANCES_MASS_KEYS(MTL_INSTANTIATE)
