/*
 * cpu_internal.h: the CPU module's device and pool objects and the addressing of gokv_layout.h, shared
 * by its op files (write/read/copy in store.c, attention in attend.c, the baseline in baseline.c).
 */
#ifndef GOKV_CPU_INTERNAL_H
#define GOKV_CPU_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>

#include "gokv_backend.h"
#include "gokv_cpu.h"
#include "kernels/kernels.h"
#include "threadpool.h"

typedef struct cpu_device {
    cpu_threadpool *tp;
    int32_t n_threads;
    pthread_mutex_t mu; /* one attention call at a time: it owns the workspace below */
    void *ws;           /* attention workspace, kept between calls (cpu_buffer_reserve) */
    size_t ws_bytes;
    pthread_mutex_t base_mu; /* one baseline call at a time: it owns the f32 pages below */
    void *base_pages;        /* the dequantize-then-attend baseline's f32 copy, kept (cpu_buffer_reserve) */
    size_t base_bytes;
    void *quest_ws;          /* Quest's selection (quest.c) and the ranges cut from masks (attend.c), under mu, kept */
    size_t quest_ws_bytes;
} cpu_device;

/* Makes *buf hold at least need bytes, 64-byte aligned: grown (its contents dropped) when too small, never
 * shrunk, so that calls in steady state allocate nothing. Returns 0 when it cannot (*buf NULL, *have 0). */
static inline int cpu_buffer_reserve(void **buf, size_t *have, size_t need) {
    if (*buf && *have >= need) return 1;
    free(*buf);
    if (posix_memalign(buf, 64, need ? need : 64) != 0) *buf = NULL;
    *have = *buf ? need : 0;
    return *buf != NULL;
}

/* A pool's memory: calloc'd, or an anonymous mapping of `mapped` bytes (cpu_backend.c). */
typedef struct pool_mem {
    void *raw;
    size_t mapped;
} pool_mem;

typedef struct cpu_pool {
    uint8_t *pages; /* n_pages * page_bytes, 64-byte aligned */
    uint8_t *rings; /* n_residual_slots * ring_bytes (KIVI) */
    uint16_t *bounds; /* key_bounds: n_pages * [Hkv][2][d_k] fp16 (gokv_layout.h); else NULL */
    pool_mem pages_mem, rings_mem, bounds_mem;
    int32_t n_pages, n_slots;
} cpu_pool;

static inline const uint8_t *cpu_page(const cpu_pool *p, const gokv_layout *L, int32_t id) {
    return p->pages + (size_t)id * L->page_bytes;
}
static inline uint8_t *cpu_page_mut(cpu_pool *p, const gokv_layout *L, int32_t id) {
    return p->pages + (size_t)id * L->page_bytes;
}
/* Page id's key bounds: [Hkv][2][d_k] fp16, min row then max row per kv head. */
static inline uint16_t *cpu_bounds(const cpu_pool *p, const gokv_layout *L, int32_t id) {
    return p->bounds + (size_t)id * (L->bounds_bytes / 2u);
}

static inline uint8_t *cpu_ring(const cpu_pool *p, const gokv_layout *L, int32_t slot) {
    return p->rings + (size_t)slot * L->ring_bytes;
}

/* Encoding of per-token rows of a format (KIVI values use their bit width). */
static inline int32_t cpu_row_enc(int32_t format) {
    switch (format) {
    case GOKV_FORMAT_F32: return CPU_ENC_F32;
    case GOKV_FORMAT_F16: return CPU_ENC_F16;
    case GOKV_FORMAT_Q8: return CPU_ENC_Q8;
    case GOKV_FORMAT_Q4: case GOKV_FORMAT_KIVI4: return CPU_ENC_Q4;
    default: return CPU_ENC_Q2;
    }
}

/* Per-token rows of kv head h in a page, from slot `slot`, n tokens: the keys (non-KIVI) or values
 * (value = 1). For MLA (v_is_k_prefix) values are the key rows. */
static inline cpu_rows cpu_page_rows(const gokv_layout *L, const uint8_t *page, int32_t h, int32_t value,
                                     int32_t slot, int32_t n) {
    cpu_rows r;
    const int v = value && !L->v_is_k_prefix;
    const uint64_t codes = v ? L->v_codes + h * L->v_codes_head : L->k_codes + h * L->k_codes_head;
    const uint64_t row_bytes = v ? L->v_row_bytes : L->k_row_bytes;
    const uint64_t sb = v ? L->v_sb_head : L->k_sb_head;
    const int32_t groups = v ? L->v_groups : L->k_groups;
    const int tiled = !v && L->k_tiled;
    r.codes = page + codes + (tiled ? gokv_k_code_byte(L, slot - slot % CPU_TILE, 0) : (uint64_t)slot * row_bytes);
    r.row_stride = row_bytes;
    r.tile = tiled ? slot % CPU_TILE : -1;
    r.scale = groups ? (const uint16_t *)(page + (v ? L->v_scale : L->k_scale) + h * sb) + (size_t)slot * groups : NULL;
    r.bias = groups ? (const uint16_t *)(page + (v ? L->v_bias : L->k_bias) + h * sb) + (size_t)slot * groups : NULL;
    r.sb_stride = (size_t)groups;
    r.n = n;
    r.enc = cpu_row_enc(L->format);
    r.group = L->group;
    r.pf = NULL;
    r.codes2 = NULL;
    r.scale2 = r.bias2 = NULL;
    r.n1 = n;
    return r;
}

/* Appends the rows of `next` (one run, same head and section of the next page) to r (one run of a multiple
 * of CPU_RUN_ALIGN tokens) as its second run. */
static inline void cpu_rows_join(cpu_rows *r, const cpu_rows *next) {
    r->codes2 = next->codes;
    r->scale2 = next->scale;
    r->bias2 = next->bias;
    r->n1 = r->n;
    r->n += next->n;
}

/* The bytes of r's rows (codes, then scales and biases when quantized, of each run; NULL r: none) into
 * regions at .. at + 5 of a prefetch hint, every one of them written. Tiled codes: the tiles they touch. */
static inline void cpu_rows_hint(const cpu_rows *r, cpu_prefetch *pf, int at) {
    const int runs = !r ? 0 : r->codes2 ? 2 : 1, sb = r && r->scale;
    for (int k = 0; k < 2; k++) {
        const size_t n = k >= runs ? 0 : (size_t)(runs == 1 ? r->n : k == 0 ? r->n1 : r->n - r->n1);
        const size_t lanes = r && r->tile >= 0 ? (size_t)(k ? 0 : r->tile) + n : 0;
        pf->p[at + 3 * k] = n ? (k ? r->codes2 : r->codes) : NULL;
        const size_t rows = lanes ? (lanes + CPU_TILE - 1) / CPU_TILE * CPU_TILE : n; /* tiled: whole tiles */
        pf->n[at + 3 * k] = n ? r->row_stride * rows : 0;
        pf->p[at + 3 * k + 1] = n && sb ? (const uint8_t *)(k ? r->scale2 : r->scale) : NULL;
        pf->p[at + 3 * k + 2] = n && sb ? (const uint8_t *)(k ? r->bias2 : r->bias) : NULL;
        pf->n[at + 3 * k + 1] = pf->n[at + 3 * k + 2] = n && sb ? r->sb_stride * n * 2u : 0;
    }
}

/* The hint of rows a, then rows b (either NULL: none), in that order: a block-head's keys and values. Each region
 * is written once: zeroing the whole hint first compiled to a rep stos, a third of block_head_rows' time
 * (perf, bench_decode q4 at 32K). */
static inline cpu_prefetch cpu_rows_prefetch(const cpu_rows *a, const cpu_rows *b) {
    cpu_prefetch pf;
    cpu_rows_hint(a, &pf, 0);
    cpu_rows_hint(b, &pf, CPU_PREFETCH_REGIONS / 2);
    return pf;
}

/* KIVI key group j (tokens j*g .. j*g+g-1 of the page) of kv head h. */
static inline cpu_chan cpu_page_chan(const gokv_layout *L, const uint8_t *page, int32_t h, int32_t j) {
    cpu_chan c;
    c.codes = page + L->k_codes + h * L->k_codes_head + (uint64_t)j * L->k_row_bytes;
    c.scale = (const uint16_t *)(page + L->k_scale + h * L->k_sb_head) + (size_t)j * L->d_k;
    c.bias = (const uint16_t *)(page + L->k_bias + h * L->k_sb_head) + (size_t)j * L->d_k;
    c.bits = L->bits;
    c.g = L->group;
    c.pf = NULL;
    return c;
}

/* Ring rows of kv head h (fp16), ring row r0 on, n rows (no wrap inside: callers split at the end). */
static inline cpu_rows cpu_ring_rows(const gokv_layout *L, const uint8_t *ring, int32_t h, int32_t value, int32_t r0,
                                     int32_t n) {
    cpu_rows r;
    const int v = value && !L->v_is_k_prefix;
    const int32_t d = v ? L->d_v : L->d_k;
    r.codes = ring + (v ? L->ring_v : L->ring_k) + ((size_t)r0 * L->n_kv_heads + h) * d * 2u;
    r.tile = -1;
    r.row_stride = (size_t)L->n_kv_heads * d * 2u;
    r.scale = r.bias = NULL;
    r.sb_stride = 0;
    r.n = n;
    r.enc = CPU_ENC_F16;
    r.group = 0;
    r.pf = NULL;
    r.codes2 = NULL;
    r.scale2 = r.bias2 = NULL;
    r.n1 = n;
    return r;
}

/* The kernel table in force for a call (FORCE_SCALAR, else the process-wide SIMD level; at AVX-512, the table
 * chosen by measurement: cpu_kernels_dispatch). */
const cpu_kernels *cpu_kernels_for_call(uint32_t flags);
/* dispatch.c: the table to use in place of the AVX-512 table wide (gokv_cpu_set_dispatch's mode; the first
 * call under the measured mode times the kernels, a few milliseconds once per process). */
const cpu_kernels *cpu_kernels_dispatch(const cpu_kernels *wide);

/* Ops of the CPU backend table. */
gokv_status cpu_pool_write(void *dev, void *pool, const gokv_layout *L, const gokv_write_desc *d);
gokv_status cpu_pool_read(void *dev, void *pool, const gokv_layout *L, const gokv_read_desc *d);
gokv_status cpu_pool_copy(void *dev, void *pool, const gokv_layout *L, const gokv_copy_desc *d);
gokv_status cpu_attend(void *dev, void *pool, const gokv_layout *L, const gokv_attend_desc *d);

/* Reads tokens [start, start + n) of one sequence as f32 rows [n][Hkv][d] (k_out, and v_out unless NULL),
 * dequantized by kern's dequant_row (gokv_pool_read: the scalar table, the reference). */
void cpu_read_sequence(const cpu_kernels *kern, const cpu_pool *p, const gokv_layout *L, const int32_t *ids,
                       int32_t kv_len, int32_t slot, int32_t start, int32_t n, float *k_out, float *v_out);

/* Key bounds (store.c): a page's bounds start afresh (min +inf, max -inf). */
void cpu_bounds_reset(const gokv_layout *L, uint16_t *b);

/* Quest's selection (quest.c), made before a call's attention: per (sequence s, kv head h), index s * Hkv + h,
 * the token ranges that kv head reads (ascending, disjoint), count[i] of them at ranges + off[i]. */
typedef struct cpu_quest {
    int64_t *off;
    int32_t *count;
    gokv_range *ranges;
    float *scores; /* the bounds B of each table entry, per sequence [Hkv][entries] */
} cpu_quest;
/* Workspace bytes of cpu_quest_plan for a call. */
size_t cpu_quest_bytes(const gokv_attend_desc *d, const gokv_layout *L);
/* Scores, selects (writing d->quest_bounds and d->quest_selected when given) and fills qs from ws (64-byte
 * aligned, cpu_quest_bytes of it); simd: the AVX2 scoring (x86 with AVX2, FMA and F16C). */
void cpu_quest_plan(cpu_threadpool *tp, const cpu_pool *pool, const gokv_layout *L, const gokv_attend_desc *d,
                    int simd, void *ws, cpu_quest *qs);

/* Decode tiles of at most this many rows per sequence are split into chunks (split-K) and cut by the masks. */
enum { CPU_SPLIT_MAX_ROWS = 16 };

/* The validity mask words of kv head h of sequence seq (GOKV_ATTEND_MASK_PER_KV_HEAD: one mask of
 * ceil(kv_len / 32) words per kv head; else one for all), NULL without masks. */
static inline const uint32_t *cpu_head_mask(const gokv_attend_desc *d, int32_t seq, int32_t h) {
    if (!d->valid_mask) return NULL;
    const uint32_t *w = d->valid_mask + d->valid_indptr[seq];
    if (d->flags & GOKV_ATTEND_MASK_PER_KV_HEAD) w += (size_t)h * (size_t)(((int64_t)d->kv_len[seq] + 31) >> 5);
    return w;
}

/* Workspace bytes of cpu_mask_plan for a call. */
size_t cpu_mask_plan_bytes(const gokv_attend_desc *d, const gokv_layout *L);
/* Cuts the ranges of every (sequence, kv head) (Quest's when quest is given, else the visible ones) by the
 * validity masks (d->valid_mask) into ws (cpu_mask_plan_bytes of it), as o; count -1: a prefill tile's visible
 * ranges, masked block by block. With a shared mask (per_head 0), the kv heads of a sequence share their first
 * one's ranges. */
void cpu_mask_plan(cpu_threadpool *tp, const gokv_layout *L, const gokv_attend_desc *d, const cpu_quest *quest,
                   int per_head, void *ws, cpu_quest *o);

/* The dequantize-then-attend baseline (docs/architecture.md §9's comparison point): baseline.c. */
gokv_status cpu_attend_dequant_baseline(cpu_device *dev, const cpu_pool *pool, const gokv_layout *L,
                                        const gokv_attend_desc *d);

#endif
