// mass.metal: attention mass (gokv_attend_desc.mass), the last pass of an attend call that asks for it; a port
// of native/vulkan/shaders/mass.comp. For sequence i, kv head h and token t < kv_len[i]:
//     mass[off_i + h kv_len[i] + t] = Σ over the counted rows r and h's query heads q of e^(s_rqt - a_rq) b_rq,
// where s_rqt is the score attend stored (MASS) for every token of the ranges row r's tile walked (NEG where r
// does not see t) and (a, b) are the row's softmax factors that the attention pass (rows it finalized) or
// reduce_mass (split rows) stored: prob = e^(s - a) b, learned sink included in b. Tokens outside row r's
// ranges are invisible to r and skipped before any score is read; every element is written (0 where no counted
// row sees t), also for sequences with no query rows.
//
// One threadgroup per item (MASS_ITEM_WORDS words of the inputs: sequence, kv head, first token); thread k takes
// tokens t0 + k, t0 + k + WG_SIZE, ... below min(t0 + span, kv_len). The sequence table is attend's (SEQ_WORDS).
//
// One instance, mass: every constant is a runtime spec word.
#include "mtl_kernel.h"
#include "attend.h"

struct mass_push {
    GOKV_PUSH_MASS(PUSH_FIELD)
};

template <typename = void>
kernel void mass(MTL_KERNEL_PARAMS) {
    constant mass_push &pc = *(constant mass_push *)push_words;
    device uint *in = inputs_of(up, scratch, spec, pc.in_base);
    const uint WG = spec[GPU_SPEC_WG_SIZE];
    const uint item = group_id.y * n_groups.x + group_id.x;
    if (item >= pc.n_items) return;
    const uint iw = pc.item_w + item * MASS_ITEM_WORDS;
    const uint seq = in[iw], kvh = in[iw + 1u], t0 = in[iw + 2u];
    const uint sw = pc.seq_w + seq * SEQ_WORDS;
    const uint kv_len = in[sw], row0 = in[sw + 6u], n_rows = in[sw + 7u], pos0 = in[sw + 8u];
    const uint score_w = in[sw + 9u], out_w = in[sw + 10u] + kvh * kv_len;
    const uint G = pc.n_heads_q / spec[GPU_SPEC_N_KV_HEADS], head0 = kvh * G, t_end = min(t0 + pc.span, kv_len);
    for (uint t = t0 + lid; t < t_end; t += WG) {
        float sum = 0.0f;
        for (uint j = 0u; j < n_rows; j++) {
            if (!sees(pc.window, pc.n_sink_tokens, pos0 + j, t)) continue;
            const uint sr = score_w + j * pc.n_heads_q * kv_len + t;
            const uint st = pc.stats_w + 2u * ((row0 + j) * pc.n_heads_q);
            for (uint g = 0u; g < G; g++) {
                const uint head = head0 + g;
                const float s = as_type<float>(scratch[sr + head * kv_len]);
                if (s != NEG)
                    sum += exp(s - as_type<float>(scratch[st + 2u * head])) *
                           as_type<float>(scratch[st + 2u * head + 1u]);
            }
        }
        down[out_w + t] = as_type<uint>(sum);
    }
}

#define MTL_INSTANCES_MASS(X) X(mass, mass)
MTL_INSTANCES_MASS(MTL_INSTANTIATE)
