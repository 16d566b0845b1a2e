// store_rows.hpp: stores per-token rows in their page slots (docs/architecture.md §4, bridge/gokv_layout.h),
// as native/cpu/store.c's store_row: f32 bits, fp16, or q8/q4 groups of GROUP channels with fp16 scale and
// bias. In KIVI pools it stores the value rows of the token groups being quantized (their keys, per
// channel, are store_kivi_keys.hpp's), from fp16 values as the CPU quantizes them from its ring. A port of
// native/metal/kernels/store_rows.metal (same push constants, inputs and thread order as the Vulkan shader).
//
// One work-item per unit of a row, items ordered (row, K then V, head, unit): a unit is a quantization group
// (it owns the group's code words; scale and bias halves may share a word with a neighbour's), or 4
// channels of an f32/f16 row (whole words). Tiled keys (K_TILED, common.hpp's key_word) put all key items
// first, ordered (head, unit, row), then the values' (row, head, unit): neighbouring work-items then quantize
// one group of neighbouring rows, in a prefill neighbouring slots, whose code words are neighbours in their
// tile (a row-major order would write one word every KEY_TILE words).
//
// up: 4 words per row at meta_w: page, slot, source, ring slot.
//   ring slot == ~0u: source is a row of the input k (floats [rows][N_KV_HEADS][D_K] at k_w) and v (at
//                     v_w); KIVI rounds it to fp16 first.
//   otherwise:        source is a position of the sequence held in that residual ring (KIVI values).
#ifndef GOKV_SYCL_STORE_ROWS_HPP
#define GOKV_SYCL_STORE_ROWS_HPP

#include "store_common.hpp"

namespace gokv_sycl {

struct store_rows_push {
    GOKV_PUSH_STORE_ROWS(PUSH_FIELD)
};

// Value i of the group a work-item quantizes: from its ring (ring != 0: half index first + i of rings) or
// from the input floats (word first + i of up), rounded to fp16 first in KIVI pools.
struct store_rows_source {
    const uint32_t *up;
    uint32_t first, ring;
    float at(const kv_pool &kv, uint32_t i) const {
        if (ring != 0u) return ring_half(kv, first + i);
        const float x = sycl::bit_cast<float>(up[first + i]);
        return kv.KIVI != 0u ? half_to_float(float_to_half(x)) : x;
    }
};

// One instance: every constant is read from the spec words at run time.
struct store_rows {
    args a;
    local_words tg;

    void operator()(sycl::nd_item<3> it) const {
        const store_rows_push pc = push_of<store_rows_push>(a);
        const kv_pool kv = kv_pool_of(a.pages, a.rings, a.spec);
        const uint32_t *up = a.up;
        const uint32_t UNIT = kv.QUANTIZED ? kv.GROUP : 4u;
        const uint32_t K_UNITS = kv.KIVI != 0u ? 0u : kv.N_KV_HEADS * (kv.D_K / UNIT); // KIVI keys: per channel
        const uint32_t V_UNITS = kv.V_IS_K_PREFIX != 0u ? 0u : kv.N_KV_HEADS * (kv.D_V / UNIT);

        const uint32_t item = store_item(it);
        if (item >= pc.n_items) return;
        uint32_t row, u;
        bool is_v;
        if (kv.K_TILED == 0u) {
            row = item / (K_UNITS + V_UNITS);
            u = item % (K_UNITS + V_UNITS);
            is_v = u >= K_UNITS;
            if (is_v) u -= K_UNITS;
        } else {
            const uint32_t rows = pc.n_items / (K_UNITS + V_UNITS);
            if (item < rows * K_UNITS) {
                row = item % rows;
                u = item / rows;
                is_v = false;
            } else {
                row = (item - rows * K_UNITS) / V_UNITS;
                u = (item - rows * K_UNITS) % V_UNITS;
                is_v = true;
            }
        }
        const uint32_t d = is_v ? kv.D_V : kv.D_K;
        const uint32_t head = u / (d / UNIT), c0 = u % (d / UNIT) * UNIT;
        const uint32_t m = pc.meta_w + 4u * row;
        const uint32_t page = up[m], slot = up[m + 1u], source = up[m + 2u], ring_slot = up[m + 3u];
        const uint32_t w = row_word(kv, page, head, slot, is_v);

        const store_rows_source src =
            ring_slot == ~0u
                ? store_rows_source{up, (is_v ? pc.v_w : pc.k_w) + (source * kv.N_KV_HEADS + head) * d + c0, 0u}
                : store_rows_source{up, ring_v_half(kv, ring_slot, source, head, c0), 1u};
        if (kv.FORMAT == FMT_F32) {
            for (uint32_t i = 0u; i < 4u; i++) a.pages[w + c0 + i] = up[src.first + i];
        } else if (kv.FORMAT == FMT_F16) {
            for (uint32_t i = 0u; i < 2u; i++)
                a.pages[w + c0 / 2u + i] = float_to_half(sycl::bit_cast<float>(up[src.first + 2u * i])) |
                                           (float_to_half(sycl::bit_cast<float>(up[src.first + 2u * i + 1u])) << 16);
        } else {
            const uint32_t j = c0 / kv.GROUP;
            const uint32_t code_word =
                is_v ? w + c0 * kv.BITS / 32u : key_word(kv, page, head, slot, c0 * kv.BITS / 32u);
            quantize_group(kv, src, code_word, is_v ? 1u : kv.K_WORD_STEP,
                           row_scale_half(kv, page, head, slot, j, is_v), row_bias_half(kv, page, head, slot, j, is_v));
        }
    }
};

} // namespace gokv_sycl

#define GOKV_SYCL_INSTANCES_STORE_ROWS(X) X(store_rows, gokv_sycl::store_rows)
GOKV_SYCL_INSTANCES_STORE_ROWS(GOKV_SYCL_DECLARE_INSTANCE)

#endif
