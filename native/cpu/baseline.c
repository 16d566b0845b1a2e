/*
 * baseline.c: dequantize-then-attend, the comparison point of the benchmarks (what an MLX server falls back
 * to for models with learned sinks, and what Open-TQ-Metal measures its 48x against). Every page a call
 * touches is first expanded to a materialized f32 copy (the transient memory and bandwidth the fused path
 * avoids), then the f32 pages are attended with the same kernels. Kept as a named path, selected by
 * GOKV_ATTEND_DEQUANT_BASELINE. A fair one, as an engine would run it: the pages are dequantized by the
 * call's kernel table (SIMD unless GOKV_ATTEND_FORCE_SCALAR), into a copy the device keeps between calls (no
 * fresh memory to fault in). With the scalar dequantize and a calloc per call, the fused q4 path measured
 * 116-140x faster at 32K-128K; the gap left is the f32 copy's writing and reading, which is what the
 * comparison is about.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

typedef struct expand_ctx {
    const cpu_pool *src;
    const gokv_layout *L, *F; /* source layout, f32 layout */
    cpu_pool *dst;
    const gokv_attend_desc *d;
    const cpu_kernels *kern;  /* the call's table: its dequant_row expands the rows */
    const int64_t *page_seq;  /* for each temporary page, its sequence */
    float *rows;              /* per worker: P rows of [Hkv][d_k + d_v] */
} expand_ctx;

/* Temporary page i holds page table entry i of the call (released entries stay released). */
static void expand_page(void *ctx_, int64_t i, int32_t worker) {
    const expand_ctx *c = ctx_;
    const gokv_layout *L = c->L, *F = c->F;
    const gokv_attend_desc *d = c->d;
    const int32_t s = (int32_t)c->page_seq[i], P = L->page_size, H = L->n_kv_heads;
    const int32_t j = (int32_t)(i - d->page_indptr[s]), start = j * P;
    const int32_t n = d->kv_len[s] - start < P ? d->kv_len[s] - start : P;
    if (n <= 0) return;
    const int32_t *ids = d->page_ids + d->page_indptr[s];
    if (ids[j] < 0) return;
    float *k = c->rows + (size_t)worker * P * H * (L->d_k + L->d_v), *v = k + (size_t)P * H * L->d_k;
    cpu_read_sequence(c->kern, c->src, L, ids, d->kv_len[s], L->kivi ? d->residual_slot[s] : -1, start, n, k, v);
    uint8_t *page = cpu_page_mut(c->dst, F, (int32_t)i);
    for (int32_t h = 0; h < H; h++)
        for (int32_t t = 0; t < n; t++) {
            memcpy(page + F->k_codes + h * F->k_codes_head + (size_t)t * F->k_row_bytes, k + ((size_t)t * H + h) * L->d_k,
                   F->k_row_bytes);
            memcpy(page + F->v_codes + h * F->v_codes_head + (size_t)t * F->v_row_bytes, v + ((size_t)t * H + h) * L->d_v,
                   F->v_row_bytes);
        }
}

gokv_status cpu_attend_dequant_baseline(cpu_device *dev, const cpu_pool *pool, const gokv_layout *L,
                                        const gokv_attend_desc *d) {
    const int64_t n_pages = d->page_indptr[d->n_seqs];
    gokv_pool_desc fd = {sizeof fd, GOKV_FORMAT_F32, 0, 0, L->n_kv_heads, L->d_k, L->d_v, 0, L->page_size,
                         n_pages > 0 ? (int32_t)n_pages : 1, 0, 0};
    gokv_layout F;
    gokv_layout_init(&F, &fd);
    const int32_t workers = cpu_threadpool_size(dev->tp);
    const size_t row_floats = (size_t)L->page_size * L->n_kv_heads * (L->d_k + L->d_v);
    const size_t bytes = (size_t)fd.n_pages * F.page_bytes;
    pthread_mutex_lock(&dev->base_mu);
    /* kept between calls, not zeroed: slots past a page's tokens are never read */
    cpu_pool tmp = {0};
    tmp.n_pages = fd.n_pages;
    tmp.pages = cpu_buffer_reserve(&dev->base_pages, &dev->base_bytes, bytes) ? dev->base_pages : NULL;
    int64_t *page_seq = malloc((size_t)(n_pages > 0 ? n_pages : 1) * sizeof *page_seq);
    int32_t *ids = malloc((size_t)(n_pages > 0 ? n_pages : 1) * sizeof *ids);
    float *rows = malloc(row_floats * workers * sizeof(float));
    if (!tmp.pages || !page_seq || !ids || !rows) {
        pthread_mutex_unlock(&dev->base_mu);
        free(page_seq), free(ids), free(rows);
        return gokv_set_error(GOKV_ENOMEM, "gokv_attend (baseline): cannot allocate %lld f32 pages of %llu bytes",
                              (long long)n_pages, (unsigned long long)F.page_bytes);
    }
    for (int32_t s = 0; s < d->n_seqs; s++)
        for (int32_t j = d->page_indptr[s]; j < d->page_indptr[s + 1]; j++) {
            page_seq[j] = s;
            ids[j] = d->page_ids[j] >= 0 ? j : -1; /* a released page stays released */
        }
    expand_ctx ec = {pool, L, &F, &tmp, d, cpu_kernels_for_call(d->flags), page_seq, rows};
    cpu_threadpool_run(dev->tp, n_pages, expand_page, &ec);

    gokv_attend_desc fdsc = *d;
    fdsc.page_ids = ids;
    fdsc.residual_slot = NULL;
    fdsc.flags &= ~(uint32_t)GOKV_ATTEND_DEQUANT_BASELINE;
    gokv_status st = cpu_attend(dev, &tmp, &F, &fdsc);
    pthread_mutex_unlock(&dev->base_mu);
    free(page_seq), free(ids), free(rows);
    return st;
}
