/*
 * gokv_validate.c: argument validation for every call of gokv.h, done once in the core so that no backend
 * sees a malformed descriptor. Each failure names the argument (and the sequence, token, head or page).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gokv_core.h"

#define FAIL(st, ...) return gokv_set_error((st), __VA_ARGS__)

enum { MAX_DIM = 1024, MAX_HEADS = 1024, MAX_PAGE = 1024 };
static const float FP16_MAX = 65504.0f;

gokv_status gokv_take_desc(const char *op, const char *what, void *dst, size_t dst_size, const void *src,
                           uint32_t src_size) {
    if (!src) FAIL(GOKV_EINVAL, "%s: %s is NULL", op, what);
    if (src_size < dst_size)
        FAIL(GOKV_EVERSION, "%s: %s->struct_size is %u, this build needs %zu (ABI %u)", op, what, src_size,
             dst_size, GOKV_ABI_VERSION);
    memcpy(dst, src, dst_size);
    return GOKV_OK;
}

gokv_status gokv_validate_pool_desc(gokv_pool_desc *d) {
    static const char *const op = "gokv_pool_create";
    if (d->format < 0 || d->format >= GOKV_FORMAT_COUNT_) FAIL(GOKV_EINVAL, "%s: format %d is unknown", op, d->format);
    const int quant = gokv_format_quantized(d->format), kivi = gokv_format_is_kivi(d->format);
    const char *fmt = gokv_format_name(d->format);
    if (quant) {
        if (d->group_size != 32 && d->group_size != 64 && d->group_size != 128)
            FAIL(GOKV_EINVAL, "%s: group_size %d for %s must be 32, 64 or 128", op, d->group_size, fmt);
    } else if (d->group_size != 0) {
        FAIL(GOKV_EINVAL, "%s: group_size %d must be 0 for %s", op, d->group_size, fmt);
    }
    if (d->n_kv_heads < 1 || d->n_kv_heads > MAX_HEADS)
        FAIL(GOKV_EINVAL, "%s: n_kv_heads %d is outside [1, %d]", op, d->n_kv_heads, MAX_HEADS);
    if (d->v_is_k_prefix != 0 && d->v_is_k_prefix != 1)
        FAIL(GOKV_EINVAL, "%s: v_is_k_prefix %d must be 0 or 1", op, d->v_is_k_prefix);
    const struct { const char *name; int32_t v; } dims[2] = {{"head_dim_k", d->head_dim_k}, {"head_dim_v", d->head_dim_v}};
    for (int i = 0; i < 2; i++) {
        if (dims[i].v < 4 || dims[i].v > MAX_DIM || dims[i].v % 4 != 0)
            FAIL(GOKV_EINVAL, "%s: %s %d must be a multiple of 4 in [4, %d]", op, dims[i].name, dims[i].v, MAX_DIM);
        if (quant && dims[i].v % d->group_size != 0)
            FAIL(GOKV_EINVAL, "%s: %s %d is not a multiple of group_size %d", op, dims[i].name, dims[i].v, d->group_size);
    }
    if (d->v_is_k_prefix && d->head_dim_v > d->head_dim_k)
        FAIL(GOKV_EINVAL, "%s: head_dim_v %d exceeds head_dim_k %d with v_is_k_prefix", op, d->head_dim_v, d->head_dim_k);
    if (d->page_size == 0) d->page_size = 64;
    if (d->page_size < 8 || d->page_size > MAX_PAGE || d->page_size % 8 != 0)
        FAIL(GOKV_EINVAL, "%s: page_size %d must be a multiple of 8 in [8, %d]", op, d->page_size, MAX_PAGE);
    if (kivi) {
        if (d->page_size % d->group_size != 0)
            FAIL(GOKV_EINVAL, "%s: page_size %d is not a multiple of group_size %d (KIVI quantizes keys per %d tokens)",
                 op, d->page_size, d->group_size, d->group_size);
        if (d->residual < 0 || d->residual > 65536 || d->residual % d->group_size != 0)
            FAIL(GOKV_EINVAL, "%s: residual %d must be a multiple of group_size %d in [0, 65536]", op, d->residual,
                 d->group_size);
        if (d->n_residual_slots < 0 || d->n_residual_slots > (1 << 20))
            FAIL(GOKV_EINVAL, "%s: n_residual_slots %d is outside [0, 2^20]", op, d->n_residual_slots);
    } else {
        if (d->residual != 0) FAIL(GOKV_EINVAL, "%s: residual %d must be 0 for %s", op, d->residual, fmt);
        if (d->n_residual_slots != 0)
            FAIL(GOKV_EINVAL, "%s: n_residual_slots %d must be 0 for %s", op, d->n_residual_slots, fmt);
    }
    if (d->n_pages < 1) FAIL(GOKV_EINVAL, "%s: n_pages %d must be at least 1", op, d->n_pages);
    if (d->key_bounds != 0 && d->key_bounds != 1) FAIL(GOKV_EINVAL, "%s: key_bounds %d must be 0 or 1", op, d->key_bounds);
    gokv_layout L;
    gokv_layout_init(&L, d);
    const double total = (double)(L.page_bytes + L.bounds_bytes) * d->n_pages + (double)L.ring_bytes * d->n_residual_slots;
    if (total > (double)(1ull << 46))
        FAIL(GOKV_ENOMEM, "%s: %d pages of %llu bytes exceed the 64 TiB limit", op, d->n_pages,
             (unsigned long long)L.page_bytes);
    return GOKV_OK;
}

/* indptr[0] == 0, non-decreasing, last <= limit */
static gokv_status check_indptr(const char *op, const char *name, const int32_t *p, int32_t n) {
    if (!p) FAIL(GOKV_EINVAL, "%s: %s is NULL", op, name);
    if (p[0] != 0) FAIL(GOKV_EINVAL, "%s: %s[0] is %d, must be 0", op, name, p[0]);
    for (int32_t i = 0; i < n; i++)
        if (p[i + 1] < p[i])
            FAIL(GOKV_EINVAL, "%s: %s[%d]=%d is below %s[%d]=%d (sequence %d)", op, name, i + 1, p[i + 1], name, i, p[i], i);
    return GOKV_OK;
}

/* The batch shape every call shares: the row indptr, the page indptr, and the page ids they index. */
static gokv_status check_batch(const char *op, int32_t n_seqs, const char *rows_name, const int32_t *rows_indptr,
                               const int32_t *page_indptr, const int32_t *page_ids) {
    gokv_status st;
    if ((st = check_indptr(op, rows_name, rows_indptr, n_seqs))) return st;
    if ((st = check_indptr(op, "page_indptr", page_indptr, n_seqs))) return st;
    if (!page_ids && page_indptr[n_seqs] > 0) FAIL(GOKV_EINVAL, "%s: page_ids is NULL", op);
    return GOKV_OK;
}

/* Every entry of sequence s's page table is -1 or a page of the pool, and it covers len tokens. */
static gokv_status check_table(const char *op, const gokv_pool *pool, int32_t s, const int32_t *ids, int32_t n,
                               int64_t len) {
    const int64_t P = pool->desc.page_size;
    if ((int64_t)n * P < len)
        FAIL(GOKV_EINVAL, "%s: page table of sequence %d has %d pages, %lld tokens need %lld", op, s, n,
             (long long)len, (long long)((len + P - 1) / P));
    for (int32_t j = 0; j < n; j++)
        if (ids[j] < -1 || ids[j] >= pool->desc.n_pages)
            FAIL(GOKV_ERANGE, "%s: page_ids entry %d of sequence %d is %d, outside [-1, %d)", op, j, s, ids[j],
                 pool->desc.n_pages);
    return GOKV_OK;
}

static gokv_status check_slot(const char *op, const gokv_pool *pool, const int32_t *slots, int32_t s) {
    if (!slots) FAIL(GOKV_EINVAL, "%s: residual_slot is NULL but %s keeps a residual per sequence", op,
                     gokv_format_name(pool->desc.format));
    if (slots[s] < 0 || slots[s] >= pool->desc.n_residual_slots)
        FAIL(GOKV_ERANGE, "%s: residual_slot[%d]=%d is outside [0, %d)", op, s, slots[s], pool->desc.n_residual_slots);
    return GOKV_OK;
}

static gokv_status check_values(const char *op, const char *name, const float *x, int64_t rows, int32_t heads,
                                int32_t dim, int fp16_range, const char *row_name, gokv_value_range *range) {
    gokv_value_range rg = {0};
    for (int64_t r = 0; r < rows; r++)
        for (int32_t h = 0; h < heads; h++) {
            const float *p = x + (r * heads + h) * (int64_t)dim;
            double l1 = 0;
            for (int32_t c = 0; c < dim; c++) {
                if (!isfinite(p[c]))
                    FAIL(GOKV_EINVAL, "%s: %s is not finite at %s %lld, head %d, channel %d", op, name, row_name,
                         (long long)r, h, c);
                const float a = fabsf(p[c]);
                if (fp16_range && a > FP16_MAX)
                    FAIL(GOKV_EINVAL, "%s: %s=%g at %s %lld, head %d, channel %d is outside the fp16 range this format stores",
                         op, name, p[c], row_name, (long long)r, h, c);
                rg.max_abs = a > rg.max_abs ? a : rg.max_abs;
                l1 += a;
            }
            if (l1 > rg.max_l1) {
                rg.max_l1 = l1;
                rg.l1_row = r;
                rg.l1_head = h;
            }
        }
    if (range) *range = rg;
    return GOKV_OK;
}

/* Every score and partial sum a kernel forms stays below this (a quarter of FLT_MAX, so that differences
 * of two scores and the sink logit stay finite too). */
static const double SCORE_LIMIT = 0.25 * 3.4028234663852886e38;
/* A stored element is read back as at most its input's magnitude plus fp16 rounding of scale and bias;
 * kernels also form sums of raw codes (up to 255 for q8) before scaling them. */
static double stored_bound(float max_abs) {
    const double a = 1.001 * (double)max_abs;
    return a > 256.0 ? a : 256.0;
}

static float load_bits(const uint32_t *bits) {
    uint32_t u = __atomic_load_n(bits, __ATOMIC_RELAXED);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Non-negative floats order like their bit patterns, so the maximum is an integer CAS loop. */
static void raise_bits(uint32_t *bits, float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t cur = __atomic_load_n(bits, __ATOMIC_RELAXED);
    while (u > cur && !__atomic_compare_exchange_n(bits, &cur, u, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

void gokv_pool_note_range(gokv_pool *pool, const gokv_value_range *k_range, const gokv_value_range *v_range) {
    raise_bits(&pool->max_abs_k_bits, k_range->max_abs);
    raise_bits(&pool->max_abs_v_bits, v_range->max_abs);
}

gokv_status gokv_check_score_range(const char *op, const gokv_pool *pool, const gokv_attend_desc *d,
                                   const gokv_value_range *q_range, float new_k_abs, float new_v_abs) {
    if (d->n_seqs == 0 || d->q_indptr[d->n_seqs] == 0) return GOKV_OK;
    float k_abs = load_bits(&pool->max_abs_k_bits), v_abs = load_bits(&pool->max_abs_v_bits);
    k_abs = new_k_abs > k_abs ? new_k_abs : k_abs;
    v_abs = new_v_abs > v_abs ? new_v_abs : v_abs;
    /* |scale q.k| <= scale * sum|q| * max|k|; partial sums before the scale is applied reach sum|q| * max|k|. */
    const double scale = d->scale > 1.0f ? d->scale : 1.0;
    const double bound = scale * q_range->max_l1 * stored_bound(k_abs);
    if (bound > SCORE_LIMIT)
        FAIL(GOKV_EINVAL, "%s: query row %lld, head %d: scale %g x sum|q| %g x the largest stored |k| %g reaches %.3g, "
             "beyond float32's range (the scores would overflow); scale the queries or keys down",
             op, (long long)q_range->l1_row, q_range->l1_head, d->scale, q_range->max_l1, k_abs, bound);
    /* The unnormalized output sums up to kv_len weights <= 1 times the values. */
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const double sum = ((double)d->kv_len[s] + 1.0) * stored_bound(v_abs);
        if (d->q_indptr[s + 1] > d->q_indptr[s] && sum > SCORE_LIMIT)
            FAIL(GOKV_EINVAL, "%s: sequence %d: %d tokens of values up to |v| %g can sum to %.3g, beyond float32's range "
                 "(the output would overflow); scale the values down", op, s, d->kv_len[s], v_abs, sum);
    }
    return GOKV_OK;
}

/* Marks page ids in a bitmap; a second mark of one page is an error (one call must not write a page twice). */
static gokv_status mark_pages(const char *op, const int32_t *ids, int32_t s, int64_t first, int64_t last,
                              uint8_t *seen) {
    for (int64_t j = first; j <= last; j++) {
        int32_t id = ids[j];
        if (id < 0)
            FAIL(GOKV_EINVAL, "%s: sequence %d writes into page table entry %lld, which is released (-1)", op, s,
                 (long long)j);
        if (seen[id >> 3] & (1u << (id & 7)))
            FAIL(GOKV_EINVAL, "%s: page %d is written twice in one call (sequence %d, entry %lld)", op, id, s, (long long)j);
        seen[id >> 3] |= (uint8_t)(1u << (id & 7));
    }
    return GOKV_OK;
}

static gokv_status validate_write_seqs(const char *op, gokv_pool *pool, const gokv_write_desc *d, uint8_t *seen_pages,
                                       uint8_t *seen_slots) {
    const gokv_layout *L = &pool->layout;
    const int64_t P = L->page_size;
    gokv_status st;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const int32_t n = d->tok_indptr[s + 1] - d->tok_indptr[s];
        const int32_t *ids = d->page_ids + d->page_indptr[s];
        const int32_t n_ids = d->page_indptr[s + 1] - d->page_indptr[s];
        const int64_t start = d->start_pos[s], len = start + n;
        if (start < 0) FAIL(GOKV_EINVAL, "%s: start_pos[%d]=%lld is negative", op, s, (long long)start);
        if (len > INT32_MAX) FAIL(GOKV_EINVAL, "%s: sequence %d would exceed 2^31-1 tokens", op, s);
        if ((st = check_table(op, pool, s, ids, n_ids, len))) return st;
        if (n == 0) continue;
        for (int64_t j = start / P; j <= (len - 1) / P; j++) /* the new tokens' pages must exist */
            if (ids[j] < 0)
                FAIL(GOKV_EINVAL, "%s: sequence %d appends positions [%lld, %lld) but page table entry %lld is released (-1)",
                     op, s, (long long)start, (long long)len, (long long)j);
        int64_t first = start, last = len - 1; /* token range written into pages */
        if (L->kivi) {
            if ((st = check_slot(op, pool, d->residual_slot, s))) return st;
            const int32_t slot = d->residual_slot[s];
            if (seen_slots[slot >> 3] & (1u << (slot & 7)))
                FAIL(GOKV_EINVAL, "%s: residual_slot %d is written by two sequences in one call (second: %d)", op, slot, s);
            seen_slots[slot >> 3] |= (uint8_t)(1u << (slot & 7));
            first = gokv_kivi_quantized_len((int32_t)start, L->group, L->residual);
            last = (int64_t)gokv_kivi_quantized_len((int32_t)len, L->group, L->residual) - 1;
        }
        if (last >= first && (st = mark_pages(op, ids, s, first / P, last / P, seen_pages))) return st;
    }
    return GOKV_OK;
}

gokv_status gokv_validate_write(const char *op, gokv_pool *pool, const gokv_write_desc *in, gokv_write_desc *d,
                                gokv_value_range *k_range, gokv_value_range *v_range) {
    if (k_range) *k_range = (gokv_value_range){0};
    if (v_range) *v_range = (gokv_value_range){0};
    if (!pool) FAIL(GOKV_EINVAL, "%s: pool is NULL", op);
    gokv_status st = gokv_take_desc(op, "desc", d, sizeof *d, in, in ? in->struct_size : 0);
    if (st) return st;
    if (d->n_seqs < 0) FAIL(GOKV_EINVAL, "%s: n_seqs %d is negative", op, d->n_seqs);
    if (d->n_seqs == 0) return GOKV_OK;
    if ((st = check_batch(op, d->n_seqs, "tok_indptr", d->tok_indptr, d->page_indptr, d->page_ids))) return st;
    if (!d->start_pos) FAIL(GOKV_EINVAL, "%s: start_pos is NULL", op);
    const gokv_layout *L = &pool->layout;
    const int64_t rows = d->tok_indptr[d->n_seqs];
    if (rows > 0 && !d->k) FAIL(GOKV_EINVAL, "%s: k is NULL with %lld tokens to write", op, (long long)rows);
    if (rows > 0 && !L->v_is_k_prefix && !d->v) FAIL(GOKV_EINVAL, "%s: v is NULL with %lld tokens to write", op, (long long)rows);
    const int fp16_range = L->format != GOKV_FORMAT_F32;
    if (rows > 0 && (st = check_values(op, "k", d->k, rows, L->n_kv_heads, L->d_k, fp16_range, "token row", k_range)))
        return st;
    if (rows > 0 && !L->v_is_k_prefix &&
        (st = check_values(op, "v", d->v, rows, L->n_kv_heads, L->d_v, fp16_range, "token row", v_range)))
        return st;
    if (L->v_is_k_prefix && k_range && v_range) *v_range = *k_range; /* the values are the keys' first dims */
    uint8_t *seen_pages = calloc(((size_t)pool->desc.n_pages + 7) / 8, 1);
    uint8_t *seen_slots = calloc(((size_t)pool->desc.n_residual_slots + 7) / 8 + 1, 1);
    if (!seen_pages || !seen_slots) {
        free(seen_pages);
        free(seen_slots);
        FAIL(GOKV_ENOMEM, "%s: cannot allocate the validation bitmap", op);
    }
    st = validate_write_seqs(op, pool, d, seen_pages, seen_slots);
    free(seen_pages);
    free(seen_slots);
    return st;
}

gokv_status gokv_validate_read(const char *op, gokv_pool *pool, const gokv_read_desc *in, gokv_read_desc *d) {
    if (!pool) FAIL(GOKV_EINVAL, "%s: pool is NULL", op);
    gokv_status st = gokv_take_desc(op, "desc", d, sizeof *d, in, in ? in->struct_size : 0);
    if (st) return st;
    if (d->n_seqs < 0) FAIL(GOKV_EINVAL, "%s: n_seqs %d is negative", op, d->n_seqs);
    if (d->n_seqs == 0) return GOKV_OK;
    if ((st = check_batch(op, d->n_seqs, "tok_indptr", d->tok_indptr, d->page_indptr, d->page_ids))) return st;
    if (!d->kv_len) FAIL(GOKV_EINVAL, "%s: kv_len is NULL", op);
    if (!d->start_pos) FAIL(GOKV_EINVAL, "%s: start_pos is NULL", op);
    if (d->tok_indptr[d->n_seqs] > 0 && !d->k_out) FAIL(GOKV_EINVAL, "%s: k_out is NULL", op);
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const int64_t n = d->tok_indptr[s + 1] - d->tok_indptr[s];
        if (d->kv_len[s] < 0) FAIL(GOKV_EINVAL, "%s: kv_len[%d]=%d is negative", op, s, d->kv_len[s]);
        if (d->start_pos[s] < 0 || d->start_pos[s] + n > d->kv_len[s])
            FAIL(GOKV_EINVAL, "%s: sequence %d reads positions [%d, %lld), outside its %d tokens", op, s,
                 d->start_pos[s], (long long)(d->start_pos[s] + n), d->kv_len[s]);
        if ((st = check_table(op, pool, s, d->page_ids + d->page_indptr[s], d->page_indptr[s + 1] - d->page_indptr[s],
                              d->kv_len[s])))
            return st;
        if (pool->layout.kivi && n > 0 && (st = check_slot(op, pool, d->residual_slot, s))) return st;
    }
    return GOKV_OK;
}

static gokv_status check_copy_ids(const char *op, const char *what, const int32_t *src, const int32_t *dst, int32_t n,
                                  int32_t limit) {
    if (n < 0) FAIL(GOKV_EINVAL, "%s: n_%s %d is negative", op, what, n);
    if (n == 0) return GOKV_OK;
    if (!src || !dst) FAIL(GOKV_EINVAL, "%s: src_%s or dst_%s is NULL", op, what, what);
    uint8_t *dst_seen = calloc(((size_t)limit + 7) / 8, 1);
    if (!dst_seen) FAIL(GOKV_ENOMEM, "%s: cannot allocate the validation bitmap", op);
    gokv_status st = GOKV_OK;
    for (int32_t i = 0; i < n && !st; i++) {
        if (src[i] < 0 || src[i] >= limit)
            st = gokv_set_error(GOKV_ERANGE, "%s: src_%s[%d]=%d is outside [0, %d)", op, what, i, src[i], limit);
        else if (dst[i] < 0 || dst[i] >= limit)
            st = gokv_set_error(GOKV_ERANGE, "%s: dst_%s[%d]=%d is outside [0, %d)", op, what, i, dst[i], limit);
        else if (dst_seen[dst[i] >> 3] & (1u << (dst[i] & 7)))
            st = gokv_set_error(GOKV_EINVAL, "%s: dst_%s[%d]=%d appears twice", op, what, i, dst[i]);
        else
            dst_seen[dst[i] >> 3] |= (uint8_t)(1u << (dst[i] & 7));
    }
    for (int32_t i = 0; i < n && !st; i++)
        if (dst_seen[src[i] >> 3] & (1u << (src[i] & 7)))
            st = gokv_set_error(GOKV_EINVAL, "%s: src_%s[%d]=%d is also a destination", op, what, i, src[i]);
    free(dst_seen);
    return st;
}

gokv_status gokv_validate_copy(const char *op, gokv_pool *pool, const gokv_copy_desc *in, gokv_copy_desc *d) {
    if (!pool) FAIL(GOKV_EINVAL, "%s: pool is NULL", op);
    gokv_status st = gokv_take_desc(op, "desc", d, sizeof *d, in, in ? in->struct_size : 0);
    if (st) return st;
    if ((st = check_copy_ids(op, "pages", d->src_pages, d->dst_pages, d->n_pages, pool->desc.n_pages))) return st;
    if (d->n_slots != 0 && !pool->layout.kivi)
        FAIL(GOKV_EINVAL, "%s: n_slots %d but %s keeps no residual slots", op, d->n_slots, gokv_format_name(pool->desc.format));
    return check_copy_ids(op, "slots", d->src_slots, d->dst_slots, d->n_slots, pool->desc.n_residual_slots);
}

static gokv_status validate_attend_seqs(const char *op, const gokv_pool *pool, const gokv_attend_desc *d) {
    gokv_status st;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const int32_t kv = d->kv_len[s];
        const int64_t rows = d->q_indptr[s + 1] - d->q_indptr[s];
        if (kv < 0) FAIL(GOKV_EINVAL, "%s: kv_len[%d]=%d is negative", op, s, kv);
        if (d->quest_pages > 0 && rows > 1)
            FAIL(GOKV_EINVAL, "%s: sequence %d has %lld query rows; Quest reads one decode row per sequence", op, s,
                 (long long)rows);
        if (d->q_pos[s] < 0 || (int64_t)d->q_pos[s] + rows > INT32_MAX)
            FAIL(GOKV_EINVAL, "%s: q_pos[%d]=%d is negative or overflows with %lld rows", op, s, d->q_pos[s], (long long)rows);
        if ((st = check_table(op, pool, s, d->page_ids + d->page_indptr[s], d->page_indptr[s + 1] - d->page_indptr[s], kv)))
            return st;
        if (pool->layout.kivi && kv > 0 && (st = check_slot(op, pool, d->residual_slot, s))) return st;
        if (d->valid_mask) {
            const int64_t words = d->valid_indptr[s + 1] - d->valid_indptr[s];
            const int64_t masks = (d->flags & GOKV_ATTEND_MASK_PER_KV_HEAD) ? pool->layout.n_kv_heads : 1;
            if (words < masks * (((int64_t)kv + 31) / 32))
                FAIL(GOKV_EINVAL, "%s: valid_mask of sequence %d has %lld words, %d tokens need %lld (%lld mask%s of %d)",
                     op, s, (long long)words, kv, (long long)(masks * ((kv + 31) / 32)), (long long)masks,
                     masks > 1 ? "s, one per kv head," : "", (kv + 31) / 32);
        }
    }
    return GOKV_OK;
}

gokv_status gokv_validate_attend(const char *op, gokv_device *dev, const gokv_attend_desc *in, gokv_attend_desc *d,
                                 gokv_value_range *q_range) {
    *q_range = (gokv_value_range){0};
    if (!dev) FAIL(GOKV_EINVAL, "%s: dev is NULL", op);
    gokv_status st = gokv_take_desc(op, "desc", d, sizeof *d, in, in ? in->struct_size : 0);
    if (st) return st;
    const gokv_pool *pool = d->pool;
    if (!pool) FAIL(GOKV_EINVAL, "%s: pool is NULL", op);
    if (pool->dev != dev) FAIL(GOKV_EINVAL, "%s: pool belongs to another device", op);
    if (d->n_seqs < 0) FAIL(GOKV_EINVAL, "%s: n_seqs %d is negative", op, d->n_seqs);
    if (d->flags & ~(uint32_t)(GOKV_ATTEND_DEQUANT_BASELINE | GOKV_ATTEND_FORCE_SCALAR | GOKV_ATTEND_MASK_PER_KV_HEAD))
        FAIL(GOKV_EINVAL, "%s: flags 0x%x has unknown bits", op, d->flags);
    if ((d->flags & GOKV_ATTEND_MASK_PER_KV_HEAD) && !d->valid_mask)
        FAIL(GOKV_EINVAL, "%s: GOKV_ATTEND_MASK_PER_KV_HEAD without valid_mask", op);
    if (d->mass_rows < 0) FAIL(GOKV_EINVAL, "%s: mass_rows %d is negative", op, d->mass_rows);
    if (d->mass && (d->flags & GOKV_ATTEND_DEQUANT_BASELINE))
        FAIL(GOKV_EINVAL, "%s: mass is not computed by the dequantize-then-attend baseline", op);
    if (d->quest_pages < 0) FAIL(GOKV_EINVAL, "%s: quest_pages %d is negative", op, d->quest_pages);
    if (d->quest_recent < 0) FAIL(GOKV_EINVAL, "%s: quest_recent %d is negative", op, d->quest_recent);
    if (d->quest_pages == 0 && (d->quest_bounds || d->quest_selected))
        FAIL(GOKV_EINVAL, "%s: quest_bounds or quest_selected given without quest_pages", op);
    if (d->quest_pages > 0) {
        if (!pool->desc.key_bounds)
            FAIL(GOKV_EINVAL, "%s: quest_pages %d needs a pool made with key_bounds", op, d->quest_pages);
        if (d->window != 0) FAIL(GOKV_EINVAL, "%s: quest_pages with window %d: Quest keeps every token", op, d->window);
        if (d->flags & GOKV_ATTEND_DEQUANT_BASELINE)
            FAIL(GOKV_EINVAL, "%s: quest_pages is not read by the dequantize-then-attend baseline", op);
    }
    const gokv_layout *L = &pool->layout;
    if (d->n_heads_q < 1 || d->n_heads_q > MAX_HEADS * 16 || d->n_heads_q % L->n_kv_heads != 0)
        FAIL(GOKV_EINVAL, "%s: n_heads_q %d is not a positive multiple of the pool's %d kv heads", op, d->n_heads_q,
             L->n_kv_heads);
    if (!(d->scale > 0.0f) || !isfinite(d->scale)) FAIL(GOKV_EINVAL, "%s: scale %g must be positive and finite", op, d->scale);
    if (d->n_sink_tokens < 0) FAIL(GOKV_EINVAL, "%s: n_sink_tokens %d is negative", op, d->n_sink_tokens);
    if (d->window < 0) FAIL(GOKV_EINVAL, "%s: window %d is negative", op, d->window);
    if (d->chunk_size < 0) FAIL(GOKV_EINVAL, "%s: chunk_size %d is negative", op, d->chunk_size);
    if (d->sink_logits)
        for (int32_t h = 0; h < d->n_heads_q; h++)
            if (!isfinite(d->sink_logits[h]))
                FAIL(GOKV_EINVAL, "%s: sink_logits[%d]=%g is not finite", op, h, d->sink_logits[h]);
    if (d->n_seqs == 0) return GOKV_OK;
    if ((st = check_batch(op, d->n_seqs, "q_indptr", d->q_indptr, d->page_indptr, d->page_ids))) return st;
    if (!d->kv_len) FAIL(GOKV_EINVAL, "%s: kv_len is NULL", op);
    if (!d->q_pos) FAIL(GOKV_EINVAL, "%s: q_pos is NULL", op);
    if (d->valid_mask && (st = check_indptr(op, "valid_indptr", d->valid_indptr, d->n_seqs))) return st;
    const int64_t rows = d->q_indptr[d->n_seqs];
    if (rows > 0 && !d->q) FAIL(GOKV_EINVAL, "%s: q is NULL with %lld query rows", op, (long long)rows);
    if (rows > 0 && !d->out) FAIL(GOKV_EINVAL, "%s: out is NULL with %lld query rows", op, (long long)rows);
    if ((st = validate_attend_seqs(op, pool, d))) return st;
    if (rows > 0 && (st = check_values(op, "q", d->q, rows, d->n_heads_q, L->d_k, 0, "query row", q_range))) return st;
    return GOKV_OK;
}
