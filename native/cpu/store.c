/*
 * store.c: quantize-on-write, dequantize-on-read and page copies for the CPU backend (docs/architecture.md §4).
 *
 * Quantization of a group x[0..n): s = (max - min) / (2^bits - 1) and b = min are rounded to fp16 first,
 * then q = clamp(floor((x - b) / s + 1/2), 0, 2^bits - 1) against the stored s and b, so the codes are the
 * best ones for what is actually stored. s == 0 (constant group, or a range below fp16's resolution) stores
 * q = 0 and reads back b.
 * KIVI: tokens enter the sequence's fp16 ring first; each time it would hold R + g tokens, the oldest g are
 * quantized, keys per channel (packed along tokens) and values per token, from their fp16 ring copies.
 */
#define _GNU_SOURCE
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "gokv_half.h"

/* ---- key bounds (Quest, gokv_layout.h): per page and kv head, the per-channel min and max of the keys as
 * stored, rounded outward to fp16 ---- */

static uint16_t half_down(float x) { /* the largest fp16 <= x */
    uint16_t h = gokv_float_to_half(x);
    if (!(gokv_half_to_float(h) > x)) return h;
    return (h & 0x7fffu) == 0 ? 0x8001u : (h & 0x8000u) ? (uint16_t)(h + 1u) : (uint16_t)(h - 1u);
}

static uint16_t half_up(float x) { /* the smallest fp16 >= x */
    uint16_t h = gokv_float_to_half(x);
    if (!(gokv_half_to_float(h) < x)) return h;
    return (h & 0x7fffu) == 0 ? 0x0001u : (h & 0x8000u) ? (uint16_t)(h - 1u) : (uint16_t)(h + 1u);
}

void cpu_bounds_reset(const gokv_layout *L, uint16_t *b) {
    for (int32_t h = 0; h < L->n_kv_heads; h++)
        for (int32_t c = 0; c < L->d_k; c++) {
            b[(size_t)h * 2 * L->d_k + c] = 0x7c00u;           /* min = +inf */
            b[(size_t)h * 2 * L->d_k + L->d_k + c] = 0xfc00u;  /* max = -inf */
        }
}

/* Widens channel c of kv head h's bounds (b: the page's) by n stored key values x[0..n). */
static void bounds_widen(const gokv_layout *L, uint16_t *b, int32_t h, int32_t c, const float *x, int32_t n) {
    uint16_t *lo = b + (size_t)h * 2 * L->d_k + c, *hi = lo + L->d_k;
    float mn = INFINITY, mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
    }
    if (mn < gokv_half_to_float(*lo)) *lo = half_down(mn);
    if (mx > gokv_half_to_float(*hi)) *hi = half_up(mx);
}

/* After slot `slot` of page id was written (per-token formats): its keys as stored widen the page's bounds. */
static void bounds_token(cpu_pool *p, const gokv_layout *L, int32_t id, int32_t slot) {
    uint16_t *b = cpu_bounds(p, L, id);
    if (slot == 0) cpu_bounds_reset(L, b);
    const cpu_kernels *kern = cpu_kernels_get(GOKV_CPU_SCALAR);
    float x[1024];
    for (int32_t h = 0; h < L->n_kv_heads; h++) {
        cpu_rows r = cpu_page_rows(L, cpu_page(p, L, id), h, 0, slot, 1);
        kern->dequant_row(&r, 0, L->d_k, x);
        for (int32_t c = 0; c < L->d_k; c++) bounds_widen(L, b, h, c, x + c, 1);
    }
}

/* After KIVI key group j of page id was quantized: its keys as stored, q·s + b as gokv_pool_read reads them,
 * widen the page's bounds (group 0 starts them afresh). */
static void bounds_kivi_group(cpu_pool *p, const gokv_layout *L, int32_t id, int32_t j) {
    uint16_t *b = cpu_bounds(p, L, id);
    if (j == 0) cpu_bounds_reset(L, b);
    const int32_t g = L->group, bytes = g * L->bits / 8;
    float x[128];
    for (int32_t h = 0; h < L->n_kv_heads; h++) {
        const cpu_chan ch = cpu_page_chan(L, cpu_page(p, L, id), h, j);
        for (int32_t c = 0; c < L->d_k; c++) {
            const float s = gokv_half_to_float(ch.scale[c]), bias = gokv_half_to_float(ch.bias[c]);
            for (int32_t t = 0; t < g; t++) {
                const uint8_t byte = ch.codes[(size_t)c * bytes + (size_t)(t * L->bits / 8)];
                const uint32_t q = (byte >> ((t * L->bits) % 8)) & ((1u << L->bits) - 1u);
                x[t] = (float)q * s + bias;
            }
            bounds_widen(L, b, h, c, x, g);
        }
    }
}

/* Page id's bounds as writes of its slots [0, n_tokens) in order would have left them (gokv_pool_set_page_bytes). */
static void bounds_recompute(cpu_pool *p, const gokv_layout *L, int32_t id, int32_t n_tokens) {
    cpu_bounds_reset(L, cpu_bounds(p, L, id));
    if (L->kivi) {
        for (int32_t j = 0; j < n_tokens / L->group; j++) bounds_kivi_group(p, L, id, j);
        return;
    }
    for (int32_t t = 0; t < n_tokens; t++) bounds_token(p, L, id, t);
}

/* Quantizes n values (stride apart) into codes q[0..n) with fp16 scale and bias. */
static void quantize_group(const float *x, size_t stride, int32_t n, int32_t bits, uint16_t *s16, uint16_t *b16,
                           uint8_t *q) {
    float lo = x[0], hi = x[0];
    for (int32_t i = 1; i < n; i++) {
        const float v = x[(size_t)i * stride];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    const float qmax = (float)((1 << bits) - 1);
    *s16 = gokv_float_to_half((hi - lo) / qmax);
    *b16 = gokv_float_to_half(lo);
    const float s = gokv_half_to_float(*s16), b = gokv_half_to_float(*b16);
    for (int32_t i = 0; i < n; i++) {
        float code = s > 0.0f ? floorf((x[(size_t)i * stride] - b) / s + 0.5f) : 0.0f;
        code = code < 0.0f ? 0.0f : (code > qmax ? qmax : code);
        q[i] = (uint8_t)code;
    }
}

/* Packs n codes of `bits` bits, lowest first: byte = q0 | q1<<bits | ... */
static void pack_codes(const uint8_t *q, int32_t n, int32_t bits, uint8_t *out) {
    if (bits == 8) {
        memcpy(out, q, (size_t)n);
        return;
    }
    const int32_t per_byte = 8 / bits;
    for (int32_t i = 0; i < n / per_byte; i++) {
        uint8_t byte = 0;
        for (int32_t j = 0; j < per_byte; j++) byte |= (uint8_t)(q[i * per_byte + j] << (j * bits));
        out[i] = byte;
    }
}

/* Stores one row of d values in a per-token section (codes, scale, bias) in the layout's format. */
static void store_row(const gokv_layout *L, const float *x, int32_t d, uint8_t *codes, uint16_t *scale, uint16_t *bias) {
    switch (L->format) {
    case GOKV_FORMAT_F32: memcpy(codes, x, (size_t)d * 4u); return;
    case GOKV_FORMAT_F16:
        for (int32_t c = 0; c < d; c++) {
            const uint16_t h = gokv_float_to_half(x[c]);
            memcpy(codes + 2 * (size_t)c, &h, 2);
        }
        return;
    default: {
        uint8_t q[1024];
        const int32_t g = L->group;
        for (int32_t j = 0; j < d / g; j++) quantize_group(x + j * g, 1, g, L->bits, &scale[j], &bias[j], q + j * g);
        pack_codes(q, d, L->bits, codes);
    }
    }
}

/* Writes position pos of a per-token format (k and v rows of all heads) into its page slot. */
static void write_token_rows(cpu_pool *p, const gokv_layout *L, uint8_t *page, int32_t slot, const float *k,
                             const float *v) {
    (void)p;
    for (int32_t h = 0; h < L->n_kv_heads; h++) {
        cpu_rows r = cpu_page_rows(L, page, h, 0, slot, 1);
        if (r.tile >= 0) { /* tiled q4 keys: the row's dwords go to lane r.tile of its tile's columns */
            uint8_t row[CPU_TILE_ROW_MAX];
            store_row(L, k + (size_t)h * L->d_k, L->d_k, row, (uint16_t *)r.scale, (uint16_t *)r.bias);
            for (size_t j = 0; j < r.row_stride / 4u; j++)
                memcpy((uint8_t *)r.codes + gokv_k_code_byte(L, r.tile, 4u * j), row + 4u * j, 4);
        } else {
            store_row(L, k + (size_t)h * L->d_k, L->d_k, (uint8_t *)r.codes, (uint16_t *)r.scale, (uint16_t *)r.bias);
        }
        if (!L->v_is_k_prefix) {
            r = cpu_page_rows(L, page, h, 1, slot, 1);
            store_row(L, v + (size_t)h * L->d_v, L->d_v, (uint8_t *)r.codes, (uint16_t *)r.scale, (uint16_t *)r.bias);
        }
    }
}

static void ring_store(const gokv_layout *L, uint8_t *ring, int32_t row, const float *k, const float *v) {
    const size_t H = (size_t)L->n_kv_heads;
    uint16_t *rk = (uint16_t *)(ring + L->ring_k) + (size_t)row * H * L->d_k;
    for (size_t i = 0; i < H * (size_t)L->d_k; i++) rk[i] = gokv_float_to_half(k[i]);
    if (!L->v_is_k_prefix) {
        uint16_t *rv = (uint16_t *)(ring + L->ring_v) + (size_t)row * H * L->d_v;
        for (size_t i = 0; i < H * (size_t)L->d_v; i++) rv[i] = gokv_float_to_half(v[i]);
    }
}

/* Quantizes the KIVI group of g tokens starting at position t0 from the ring into its page. */
static void kivi_flush_group(cpu_pool *p, const gokv_layout *L, const int32_t *ids, const uint8_t *ring, int32_t t0) {
    const int32_t g = L->group, P = L->page_size, H = L->n_kv_heads;
    uint8_t *page = cpu_page_mut(p, L, ids[t0 / P]);
    const int32_t slot0 = t0 % P, j = slot0 / g;
    float x[1024];
    uint8_t q[128];
    for (int32_t h = 0; h < H; h++) {
        cpu_chan ch = cpu_page_chan(L, page, h, j);
        for (int32_t c = 0; c < L->d_k; c++) {
            for (int32_t t = 0; t < g; t++) {
                const int32_t row = (t0 + t) % L->ring_rows;
                x[t] = gokv_half_to_float(((const uint16_t *)(ring + L->ring_k))[((size_t)row * H + h) * L->d_k + c]);
            }
            quantize_group(x, 1, g, L->bits, (uint16_t *)&ch.scale[c], (uint16_t *)&ch.bias[c], q);
            pack_codes(q, g, L->bits, (uint8_t *)ch.codes + (size_t)c * (size_t)(g * L->bits / 8));
        }
        if (L->v_is_k_prefix) continue;
        for (int32_t t = 0; t < g; t++) {
            const int32_t row = (t0 + t) % L->ring_rows;
            const uint16_t *rv = (const uint16_t *)(ring + L->ring_v) + ((size_t)row * H + h) * L->d_v;
            for (int32_t c = 0; c < L->d_v; c++) x[c] = gokv_half_to_float(rv[c]);
            cpu_rows r = cpu_page_rows(L, page, h, 1, slot0 + t, 1);
            store_row(L, x, L->d_v, (uint8_t *)r.codes, (uint16_t *)r.scale, (uint16_t *)r.bias);
        }
    }
    if (L->key_bounds) bounds_kivi_group(p, L, ids[t0 / P], j);
}

typedef struct write_ctx {
    cpu_pool *p;
    const gokv_layout *L;
    const gokv_write_desc *d;
} write_ctx;

static void write_sequence(void *ctx_, int64_t s, int32_t worker) {
    (void)worker;
    const write_ctx *ctx = ctx_;
    const gokv_layout *L = ctx->L;
    const gokv_write_desc *d = ctx->d;
    const int32_t *ids = d->page_ids + d->page_indptr[s];
    const int32_t row0 = d->tok_indptr[s], n = d->tok_indptr[s + 1] - row0, start = d->start_pos[s];
    const size_t k_row = (size_t)L->n_kv_heads * L->d_k, v_row = (size_t)L->n_kv_heads * L->d_v;
    uint8_t *ring = L->kivi && n > 0 ? cpu_ring(ctx->p, L, d->residual_slot[s]) : NULL;
    for (int32_t j = 0; j < n; j++) {
        const int32_t pos = start + j;
        const float *k = d->k + (size_t)(row0 + j) * k_row;
        const float *v = L->v_is_k_prefix ? NULL : d->v + (size_t)(row0 + j) * v_row;
        if (!L->kivi) {
            write_token_rows(ctx->p, L, cpu_page_mut(ctx->p, L, ids[pos / L->page_size]), pos % L->page_size, k, v);
            if (L->key_bounds) bounds_token(ctx->p, L, ids[pos / L->page_size], pos % L->page_size);
            continue;
        }
        ring_store(L, ring, pos % L->ring_rows, k, v);
        const int32_t before = gokv_kivi_quantized_len(pos, L->group, L->residual);
        if (gokv_kivi_quantized_len(pos + 1, L->group, L->residual) > before) kivi_flush_group(ctx->p, L, ids, ring, before);
    }
}

gokv_status cpu_pool_write(void *dev_, void *pool, const gokv_layout *L, const gokv_write_desc *d) {
    cpu_device *dev = dev_;
    write_ctx ctx = {pool, L, d};
    /* sequences write disjoint pages and rings (validated), so they run in parallel */
    cpu_threadpool_run(dev->tp, d->n_seqs, write_sequence, &ctx);
    return GOKV_OK;
}

void cpu_read_sequence(const cpu_kernels *kern, const cpu_pool *p, const gokv_layout *L, const int32_t *ids,
                       int32_t kv_len, int32_t slot, int32_t start, int32_t n, float *k_out, float *v_out) {
    const int32_t H = L->n_kv_heads, P = L->page_size;
    const int32_t n_quant = L->kivi ? gokv_kivi_quantized_len(kv_len, L->group, L->residual) : kv_len;
    const uint8_t *ring = L->kivi && slot >= 0 ? cpu_ring(p, L, slot) : NULL;
    for (int32_t j = 0; j < n; j++) {
        const int32_t pos = start + j;
        for (int32_t h = 0; h < H; h++) {
            float *ko = k_out + ((size_t)j * H + h) * L->d_k;
            float *vo = v_out ? v_out + ((size_t)j * H + h) * L->d_v : NULL;
            const int32_t id = ids[pos / P];
            if (id < 0) { /* released page (hides ring tokens too) */
                memset(ko, 0, (size_t)L->d_k * sizeof *ko);
                if (vo) memset(vo, 0, (size_t)L->d_v * sizeof *vo);
                continue;
            }
            if (pos >= n_quant) { /* KIVI ring */
                cpu_rows rk = cpu_ring_rows(L, ring, h, 0, pos % L->ring_rows, 1);
                kern->dequant_row(&rk, 0, L->d_k, ko);
                if (vo) {
                    cpu_rows rv = cpu_ring_rows(L, ring, h, 1, pos % L->ring_rows, 1);
                    kern->dequant_row(&rv, 0, L->d_v, vo);
                }
                continue;
            }
            const uint8_t *page = cpu_page(p, L, id);
            const int32_t slot_in_page = pos % P;
            if (L->kivi) {
                cpu_chan ch = cpu_page_chan(L, page, h, slot_in_page / L->group);
                const int32_t t = slot_in_page % L->group, bytes = L->group * L->bits / 8;
                for (int32_t c = 0; c < L->d_k; c++) {
                    const uint8_t byte = ch.codes[(size_t)c * bytes + (size_t)(t * L->bits / 8)];
                    const uint32_t code = (byte >> ((t * L->bits) % 8)) & ((1u << L->bits) - 1u);
                    ko[c] = (float)code * gokv_half_to_float(ch.scale[c]) + gokv_half_to_float(ch.bias[c]);
                }
            } else {
                cpu_rows rk = cpu_page_rows(L, page, h, 0, slot_in_page, 1);
                kern->dequant_row(&rk, 0, L->d_k, ko);
            }
            if (!vo) continue;
            if (L->v_is_k_prefix) {
                memcpy(vo, ko, (size_t)L->d_v * sizeof *vo);
            } else {
                cpu_rows rv = cpu_page_rows(L, page, h, 1, slot_in_page, 1);
                kern->dequant_row(&rv, 0, L->d_v, vo);
            }
        }
    }
}

gokv_status cpu_pool_read(void *dev, void *pool, const gokv_layout *L, const gokv_read_desc *d) {
    (void)dev;
    const size_t k_row = (size_t)L->n_kv_heads * L->d_k, v_row = (size_t)L->n_kv_heads * L->d_v;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const int32_t row0 = d->tok_indptr[s], n = d->tok_indptr[s + 1] - row0;
        if (n == 0) continue;
        cpu_read_sequence(cpu_kernels_get(GOKV_CPU_SCALAR), pool, L, d->page_ids + d->page_indptr[s], d->kv_len[s],
                          L->kivi ? d->residual_slot[s] : -1, d->start_pos[s], n, d->k_out + (size_t)row0 * k_row,
                          d->v_out ? d->v_out + (size_t)row0 * v_row : NULL);
    }
    return GOKV_OK;
}

gokv_status cpu_pool_copy(void *dev, void *pool_, const gokv_layout *L, const gokv_copy_desc *d) {
    (void)dev;
    cpu_pool *p = pool_;
    for (int32_t i = 0; i < d->n_pages; i++) {
        memcpy(cpu_page_mut(p, L, d->dst_pages[i]), cpu_page(p, L, d->src_pages[i]), L->page_bytes);
        if (L->key_bounds)
            memcpy(cpu_bounds(p, L, d->dst_pages[i]), cpu_bounds(p, L, d->src_pages[i]), L->bounds_bytes);
    }
    for (int32_t i = 0; i < d->n_slots; i++)
        memcpy(cpu_ring(p, L, d->dst_slots[i]), cpu_ring(p, L, d->src_slots[i]), L->ring_bytes);
    return GOKV_OK;
}

/* A page or ring as stored (validated by the core: in range, its bytes finite where they hold tokens); with
 * key_bounds the page's bounds are rebuilt from its first n_tokens slots. */
gokv_status cpu_pool_set_page_bytes(void *dev, void *pool, const gokv_layout *L, int32_t page, const void *bytes,
                                    int32_t n_tokens) {
    (void)dev;
    memcpy(cpu_page_mut(pool, L, page), bytes, L->page_bytes);
    if (L->key_bounds) bounds_recompute(pool, L, page, n_tokens);
    return GOKV_OK;
}

gokv_status cpu_pool_set_slot_bytes(void *dev, void *pool, const gokv_layout *L, int32_t slot, const void *bytes) {
    (void)dev;
    memcpy(cpu_ring(pool, L, slot), bytes, L->ring_bytes);
    return GOKV_OK;
}
