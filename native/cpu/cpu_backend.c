/*
 * cpu_backend.c: the CPU module's backend table: devices (a thread pool), pools (page and ring storage in
 * host memory), the SIMD level chosen at run time from the CPU's features, and the test hooks of gokv_cpu.h.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "cpu_internal.h"
#include "gokv_core.h"

/* ---- SIMD level ---- */

static int32_t detect_simd(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return GOKV_CPU_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return GOKV_CPU_AVX2;
    return GOKV_CPU_SCALAR;
#elif defined(__aarch64__)
    return GOKV_CPU_NEON;
#else
    return GOKV_CPU_SCALAR;
#endif
}

static _Atomic int32_t g_simd_detected = -1;
static _Atomic int32_t g_simd_limit = -1; /* -1: not read from the environment yet */

/* GOKV_CPU_SIMD=scalar|avx2|avx512 caps the level as gokv_cpu_set_simd_limit does (the figures of a
 * narrower machine's path on this one); unset or anything else: no cap. */
static int32_t simd_limit(void) {
    int32_t lim = atomic_load(&g_simd_limit);
    if (lim < 0) {
        const char *e = getenv("GOKV_CPU_SIMD");
        lim = 1 << 20;
        if (e && !strcmp(e, "scalar")) lim = GOKV_CPU_SCALAR;
        else if (e && !strcmp(e, "avx2")) lim = GOKV_CPU_AVX2;
        else if (e && !strcmp(e, "avx512")) lim = GOKV_CPU_AVX512;
        int32_t unread = -1;
        if (!atomic_compare_exchange_strong(&g_simd_limit, &unread, lim)) lim = unread; /* set meanwhile */
    }
    return lim;
}

int32_t gokv_cpu_simd_level(void) {
    int32_t v = atomic_load(&g_simd_detected);
    if (v < 0) {
        v = detect_simd();
        atomic_store(&g_simd_detected, v);
    }
    return v;
}

/* NEON is not above AVX levels: the limit only moves between scalar and the detected level. */
static int32_t level_in_force(void) {
    const int32_t hw = gokv_cpu_simd_level(), lim = simd_limit();
    if (hw == GOKV_CPU_NEON) return lim >= GOKV_CPU_NEON ? GOKV_CPU_NEON : GOKV_CPU_SCALAR;
    return hw < lim ? hw : lim;
}

int32_t gokv_cpu_set_simd_limit(int32_t level) {
    atomic_store(&g_simd_limit, level < 0 ? 0 : level);
    return level_in_force();
}

const char *gokv_cpu_simd_name(int32_t level) {
    switch (level) {
    case GOKV_CPU_SCALAR: return "scalar";
    case GOKV_CPU_AVX2: return "avx2";
    case GOKV_CPU_AVX512: return "avx512";
    case GOKV_CPU_NEON: return "neon";
    default: return "unknown";
    }
}

/* One table per level, built once: scalar entries, overridden by the level's own. */
static cpu_kernels g_tables[4];
static pthread_once_t g_table_once[4] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};
static void fill_scalar(void) { cpu_kernels_fill_scalar(&g_tables[GOKV_CPU_SCALAR]); }
#if defined(__x86_64__)
static void fill_avx2(void) {
    cpu_kernels_fill_scalar(&g_tables[GOKV_CPU_AVX2]);
    cpu_kernels_fill_avx2(&g_tables[GOKV_CPU_AVX2]);
}
static void fill_avx512(void) {
    cpu_kernels_fill_scalar(&g_tables[GOKV_CPU_AVX512]);
    cpu_kernels_fill_avx2(&g_tables[GOKV_CPU_AVX512]);
    cpu_kernels_fill_avx512(&g_tables[GOKV_CPU_AVX512]);
}
#endif
#if defined(__aarch64__)
static void fill_neon(void) {
    cpu_kernels_fill_scalar(&g_tables[GOKV_CPU_NEON]);
    cpu_kernels_fill_neon(&g_tables[GOKV_CPU_NEON]);
}
#endif

const cpu_kernels *cpu_kernels_get(int32_t level) {
    switch (level) {
#if defined(__x86_64__)
    case GOKV_CPU_AVX2: pthread_once(&g_table_once[level], fill_avx2); break;
    case GOKV_CPU_AVX512: pthread_once(&g_table_once[level], fill_avx512); break;
#endif
#if defined(__aarch64__)
    case GOKV_CPU_NEON: pthread_once(&g_table_once[level], fill_neon); break;
#endif
    default: level = GOKV_CPU_SCALAR; pthread_once(&g_table_once[level], fill_scalar); break;
    }
    return &g_tables[level];
}

const cpu_kernels *cpu_kernels_for_call(uint32_t flags) {
    const int32_t level = flags & GOKV_ATTEND_FORCE_SCALAR ? GOKV_CPU_SCALAR : level_in_force();
    const cpu_kernels *k = cpu_kernels_get(level);
    return level == GOKV_CPU_AVX512 ? cpu_kernels_dispatch(k) : k; /* dispatch.c */
}

/* ---- devices ---- */

static int32_t online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int32_t)n : 1;
}

static void cpu_model_name(char *out, size_t cap);

static gokv_status cpu_device_open(const gokv_device_desc *desc, void **impl) {
    if (desc->device_index > 0)
        return gokv_set_error(GOKV_ENODEV, "gokv_device_open: cpu has one device (index 0), asked for %d", desc->device_index);
    if (desc->device_name && desc->device_name[0]) { /* as Vulkan: a substring of the device's name */
        char model[256];
        cpu_model_name(model, sizeof model);
        if (!strstr(model, desc->device_name) && strcmp(desc->device_name, "cpu") != 0)
            return gokv_set_error(GOKV_ENODEV, "gokv_device_open: cpu: no device named like \"%s\" (the one device: %s)",
                                  desc->device_name, model);
    }
    cpu_device *dev = calloc(1, sizeof *dev);
    if (!dev) return gokv_set_error(GOKV_ENOMEM, "gokv_device_open: cannot allocate the cpu device");
    (void)cpu_kernels_for_call(0); /* the kernels measured now (dispatch.c), not during the first call */
    dev->n_threads = desc->n_threads > 0 ? desc->n_threads : online_cpus();
    dev->tp = cpu_threadpool_create(dev->n_threads);
    if (!dev->tp) {
        free(dev);
        return gokv_set_error(GOKV_ENOMEM, "gokv_device_open: cannot start %d cpu worker threads", desc->n_threads);
    }
    pthread_mutex_init(&dev->mu, NULL);
    pthread_mutex_init(&dev->base_mu, NULL);
    *impl = dev;
    return GOKV_OK;
}

static void cpu_device_close(void *impl) {
    cpu_device *dev = impl;
    cpu_threadpool_destroy(dev->tp);
    pthread_mutex_destroy(&dev->mu);
    pthread_mutex_destroy(&dev->base_mu);
    free(dev->ws);
    free(dev->base_pages);
    free(dev->quest_ws);
    free(dev);
}

static void cpu_model_name(char *out, size_t cap) {
    snprintf(out, cap, "cpu");
#if defined(__linux__)
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *v = strchr(line, ':');
        if (!v) break;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        snprintf(out, cap, "%s", v);
        out[strcspn(out, "\n")] = '\0';
        break;
    }
    fclose(f);
#endif
}

static gokv_status cpu_device_info(void *impl, gokv_device_info *out) {
    const cpu_device *dev = impl;
    const int32_t level = level_in_force();
    cpu_model_name(out->name, sizeof out->name);
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    out->memory_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    out->n_threads = dev->n_threads;
    out->subgroup_size = level == GOKV_CPU_AVX512 ? 16 : level == GOKV_CPU_AVX2 ? 8 : level == GOKV_CPU_NEON ? 4 : 1;
    out->caps = GOKV_CAP_DECODE | GOKV_CAP_PREFILL | GOKV_CAP_LEARNED_SINKS | GOKV_CAP_WINDOW | GOKV_CAP_MLA |
                GOKV_CAP_HOLES | GOKV_CAP_BASELINE | GOKV_CAP_MASS | GOKV_CAP_KV_HEAD_MASKS | GOKV_CAP_QUEST;
    out->formats = (1u << GOKV_FORMAT_COUNT_) - 1u;
    const char *extra = "";
#if defined(__x86_64__)
    const int vnni = cpu_kernels_get(level)->query_prep[CPU_ENC_Q4] != NULL; /* q4 scores through (AVX-512 or AVX-)VNNI */
    if (level == GOKV_CPU_AVX512) extra = vnni ? " vnni fma f16c avx2" : " fma f16c avx2";
    if (level == GOKV_CPU_AVX2) extra = vnni ? " avx-vnni fma f16c" : " fma f16c";
#endif
    snprintf(out->features, sizeof out->features, "%s%s (detected %s%s%s)", gokv_cpu_simd_name(level), extra,
             gokv_cpu_simd_name(gokv_cpu_simd_level()), level == GOKV_CPU_AVX512 ? "; measured: " : "",
             level == GOKV_CPU_AVX512 ? gokv_cpu_dispatch_note() : "");
    return GOKV_OK;
}

/* ---- pools ---- */

/* Pool memory: zeroed and 64-byte aligned. Pools of 2 MiB or more come from an anonymous mapping aligned to
 * 2 MiB and marked MADV_HUGEPAGE: a long context is a walk over thousands of pages scattered through the
 * pool, and with 4 KiB pages every 4 KiB of them can cost a TLB miss and a page walk (the kernel may decline
 * the advice; the memory is then simply 4 KiB pages). A 128K-token walk on the test machine was no faster
 * with it (TLB misses were not its bottleneck); larger pools and smaller TLBs may gain.
 * Smaller pools, and systems without mmap, use calloc. */
enum { POOL_HUGE = 2u << 20 };

static void *pool_alloc(size_t bytes, pool_mem *m) {
    memset(m, 0, sizeof *m);
#if defined(__linux__)
    if (bytes >= POOL_HUGE) {
        const size_t len = bytes + POOL_HUGE;
        void *raw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw != MAP_FAILED) {
            m->raw = raw;
            m->mapped = len;
            void *p = (void *)(((uintptr_t)raw + POOL_HUGE - 1u) & ~(uintptr_t)(POOL_HUGE - 1u));
#if defined(MADV_HUGEPAGE)
            (void)madvise(p, (bytes + POOL_HUGE - 1u) & ~(size_t)(POOL_HUGE - 1u), MADV_HUGEPAGE);
#endif
            return p;
        }
    }
#endif
    m->raw = calloc(1, bytes + 64);
    if (!m->raw) return NULL;
    return (void *)(((uintptr_t)m->raw + 63u) & ~(uintptr_t)63u);
}

static void pool_free(pool_mem *m) {
#if defined(__linux__)
    if (m->mapped)
        munmap(m->raw, m->mapped);
    else
#endif
        free(m->raw);
    memset(m, 0, sizeof *m);
}

static gokv_status cpu_pool_create(void *dev, const gokv_pool_desc *desc, const gokv_layout *L, void **impl) {
    (void)dev;
    cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return gokv_set_error(GOKV_ENOMEM, "gokv_pool_create: cannot allocate the pool");
    p->n_pages = desc->n_pages;
    p->n_slots = desc->n_residual_slots;
    const size_t page_total = (size_t)L->page_bytes * (size_t)desc->n_pages;
    p->pages = pool_alloc(page_total, &p->pages_mem);
    if (p->pages && p->n_slots > 0) p->rings = pool_alloc((size_t)L->ring_bytes * (size_t)p->n_slots, &p->rings_mem);
    if (p->pages && L->key_bounds) {
        p->bounds = pool_alloc((size_t)L->bounds_bytes * (size_t)p->n_pages, &p->bounds_mem);
        for (int32_t i = 0; p->bounds && i < p->n_pages; i++) cpu_bounds_reset(L, cpu_bounds(p, L, i));
    }
    if (!p->pages || (p->n_slots > 0 && !p->rings) || (L->key_bounds && !p->bounds)) {
        pool_free(&p->pages_mem);
        pool_free(&p->rings_mem);
        pool_free(&p->bounds_mem);
        free(p);
        return gokv_set_error(GOKV_ENOMEM, "gokv_pool_create: cannot allocate %d pages of %llu bytes (%zu MiB)",
                              desc->n_pages, (unsigned long long)L->page_bytes, page_total >> 20);
    }
    *impl = p;
    return GOKV_OK;
}

static void cpu_pool_destroy(void *dev, void *impl) {
    (void)dev;
    cpu_pool *p = impl;
    pool_free(&p->pages_mem);
    pool_free(&p->rings_mem);
    pool_free(&p->bounds_mem);
    free(p);
}

static gokv_status cpu_page_bytes(void *dev, void *impl, const gokv_layout *L, int32_t page, void *out) {
    (void)dev;
    memcpy(out, cpu_page(impl, L, page), L->page_bytes);
    return GOKV_OK;
}

static gokv_status cpu_slot_bytes(void *dev, void *impl, const gokv_layout *L, int32_t slot, void *out) {
    (void)dev;
    memcpy(out, cpu_ring(impl, L, slot), L->ring_bytes);
    return GOKV_OK;
}

/* Pages and rings written as stored (store.c). Declared here rather than in cpu_internal.h beside the other
 * ops because only this table uses them. */
gokv_status cpu_pool_set_page_bytes(void *dev, void *pool, const gokv_layout *L, int32_t page, const void *bytes,
                                    int32_t n_tokens);
gokv_status cpu_pool_set_slot_bytes(void *dev, void *pool, const gokv_layout *L, int32_t slot, const void *bytes);

/* The ceilings of docs/architecture.md §9 with the device's threads (roofline.c). */
static gokv_status cpu_measure(void *impl, uint64_t bytes, gokv_device_ceilings *out) {
    const cpu_device *dev = impl;
    out->read_gbps = gokv_cpu_measure_read_gbps(dev->n_threads, bytes);
    out->peak_gflops = gokv_cpu_measure_peak_gflops(dev->n_threads);
    if (out->read_gbps <= 0 || out->peak_gflops <= 0)
        return gokv_set_error(GOKV_ENOMEM, "gokv_device_measure: cpu: cannot allocate the buffer or start %d threads",
                              dev->n_threads);
    snprintf(out->method, sizeof out->method, "streaming read and fp32 FMA peak, %d threads, %s", dev->n_threads,
             gokv_cpu_simd_name(level_in_force()));
    return GOKV_OK;
}

static const gokv_backend g_cpu_backend = {
    .name = "cpu",
    .device_open = cpu_device_open,
    .device_close = cpu_device_close,
    .device_info = cpu_device_info,
    .pool_create = cpu_pool_create,
    .pool_destroy = cpu_pool_destroy,
    .pool_write = cpu_pool_write,
    .pool_read = cpu_pool_read,
    .pool_copy = cpu_pool_copy,
    .attend = cpu_attend,
    .page_bytes = cpu_page_bytes,
    .slot_bytes = cpu_slot_bytes,
    .set_page_bytes = cpu_pool_set_page_bytes,
    .set_slot_bytes = cpu_pool_set_slot_bytes,
    .measure = cpu_measure,
};

const gokv_backend *gokv_cpu_backend(void) { return &g_cpu_backend; }
