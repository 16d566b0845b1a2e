/*
 * gokv_pages.c: pages and residual rings written as stored (gokv_pool_set_page_bytes, gokv_pool_set_slot_bytes),
 * and token rows moved between pages byte for byte (gokv_pool_gather_rows), docs/architecture.md §3-4.
 *
 * Stored bytes come from outside the library (a saved cache), so the core checks them before a backend sees
 * them: every fp16 scale and bias and every f32/f16 element of the slots that hold tokens must be finite,
 * and the pool's recorded largest |k| and |v| (the score-range guard, gokv_check_score_range) are raised to
 * cover what the bytes dequantize to, as a write of the same tokens would have.
 *
 * gather_rows has no backend slot: it is built here on page_bytes and set_page_bytes. Everything is
 * validated first; then the rows are sorted by destination page and, within one, by source page, and each
 * destination page is read, patched from its source pages (each read once per destination page) and
 * written back. At most two pages are held at a time, whatever the number of rows.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gokv_core.h"
#include "gokv_half.h"

#define FAIL(st, ...) return gokv_set_error((st), __VA_ARGS__)

static gokv_status ok(void) {
    gokv_set_error(GOKV_OK, "%s", "");
    return GOKV_OK;
}

static int half_finite(uint16_t h) { return (h & 0x7c00u) != 0x7c00u; }

static uint16_t half_at(const uint8_t *p, uint64_t off) {
    uint16_t h;
    memcpy(&h, p + off, sizeof h);
    return h;
}

static float f32_at(const uint8_t *p, uint64_t off) {
    float f;
    memcpy(&f, p + off, sizeof f);
    return f;
}

static float max_f(float a, float b) { return b > a ? b : a; }

/* Checks the per-token rows [0, n_tokens) of kv head h in one section family (keys, or values when value is
 * set) and raises *abs to the largest magnitude they dequantize to. Quantized rows: every fp16 scale and bias
 * finite, and |q·s + b| <= max(|b|, |qmax·s + b|) over the codes' range; f32/f16 rows: every element finite. */
static gokv_status check_token_rows(const char *op, const gokv_layout *L, const uint8_t *page, int32_t h,
                                    int32_t n_tokens, int value, float *abs) {
    const char *const codes_name = value ? "v_codes" : "k_codes";
    const char *const scale_name = value ? "v_scale" : "k_scale";
    const char *const bias_name = value ? "v_bias" : "k_bias";
    const int32_t d = value ? L->d_v : L->d_k, groups = value ? L->v_groups : L->k_groups;
    const uint64_t codes = value ? L->v_codes + (uint64_t)h * L->v_codes_head : L->k_codes + (uint64_t)h * L->k_codes_head;
    const uint64_t row_bytes = value ? L->v_row_bytes : L->k_row_bytes;
    const uint64_t sb_head = (uint64_t)h * (value ? L->v_sb_head : L->k_sb_head);
    const uint64_t scale = (value ? L->v_scale : L->k_scale) + sb_head, bias = (value ? L->v_bias : L->k_bias) + sb_head;
    const float qmax = L->bits <= 8 ? (float)((1 << L->bits) - 1) : 0.0f;
    for (int32_t t = 0; t < n_tokens; t++) {
        if (L->format == GOKV_FORMAT_F32 || L->format == GOKV_FORMAT_F16) {
            for (int32_t c = 0; c < d; c++) {
                const uint64_t off = codes + (uint64_t)t * row_bytes + (uint64_t)c * (uint64_t)(L->bits / 8);
                float x;
                if (L->format == GOKV_FORMAT_F32) {
                    x = f32_at(page, off);
                } else {
                    const uint16_t hx = half_at(page, off);
                    x = half_finite(hx) ? gokv_half_to_float(hx) : INFINITY;
                }
                if (!isfinite(x)) FAIL(GOKV_EINVAL, "%s: kv head %d, slot %d: %s[%d] is not finite", op, h, t, codes_name, c);
                *abs = max_f(*abs, fabsf(x));
            }
            continue;
        }
        for (int32_t j = 0; j < groups; j++) {
            const uint64_t at = ((uint64_t)t * (uint64_t)groups + (uint64_t)j) * 2u;
            const uint16_t s16 = half_at(page, scale + at), b16 = half_at(page, bias + at);
            if (!half_finite(s16)) FAIL(GOKV_EINVAL, "%s: kv head %d, slot %d: %s[%d] is not finite", op, h, t, scale_name, j);
            if (!half_finite(b16)) FAIL(GOKV_EINVAL, "%s: kv head %d, slot %d: %s[%d] is not finite", op, h, t, bias_name, j);
            const float s = gokv_half_to_float(s16), b = gokv_half_to_float(b16);
            *abs = max_f(*abs, max_f(fabsf(b), fabsf(qmax * s + b)));
        }
    }
    return GOKV_OK;
}

/* KIVI keys: the scales and biases of token groups [0, n_tokens / g) of kv head h. */
static gokv_status check_kivi_keys(const char *op, const gokv_layout *L, const uint8_t *page, int32_t h,
                                   int32_t n_tokens, float *abs) {
    const uint64_t scale = L->k_scale + (uint64_t)h * L->k_sb_head, bias = L->k_bias + (uint64_t)h * L->k_sb_head;
    const float qmax = (float)((1 << L->bits) - 1);
    for (int32_t j = 0; j < n_tokens / L->group; j++)
        for (int32_t c = 0; c < L->d_k; c++) {
            const uint64_t at = ((uint64_t)j * (uint64_t)L->d_k + (uint64_t)c) * 2u;
            const uint16_t s16 = half_at(page, scale + at), b16 = half_at(page, bias + at);
            if (!half_finite(s16) || !half_finite(b16))
                FAIL(GOKV_EINVAL, "%s: kv head %d, token group %d (slots %d..%d): %s[%d] is not finite", op, h, j,
                     j * L->group, j * L->group + L->group - 1, half_finite(s16) ? "k_bias" : "k_scale", c);
            const float s = gokv_half_to_float(s16), b = gokv_half_to_float(b16);
            *abs = max_f(*abs, max_f(fabsf(b), fabsf(qmax * s + b)));
        }
    return GOKV_OK;
}

gokv_status gokv_pool_set_page_bytes(gokv_pool *pool, int32_t page, const void *bytes, uint64_t n_bytes,
                                     int32_t n_tokens) {
    static const char *const op = "gokv_pool_set_page_bytes";
    if (!pool) FAIL(GOKV_EINVAL, "%s: pool is NULL", op);
    if (!bytes) FAIL(GOKV_EINVAL, "%s: bytes is NULL", op);
    const gokv_layout *L = &pool->layout;
    if (page < 0 || page >= pool->desc.n_pages)
        FAIL(GOKV_ERANGE, "%s: page %d is not in [0, %d)", op, page, pool->desc.n_pages);
    if (n_bytes != L->page_bytes)
        FAIL(GOKV_EINVAL, "%s: n_bytes %llu is not the pool's page bytes %llu", op, (unsigned long long)n_bytes,
             (unsigned long long)L->page_bytes);
    if (n_tokens < 0 || n_tokens > L->page_size)
        FAIL(GOKV_EINVAL, "%s: n_tokens %d is outside [0, %d]", op, n_tokens, L->page_size);
    if (L->kivi && n_tokens % L->group != 0)
        FAIL(GOKV_EINVAL, "%s: n_tokens %d is not a multiple of group_size %d (%s keys are quantized per %d tokens)", op,
             n_tokens, L->group, gokv_format_name(L->format), L->group);
    const gokv_backend *be = pool->dev->be;
    if (!be->set_page_bytes) FAIL(GOKV_ENOTSUP, "%s: backend \"%s\" does not implement set_page_bytes", op, be->name);
    float k_abs = 0.0f, v_abs = 0.0f;
    gokv_status st;
    for (int32_t h = 0; h < L->n_kv_heads; h++) {
        st = L->kivi ? check_kivi_keys(op, L, bytes, h, n_tokens, &k_abs)
                     : check_token_rows(op, L, bytes, h, n_tokens, 0, &k_abs);
        if (st) return st;
        if (!L->v_is_k_prefix && (st = check_token_rows(op, L, bytes, h, n_tokens, 1, &v_abs))) return st;
    }
    const gokv_value_range k_range = {.max_abs = k_abs}, v_range = {.max_abs = L->v_is_k_prefix ? k_abs : v_abs};
    gokv_pool_note_range(pool, &k_range, &v_range);
    st = be->set_page_bytes(pool->dev->impl, pool->impl, L, page, bytes, n_tokens);
    return st ? st : ok();
}

gokv_status gokv_pool_set_slot_bytes(gokv_pool *pool, int32_t slot, const void *bytes, uint64_t n_bytes) {
    static const char *const op = "gokv_pool_set_slot_bytes";
    if (!pool) FAIL(GOKV_EINVAL, "%s: pool is NULL", op);
    if (!bytes) FAIL(GOKV_EINVAL, "%s: bytes is NULL", op);
    const gokv_layout *L = &pool->layout;
    if (!L->kivi) FAIL(GOKV_EINVAL, "%s: %s keeps no residual slots", op, gokv_format_name(L->format));
    if (slot < 0 || slot >= pool->desc.n_residual_slots)
        FAIL(GOKV_ERANGE, "%s: slot %d is not in [0, %d)", op, slot, pool->desc.n_residual_slots);
    if (n_bytes != L->ring_bytes)
        FAIL(GOKV_EINVAL, "%s: n_bytes %llu is not the pool's residual slot bytes %llu", op, (unsigned long long)n_bytes,
             (unsigned long long)L->ring_bytes);
    const gokv_backend *be = pool->dev->be;
    if (!be->set_slot_bytes) FAIL(GOKV_ENOTSUP, "%s: backend \"%s\" does not implement set_slot_bytes", op, be->name);
    float abs[2] = {0.0f, 0.0f};
    for (int v = 0; v < (L->v_is_k_prefix ? 1 : 2); v++) {
        const int32_t d = v ? L->d_v : L->d_k;
        const uint64_t base = v ? L->ring_v : L->ring_k;
        for (int32_t r = 0; r < L->ring_rows; r++)
            for (int32_t h = 0; h < L->n_kv_heads; h++)
                for (int32_t c = 0; c < d; c++) {
                    const uint16_t x = half_at(bytes, base + (((uint64_t)r * (uint64_t)L->n_kv_heads + (uint64_t)h) *
                                                                  (uint64_t)d + (uint64_t)c) * 2u);
                    if (!half_finite(x))
                        FAIL(GOKV_EINVAL, "%s: ring row %d, kv head %d: %s[%d] is not finite", op, r, h,
                             v ? "ring_v" : "ring_k", c);
                    abs[v] = max_f(abs[v], fabsf(gokv_half_to_float(x)));
                }
    }
    const gokv_value_range k_range = {.max_abs = abs[0]}, v_range = {.max_abs = L->v_is_k_prefix ? abs[0] : abs[1]};
    gokv_pool_note_range(pool, &k_range, &v_range);
    gokv_status st = be->set_slot_bytes(pool->dev->impl, pool->impl, L, slot, bytes);
    return st ? st : ok();
}

/* ---- gather ---- */

typedef struct gather_row {
    int32_t dst_page, dst_slot, head, src_page, src_slot, i;
} gather_row;

static int cmp_i32(int32_t a, int32_t b) { return (a > b) - (a < b); }

/* By destination (page, slot, head), then by entry: duplicates end up next to each other. */
static int by_destination(const void *a_, const void *b_) {
    const gather_row *a = a_, *b = b_;
    int c = cmp_i32(a->dst_page, b->dst_page);
    if (!c) c = cmp_i32(a->dst_slot, b->dst_slot);
    if (!c) c = cmp_i32(a->head, b->head);
    return c ? c : cmp_i32(a->i, b->i);
}

/* By destination page, then source page: each destination page reads each of its source pages once. */
static int by_page_pair(const void *a_, const void *b_) {
    const gather_row *a = a_, *b = b_;
    int c = cmp_i32(a->dst_page, b->dst_page);
    if (!c) c = cmp_i32(a->src_page, b->src_page);
    return c ? c : cmp_i32(a->i, b->i);
}

/* Copies kv head h's row bytes of slot ss of page src into slot ds of page dst: key codes (tiled q4 keys
 * byte by byte through gokv_k_code_byte), key scales and biases, then the values' (absent with
 * v_is_k_prefix). */
static void copy_row(const gokv_layout *L, uint8_t *dst, int32_t ds, const uint8_t *src, int32_t ss, int32_t h) {
    const uint64_t kc = L->k_codes + (uint64_t)h * L->k_codes_head;
    for (uint64_t b = 0; b < L->k_row_bytes; b++)
        dst[kc + gokv_k_code_byte(L, ds, b)] = src[kc + gokv_k_code_byte(L, ss, b)];
    if (L->k_groups > 0) {
        const uint64_t n = (uint64_t)L->k_groups * 2u, sb = (uint64_t)h * L->k_sb_head;
        memcpy(dst + L->k_scale + sb + (uint64_t)ds * n, src + L->k_scale + sb + (uint64_t)ss * n, n);
        memcpy(dst + L->k_bias + sb + (uint64_t)ds * n, src + L->k_bias + sb + (uint64_t)ss * n, n);
    }
    if (L->v_is_k_prefix) return;
    const uint64_t vc = L->v_codes + (uint64_t)h * L->v_codes_head;
    memcpy(dst + vc + (uint64_t)ds * L->v_row_bytes, src + vc + (uint64_t)ss * L->v_row_bytes, L->v_row_bytes);
    if (L->v_groups > 0) {
        const uint64_t n = (uint64_t)L->v_groups * 2u, sb = (uint64_t)h * L->v_sb_head;
        memcpy(dst + L->v_scale + sb + (uint64_t)ds * n, src + L->v_scale + sb + (uint64_t)ss * n, n);
        memcpy(dst + L->v_bias + sb + (uint64_t)ds * n, src + L->v_bias + sb + (uint64_t)ss * n, n);
    }
}

/* Checks every entry of d; on success *rows_out holds them sorted by (destination page, source page). */
static gokv_status validate_gather(const char *op, const gokv_pool *pool, const gokv_gather_desc *d,
                                   gather_row **rows_out) {
    const int32_t n_pages = pool->desc.n_pages, P = pool->layout.page_size, H = pool->layout.n_kv_heads;
    const struct {
        const char *name;
        const int32_t *v;
    } arrays[5] = {{"src_pages", d->src_pages}, {"src_slots", d->src_slots}, {"dst_pages", d->dst_pages},
                   {"dst_slots", d->dst_slots}, {"kv_heads", d->kv_heads}};
    for (int a = 0; a < 5; a++)
        if (!arrays[a].v) FAIL(GOKV_EINVAL, "%s: %s is NULL with n_rows %d", op, arrays[a].name, d->n_rows);
    for (int32_t i = 0; i < d->n_rows; i++)
        for (int a = 0; a < 5; a++) {
            const int32_t x = arrays[a].v[i], limit = a == 4 ? H : (a % 2 == 0 ? n_pages : P);
            if (x < 0 || x >= limit) FAIL(GOKV_ERANGE, "%s: %s[%d]=%d is outside [0, %d)", op, arrays[a].name, i, x, limit);
        }
    gather_row *rows = malloc((size_t)d->n_rows * sizeof *rows);
    uint8_t *is_dst = calloc(((size_t)n_pages + 7u) / 8u, 1);
    if (!rows || !is_dst) {
        free(rows);
        free(is_dst);
        FAIL(GOKV_ENOMEM, "%s: cannot allocate the index of %d rows", op, d->n_rows);
    }
    for (int32_t i = 0; i < d->n_rows; i++) {
        rows[i] = (gather_row){d->dst_pages[i], d->dst_slots[i], d->kv_heads[i], d->src_pages[i], d->src_slots[i], i};
        is_dst[d->dst_pages[i] >> 3] |= (uint8_t)(1u << (d->dst_pages[i] & 7));
    }
    gokv_status st = GOKV_OK;
    qsort(rows, (size_t)d->n_rows, sizeof *rows, by_destination);
    for (int32_t k = 1; k < d->n_rows && !st; k++) {
        const gather_row *a = &rows[k - 1], *b = &rows[k];
        if (a->dst_page == b->dst_page && a->dst_slot == b->dst_slot && a->head == b->head)
            st = gokv_set_error(GOKV_EINVAL, "%s: rows %d and %d both write kv head %d of slot %d of page %d", op, a->i,
                                b->i, b->head, b->dst_slot, b->dst_page);
    }
    for (int32_t i = 0; i < d->n_rows && !st; i++)
        if (is_dst[d->src_pages[i] >> 3] & (1u << (d->src_pages[i] & 7)))
            st = gokv_set_error(GOKV_EINVAL, "%s: src_pages[%d]=%d is also a destination page", op, i, d->src_pages[i]);
    free(is_dst);
    if (st) {
        free(rows);
        return st;
    }
    qsort(rows, (size_t)d->n_rows, sizeof *rows, by_page_pair);
    *rows_out = rows;
    return GOKV_OK;
}

gokv_status gokv_pool_gather_rows(gokv_pool *pool, const gokv_gather_desc *desc) {
    static const char *const op = "gokv_pool_gather_rows";
    if (!pool) FAIL(GOKV_EINVAL, "%s: pool is NULL", op);
    gokv_gather_desc d;
    gokv_status st = gokv_take_desc(op, "desc", &d, sizeof d, desc, desc ? desc->struct_size : 0);
    if (st) return st;
    const gokv_layout *L = &pool->layout;
    if (L->kivi)
        FAIL(GOKV_ENOTSUP, "%s: %s keys are quantized per channel across %d tokens, so a token's row cannot move alone",
             op, gokv_format_name(L->format), L->group);
    if (L->key_bounds)
        FAIL(GOKV_ENOTSUP, "%s: the pool keeps key bounds (Quest), which assume every token stays in its page", op);
    if (d.n_rows < 0) FAIL(GOKV_EINVAL, "%s: n_rows %d is negative", op, d.n_rows);
    if (d.n_rows == 0) return ok();
    gather_row *rows = NULL;
    if ((st = validate_gather(op, pool, &d, &rows))) return st;
    const gokv_backend *be = pool->dev->be;
    if (!be->page_bytes || !be->set_page_bytes) {
        free(rows);
        FAIL(GOKV_ENOTSUP, "%s: backend \"%s\" does not implement %s", op, be->name,
             be->page_bytes ? "set_page_bytes" : "page_bytes");
    }
    uint8_t *dst = malloc(L->page_bytes), *src = malloc(L->page_bytes);
    if (!dst || !src) {
        free(rows);
        free(dst);
        free(src);
        FAIL(GOKV_ENOMEM, "%s: cannot allocate two pages of %llu bytes", op, (unsigned long long)L->page_bytes);
    }
    for (int32_t k = 0; k < d.n_rows && !st;) {
        const int32_t page = rows[k].dst_page;
        if ((st = be->page_bytes(pool->dev->impl, pool->impl, L, page, dst))) break;
        int32_t src_page = -1;
        for (; k < d.n_rows && rows[k].dst_page == page && !st; k++) {
            if (rows[k].src_page != src_page) {
                src_page = rows[k].src_page;
                if ((st = be->page_bytes(pool->dev->impl, pool->impl, L, src_page, src))) break;
            }
            copy_row(L, dst, rows[k].dst_slot, src, rows[k].src_slot, rows[k].head);
        }
        if (!st) st = be->set_page_bytes(pool->dev->impl, pool->impl, L, page, dst, L->page_size);
    }
    free(rows);
    free(dst);
    free(src);
    return st ? st : ok();
}
