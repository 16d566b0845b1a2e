/*
 * gokv.h: the C ABI of gokv, compressed KV caches and fused attention for LLM inference.
 *
 * Plain C99. Every call returns a gokv_status (GOKV_OK == 0); on failure gokv_last_error() (thread-local)
 * names the argument at fault. No call aborts the process on bad input, and a failed call changes nothing
 * that was already stored: every argument is validated before any data is touched.
 *
 * Ownership: handles come in create/destroy pairs; destroy(NULL) is a no-op. Caller-owned buffers are read
 * or written only during the call and never retained.
 *
 * Threads: calls on different handles may run concurrently. Calls on one device may come from many threads;
 * the CPU backend serializes the attention calls of one device on its thread pool. Writes to a pool must
 * not race with attention calls that read the same pages (the caller owns the page tables, so it knows).
 *
 * Positions: token i of a sequence sits at position i, in page page_ids[i / page_size], slot i % page_size.
 * A page id < 0 in a page table marks a page that was released (evicted): its tokens are invisible.
 *
 * The math, formats and layouts are docs/architecture.md §3-§5; the layout of a page is in gokv_layout.h.
 */
#ifndef GOKV_H
#define GOKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GOKV_ABI_VERSION 1u

/* ---- status codes: one X-macro list makes the enum, the names and the messages ---- */
#define GOKV_STATUS_LIST(X)                                                          \
    X(GOKV_OK, 0, "ok")                                                              \
    X(GOKV_EINVAL, 1, "invalid argument")                                            \
    X(GOKV_ERANGE, 2, "index out of range")                                          \
    X(GOKV_ENOMEM, 3, "out of memory")                                               \
    X(GOKV_ENOTSUP, 4, "not supported by this backend")                              \
    X(GOKV_ENODEV, 5, "no such backend or device")                                   \
    X(GOKV_EVERSION, 6, "descriptor or ABI version mismatch")                        \
    X(GOKV_EDEVICE, 7, "device error (lost device or failed submission)")            \
    X(GOKV_EINTERNAL, 8, "internal error")

typedef int32_t gokv_status;
#define GOKV_STATUS_ENUM_(name, value, msg) name = value,
enum { GOKV_STATUS_LIST(GOKV_STATUS_ENUM_) GOKV_STATUS_COUNT_ };
#undef GOKV_STATUS_ENUM_

/* Name ("GOKV_EINVAL") and generic message of a status; unknown codes give "GOKV_UNKNOWN". */
const char *gokv_status_name(gokv_status s);
const char *gokv_status_message(gokv_status s);

/* The message of the last failed call on this thread ("" if none). Valid until the next gokv call on it. */
const char *gokv_last_error(void);
/* Copies that message into buf (always NUL-terminated when cap > 0); returns the full length. Lets a
 * wrapper fetch the message inside the same foreign call as the failing one (Go may switch threads). */
size_t gokv_last_error_copy(char *buf, size_t cap);

uint32_t gokv_abi_version(void);

/* ---- logging: native code never prints, it calls this ---- */
enum { GOKV_LOG_DEBUG = 0, GOKV_LOG_INFO = 1, GOKV_LOG_WARN = 2, GOKV_LOG_ERROR = 3 };
typedef void (*gokv_log_fn)(void *user, int32_t level, const char *backend, const char *op, const char *msg);
/* Installs the process-wide log callback (NULL: silent, the default); messages below min_level are dropped. */
gokv_status gokv_set_log_callback(gokv_log_fn fn, void *user, int32_t min_level);

/* ---- storage formats (docs/architecture.md §4) ---- */
enum {
    GOKV_FORMAT_F32 = 0,
    GOKV_FORMAT_F16 = 1,
    GOKV_FORMAT_Q8 = 2,    /* per token, groups of g along head_dim, 8-bit asymmetric */
    GOKV_FORMAT_Q4 = 3,    /* per token, groups of g along head_dim, 4-bit asymmetric */
    GOKV_FORMAT_KIVI2 = 4, /* keys per channel over g tokens, values per token; newest R tokens in f16 */
    GOKV_FORMAT_KIVI4 = 5,
    GOKV_FORMAT_COUNT_ = 6
};
const char *gokv_format_name(int32_t format); /* "f32", "q4", ...; NULL if unknown */

/* ---- backends and devices ---- */
typedef struct gokv_device gokv_device;
typedef struct gokv_pool gokv_pool;

/* Backends compiled into this build ("cpu" always first). index in [0, gokv_backend_count()). */
int32_t gokv_backend_count(void);
const char *gokv_backend_name(int32_t index);

typedef struct gokv_device_desc {
    uint32_t struct_size;  /* sizeof(gokv_device_desc) */
    const char *backend;   /* "cpu", "vulkan", "metal", "sycl" or "auto" (a vendor module if any, not an
                              emulated one, else cpu) */
    int32_t device_index;  /* -1: the backend's choice (discrete GPU first) */
    const char *device_name; /* optional substring to pick a device by name; NULL to ignore */
    int32_t n_threads;     /* CPU worker threads, 0 = all online CPUs; GPU backends use it for host work */
} gokv_device_desc;

enum {
    GOKV_CAP_DECODE = 1u << 0,
    GOKV_CAP_PREFILL = 1u << 1,
    GOKV_CAP_LEARNED_SINKS = 1u << 2,
    GOKV_CAP_WINDOW = 1u << 3,
    GOKV_CAP_MLA = 1u << 4,
    GOKV_CAP_HOLES = 1u << 5,
    GOKV_CAP_BASELINE = 1u << 6, /* GOKV_ATTEND_DEQUANT_BASELINE is available */
    GOKV_CAP_MASS = 1u << 7,     /* gokv_attend_desc.mass (attention mass output) */
    GOKV_CAP_KV_HEAD_MASKS = 1u << 8, /* GOKV_ATTEND_MASK_PER_KV_HEAD */
    GOKV_CAP_QUEST = 1u << 9,    /* pools with key_bounds, and gokv_attend_desc.quest_pages */
};

typedef struct gokv_device_info {
    uint32_t struct_size;     /* set by the caller: sizeof(gokv_device_info) */
    char backend[16];
    char name[128];
    char features[128];       /* CPU: the SIMD paths chosen, e.g. "avx512f avx512vnni fma" */
    uint64_t memory_bytes;    /* device memory (CPU: physical RAM) */
    int32_t subgroup_size;    /* CPU: SIMD width in floats of the chosen path */
    int32_t n_threads;        /* worker threads in use */
    uint32_t caps;            /* GOKV_CAP_* */
    uint32_t formats;         /* bit (1 << format) for each supported format */
} gokv_device_info;

gokv_status gokv_device_open(const gokv_device_desc *desc, gokv_device **out);
gokv_status gokv_device_info_get(gokv_device *dev, gokv_device_info *out);
void gokv_device_close(gokv_device *dev);

/* ---- page pools: the storage of one (layer group, format, geometry) ---- */
typedef struct gokv_pool_desc {
    uint32_t struct_size;   /* sizeof(gokv_pool_desc) */
    int32_t format;         /* GOKV_FORMAT_* */
    int32_t group_size;     /* g: 32, 64 or 128 for quantized formats (divides head dims; KIVI: divides page_size) */
    int32_t residual;       /* KIVI R: full-precision recent tokens, a multiple of g (0 allowed); else 0 */
    int32_t n_kv_heads;     /* KV heads (MLA: 1) */
    int32_t head_dim_k;     /* d_qk: 1..1024, a multiple of 4 (and of g when quantized) */
    int32_t head_dim_v;     /* d_v: 1..1024, same rules; with v_is_k_prefix, d_v <= d_qk */
    int32_t v_is_k_prefix;  /* 1: MLA absorbed form, V is the first d_v dims of K, no V storage */
    int32_t page_size;      /* P tokens per page: a multiple of 8 (and of g for KIVI), 8..1024; 0 = 64 */
    int32_t n_pages;        /* capacity in pages, >= 1 */
    int32_t n_residual_slots; /* KIVI: per-sequence residual rings, one per live sequence; else 0 */
    int32_t key_bounds;     /* 1: keep, per page and kv head, the per-channel min and max of the keys as stored
                               (Quest's page bounds, gokv_layout.h; GOKV_CAP_QUEST); 0: none */
} gokv_pool_desc;

gokv_status gokv_pool_create(gokv_device *dev, const gokv_pool_desc *desc, gokv_pool **out);
void gokv_pool_destroy(gokv_pool *pool);
/* Bytes of one page and of one residual slot (0 if none) for this pool's format and geometry. */
gokv_status gokv_pool_sizes(const gokv_pool *pool, uint64_t *page_bytes, uint64_t *residual_slot_bytes);

/*
 * Appends tokens to sequences: sequence i already holds start_pos[i] tokens and receives the rows
 * [tok_indptr[i], tok_indptr[i+1]) of k and v, at positions start_pos[i], start_pos[i]+1, ...
 * Its page table (page_ids[page_indptr[i] .. page_indptr[i+1])) must cover every position up to the new
 * length, with pages >= 0 for the new positions (older entries may be released, -1). Quantized formats
 * quantize on write. KIVI: the newest tokens go to the sequence's
 * residual ring (residual_slot[i]); whenever it would hold R + g tokens the oldest g are quantized per
 * channel into their page. After the call, tokens [0, n_quant) of a KIVI sequence of length n are in pages
 * and [n_quant, n) in its ring, with n_quant = max(0, floor((n - R) / g) * g) (gokv_kivi_quantized_len).
 * Sequences of one call must not write into the same page (nor share a residual slot).
 */
typedef struct gokv_write_desc {
    uint32_t struct_size;         /* sizeof(gokv_write_desc) */
    int32_t n_seqs;
    const int32_t *tok_indptr;    /* [n_seqs + 1], non-decreasing, tok_indptr[0] == 0 */
    const int32_t *page_indptr;   /* [n_seqs + 1], non-decreasing, page_indptr[0] == 0 */
    const int32_t *page_ids;      /* [page_indptr[n_seqs]] */
    const int32_t *start_pos;     /* [n_seqs] tokens already in each sequence */
    const int32_t *residual_slot; /* [n_seqs] KIVI only (NULL otherwise) */
    const float *k;               /* [tok_indptr[n_seqs], n_kv_heads, head_dim_k] */
    const float *v;               /* [tok_indptr[n_seqs], n_kv_heads, head_dim_v]; NULL when v_is_k_prefix */
} gokv_write_desc;
gokv_status gokv_pool_write(gokv_pool *pool, const gokv_write_desc *desc);

/*
 * Dequantize-on-read: for sequence i of length kv_len[i], reads positions start_pos[i] .. into rows
 * [tok_indptr[i], tok_indptr[i+1]) of k_out and v_out, as the attention kernels see them. Released pages
 * read as zeros. For persistence and debugging, not for attention.
 */
typedef struct gokv_read_desc {
    uint32_t struct_size;
    int32_t n_seqs;
    const int32_t *tok_indptr;
    const int32_t *page_indptr;
    const int32_t *page_ids;
    const int32_t *kv_len;        /* [n_seqs] current length of each sequence */
    const int32_t *start_pos;     /* [n_seqs] first position to read */
    const int32_t *residual_slot; /* [n_seqs] KIVI only */
    float *k_out;                 /* [tok_indptr[n_seqs], n_kv_heads, head_dim_k] */
    float *v_out;                 /* [.., n_kv_heads, head_dim_v]; may be NULL */
} gokv_read_desc;
gokv_status gokv_pool_read(gokv_pool *pool, const gokv_read_desc *desc);

/* Copies whole pages src[i] -> dst[i] and residual slots (copy-on-write forks). Destinations must be
 * distinct and must not be sources. Either count may be 0. */
typedef struct gokv_copy_desc {
    uint32_t struct_size;
    int32_t n_pages;
    const int32_t *src_pages;
    const int32_t *dst_pages;
    int32_t n_slots;
    const int32_t *src_slots;
    const int32_t *dst_slots;
} gokv_copy_desc;
gokv_status gokv_pool_copy(gokv_pool *pool, const gokv_copy_desc *desc);

/*
 * Moves token rows between pages as stored, byte for byte, with no requantization (compaction after
 * per-kv-head eviction, docs/architecture.md §6): for each i, kv head kv_heads[i]'s key and value rows
 * (codes, scales and biases) of slot src_slots[i] of page src_pages[i] are copied into slot dst_slots[i] of
 * page dst_pages[i]. Only formats whose rows lie within a token: f32, f16, q8, q4 (KIVI keys are grouped
 * per channel across tokens, and pools with key_bounds keep every token: both GOKV_ENOTSUP). Pages in
 * range and >= 0, slots in [0, P), heads in [0, n_kv_heads); the destinations (page, slot, head) are
 * distinct and no destination page is a source page, so the order of the rows does not matter. Rows of
 * a destination page that no entry names keep their bytes. A call rejected by validation writes nothing;
 * a device failure while writing may leave destination pages part-written, never a source page.
 */
typedef struct gokv_gather_desc {
    uint32_t struct_size;     /* sizeof(gokv_gather_desc) */
    int32_t n_rows;           /* >= 0 */
    const int32_t *src_pages; /* [n_rows] */
    const int32_t *src_slots;
    const int32_t *dst_pages;
    const int32_t *dst_slots;
    const int32_t *kv_heads;
} gokv_gather_desc;
gokv_status gokv_pool_gather_rows(gokv_pool *pool, const gokv_gather_desc *desc);

/*
 * Writes page `page` as stored (gokv_layout.h): n_bytes == the pool's page bytes, exactly what
 * gokv_pool_page_bytes returns (saved caches load through it; no requantization). The bytes are checked
 * before anything is written: every fp16 scale and bias and every f32/f16 element of the first n_tokens
 * slots must be finite (the error names the kv head, the slot and the section). n_tokens in [0, P] is how
 * many leading slots hold tokens (KIVI: tokens quantized into the page, a multiple of g); in a pool with
 * key_bounds the page's bounds are recomputed from the stored keys of those slots, as writes of them
 * would have left them. gokv_pool_set_slot_bytes writes KIVI residual slot `slot` (its ring bytes, every
 * fp16 finite). Both raise the pool's recorded largest |k| and |v| (the score-range check of attention) to
 * cover what the loaded bytes read as, as writes do. Slots past n_tokens are written as given and not
 * checked: a caller must not attend them (kv_len within the tokens it loaded). Optional per backend
 * (GOKV_ENOTSUP naming it).
 */
gokv_status gokv_pool_set_page_bytes(gokv_pool *pool, int32_t page, const void *bytes, uint64_t n_bytes,
                                     int32_t n_tokens);
gokv_status gokv_pool_set_slot_bytes(gokv_pool *pool, int32_t slot, const void *bytes, uint64_t n_bytes);

/* ---- attention (docs/architecture.md §5) ---- */
enum {
    /* Use the dequantize-then-attend baseline (materializes f32 K/V, then attends): benchmarks only. The
     * CPU backend keeps the f32 copy's memory on the device, grown to the largest call, until it closes. */
    GOKV_ATTEND_DEQUANT_BASELINE = 1u << 0,
    /* Use the plain scalar kernels even where a SIMD path exists (tests compare the two). */
    GOKV_ATTEND_FORCE_SCALAR = 1u << 1,
    /* valid_mask holds one mask per kv head (per-kv-head eviction: H2O, SnapKV): sequence i's words at
     * valid_indptr[i] are n_kv_heads masks of W_i = ceil(kv_len[i] / 32) words each, kv head h's starting
     * at word valid_indptr[i] + h * W_i; a query head sees token t only if its kv head's bit t is set. */
    GOKV_ATTEND_MASK_PER_KV_HEAD = 1u << 2,
};

/*
 * Batched attention over B sequences of one pool (varlen). Sequence i has kv_len[i] stored tokens and the
 * query rows [q_indptr[i], q_indptr[i+1]) at positions q_pos[i], q_pos[i]+1, ... (decode: one row at
 * kv_len-1; prefill: T rows ending at kv_len-1, after their K/V were written). Each row holds n_heads_q
 * query heads; head h reads kv head h / (n_heads_q / n_kv_heads).
 *
 * A query at position p sees token t iff t < kv_len, t <= p, the page of t is not released, bit t of its
 * validity mask is set (when masks are given), and (window == 0 or t > p - window or t < n_sink_tokens).
 * out = Σ e^(s_t - m) v_t / (Σ e^(s_t - m) + e^(σ_h - m)), s_t = scale · q·k_t, σ_h the learned sink logit
 * (absent when sink_logits is NULL). A query that sees nothing outputs zeros (with or without σ).
 * Decode rows are split into chunks of chunk_size visible-range tokens and combined by a reduce pass.
 */
typedef struct gokv_attend_desc {
    uint32_t struct_size;         /* sizeof(gokv_attend_desc) */
    gokv_pool *pool;
    int32_t n_seqs;
    const int32_t *q_indptr;      /* [n_seqs + 1] query rows of each sequence */
    const int32_t *page_indptr;   /* [n_seqs + 1] */
    const int32_t *page_ids;      /* concatenated page tables, -1 = released page */
    const int32_t *kv_len;        /* [n_seqs] */
    const int32_t *q_pos;         /* [n_seqs] position of each sequence's first query row */
    const int32_t *residual_slot; /* [n_seqs] KIVI only */
    const uint32_t *valid_mask;   /* optional bitmask per token (bit t%32 of word t/32), NULL = all valid */
    const int32_t *valid_indptr;  /* [n_seqs + 1] word offsets of each sequence's mask; with valid_mask */
    int32_t n_heads_q;            /* a multiple of the pool's n_kv_heads */
    const float *q;               /* [q_indptr[n_seqs], n_heads_q, head_dim_k] */
    float *out;                   /* [q_indptr[n_seqs], n_heads_q, head_dim_v] */
    float scale;                  /* α, > 0 and finite (typically 1/sqrt(d_qk)) */
    const float *sink_logits;     /* [n_heads_q] learned sink logits σ_h, or NULL */
    int32_t n_sink_tokens;        /* first positions always visible under a window (StreamingLLM) */
    int32_t window;               /* sliding window W, 0 = none */
    int32_t chunk_size;           /* split-K chunk C in tokens, 0 = backend default (512) */
    uint32_t flags;               /* GOKV_ATTEND_* */
    /* Attention mass (optional; NULL = none), what H2O and SnapKV rank tokens by: for sequence i, kv head h
     * and token t < kv_len[i], mass[off_i + h * kv_len[i] + t] (off_i = Σ_{j<i} n_kv_heads · kv_len[j]) is
     * the softmax probability of t summed over h's query heads and over the counted query rows of sequence
     * i, the learned sink in each denominator (so one row's mass over all tokens is its heads' 1 - sink
     * share). Tokens no counted row sees get 0; every element is written. mass_rows = 0 counts every query
     * row of the call; R > 0 counts only each sequence's last min(R, rows) rows (SnapKV's observation
     * window). Computed in the same call as out; not with GOKV_ATTEND_DEQUANT_BASELINE. */
    float *mass;
    int32_t mass_rows;
    /* Quest (a pool made with key_bounds): quest_pages = K > 0 makes each sequence's decode row read, per kv
     * head, only the K pages of its table with the highest bound
     *     B(page) = max over the kv head's query heads h of Σ_c max(q_hc · min_c, q_hc · max_c)
     * (min_c, max_c: the page's stored key bounds; B >= q_h · k for every key the page holds), plus every
     * page holding a sink token (t < n_sink_tokens) or one of the last quest_recent tokens, plus (KIVI) the
     * residual ring; every other token is skipped as if masked (its mass is 0). Ties go to the older page.
     * At most one query row per sequence, window 0, not with the baseline. */
    int32_t quest_pages;
    int32_t quest_recent;
    float *quest_bounds;      /* optional out: [page_indptr[n_seqs]][n_kv_heads] B of each page-table entry;
                                 -INFINITY for released pages and pages none of whose tokens are in pages yet */
    int32_t *quest_selected;  /* optional out: [n_seqs][n_kv_heads][quest_pages] the table indices chosen by
                                 bound (ascending), -1 where fewer pages compete; the sink and recent pages
                                 are read besides them and are not listed */
} gokv_attend_desc;
gokv_status gokv_attend(gokv_device *dev, const gokv_attend_desc *desc);

/* One batch step of a layer in one call: appends the new tokens (write, may be NULL or have no rows) and then
 * attends (attend->pool must be the pool written). Both descriptors are validated before anything is
 * written, so a rejected step leaves the cache as it was. */
gokv_status gokv_append_attend(gokv_device *dev, const gokv_write_desc *write, const gokv_attend_desc *attend);

/* KIVI: how many of a sequence's n tokens are quantized into pages (the rest are in its ring), in [0, n];
 * -1 (with gokv_last_error set) for n < 0, group_size <= 0 or residual < 0. */
int32_t gokv_kivi_quantized_len(int32_t n, int32_t group_size, int32_t residual);

/* ---- sizes without a device (docs/architecture.md §4) ---- */
typedef struct gokv_layout_sizes {
    uint32_t struct_size;         /* set by the caller: sizeof(gokv_layout_sizes) */
    uint64_t page_bytes;          /* one page: P tokens of every kv head, sections 64-byte aligned */
    uint64_t page_code_bytes;     /* of which stored elements or codes */
    uint64_t page_meta_bytes;     /* of which fp16 scales and biases */
    uint64_t residual_slot_bytes; /* one KIVI residual ring (R + g rows of fp16 K and V); 0 otherwise */
    uint64_t page_bounds_bytes;   /* a page's key bounds, kept beside it (key_bounds); 0 otherwise */
} gokv_layout_sizes;
/* What a pool of this description allocates, from the same layout code every backend allocates by, with
 * no device: a pure function of the description, validated as gokv_pool_create validates it. The rest of
 * a page (page_bytes - code - meta) is alignment and tile padding. */
gokv_status gokv_layout_sizes_get(const gokv_pool_desc *desc, gokv_layout_sizes *out);

/* ---- inspection, measurement and fault injection, for tests and benchmarks ----
 * Optional per backend: one without the slot answers GOKV_ENOTSUP naming itself and the operation. */

/* Copies page `page` of a pool exactly as stored (gokv_layout.h) into out, which holds out_bytes >= the
 * pool's page bytes. gokv_pool_slot_bytes does the same for KIVI residual slot `slot` (its ring bytes). */
gokv_status gokv_pool_page_bytes(gokv_pool *pool, int32_t page, void *out, uint64_t out_bytes);
gokv_status gokv_pool_slot_bytes(gokv_pool *pool, int32_t slot, void *out, uint64_t out_bytes);

typedef struct gokv_device_ceilings {
    uint32_t struct_size;  /* set by the caller: sizeof(gokv_device_ceilings) */
    double read_gbps;      /* GB/s (1e9 B/s) at which the device streams memory: attention's floor */
    double peak_gflops;    /* float32 FMA peak, an FMA counting 2; 0 where not measured */
    char method[96];       /* what read_gbps measured, e.g. "streaming read" or "buffer copy, read + write" */
} gokv_device_ceilings;
/* Measures the device's ceilings over about `bytes` of memory (0: the backend's default; at least 1 MiB
 * otherwise). Takes up to a few seconds; for benchmarks, never called by the other operations. */
gokv_status gokv_device_measure(gokv_device *dev, uint64_t bytes, gokv_device_ceilings *out);

/* Makes the next operation of `site` on any device of `backend` fail with the backend's own error code
 * `code` (Vulkan: a VkResult, e.g. VK_ERROR_DEVICE_LOST = -4, VK_ERROR_OUT_OF_DEVICE_MEMORY = -2), as a
 * real failure would; code 0 disarms the site. For tests of the error paths. */
enum { GOKV_FAULT_SUBMIT = 0, GOKV_FAULT_ALLOC = 1 };
gokv_status gokv_inject_fault(const char *backend, int32_t site, int32_t code);

#ifdef __cplusplus
}
#endif
#endif /* GOKV_H */
