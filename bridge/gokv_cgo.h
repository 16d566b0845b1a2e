/*
 * gokv_cgo.h: the C half of the cgo glue (package bridge), included by the cgo preamble of each Go file
 * that calls the ABI. Not part of the ABI and not compiled by CMake.
 *
 * Why wrappers: gokv_last_error() is thread-local, and a goroutine may move to another OS thread between two
 * cgo calls (docs/architecture.md §3). Each wrapper makes the ABI call and, on failure, copies the message in
 * the same C call. The copy is malloc'ed only on failure, so a successful call allocates nothing; Go frees
 * it.
 *
 * Descriptors arrive from Go as Go-allocated C structs whose pointers refer to Go memory pinned by a
 * runtime.Pinner for the duration of the call; nothing here keeps a pointer after returning.
 */
#ifndef GOKV_CGO_H
#define GOKV_CGO_H

#include <stdlib.h>
#include <string.h>

#include "gokv.h"

typedef struct gokv_cgo_result {
    gokv_status status;
    char *msg; /* malloc'ed copy of the last error when status != GOKV_OK (may be NULL), freed by Go */
} gokv_cgo_result;

static inline gokv_cgo_result gokv_cgo_result_of(gokv_status s) {
    gokv_cgo_result r;
    r.status = s;
    r.msg = NULL;
    if (s != GOKV_OK) {
        char buf[1024];
        gokv_last_error_copy(buf, sizeof buf);
        size_t n = strlen(buf) + 1;
        r.msg = (char *)malloc(n);
        if (r.msg) memcpy(r.msg, buf, n);
    }
    return r;
}

static inline gokv_cgo_result gokv_cgo_device_open(const gokv_device_desc *d, gokv_device **out) {
    return gokv_cgo_result_of(gokv_device_open(d, out));
}
static inline gokv_cgo_result gokv_cgo_device_info(gokv_device *dev, gokv_device_info *out) {
    return gokv_cgo_result_of(gokv_device_info_get(dev, out));
}
static inline gokv_cgo_result gokv_cgo_pool_create(gokv_device *dev, const gokv_pool_desc *d, gokv_pool **out) {
    return gokv_cgo_result_of(gokv_pool_create(dev, d, out));
}
static inline gokv_cgo_result gokv_cgo_pool_sizes(const gokv_pool *pool, uint64_t *page, uint64_t *slot) {
    return gokv_cgo_result_of(gokv_pool_sizes(pool, page, slot));
}
static inline gokv_cgo_result gokv_cgo_pool_write(gokv_pool *pool, const gokv_write_desc *d) {
    return gokv_cgo_result_of(gokv_pool_write(pool, d));
}
static inline gokv_cgo_result gokv_cgo_pool_read(gokv_pool *pool, const gokv_read_desc *d) {
    return gokv_cgo_result_of(gokv_pool_read(pool, d));
}
static inline gokv_cgo_result gokv_cgo_pool_copy(gokv_pool *pool, const gokv_copy_desc *d) {
    return gokv_cgo_result_of(gokv_pool_copy(pool, d));
}
static inline gokv_cgo_result gokv_cgo_pool_gather_rows(gokv_pool *pool, const gokv_gather_desc *d) {
    return gokv_cgo_result_of(gokv_pool_gather_rows(pool, d));
}
static inline gokv_cgo_result gokv_cgo_pool_set_page_bytes(gokv_pool *pool, int32_t page, const void *b, uint64_t n,
                                                           int32_t n_tokens) {
    return gokv_cgo_result_of(gokv_pool_set_page_bytes(pool, page, b, n, n_tokens));
}
static inline gokv_cgo_result gokv_cgo_pool_set_slot_bytes(gokv_pool *pool, int32_t slot, const void *b, uint64_t n) {
    return gokv_cgo_result_of(gokv_pool_set_slot_bytes(pool, slot, b, n));
}
static inline gokv_cgo_result gokv_cgo_attend(gokv_device *dev, const gokv_attend_desc *d) {
    return gokv_cgo_result_of(gokv_attend(dev, d));
}
static inline gokv_cgo_result gokv_cgo_append_attend(gokv_device *dev, const gokv_write_desc *w,
                                                     const gokv_attend_desc *a) {
    return gokv_cgo_result_of(gokv_append_attend(dev, w, a));
}

static inline gokv_cgo_result gokv_cgo_layout_sizes(const gokv_pool_desc *d, gokv_layout_sizes *out) {
    return gokv_cgo_result_of(gokv_layout_sizes_get(d, out));
}
static inline gokv_cgo_result gokv_cgo_pool_page_bytes(gokv_pool *pool, int32_t page, void *out, uint64_t n) {
    return gokv_cgo_result_of(gokv_pool_page_bytes(pool, page, out, n));
}
static inline gokv_cgo_result gokv_cgo_pool_slot_bytes(gokv_pool *pool, int32_t slot, void *out, uint64_t n) {
    return gokv_cgo_result_of(gokv_pool_slot_bytes(pool, slot, out, n));
}
static inline gokv_cgo_result gokv_cgo_device_measure(gokv_device *dev, uint64_t bytes, gokv_device_ceilings *out) {
    return gokv_cgo_result_of(gokv_device_measure(dev, bytes, out));
}
static inline gokv_cgo_result gokv_cgo_inject_fault(const char *backend, int32_t site, int32_t code) {
    return gokv_cgo_result_of(gokv_inject_fault(backend, site, code));
}

/* The log callback: C hands it const strings; the exported Go function (log_export.go) takes char *. */
extern void gokvGoLog(void *user, int32_t level, char *backend, char *op, char *msg);
static inline void gokv_cgo_log_trampoline(void *user, int32_t level, const char *backend, const char *op,
                                           const char *msg) {
    gokvGoLog(user, level, (char *)backend, (char *)op, (char *)msg);
}
static inline gokv_cgo_result gokv_cgo_set_log(int enable, int32_t min_level) {
    return gokv_cgo_result_of(gokv_set_log_callback(enable ? gokv_cgo_log_trampoline : NULL, NULL, min_level));
}

#endif
