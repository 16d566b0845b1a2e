// mass_keys.comp: attention mass for sequences whose counted rows are many (longer prefills): instead of
// keeping every score in scratch (mass.comp), it computes the scores again from the pool, with
// attend_common.glsl's key decoding, once each row's softmax factors (a, b) are known (prob = e^(s - a) b,
// stored by the attention pass or reduce_mass.comp). For sequence i, kv head h and token t < kv_len[i]:
//     mass[off_i + h kv_len[i] + t] = Σ over the counted rows r that see t and h's query heads q of
//                                     e^(s_rqt - a_rq) b_rq.
// One workgroup per item (MASS_ITEM_WORDS words of the inputs: sequence, kv head, first token): invocation k
// takes token t0 + k. The counted rows' query vectors (rows x the kv head's query heads) go through shared
// memory NQ_MAX at a time, scaled as the attention pass scales them, so the scores are the same. Every
// element of the item's tokens is written (0 where no counted row sees t). Push constants: attend's
// (n_items and item_w name this shader's items; part_w is unused).
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 28) in;
#define GOKV_READ_ONLY_POOL
#define UP_QUAL readonly
#define DOWN_QUAL writeonly
#include "common.glsl"
#include "attend_common.glsl"

const uint MASS_ITEM_WORDS = 3u;

void main() {
    const uint lid = gl_LocalInvocationID.x;
    const uint item = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (item >= pc.n_items) return;
    const uint iw = pc.item_w + item * MASS_ITEM_WORDS;
    const uint seq = in_u(iw), kvh = in_u(iw + 1u), t = in_u(iw + 2u) + lid;
    const uint sw = pc.seq_w + seq * SEQ_WORDS;
    const uint kv_len = in_u(sw), n_quant = in_u(sw + 1u), page_w = in_u(sw + 2u), rs = in_u(sw + 4u);
    uint mask_w = in_u(sw + 3u);
    if (mask_w != NONE) mask_w += kvh * in_u(sw + 5u);
    const uint row0 = in_u(sw + 6u), n_rows = in_u(sw + 7u), pos0 = in_u(sw + 8u), out_w = in_u(sw + 10u);
    const uint G = pc.n_heads_q / N_KV_HEADS, head0 = kvh * G, n_vec = n_rows * G;

    // whether t is stored, valid for this kv head and its page not released (the rows' positions aside)
    bool ok = t < kv_len;
    int id = -1;
    if (ok) {
        id = int(in_u(page_w + t / PAGE_SIZE));
        ok = id >= 0;
        if (ok && mask_w != NONE) ok = ((in_u(mask_w + (t >> 5)) >> (t & 31u)) & 1u) != 0u;
    }
    const bool ring = KIVI != 0u && t >= n_quant;
    float sum = 0.0;
    for (uint v0 = 0u; v0 < n_vec; v0 += NQ_MAX) {
        barrier(); // the previous vectors' queries are no longer read
        for (uint x = lid; x < NQ_MAX * DK4; x += WG_SIZE) {
            uint i = x / DK4, c4 = x % DK4, v = v0 + i;
            vec4 q = vec4(0.0);
            if (v < n_vec) {
                uint w = pc.q_w + ((row0 + v / G) * pc.n_heads_q + head0 + v % G) * D_K + 4u * c4;
                q = uintBitsToFloat(uvec4(in_u(w), in_u(w + 1u), in_u(w + 2u), in_u(w + 3u))) * pc.scale;
            }
            qo[x] = q;
        }
        barrier();
        // some row of these vectors sees t iff the first of them at or after t does
        const uint j0 = v0 / G, j1 = min(n_rows - 1u, (v0 + NQ_MAX - 1u) / G);
        const uint p_first = max(t, pos0 + j0);
        if (ok && p_first <= pos0 + j1 && sees(p_first, t)) {
            [[unroll]] for (uint i = 0u; i < NQ_MAX; i++) score[i] = 0.0;
            if (ring) {
                score_ring_key(rs, t, kvh);
            } else if (KIVI != 0u) {
                score_kivi_key(uint(id), kvh, t % PAGE_SIZE);
            } else {
                uint sl = t % PAGE_SIZE;
                score_key_row(key_word(uint(id), kvh, sl, 0u), row_scale_half(uint(id), kvh, sl, 0u, false),
                              row_bias_half(uint(id), kvh, sl, 0u, false));
            }
            [[unroll]] for (uint i = 0u; i < NQ_MAX; i++) {
                const uint v = v0 + i;
                if (v < n_vec && sees(pos0 + v / G, t)) {
                    const uint st = pc.stats_w + 2u * ((row0 + v / G) * pc.n_heads_q + head0 + v % G);
                    sum += exp(score[i] - uintBitsToFloat(scratch[st])) * uintBitsToFloat(scratch[st + 1u]);
                }
            }
        }
    }
    if (t < kv_len) down[out_w + kvh * kv_len + t] = floatBitsToUint(sum);
}
