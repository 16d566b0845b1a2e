// quest_score.comp: Quest's page bounds (gokv_attend_desc.quest_pages), the first pass of a Quest call
// (native/gpu/gpu_attend.c): for each page-table entry of a sequence with a decode row and each kv head,
//     B = max over the kv head's query heads h of Σ_c max(q_hc · min_c, q_hc · max_c)
// from the page's key bounds alone (store_bounds.comp keeps them after the pool's pages), summed over the
// channels in order as native/cpu/quest.c's scalar path does; -inf for entries the host marks NONE
// (released pages, pages with no key yet, sequences without a query row). max(q min, q max) is taken as
// q · (q < 0 ? min : max), as native/cpu/quest.c's SIMD path does: the same value for bounds that hold a
// key, and -inf (no bound) for a page whose bounds say "no key" (min = +inf, max = -inf: a page loaded
// with n_tokens 0). quest_select.comp chooses the pages from them.
//
// One invocation per (entry, kv head). Inputs (attend_inputs.glsl: staged in scratch on a Quest call):
// 2 words per entry at entry_w: page (NONE: -inf), the word of query head 0 of the sequence's row
// (queries [rows][group * N_KV_HEADS][D_K]). Out: B as floats [entries][N_KV_HEADS] at scratch word out_w.
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 28) in;

#define GOKV_READ_ONLY_POOL
#define UP_QUAL readonly
#include "common.glsl"
#include "store_common.glsl"

#include "gpu_push.h"
PUSH_BLOCK(GOKV_PUSH_QUEST_SCORE); // the fields: gpu_push.h

#include "attend_inputs.glsl"

void main() {
    uint item = store_item();
    if (item >= pc.n_items) return;
    uint e = item / N_KV_HEADS, head = item % N_KV_HEADS;
    uint page = in_u(pc.entry_w + 2u * e), q0 = in_u(pc.entry_w + 2u * e + 1u);
    float best = -1.0 / 0.0;
    if (page != 0xffffffffu) {
        uint lo_h = (pc.bounds_w + (page * N_KV_HEADS + head) * D_K) * 2u; // half index of the min row
        uint qw = q0 + head * pc.group * D_K;
        for (uint g = 0u; g < pc.group; g++) {
            precise float acc = 0.0;
            for (uint c = 0u; c < D_K; c++) {
                float q = in_f(qw + g * D_K + c);
                precise float x = q < 0.0 ? q * page_half(lo_h + c) : q * page_half(lo_h + D_K + c);
                acc += x;
            }
            // acc > best fails for a NaN (q_c = 0 against a page with no key), which stays -inf
            best = acc > best ? acc : best;
        }
    }
    scratch[pc.out_w + item] = floatBitsToUint(best);
}
