/* gokv_layout.c: computes the page and ring layout of gokv_layout.h from a pool description. */
#include "gokv_layout.h"

static uint64_t align64(uint64_t x) { return (x + 63u) & ~(uint64_t)63u; }

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
    uint64_t off = 0;

    /* keys */
    L->k_codes = off;
    if (L->kivi) {
        /* per token group: d_k channels x g tokens packed along tokens */
        L->k_row_bytes = (uint64_t)L->d_k * (uint64_t)L->group * bits / 8u;
        L->k_groups = L->d_k;
        L->k_codes_head = L->k_row_bytes * (P / (uint64_t)L->group);
        L->k_sb_head = (uint64_t)L->d_k * (P / (uint64_t)L->group) * 2u;
    } else {
        L->k_row_bytes = (uint64_t)L->d_k * bits / 8u;
        L->k_groups = quant ? L->d_k / L->group : 0;
        L->k_codes_head = L->k_row_bytes * P;
        L->k_sb_head = (uint64_t)L->k_groups * P * 2u;
    }
    off = align64(off + L->k_codes_head * H);
    L->k_scale = off;
    off = align64(off + L->k_sb_head * H);
    L->k_bias = off;
    off = align64(off + L->k_sb_head * H);

    /* values: always per token */
    if (L->v_is_k_prefix) {
        L->v_row_bytes = 0;
        L->v_groups = 0;
        L->v_codes_head = L->v_sb_head = 0;
        L->v_codes = L->v_scale = L->v_bias = off;
    } else {
        L->v_row_bytes = (uint64_t)L->d_v * bits / 8u;
        L->v_groups = quant ? L->d_v / L->group : 0;
        L->v_codes_head = L->v_row_bytes * P;
        L->v_sb_head = (uint64_t)L->v_groups * P * 2u;
        L->v_codes = off;
        off = align64(off + L->v_codes_head * H);
        L->v_scale = off;
        off = align64(off + L->v_sb_head * H);
        L->v_bias = off;
        off = align64(off + L->v_sb_head * H);
    }
    L->page_bytes = off;

    /* residual ring */
    if (L->kivi) {
        const uint64_t rows = (uint64_t)L->ring_rows;
        L->ring_k = 0;
        L->ring_v = align64(rows * H * (uint64_t)L->d_k * 2u);
        L->ring_bytes = L->ring_v + (L->v_is_k_prefix ? 0 : align64(rows * H * (uint64_t)L->d_v * 2u));
    } else {
        L->ring_k = L->ring_v = L->ring_bytes = 0;
    }
}
