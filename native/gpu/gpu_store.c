/*
 * gpu_store.c: the plan's quantize-on-write and dequantize-on-read (gpu_pool_write, gpu_pool_read: the slots
 * pool_write and pool_read of every GPU module; docs/architecture.md §4, layouts in bridge/gokv_layout.h).
 * Pages and rings end up byte-identical to what native/cpu/store.c stores, and reads return the same floats
 * bit for bit (the kernels avoid every arithmetic the driver could round differently: see the Vulkan
 * module's shaders/store_common.glsl).
 *
 * The host lays out the caller's k and v floats and small per-row records (page, slot, source ...) in the
 * up buffer; the kernels do all the arithmetic, one invocation per independent unit of output:
 *
 *   per-token formats:  store_rows quantizes every new (token, head) row into its page slot.
 *   KIVI:               a sequence growing from n0 to n1 tokens quantizes the groups of positions
 *                       [kivi_len(n0), kivi_len(n1)) (gokv_kivi_quantized_len): the CPU does it one group
 *                       at a time as its ring fills, here all at once, store_kivi_keys for the keys (per
 *                       channel) and store_rows for the values (per token). A group's token t comes from
 *                       the ring if it was already there (t < n0), else from the new rows rounded to fp16,
 *                       which is what the CPU reads back from its ring. Then, after a barrier (the flush
 *                       reads ring rows that new tokens overwrite), store_ring writes each new token that
 *                       is the last one of this write to land on its ring row (t >= n1 - (R + g)): the
 *                       ring ends exactly as the CPU's sequential loop leaves it.
 *   key bounds:         (pools with key_bounds, Quest) after a barrier, store_bounds widens the bounds of each
 *                       page the chunk filled by the keys it stored there (per-token formats: the new
 *                       positions; KIVI: the quantized groups), starting afresh at slot 0.
 *   read:               store_read dequantizes each requested element (page, ring or zero).
 *
 * A call is one submission unless its buffers would exceed what one binding of the device may address
 * (caps.max_binding_bytes; Vulkan only guarantees 128 MiB): then it is cut into chunks of consecutive input
 * rows, one submission each. Writing a sequence's tokens in consecutive pieces stores exactly what writing
 * them at once does, and every chunk's buffers and pipelines are acquired before the first is submitted, so
 * only a lost device can leave a call half done.
 */
#include <string.h>

#include "gpu_internal.h"

/* Words of the per-row records in up, as the kernels read them. */
enum { ROW_META = 4, KEY_GROUP_META = 6, RING_META = 3, READ_META = 4, BOUNDS_META = 3 };
#define NONE GPU_NONE /* "no ring slot" / "released page" in a record */

/* Push constants: the kernels' Push blocks, from the field lists of gpu_push.h. */
GPU_PUSH_STRUCT(rows_push, GOKV_PUSH_STORE_ROWS);           /* store_rows */
GPU_PUSH_STRUCT(kivi_keys_push, GOKV_PUSH_STORE_KIVI_KEYS); /* store_kivi_keys */
GPU_PUSH_STRUCT(ring_push, GOKV_PUSH_STORE_RING);           /* store_ring */
GPU_PUSH_STRUCT(read_push, GOKV_PUSH_STORE_READ);           /* store_read */
GPU_PUSH_STRUCT(bounds_push, GOKV_PUSH_STORE_BOUNDS);       /* store_bounds */

/* The rows of sequence s that lie in the input rows [r0, r1): rows [row, row + n), positions from pos. */
typedef struct piece {
    int32_t row, pos, n;
} piece;

static piece seq_piece(const int32_t *tok_indptr, const int32_t *start_pos, int32_t s, int64_t r0, int64_t r1) {
    const int64_t a = tok_indptr[s] > r0 ? tok_indptr[s] : r0, b = tok_indptr[s + 1] < r1 ? tok_indptr[s + 1] : r1;
    piece p = {(int32_t)a, start_pos[s] + (int32_t)(a - tok_indptr[s]), b > a ? (int32_t)(b - a) : 0};
    return p;
}

/* ---- write ---- */

/* What a chunk of a write stores. */
typedef struct write_count {
    uint64_t rows;        /* input rows */
    uint64_t groups;      /* KIVI token groups quantized */
    uint64_t ring_tokens; /* KIVI tokens written to rings */
    uint64_t bounds;      /* key bounds records (at most one per page a piece fills): pools with key_bounds */
} write_count;

/* Adds a sequence growing from n0 to n0 + n tokens. */
static void count_piece(const gokv_layout *L, int32_t n0, int32_t n, write_count *c) {
    c->rows += (uint64_t)n;
    if (L->key_bounds && !L->kivi && n > 0)
        c->bounds += (uint64_t)((n0 + n - 1) / L->page_size - n0 / L->page_size + 1);
    if (!L->kivi || n == 0) return;
    const int32_t n1 = n0 + n;
    if (L->key_bounds) {
        const int32_t q0 = gokv_kivi_quantized_len(n0, L->group, L->residual), q1 = gokv_kivi_quantized_len(n1, L->group, L->residual);
        if (q1 > q0) c->bounds += (uint64_t)((q1 - 1) / L->page_size - q0 / L->page_size + 1);
    }
    c->groups += (uint64_t)((gokv_kivi_quantized_len(n1, L->group, L->residual) -
                             gokv_kivi_quantized_len(n0, L->group, L->residual)) / L->group);
    c->ring_tokens += (uint64_t)(n1 - (n1 - L->ring_rows > n0 ? n1 - L->ring_rows : n0));
}

/* The up buffer of a chunk, in words: k, v, value-row records, key-group records, ring records. */
typedef struct write_layout {
    uint64_t k_w, v_w, row_meta_w, key_meta_w, ring_meta_w, bounds_meta_w, words;
    uint64_t meta_rows; /* rows store_rows stores: every input row, or (KIVI) the values of quantized groups */
} write_layout;

static write_layout layout_write(const gokv_layout *L, const write_count *c) {
    const uint64_t H = (uint64_t)L->n_kv_heads;
    write_layout w;
    w.meta_rows = L->kivi ? (L->v_is_k_prefix ? 0 : c->groups * (uint64_t)L->group) : c->rows;
    w.k_w = 0;
    w.v_w = w.k_w + c->rows * H * (uint64_t)L->d_k;
    w.row_meta_w = w.v_w + (L->v_is_k_prefix ? 0 : c->rows * H * (uint64_t)L->d_v);
    w.key_meta_w = w.row_meta_w + w.meta_rows * ROW_META;
    w.ring_meta_w = w.key_meta_w + c->groups * KEY_GROUP_META;
    w.bounds_meta_w = w.ring_meta_w + c->ring_tokens * RING_META;
    w.words = w.bounds_meta_w + c->bounds * BOUNDS_META;
    return w;
}

static uint64_t count_words(const gokv_layout *L, const write_count *c) { return layout_write(L, c).words; }

/* Whether a chunk fits limit words of up, and its KIVI flush (which may read more from the rings than from
 * up) stays within 2^32 invocations; every other dispatch has fewer invocations than up has words. */
static int chunk_fits(const gokv_layout *L, const write_count *c, uint64_t limit) {
    const uint64_t d = (uint64_t)(L->d_k > L->d_v ? L->d_k : L->d_v);
    return count_words(L, c) <= limit && c->groups * (uint64_t)L->n_kv_heads * d <= UINT32_MAX;
}

/* The end r1 of the chunk of input rows starting at r0: as many rows as fit (chunk_fits). */
static gokv_status chunk_end(const char *op, const char *backend, const gokv_layout *L, const gokv_write_desc *d,
                             int64_t r0, uint64_t limit, int64_t *r1, write_count *out) {
    const int64_t rows = d->tok_indptr[d->n_seqs];
    write_count c = {0, 0, 0, 0};
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const piece p = seq_piece(d->tok_indptr, d->start_pos, s, r0, rows);
        if (p.n == 0) continue;
        write_count t = c;
        count_piece(L, p.pos, p.n, &t);
        if (chunk_fits(L, &t, limit)) {
            c = t;
            continue;
        }
        int32_t lo = 0, hi = p.n; /* the first lo rows of the piece fit, hi rows do not (the cost grows with n) */
        while (hi - lo > 1) {
            const int32_t mid = lo + (hi - lo) / 2;
            t = c;
            count_piece(L, p.pos, mid, &t);
            if (chunk_fits(L, &t, limit)) lo = mid;
            else hi = mid;
        }
        count_piece(L, p.pos, lo, &c);
        if (p.row + lo == r0)
            return gokv_set_error(GOKV_ENOMEM, "%s: %s: one token of sequence %d needs more than the device's %llu-byte "
                                  "buffer binding range", op, backend, s, (unsigned long long)limit * 4u);
        *r1 = p.row + lo;
        *out = c;
        return GOKV_OK;
    }
    *r1 = rows;
    *out = c;
    return GOKV_OK;
}

/* Records of a per-token chunk: each input row goes to the page slot of its position. */
static void fill_row_meta(const gokv_layout *L, const gokv_write_desc *d, int64_t r0, int64_t r1, uint32_t *meta) {
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const piece p = seq_piece(d->tok_indptr, d->start_pos, s, r0, r1);
        const int32_t *ids = d->page_ids + d->page_indptr[s];
        for (int32_t j = 0; j < p.n; j++, meta += ROW_META) {
            const int32_t pos = p.pos + j;
            meta[0] = (uint32_t)ids[pos / L->page_size];
            meta[1] = (uint32_t)(pos % L->page_size);
            meta[2] = (uint32_t)(p.row + j - r0);
            meta[3] = NONE;
        }
    }
}

/* Records of a KIVI chunk: the groups to quantize (keys), their tokens' value rows, the ring tokens. */
static void fill_kivi_meta(const gokv_layout *L, const gokv_write_desc *d, int64_t r0, int64_t r1, uint32_t *key_meta,
                           uint32_t *row_meta, uint32_t *ring_meta) {
    const int32_t g = L->group, P = L->page_size;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const piece p = seq_piece(d->tok_indptr, d->start_pos, s, r0, r1);
        if (p.n == 0) continue;
        const int32_t *ids = d->page_ids + d->page_indptr[s];
        const uint32_t slot = (uint32_t)d->residual_slot[s];
        const int32_t n0 = p.pos, n1 = n0 + p.n, row0 = (int32_t)(p.row - r0); /* row0: position n0's row */
        const int32_t q0 = gokv_kivi_quantized_len(n0, g, L->residual);
        const int32_t q1 = gokv_kivi_quantized_len(n1, g, L->residual);
        for (int32_t t0 = q0; t0 < q1; t0 += g, key_meta += KEY_GROUP_META) {
            const uint32_t page = (uint32_t)ids[t0 / P];
            key_meta[0] = page;
            key_meta[1] = (uint32_t)(t0 % P / g);
            key_meta[2] = slot;
            key_meta[3] = (uint32_t)t0;
            key_meta[4] = (uint32_t)n0;
            key_meta[5] = (uint32_t)row0;
            if (L->v_is_k_prefix) continue;
            for (int32_t t = t0; t < t0 + g; t++, row_meta += ROW_META) {
                row_meta[0] = page;
                row_meta[1] = (uint32_t)(t % P);
                row_meta[2] = t < n0 ? (uint32_t)t : (uint32_t)(row0 + t - n0);
                row_meta[3] = t < n0 ? slot : NONE;
            }
        }
        for (int32_t t = n1 - L->ring_rows > n0 ? n1 - L->ring_rows : n0; t < n1; t++, ring_meta += RING_META) {
            ring_meta[0] = slot;
            ring_meta[1] = (uint32_t)t;
            ring_meta[2] = (uint32_t)(row0 + t - n0);
        }
    }
}

/* Key bounds records of a chunk: for each page it fills, (page, s0, s1), the slots whose keys it stores
 * (per-token formats: the new positions; KIVI: the groups it quantizes). Returns their number. */
static uint64_t fill_bounds_meta(const gokv_layout *L, const gokv_write_desc *d, int64_t r0, int64_t r1, uint32_t *meta) {
    const int32_t P = L->page_size;
    uint64_t n = 0;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const piece p = seq_piece(d->tok_indptr, d->start_pos, s, r0, r1);
        if (p.n == 0) continue;
        const int32_t *ids = d->page_ids + d->page_indptr[s];
        int32_t a = p.pos, b = p.pos + p.n; /* positions whose keys land in pages */
        if (L->kivi) {
            a = gokv_kivi_quantized_len(p.pos, L->group, L->residual);
            b = gokv_kivi_quantized_len(p.pos + p.n, L->group, L->residual);
        }
        for (int32_t t = a; t < b;) {
            const int32_t end = (t / P + 1) * P < b ? (t / P + 1) * P : b;
            meta[0] = (uint32_t)ids[t / P];
            meta[1] = (uint32_t)(t % P);
            meta[2] = (uint32_t)((end - 1) % P + 1);
            meta += BOUNDS_META;
            n++;
            t = end;
        }
    }
    return n;
}

/* The pipelines a write of this pool may use (acquired up front, so no chunk fails on one). */
typedef struct write_pipes {
    gpu_pipeline rows, kivi_keys, ring, bounds;
    uint32_t wg;
} write_pipes;

static gokv_status get_write_pipes(gpu_device *D, const gokv_layout *L, write_pipes *wp) {
    uint32_t spec[GPU_SPEC_COUNT];
    gpu_pool_spec(D, L, spec);
    memset(wp, 0, sizeof *wp);
    wp->wg = spec[GPU_SPEC_WG_SIZE];
    gokv_status st = GOKV_OK;
    if (!(L->kivi && L->v_is_k_prefix)) st = gpu_get_pipeline(D, "store_rows", spec, &wp->rows);
    if (!st && L->kivi) st = gpu_get_pipeline(D, "store_kivi_keys", spec, &wp->kivi_keys);
    if (!st && L->kivi) st = gpu_get_pipeline(D, "store_ring", spec, &wp->ring);
    if (!st && L->key_bounds) st = gpu_get_pipeline(D, "store_bounds", spec, &wp->bounds);
    return st;
}

/* One submission: input rows [r0, r1) of the write, whose records c counts; up_bytes >= what they need. */
static gokv_status write_chunk(gpu_device *D, gpu_pool *p, const gokv_layout *L, const gokv_write_desc *d,
                               const write_pipes *wp, int64_t r0, int64_t r1, const write_count *c,
                               uint64_t up_bytes) {
    static const char *const op = "gokv_pool_write";
    const write_layout w = layout_write(L, c);
    const uint64_t H = (uint64_t)L->n_kv_heads;
    gpu_call call;
    gokv_status st = gpu_call_begin(D, p, up_bytes, 0, 0, &call);
    if (st) return st;
    uint32_t *up = (uint32_t *)call.up;
    memcpy(up + w.k_w, d->k + (size_t)r0 * H * L->d_k, (w.v_w - w.k_w) * 4u);
    if (!L->v_is_k_prefix) memcpy(up + w.v_w, d->v + (size_t)r0 * H * L->d_v, (w.row_meta_w - w.v_w) * 4u);
    if (L->kivi)
        fill_kivi_meta(L, d, r0, r1, up + w.key_meta_w, up + w.row_meta_w, up + w.ring_meta_w);
    else
        fill_row_meta(L, d, r0, r1, up + w.row_meta_w);

    if (c->groups > 0) {
        const uint64_t items = c->groups * H * (uint64_t)L->d_k;
        const kivi_keys_push push = {(uint32_t)w.k_w, (uint32_t)w.key_meta_w, (uint32_t)items};
        gpu_dispatch_linear(&call, wp->kivi_keys, &push, sizeof push, items, wp->wg);
    }
    if (w.meta_rows > 0) {
        const uint64_t unit = L->group ? (uint64_t)L->group : 4u; /* store_rows' UNIT, K_UNITS, V_UNITS */
        const uint64_t units = (L->kivi ? 0 : H * (uint64_t)L->d_k / unit) + (L->v_is_k_prefix ? 0 : H * (uint64_t)L->d_v / unit);
        const rows_push push = {(uint32_t)w.k_w, (uint32_t)w.v_w, (uint32_t)w.row_meta_w, (uint32_t)(w.meta_rows * units)};
        gpu_dispatch_linear(&call, wp->rows, &push, sizeof push, w.meta_rows * units, wp->wg);
    }
    const uint64_t n_bounds = L->key_bounds ? fill_bounds_meta(L, d, r0, r1, up + w.bounds_meta_w) : 0;
    if (n_bounds > 0) { /* after the keys are stored; the ring pass below reads nothing it writes */
        gpu_barrier(&call);
        const uint64_t items = n_bounds * H * (uint64_t)L->d_k / 2u;
        const bounds_push push = {(uint32_t)w.bounds_meta_w, p->bounds_w, 0u, (uint32_t)items};
        gpu_dispatch_linear(&call, wp->bounds, &push, sizeof push, items, wp->wg);
    }
    if (c->ring_tokens > 0) {
        if (c->groups > 0) gpu_barrier(&call);
        const uint64_t items = c->ring_tokens * H * (uint64_t)(L->d_k + (L->v_is_k_prefix ? 0 : L->d_v)) / 2u;
        const ring_push push = {(uint32_t)w.k_w, (uint32_t)w.v_w, (uint32_t)w.ring_meta_w, (uint32_t)items};
        gpu_dispatch_linear(&call, wp->ring, &push, sizeof push, items, wp->wg);
    }
    st = gpu_call_submit(&call, op);
    gpu_call_end(&call);
    return st;
}

gokv_status gpu_pool_write(gpu_device *D, gpu_pool *pool, const gokv_write_desc *d) {
    static const char *const op = "gokv_pool_write";
    const gokv_layout *L = &pool->L;
    const int64_t rows = d->tok_indptr[d->n_seqs];
    if (rows == 0) return GOKV_OK;
    const uint64_t limit = gpu_word_limit(D);
    /* plan the chunks once for the largest, so the up buffer grows (if at all) before anything is written */
    uint64_t max_words = 0;
    int64_t r1;
    write_count c;
    gokv_status st;
    for (int64_t r0 = 0; r0 < rows; r0 = r1) {
        if ((st = chunk_end(op, D->backend, L, d, r0, limit, &r1, &c))) return st;
        const uint64_t words = count_words(L, &c);
        max_words = words > max_words ? words : max_words;
    }
    write_pipes wp;
    if ((st = get_write_pipes(D, L, &wp))) return st;
    for (int64_t r0 = 0; r0 < rows; r0 = r1) {
        (void)chunk_end(op, D->backend, L, d, r0, limit, &r1, &c); /* succeeded when planning */
        if ((st = write_chunk(D, pool, L, d, &wp, r0, r1, &c, max_words * 4u))) return st;
    }
    return GOKV_OK;
}

/* ---- read ---- */

/* Records of the rows [r0, r1) of a read: page (or NONE if released), slot, ring slot (or NONE), position. */
static void fill_read_meta(const gokv_layout *L, const gokv_read_desc *d, int64_t r0, int64_t r1, uint32_t *meta) {
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const piece p = seq_piece(d->tok_indptr, d->start_pos, s, r0, r1);
        if (p.n == 0) continue;
        const int32_t *ids = d->page_ids + d->page_indptr[s];
        const int32_t n_quant = L->kivi ? gokv_kivi_quantized_len(d->kv_len[s], L->group, L->residual) : d->kv_len[s];
        for (int32_t pos = p.pos; pos < p.pos + p.n; pos++, meta += READ_META) {
            const int32_t id = ids[pos / L->page_size];
            meta[0] = id < 0 ? NONE : (uint32_t)id; /* a released page hides ring tokens too */
            meta[1] = (uint32_t)(pos % L->page_size);
            meta[2] = pos >= n_quant ? (uint32_t)d->residual_slot[s] : NONE;
            meta[3] = (uint32_t)pos;
        }
    }
}

gokv_status gpu_pool_read(gpu_device *D, gpu_pool *pool, const gokv_read_desc *d) {
    static const char *const op = "gokv_pool_read";
    const gokv_layout *L = &pool->L;
    const int64_t rows = d->tok_indptr[d->n_seqs];
    if (rows == 0) return GOKV_OK;
    const uint64_t H = (uint64_t)L->n_kv_heads;
    const uint64_t k_row = H * (uint64_t)L->d_k, v_row = d->v_out ? H * (uint64_t)L->d_v : 0;
    const uint64_t row_words = k_row + v_row > READ_META ? k_row + v_row : READ_META;
    const int64_t chunk_rows = (int64_t)(gpu_word_limit(D) / row_words);
    if (chunk_rows == 0)
        return gokv_set_error(GOKV_ENOMEM, "%s: %s: one token needs more than the device's %llu-byte buffer binding range",
                              op, D->backend, (unsigned long long)gpu_word_limit(D) * 4u);
    const int64_t first = rows < chunk_rows ? rows : chunk_rows; /* the largest chunk comes first */

    uint32_t spec[GPU_SPEC_COUNT];
    gpu_pool_spec(D, L, spec);
    gpu_pipeline pl;
    gokv_status st = gpu_get_pipeline(D, "store_read", spec, &pl);
    for (int64_t r0 = 0; !st && r0 < rows; r0 += chunk_rows) {
        const int64_t n = rows - r0 < chunk_rows ? rows - r0 : chunk_rows;
        gpu_call c;
        if ((st = gpu_call_begin(D, pool, (uint64_t)first * READ_META * 4u, 0, (uint64_t)first * (k_row + v_row) * 4u, &c)))
            break;
        fill_read_meta(L, d, r0, r0 + n, (uint32_t *)c.up);
        const uint64_t k_items = (uint64_t)n * k_row, items = (uint64_t)n * (k_row + v_row);
        const read_push push = {0, 0, (uint32_t)k_items, (uint32_t)k_items, (uint32_t)items};
        gpu_dispatch_linear(&c, pl, &push, sizeof push, items, spec[GPU_SPEC_WG_SIZE]);
        st = gpu_call_submit(&c, op);
        if (!st) {
            memcpy(d->k_out + (size_t)r0 * k_row, c.down, k_items * 4u);
            if (d->v_out) memcpy(d->v_out + (size_t)r0 * v_row, c.down + k_items * 4u, (items - k_items) * 4u);
        }
        gpu_call_end(&c);
    }
    return st;
}
