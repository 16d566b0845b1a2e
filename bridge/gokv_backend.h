/*
 * gokv_backend.h: what a backend module implements (one table, one registration call), and the core's
 * helpers it may use. Internal to gokv: not part of the public ABI.
 *
 * The core validates every argument before a backend sees a call, so a backend receives only
 * well-formed descriptors (the guarantees are listed on each slot). A backend returns a status and, on
 * failure, sets a message with gokv_set_error(). Optional slots may be NULL: the core answers
 * GOKV_ENOTSUP naming the backend and the operation.
 */
#ifndef GOKV_BACKEND_H
#define GOKV_BACKEND_H

#include "gokv.h"
#include "gokv_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gokv_backend {
    /* ---- required ---- */
    const char *name;
    /* 1: the kernels run on an emulator (native/simt), to test them where the hardware is missing: the
     * backend answers by name but is never "auto"'s choice. */
    int32_t emulated;
    /* Opens device index (>= 0, or -1 for the backend's choice) or the one whose name contains
     * name_filter. Returns the backend's device object in *impl. */
    gokv_status (*device_open)(const gokv_device_desc *desc, void **impl);
    void (*device_close)(void *dev);
    gokv_status (*device_info)(void *dev, gokv_device_info *out); /* core fills struct_size and backend */
    /* Pools: the layout is computed by the core; the backend allocates page and ring storage. */
    gokv_status (*pool_create)(void *dev, const gokv_pool_desc *desc, const gokv_layout *L, void **impl);
    void (*pool_destroy)(void *dev, void *pool);
    /* Validated: every page written is in range and >= 0, no page or ring is written twice, values finite
     * and within fp16 range for fp16/quantized formats. */
    gokv_status (*pool_write)(void *dev, void *pool, const gokv_layout *L, const gokv_write_desc *desc);
    gokv_status (*pool_read)(void *dev, void *pool, const gokv_layout *L, const gokv_read_desc *desc);
    gokv_status (*pool_copy)(void *dev, void *pool, const gokv_layout *L, const gokv_copy_desc *desc);
    /* Validated: page tables cover kv_len, ids in [-1, n_pages), queries and sinks finite. */
    gokv_status (*attend)(void *dev, void *pool, const gokv_layout *L, const gokv_attend_desc *desc);

    /* ---- optional (NULL: the core answers GOKV_ENOTSUP): what tests and benchmarks need ---- */
    /* Copies page `page` (validated in range) or residual slot `slot` as stored: L->page_bytes or
     * L->ring_bytes bytes to out. */
    gokv_status (*page_bytes)(void *dev, void *pool, const gokv_layout *L, int32_t page, void *out);
    gokv_status (*slot_bytes)(void *dev, void *pool, const gokv_layout *L, int32_t slot, void *out);
    /* Writes page `page` as stored (validated: in range, bytes checked finite, n_tokens in [0, P] and a
     * multiple of g for KIVI); with key_bounds, recomputes the page's bounds from slots [0, n_tokens).
     * The core's gokv_pool_gather_rows is built on page_bytes + set_page_bytes (no slot of its own). */
    gokv_status (*set_page_bytes)(void *dev, void *pool, const gokv_layout *L, int32_t page, const void *bytes,
                                  int32_t n_tokens);
    gokv_status (*set_slot_bytes)(void *dev, void *pool, const gokv_layout *L, int32_t slot, const void *bytes);
    /* Fills read_gbps, peak_gflops and method (bytes: 0 or >= 1 MiB). */
    gokv_status (*measure)(void *dev, uint64_t bytes, gokv_device_ceilings *out);
    /* Arms (code != 0) or disarms site GOKV_FAULT_* for every device of the backend. */
    gokv_status (*inject_fault)(int32_t site, int32_t code);
} gokv_backend;

/* The token ranges that queries at positions [p0, p1] of a sequence of kv_len tokens can see under the
 * call's window W and sink tokens (docs/architecture.md §5): [0, min(p1 + 1, kv_len)) without a window, else
 * the sink tokens [0, n_sink) and the window (p0 - W, p1], merged when they touch. At most two, in order;
 * returns how many. Every backend cuts its attention work along these ranges, so only they are ever read. */
typedef struct gokv_range {
    int32_t lo, hi;
} gokv_range;

static inline int32_t gokv_visible_ranges(const gokv_attend_desc *d, int32_t kv_len, int32_t p0, int32_t p1,
                                          gokv_range out[2]) {
    const int64_t hi = (int64_t)p1 + 1 < kv_len ? (int64_t)p1 + 1 : kv_len;
    if (hi <= 0) return 0;
    if (d->window == 0) {
        out[0].lo = 0, out[0].hi = (int32_t)hi;
        return 1;
    }
    const int64_t wlo = (int64_t)p0 - d->window + 1 > 0 ? (int64_t)p0 - d->window + 1 : 0;
    const int64_t sink_hi = d->n_sink_tokens < hi ? d->n_sink_tokens : hi;
    if (wlo <= sink_hi) {
        out[0].lo = 0, out[0].hi = (int32_t)hi;
        return 1;
    }
    int32_t n = 0;
    if (sink_hi > 0) out[n].lo = 0, out[n++].hi = (int32_t)sink_hi;
    if (wlo < hi) out[n].lo = (int32_t)wlo, out[n++].hi = (int32_t)hi;
    return n;
}

/* Adds a backend to the registry (idempotent for the same table). The CPU backend is always present. */
gokv_status gokv_register_backend(const gokv_backend *b);

/* Sets this thread's last error message (printf-style) and returns status, for `return gokv_set_error(...)`. */
gokv_status gokv_set_error(gokv_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Sends a message to the registered log callback, if any (printf-style). */
void gokv_log(int32_t level, const char *backend, const char *op, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* The layout of a pool (any backend): for tests that check stored bytes against gokv_layout.h. */
const gokv_layout *gokv_pool_layout(const gokv_pool *pool);

/* The CPU backend's table (native/cpu); the core registers it first. */
const gokv_backend *gokv_cpu_backend(void);

#ifdef __cplusplus
}
#endif
#endif
