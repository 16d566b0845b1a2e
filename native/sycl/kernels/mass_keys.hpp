// mass_keys.hpp: attention mass for sequences whose counted rows are many (longer prefills): instead of keeping
// every score in scratch (mass.hpp), it computes the scores again from the pool with attend_common.hpp's key
// decoding, once each row's softmax factors (a, b) are known (prob = e^(s - a) b, stored by the attention pass
// or reduce_mass). For sequence i, kv head h and token t < kv_len[i]:
//     mass[off_i + h kv_len[i] + t] = Σ over the counted rows r that see t and h's query heads q of
//                                     e^(s_rqt - a_rq) b_rq.
// A port of native/metal/kernels/mass_keys.metal. One work-group per item (MASS_ITEM_WORDS words of the inputs:
// sequence, kv head, first token): thread k takes token t0 + k. The counted rows' query vectors (rows x the kv
// head's query heads) go through local memory NQ_MAX (spec OP0) at a time, scaled (and, for q4 keys,
// pre-divided) as the attention pass does it, so the scores are the same. Every element of the item's tokens
// is written (0 where no counted row sees t). Push constants: attend's (n_items and item_w name this kernel's
// items; part_w is unused).
//
// Instances: mass_keys_<NQ>, NQ the plan's NQ_MAX rounded up to a power of two (<= 64). Local memory:
// NQ_MAX x (D_K + the q4 group sums) words.
#ifndef GOKV_SYCL_MASS_KEYS_HPP
#define GOKV_SYCL_MASS_KEYS_HPP

#include "attend_common.hpp"

namespace gokv_sycl {

template <uint32_t NQ> struct mass_keys_kernel {
    args a;
    local_words tg;
    void operator()(sycl::nd_item<3> ndi) const {
        const sycl::group<3> grp = ndi.get_group();
        const uint32_t lid = uint32_t(ndi.get_local_linear_id());
        attend_engine<NQ, 1, 1> e;
        attend_setup(e, a, &tg[0], false, true);
        const uint32_t item = plan_workgroup(ndi);
        if (item >= e.pc.n_items) return;
        const uint32_t *in = e.in;
        const uint32_t iw = e.pc.item_w + item * MASS_ITEM_WORDS;
        const uint32_t seq = in[iw], kvh = in[iw + 1u], t = in[iw + 2u] + lid;
        const uint32_t sw = e.pc.seq_w + seq * SEQ_WORDS;
        const uint32_t kv_len = in[sw], n_quant = in[sw + 1u], page_w = in[sw + 2u], rs = in[sw + 4u];
        uint32_t mask_w = in[sw + 3u];
        if (mask_w != NONE) mask_w += kvh * in[sw + 5u];
        const uint32_t row0 = in[sw + 6u], n_rows = in[sw + 7u], pos0 = in[sw + 8u], out_w = in[sw + 10u];
        const uint32_t G = e.pc.n_heads_q / e.kv.N_KV_HEADS, head0 = kvh * G, n_vec = n_rows * G;

        // whether t is stored, valid for this kv head and its page not released (the rows' positions aside)
        bool ok = t < kv_len;
        int32_t id = -1;
        if (ok) {
            id = int32_t(in[page_w + t / e.kv.PAGE_SIZE]);
            ok = id >= 0;
            if (ok && mask_w != NONE) ok = ((in[mask_w + (t >> 5)] >> (t & 31u)) & 1u) != 0u;
        }
        float sum = 0.0f;
        for (uint32_t v0 = 0u; v0 < n_vec; v0 += e.NQ_MAX) {
            sycl::group_barrier(grp); // the previous vectors' queries are no longer read
            e.load_queries(lid, v0, n_vec, row0, head0, G);
            sycl::group_barrier(grp);
            // some row of these vectors sees t iff the first of them at or after t does
            const uint32_t j0 = v0 / G, j1 = sycl::min(n_rows - 1u, (v0 + e.NQ_MAX - 1u) / G);
            const uint32_t p_first = sycl::max(t, pos0 + j0);
            if (ok && p_first <= pos0 + j1 && e.sees_pos(p_first, t)) {
                e.score_token(id, t, n_quant, rs, kvh);
                for (uint32_t i = 0u; i < NQ; i++) {
                    if (i >= e.NQ_MAX) break;
                    const uint32_t v = v0 + i;
                    if (v < n_vec && e.sees_pos(pos0 + v / G, t)) {
                        const uint32_t st = e.pc.stats_w + 2u * ((row0 + v / G) * e.pc.n_heads_q + head0 + v % G);
                        sum += sycl::exp(e.score[i] - sycl::bit_cast<float>(e.scratch[st])) *
                               sycl::bit_cast<float>(e.scratch[st + 1u]);
                    }
                }
            }
        }
        if (t < kv_len) e.down[out_w + kvh * kv_len + t] = sycl::bit_cast<uint32_t>(sum);
    }
};

} // namespace gokv_sycl

#define GOKV_SYCL_INSTANCES_MASS_KEYS(X)                                                                    \
    X(mass_keys_1, gokv_sycl::mass_keys_kernel<1>) X(mass_keys_2, gokv_sycl::mass_keys_kernel<2>)          \
    X(mass_keys_4, gokv_sycl::mass_keys_kernel<4>) X(mass_keys_8, gokv_sycl::mass_keys_kernel<8>)          \
    X(mass_keys_16, gokv_sycl::mass_keys_kernel<16>) X(mass_keys_32, gokv_sycl::mass_keys_kernel<32>)      \
    X(mass_keys_64, gokv_sycl::mass_keys_kernel<64>)
GOKV_SYCL_INSTANCES_MASS_KEYS(GOKV_SYCL_DECLARE_INSTANCE)

#endif
