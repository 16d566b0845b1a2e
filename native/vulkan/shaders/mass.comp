// mass.comp: attention mass (gokv_attend_desc.mass), the last pass of an attend call that asks for it. For
// sequence i, kv head h and token t < kv_len[i]:
//     mass[off_i + h kv_len[i] + t] = Σ over the counted rows r and h's query heads q of e^(s_rqt - a_rq) b_rq,
// where s_rqt is the score attend.comp stored (MASS) for every token of the ranges row r's tile walked (NEG
// where r does not see t) and (a, b) are the row's softmax factors that the attention pass (rows it
// finalized) or reduce_mass.comp (split rows) stored: prob = e^(s - a) b, learned sink included in b.
// Tokens outside row r's ranges are invisible to r (t > p, or outside the window and not a sink token),
// and are skipped before any score is read; every element is written (0 where no counted row sees t), also
// for sequences with no query rows.
//
// One workgroup per item (MASS_ITEM_WORDS words of the inputs: sequence, kv head, first token); invocation k
// takes tokens t0 + k, t0 + k + WG_SIZE, ... below min(t0 + span, kv_len). The sequence table is
// attend_common.glsl's (SEQ_WORDS).
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 28) in;
#define GOKV_READ_ONLY_POOL
#define UP_QUAL readonly
#define SCRATCH_QUAL readonly
#define DOWN_QUAL writeonly
#include "common.glsl"

const uint NONE = 0xffffffffu;
const float NEG = -3.0e38;
const uint MASS_ITEM_WORDS = 3u, SEQ_WORDS = 11u;

#include "gpu_push.h"
PUSH_BLOCK(GOKV_PUSH_MASS); // the fields: gpu_push.h

#include "attend_inputs.glsl"

// Whether a query at position p sees token t (< kv_len), by position alone (attend_common.glsl's sees).
bool sees(uint p, uint t) {
    return t <= p && (pc.window == 0 || p - t < uint(pc.window) || t < uint(pc.n_sink_tokens));
}

void main() {
    const uint item = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (item >= pc.n_items) return;
    const uint iw = pc.item_w + item * MASS_ITEM_WORDS;
    const uint seq = in_u(iw), kvh = in_u(iw + 1u), t0 = in_u(iw + 2u);
    const uint sw = pc.seq_w + seq * SEQ_WORDS;
    const uint kv_len = in_u(sw), row0 = in_u(sw + 6u), n_rows = in_u(sw + 7u), pos0 = in_u(sw + 8u);
    const uint score_w = in_u(sw + 9u), out_w = in_u(sw + 10u) + kvh * kv_len;
    const uint G = pc.n_heads_q / N_KV_HEADS, head0 = kvh * G, t_end = min(t0 + pc.span, kv_len);
    for (uint t = t0 + gl_LocalInvocationID.x; t < t_end; t += WG_SIZE) {
        float sum = 0.0;
        for (uint j = 0u; j < n_rows; j++) {
            if (!sees(pos0 + j, t)) continue;
            const uint sr = score_w + j * pc.n_heads_q * kv_len + t, st = pc.stats_w + 2u * ((row0 + j) * pc.n_heads_q);
            for (uint g = 0u; g < G; g++) {
                const uint head = head0 + g;
                const float s = uintBitsToFloat(scratch[sr + head * kv_len]);
                if (s != NEG)
                    sum += exp(s - uintBitsToFloat(scratch[st + 2u * head])) * uintBitsToFloat(scratch[st + 2u * head + 1u]);
            }
        }
        down[out_w + t] = floatBitsToUint(sum);
    }
}
