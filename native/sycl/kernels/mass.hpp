// mass.hpp: attention mass (gokv_attend_desc.mass), the last pass of an attend call that asks for it; a port
// of native/metal/kernels/mass.metal (mass.comp of the Vulkan module). For sequence i, kv head h and token
// t < kv_len[i]:
//     mass[off_i + h kv_len[i] + t] = Σ over the counted rows r and h's query heads q of e^(s_rqt - a_rq) b_rq,
// where s_rqt is the score attend stored (MASS) for every token of the ranges row r's tile walked (NEG where r
// does not see t) and (a, b) are the row's softmax factors that the attention pass (rows it finalized) or
// reduce_mass (split rows) stored: prob = e^(s - a) b, learned sink included in b. Tokens outside row r's
// ranges are invisible to r and skipped before any score is read; every element is written (0 where no counted
// row sees t), also for sequences with no query rows.
//
// One work-group per item (MASS_ITEM_WORDS words of the inputs: sequence, kv head, first token); thread k takes
// tokens t0 + k, t0 + k + WG_SIZE, ... below min(t0 + span, kv_len). The sequence table is attend's (SEQ_WORDS).
//
// One instance, mass: every constant is a runtime spec word; no local memory.
#ifndef GOKV_SYCL_MASS_HPP
#define GOKV_SYCL_MASS_HPP

#include "attend_common.hpp"

namespace gokv_sycl {

struct mass_push {
    GOKV_PUSH_MASS(PUSH_FIELD)
};

struct mass_kernel {
    args a;
    local_words tg;
    void operator()(sycl::nd_item<3> it) const {
        const mass_push pc = push_of<mass_push>(a);
        const uint32_t *in = inputs_of(a.up, a.scratch, a.spec, pc.in_base);
        const uint32_t *scratch = a.scratch;
        const uint32_t WG = a.spec[GPU_SPEC_WG_SIZE], lid = uint32_t(it.get_local_linear_id());
        const uint32_t item = plan_workgroup(it);
        if (item >= pc.n_items) return;
        const uint32_t iw = pc.item_w + item * MASS_ITEM_WORDS;
        const uint32_t seq = in[iw], kvh = in[iw + 1u], t0 = in[iw + 2u];
        const uint32_t sw = pc.seq_w + seq * SEQ_WORDS;
        const uint32_t kv_len = in[sw], row0 = in[sw + 6u], n_rows = in[sw + 7u], pos0 = in[sw + 8u];
        const uint32_t score_w = in[sw + 9u], out_w = in[sw + 10u] + kvh * kv_len;
        const uint32_t G = pc.n_heads_q / a.spec[GPU_SPEC_N_KV_HEADS], head0 = kvh * G;
        const uint32_t t_end = sycl::min(t0 + pc.span, kv_len);
        for (uint32_t t = t0 + lid; t < t_end; t += WG) {
            float sum = 0.0f;
            for (uint32_t j = 0u; j < n_rows; j++) {
                if (!sees(pc.window, pc.n_sink_tokens, pos0 + j, t)) continue;
                const uint32_t sr = score_w + j * pc.n_heads_q * kv_len + t;
                const uint32_t st = pc.stats_w + 2u * ((row0 + j) * pc.n_heads_q);
                for (uint32_t g = 0u; g < G; g++) {
                    const uint32_t head = head0 + g;
                    const float s = sycl::bit_cast<float>(scratch[sr + head * kv_len]);
                    if (s != NEG)
                        sum += sycl::exp(s - sycl::bit_cast<float>(scratch[st + 2u * head])) *
                               sycl::bit_cast<float>(scratch[st + 2u * head + 1u]);
                }
            }
            a.down[out_w + t] = sycl::bit_cast<uint32_t>(sum);
        }
    }
};

} // namespace gokv_sycl

#define GOKV_SYCL_INSTANCES_MASS(X) X(mass, gokv_sycl::mass_kernel)
GOKV_SYCL_INSTANCES_MASS(GOKV_SYCL_DECLARE_INSTANCE)

#endif
