/*
 * gokv_core.c: the C core behind gokv.h. Status names, the thread-local last error, the log callback,
 * the backend registry, and the handles. Argument validation lives in gokv_validate.c; this file only
 * dispatches what validated to the backend table (docs/architecture.md §3). Pages and rings written as
 * stored, and rows gathered between pages, are in gokv_pages.c.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gokv_backend.h"
#include "gokv_core.h"

/* ---- status names and messages ---- */

#define GOKV_STATUS_NAME_(name, value, msg) case value: return #name;
#define GOKV_STATUS_MSG_(name, value, msg) case value: return msg;
const char *gokv_status_name(gokv_status s) {
    switch (s) { GOKV_STATUS_LIST(GOKV_STATUS_NAME_) default: return "GOKV_UNKNOWN"; }
}
const char *gokv_status_message(gokv_status s) {
    switch (s) { GOKV_STATUS_LIST(GOKV_STATUS_MSG_) default: return "unknown status"; }
}
#undef GOKV_STATUS_NAME_
#undef GOKV_STATUS_MSG_

uint32_t gokv_abi_version(void) { return GOKV_ABI_VERSION; }

const char *gokv_format_name(int32_t format) {
    static const char *const names[GOKV_FORMAT_COUNT_] = {"f32", "f16", "q8", "q4", "kivi2", "kivi4"};
    return format >= 0 && format < GOKV_FORMAT_COUNT_ ? names[format] : NULL;
}

int32_t gokv_kivi_quantized_len(int32_t n, int32_t group_size, int32_t residual) {
    if (n < 0 || group_size <= 0 || residual < 0) {
        gokv_set_error(GOKV_EINVAL, "gokv_kivi_quantized_len: n %d, group_size %d, residual %d: want n >= 0, "
                       "group_size > 0, residual >= 0", n, group_size, residual);
        return -1;
    }
    if (n <= residual) return 0;
    return (n - residual) / group_size * group_size; /* n > residual >= 0: no overflow */
}

/* ---- last error (thread-local) ---- */

static _Thread_local char g_last_error[1024];

gokv_status gokv_set_error(gokv_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    return status;
}

const char *gokv_last_error(void) { return g_last_error; }

size_t gokv_last_error_copy(char *buf, size_t cap) {
    size_t n = strlen(g_last_error);
    if (buf && cap > 0) {
        size_t c = n < cap - 1 ? n : cap - 1;
        memcpy(buf, g_last_error, c);
        buf[c] = '\0';
    }
    return n;
}

static gokv_status ok(void) {
    g_last_error[0] = '\0';
    return GOKV_OK;
}

/* ---- logging ---- */

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static gokv_log_fn g_log_fn;
static void *g_log_user;
static int32_t g_log_min = GOKV_LOG_INFO;

gokv_status gokv_set_log_callback(gokv_log_fn fn, void *user, int32_t min_level) {
    if (min_level < GOKV_LOG_DEBUG || min_level > GOKV_LOG_ERROR)
        return gokv_set_error(GOKV_EINVAL, "gokv_set_log_callback: min_level %d is not a GOKV_LOG_* level", min_level);
    pthread_mutex_lock(&g_log_mu);
    g_log_fn = fn;
    g_log_user = user;
    g_log_min = min_level;
    pthread_mutex_unlock(&g_log_mu);
    return ok();
}

void gokv_log(int32_t level, const char *backend, const char *op, const char *fmt, ...) {
    pthread_mutex_lock(&g_log_mu);
    gokv_log_fn fn = g_log_fn;
    void *user = g_log_user;
    int32_t min = g_log_min;
    pthread_mutex_unlock(&g_log_mu);
    if (!fn || level < min) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fn(user, level, backend ? backend : "", op ? op : "", msg);
}

/* ---- backend registry ---- */

enum { GOKV_MAX_BACKENDS = 8 };
static pthread_mutex_t g_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static const gokv_backend *g_backends[GOKV_MAX_BACKENDS];
static int32_t g_n_backends;
static pthread_once_t g_reg_once = PTHREAD_ONCE_INIT;

static void register_cpu(void) {
    g_backends[0] = gokv_cpu_backend();
    g_n_backends = 1;
}

gokv_status gokv_register_backend(const gokv_backend *b) {
    pthread_once(&g_reg_once, register_cpu);
    if (!b || !b->name) return gokv_set_error(GOKV_EINVAL, "gokv_register_backend: table or its name is NULL");
    const struct {
        const char *slot;
        int present;
    } required[] = {{"device_open", !!b->device_open}, {"device_close", !!b->device_close},
                    {"device_info", !!b->device_info}, {"pool_create", !!b->pool_create},
                    {"pool_destroy", !!b->pool_destroy}, {"pool_write", !!b->pool_write},
                    {"pool_read", !!b->pool_read},     {"pool_copy", !!b->pool_copy},
                    {"attend", !!b->attend}};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!required[i].present)
            return gokv_set_error(GOKV_EINVAL, "gokv_register_backend: backend \"%s\" lacks the required slot %s",
                                  b->name, required[i].slot);
    gokv_status st = GOKV_OK;
    pthread_mutex_lock(&g_reg_mu);
    int found = 0;
    for (int32_t i = 0; i < g_n_backends; i++)
        if (g_backends[i] == b || strcmp(g_backends[i]->name, b->name) == 0) found = 1;
    if (!found) {
        if (g_n_backends == GOKV_MAX_BACKENDS)
            st = gokv_set_error(GOKV_ENOMEM, "gokv_register_backend: registry full (%d backends)", GOKV_MAX_BACKENDS);
        else
            g_backends[g_n_backends++] = b;
    }
    pthread_mutex_unlock(&g_reg_mu);
    return st == GOKV_OK ? ok() : st;
}

int32_t gokv_backend_count(void) {
    pthread_once(&g_reg_once, register_cpu);
    pthread_mutex_lock(&g_reg_mu);
    int32_t n = g_n_backends;
    pthread_mutex_unlock(&g_reg_mu);
    return n;
}

const char *gokv_backend_name(int32_t index) {
    pthread_once(&g_reg_once, register_cpu);
    pthread_mutex_lock(&g_reg_mu);
    const char *name = index >= 0 && index < g_n_backends ? g_backends[index]->name : NULL;
    pthread_mutex_unlock(&g_reg_mu);
    return name;
}

static const gokv_backend *find_backend(const char *name) {
    pthread_once(&g_reg_once, register_cpu);
    const gokv_backend *b = NULL;
    pthread_mutex_lock(&g_reg_mu);
    if (strcmp(name, "auto") == 0) {
        /* The first vendor module registered, unless it only emulates its hardware; else the CPU. */
        b = g_backends[0];
        for (int32_t i = 1; i < g_n_backends; i++)
            if (!g_backends[i]->emulated) {
                b = g_backends[i];
                break;
            }
    } else {
        for (int32_t i = 0; i < g_n_backends; i++)
            if (strcmp(g_backends[i]->name, name) == 0) b = g_backends[i];
    }
    pthread_mutex_unlock(&g_reg_mu);
    return b;
}

/* ---- devices ---- */

gokv_status gokv_device_open(const gokv_device_desc *desc, gokv_device **out) {
    static const char *const op = "gokv_device_open";
    if (!out) return gokv_set_error(GOKV_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    gokv_device_desc d;
    gokv_status st = gokv_take_desc(op, "desc", &d, sizeof d, desc, desc ? desc->struct_size : 0);
    if (st) return st;
    if (!d.backend) d.backend = "auto";
    if (d.n_threads < 0 || d.n_threads > 1024)
        return gokv_set_error(GOKV_EINVAL, "%s: n_threads %d is outside [0, 1024]", op, d.n_threads);
    if (d.device_index < -1)
        return gokv_set_error(GOKV_EINVAL, "%s: device_index %d is below -1", op, d.device_index);
    const gokv_backend *be = find_backend(d.backend);
    if (!be) return gokv_set_error(GOKV_ENODEV, "%s: backend \"%s\" is not compiled into this build", op, d.backend);
    gokv_device *dev = calloc(1, sizeof *dev);
    if (!dev) return gokv_set_error(GOKV_ENOMEM, "%s: cannot allocate the device handle", op);
    dev->be = be;
    st = be->device_open(&d, &dev->impl);
    if (st) {
        free(dev);
        return st;
    }
    gokv_log(GOKV_LOG_DEBUG, be->name, op, "opened device (index %d, %d threads requested)", d.device_index, d.n_threads);
    *out = dev;
    return ok();
}

gokv_status gokv_device_info_get(gokv_device *dev, gokv_device_info *out) {
    static const char *const op = "gokv_device_info_get";
    if (!dev) return gokv_set_error(GOKV_EINVAL, "%s: dev is NULL", op);
    if (!out) return gokv_set_error(GOKV_EINVAL, "%s: out is NULL", op);
    if (out->struct_size < sizeof *out)
        return gokv_set_error(GOKV_EVERSION, "%s: out->struct_size %u is smaller than %zu", op, out->struct_size, sizeof *out);
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    snprintf(out->backend, sizeof out->backend, "%s", dev->be->name);
    gokv_status st = dev->be->device_info(dev->impl, out);
    return st ? st : ok();
}

void gokv_device_close(gokv_device *dev) {
    if (!dev) return;
    dev->be->device_close(dev->impl);
    free(dev);
}

/* ---- pools ---- */

gokv_status gokv_pool_create(gokv_device *dev, const gokv_pool_desc *desc, gokv_pool **out) {
    static const char *const op = "gokv_pool_create";
    if (!out) return gokv_set_error(GOKV_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    if (!dev) return gokv_set_error(GOKV_EINVAL, "%s: dev is NULL", op);
    gokv_pool_desc d;
    gokv_status st = gokv_take_desc(op, "desc", &d, sizeof d, desc, desc ? desc->struct_size : 0);
    if (st) return st;
    if ((st = gokv_validate_pool_desc(&d))) return st;
    if (d.key_bounds) { /* the one pool feature a backend may lack: ask its capabilities */
        gokv_device_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        if ((st = dev->be->device_info(dev->impl, &info))) return st;
        if (!(info.caps & GOKV_CAP_QUEST))
            return gokv_set_error(GOKV_ENOTSUP, "%s: backend \"%s\" keeps no key bounds (Quest)", op, dev->be->name);
    }
    gokv_pool *p = calloc(1, sizeof *p);
    if (!p) return gokv_set_error(GOKV_ENOMEM, "%s: cannot allocate the pool handle", op);
    p->dev = dev;
    p->desc = d;
    gokv_layout_init(&p->layout, &d);
    st = dev->be->pool_create(dev->impl, &d, &p->layout, &p->impl);
    if (st) {
        free(p);
        return st;
    }
    *out = p;
    return ok();
}

void gokv_pool_destroy(gokv_pool *pool) {
    if (!pool) return;
    pool->dev->be->pool_destroy(pool->dev->impl, pool->impl);
    free(pool);
}

gokv_status gokv_pool_sizes(const gokv_pool *pool, uint64_t *page_bytes, uint64_t *residual_slot_bytes) {
    if (!pool) return gokv_set_error(GOKV_EINVAL, "gokv_pool_sizes: pool is NULL");
    if (page_bytes) *page_bytes = pool->layout.page_bytes;
    if (residual_slot_bytes) *residual_slot_bytes = pool->layout.ring_bytes;
    return ok();
}

const gokv_layout *gokv_pool_layout(const gokv_pool *pool) { return pool ? &pool->layout : NULL; }

gokv_status gokv_layout_sizes_get(const gokv_pool_desc *desc, gokv_layout_sizes *out) {
    static const char *const op = "gokv_layout_sizes_get";
    if (!out) return gokv_set_error(GOKV_EINVAL, "%s: out is NULL", op);
    if (out->struct_size < sizeof *out)
        return gokv_set_error(GOKV_EVERSION, "%s: out->struct_size %u is smaller than %zu", op, out->struct_size, sizeof *out);
    gokv_pool_desc d;
    gokv_status st = gokv_take_desc(op, "desc", &d, sizeof d, desc, desc ? desc->struct_size : 0);
    if (st) return st;
    if ((st = gokv_validate_pool_desc(&d))) return st;
    gokv_layout L;
    gokv_layout_init(&L, &d);
    const uint64_t H = (uint64_t)L.n_kv_heads, P = (uint64_t)L.page_size;
    /* KIVI keys: k_row_bytes covers one group of g tokens; per-token formats: one token. */
    const uint64_t k_rows = L.kivi ? P / (uint64_t)L.group : P;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->page_bytes = L.page_bytes;
    out->page_code_bytes = H * (k_rows * L.k_row_bytes + P * L.v_row_bytes);
    out->page_meta_bytes = H * 2u * 2u * (k_rows * (uint64_t)L.k_groups + P * (uint64_t)L.v_groups);
    out->residual_slot_bytes = L.ring_bytes;
    out->page_bounds_bytes = L.bounds_bytes;
    return ok();
}

/* ---- inspection, measurement and fault injection (optional slots) ---- */

static gokv_status not_supported(const char *op, const gokv_backend *be, const char *slot) {
    return gokv_set_error(GOKV_ENOTSUP, "%s: backend \"%s\" does not implement %s", op, be->name, slot);
}

/* Shared by gokv_pool_page_bytes and gokv_pool_slot_bytes: checks the index and the buffer, then copies. */
static gokv_status pool_raw_bytes(const char *op, gokv_pool *pool, int32_t index, void *out, uint64_t out_bytes,
                                  int slot) {
    if (!pool) return gokv_set_error(GOKV_EINVAL, "%s: pool is NULL", op);
    if (!out) return gokv_set_error(GOKV_EINVAL, "%s: out is NULL", op);
    const char *what = slot ? "residual slot" : "page";
    const int32_t n = slot ? pool->desc.n_residual_slots : pool->desc.n_pages;
    if (index < 0 || index >= n)
        return gokv_set_error(GOKV_ERANGE, "%s: %s %d is not in [0, %d)", op, what, index, n);
    const uint64_t need = slot ? pool->layout.ring_bytes : pool->layout.page_bytes;
    if (out_bytes < need)
        return gokv_set_error(GOKV_EINVAL, "%s: out holds %llu bytes, a %s needs %llu", op,
                              (unsigned long long)out_bytes, what, (unsigned long long)need);
    const gokv_backend *be = pool->dev->be;
    gokv_status (*fn)(void *, void *, const gokv_layout *, int32_t, void *) = slot ? be->slot_bytes : be->page_bytes;
    if (!fn) return not_supported(op, be, slot ? "slot_bytes" : "page_bytes");
    gokv_status st = fn(pool->dev->impl, pool->impl, &pool->layout, index, out);
    return st ? st : ok();
}

gokv_status gokv_pool_page_bytes(gokv_pool *pool, int32_t page, void *out, uint64_t out_bytes) {
    return pool_raw_bytes("gokv_pool_page_bytes", pool, page, out, out_bytes, 0);
}

gokv_status gokv_pool_slot_bytes(gokv_pool *pool, int32_t slot, void *out, uint64_t out_bytes) {
    return pool_raw_bytes("gokv_pool_slot_bytes", pool, slot, out, out_bytes, 1);
}

gokv_status gokv_device_measure(gokv_device *dev, uint64_t bytes, gokv_device_ceilings *out) {
    static const char *const op = "gokv_device_measure";
    if (!dev) return gokv_set_error(GOKV_EINVAL, "%s: dev is NULL", op);
    if (!out) return gokv_set_error(GOKV_EINVAL, "%s: out is NULL", op);
    if (out->struct_size < sizeof *out)
        return gokv_set_error(GOKV_EVERSION, "%s: out->struct_size %u is smaller than %zu", op, out->struct_size, sizeof *out);
    if (bytes != 0 && bytes < (1u << 20))
        return gokv_set_error(GOKV_EINVAL, "%s: bytes %llu is below 1 MiB (0 picks the backend's default)", op,
                              (unsigned long long)bytes);
    if (!dev->be->measure) return not_supported(op, dev->be, "measure");
    gokv_device_ceilings c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    gokv_status st = dev->be->measure(dev->impl, bytes, &c);
    if (st) return st;
    c.method[sizeof c.method - 1] = '\0';
    *out = c;
    return ok();
}

gokv_status gokv_inject_fault(const char *backend, int32_t site, int32_t code) {
    static const char *const op = "gokv_inject_fault";
    if (!backend) return gokv_set_error(GOKV_EINVAL, "%s: backend is NULL", op);
    if (site != GOKV_FAULT_SUBMIT && site != GOKV_FAULT_ALLOC)
        return gokv_set_error(GOKV_EINVAL, "%s: site %d is not a GOKV_FAULT_* site", op, site);
    const gokv_backend *be = find_backend(backend);
    if (!be || strcmp(backend, "auto") == 0)
        return gokv_set_error(GOKV_ENODEV, "%s: backend \"%s\" is not compiled into this build", op, backend);
    if (!be->inject_fault) return not_supported(op, be, "inject_fault");
    gokv_status st = be->inject_fault(site, code);
    return st ? st : ok();
}

/* Dispatches a validated call on a pool to an optional backend slot. */
#define GOKV_POOL_CALL(op, pool, slot, desc_ptr)                                                              \
    do {                                                                                                      \
        if (!(pool)->dev->be->slot)                                                                           \
            return gokv_set_error(GOKV_ENOTSUP, "%s: backend \"%s\" does not implement %s", op,                \
                                  (pool)->dev->be->name, #slot);                                              \
        gokv_status st_ = (pool)->dev->be->slot((pool)->dev->impl, (pool)->impl, &(pool)->layout, desc_ptr); \
        return st_ ? st_ : ok();                                                                              \
    } while (0)

gokv_status gokv_pool_write(gokv_pool *pool, const gokv_write_desc *desc) {
    static const char *const op = "gokv_pool_write";
    gokv_write_desc d;
    gokv_value_range k_range, v_range;
    gokv_status st = gokv_validate_write(op, pool, desc, &d, &k_range, &v_range);
    if (st) return st;
    if (d.n_seqs == 0) return ok();
    gokv_pool_note_range(pool, &k_range, &v_range);
    GOKV_POOL_CALL(op, pool, pool_write, &d);
}

gokv_status gokv_pool_read(gokv_pool *pool, const gokv_read_desc *desc) {
    static const char *const op = "gokv_pool_read";
    gokv_read_desc d;
    gokv_status st = gokv_validate_read(op, pool, desc, &d);
    if (st) return st;
    if (d.n_seqs == 0) return ok();
    GOKV_POOL_CALL(op, pool, pool_read, &d);
}

gokv_status gokv_pool_copy(gokv_pool *pool, const gokv_copy_desc *desc) {
    static const char *const op = "gokv_pool_copy";
    gokv_copy_desc d;
    gokv_status st = gokv_validate_copy(op, pool, desc, &d);
    if (st) return st;
    if (d.n_pages == 0 && d.n_slots == 0) return ok();
    GOKV_POOL_CALL(op, pool, pool_copy, &d);
}

gokv_status gokv_attend(gokv_device *dev, const gokv_attend_desc *desc) {
    static const char *const op = "gokv_attend";
    gokv_attend_desc d;
    gokv_value_range q_range;
    gokv_status st = gokv_validate_attend(op, dev, desc, &d, &q_range);
    if (st) return st;
    if (d.n_seqs == 0) return ok();
    gokv_pool *pool = d.pool;
    if ((st = gokv_check_score_range(op, pool, &d, &q_range, 0.0f, 0.0f))) return st;
    GOKV_POOL_CALL(op, pool, attend, &d);
}

gokv_status gokv_append_attend(gokv_device *dev, const gokv_write_desc *write, const gokv_attend_desc *attend) {
    static const char *const op = "gokv_append_attend";
    gokv_attend_desc a;
    gokv_value_range q_range, k_range = {0}, v_range = {0};
    gokv_status st = gokv_validate_attend(op, dev, attend, &a, &q_range);
    if (st) return st;
    gokv_pool *pool = a.pool;
    gokv_write_desc w = {0};
    if (write && (st = gokv_validate_write(op, pool, write, &w, &k_range, &v_range))) return st;
    if ((st = gokv_check_score_range(op, pool, &a, &q_range, k_range.max_abs, v_range.max_abs))) return st;
    if (write) {
        if (w.n_seqs > 0) {
            gokv_pool_note_range(pool, &k_range, &v_range);
            if (!pool->dev->be->pool_write)
                return gokv_set_error(GOKV_ENOTSUP, "%s: backend \"%s\" does not implement pool_write", op, pool->dev->be->name);
            if ((st = pool->dev->be->pool_write(pool->dev->impl, pool->impl, &pool->layout, &w))) return st;
        }
    }
    if (a.n_seqs == 0) return ok();
    GOKV_POOL_CALL(op, pool, attend, &a);
}
