/* gokv_layout.c: computes the page and ring layout of gokv_layout.h from a pool description. */
#include "gokv_layout.h"

static uint64_t align64(uint64_t x) { return (x + 63u) & ~(uint64_t)63u; }

/* Places a section of `bytes` at *off and moves *off to the next 64-byte boundary after it. */
static uint64_t take_section(uint64_t *off, uint64_t bytes) {
    const uint64_t at = *off;
    *off = align64(at + bytes);
    return at;
}

void gokv_layout_init(gokv_layout *L, const gokv_pool_desc *d) {
    const uint64_t P = (uint64_t)d->page_size;
    const uint64_t H = (uint64_t)d->n_kv_heads;
    L->format = d->format;
    L->bits = gokv_format_bits(d->format);
    L->group = gokv_format_quantized(d->format) ? d->group_size : 0;
    L->page_size = d->page_size;
    L->n_kv_heads = d->n_kv_heads;
    L->d_k = d->head_dim_k;
    L->d_v = d->head_dim_v;
    L->v_is_k_prefix = d->v_is_k_prefix ? 1 : 0;
    L->kivi = gokv_format_is_kivi(d->format);
    L->residual = L->kivi ? d->residual : 0;
    L->ring_rows = L->kivi ? d->residual + d->group_size : 0;

    const uint64_t bits = (uint64_t)L->bits;
    const int quant = gokv_format_quantized(d->format);

    /* Sizes of one kv head's part of each section; the sections of one head are laid end to end (each on a
     * 64-byte boundary) and the heads follow each other, so the X_head fields are the stride between heads. */
    uint64_t k_codes_bytes, k_sb_bytes, v_codes_bytes = 0, v_sb_bytes = 0;
    L->k_tiled = 0;
    if (L->kivi) {
        /* per token group: d_k channels x g tokens packed along tokens */
        L->k_row_bytes = (uint64_t)L->d_k * (uint64_t)L->group * bits / 8u;
        L->k_groups = L->d_k;
        k_codes_bytes = L->k_row_bytes * (P / (uint64_t)L->group);
        k_sb_bytes = (uint64_t)L->d_k * (P / (uint64_t)L->group) * 2u;
    } else {
        L->k_row_bytes = (uint64_t)L->d_k * bits / 8u;
        L->k_groups = quant ? L->d_k / L->group : 0;
        L->k_tiled = d->format == GOKV_FORMAT_Q4 && !L->v_is_k_prefix; /* d_k % 32 == 0: whole dwords */
        const uint64_t slots = L->k_tiled ? (P + GOKV_KEY_TILE - 1u) / GOKV_KEY_TILE * GOKV_KEY_TILE : P;
        k_codes_bytes = L->k_row_bytes * slots;
        k_sb_bytes = (uint64_t)L->k_groups * P * 2u;
    }
    /* values: always per token */
    if (L->v_is_k_prefix) {
        L->v_row_bytes = 0;
        L->v_groups = 0;
    } else {
        L->v_row_bytes = (uint64_t)L->d_v * bits / 8u;
        L->v_groups = quant ? L->d_v / L->group : 0;
        v_codes_bytes = L->v_row_bytes * P;
        v_sb_bytes = (uint64_t)L->v_groups * P * 2u;
    }
    uint64_t off = 0;
    L->k_codes = take_section(&off, k_codes_bytes);
    L->k_scale = take_section(&off, k_sb_bytes);
    L->k_bias = take_section(&off, k_sb_bytes);
    L->v_codes = take_section(&off, v_codes_bytes);
    L->v_scale = take_section(&off, v_sb_bytes);
    L->v_bias = take_section(&off, v_sb_bytes);
    /* off is now the bytes of one head's block */
    L->k_codes_head = L->k_sb_head = off;
    L->v_codes_head = L->v_sb_head = L->v_is_k_prefix ? 0 : off;
    L->page_bytes = off * H;

    /* residual ring */
    if (L->kivi) {
        const uint64_t rows = (uint64_t)L->ring_rows;
        L->ring_k = 0;
        L->ring_v = align64(rows * H * (uint64_t)L->d_k * 2u);
        L->ring_bytes = L->ring_v + (L->v_is_k_prefix ? 0 : align64(rows * H * (uint64_t)L->d_v * 2u));
    } else {
        L->ring_k = L->ring_v = L->ring_bytes = 0;
    }
    L->key_bounds = d->key_bounds ? 1 : 0;
    L->bounds_bytes = L->key_bounds ? H * 2u * (uint64_t)L->d_k * 2u : 0;
}
