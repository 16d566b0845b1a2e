/*
 * mtl_device.m: the choice of Metal device (index or name into MTLCopyAllDevices, else the system default),
 * what the shared plan learns of it (gpu_caps), the backend slots device_open, device_close and
 * device_info, the mapping of command buffer errors to statuses, and the fault hooks.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtl_internal.h"

/* ---- errors and test hooks ---- */

static atomic_int g_injected[2]; /* per GOKV_FAULT_* site: 0, or the code the next submit / allocation fails with */

gokv_status mtl_inject_fault(int32_t site, int32_t code) {
    atomic_store(&g_injected[site], code);
    return GOKV_OK;
}

int32_t mtl_take_injected(int site) { return atomic_exchange(&g_injected[site], 0); }

const char *mtl_error_text(NSError *e) {
    const char *s = e ? [[e localizedDescription] UTF8String] : NULL;
    return s ? s : "unknown error";
}

static const char *cb_error_name(NSInteger code) {
    switch (code) {
    case MTLCommandBufferErrorInternal: return "MTLCommandBufferErrorInternal";
    case MTLCommandBufferErrorTimeout: return "MTLCommandBufferErrorTimeout";
    case MTLCommandBufferErrorPageFault: return "MTLCommandBufferErrorPageFault";
    case MTLCommandBufferErrorAccessRevoked: return "MTLCommandBufferErrorAccessRevoked";
    case MTLCommandBufferErrorNotPermitted: return "MTLCommandBufferErrorNotPermitted";
    case MTLCommandBufferErrorOutOfMemory: return "MTLCommandBufferErrorOutOfMemory";
    case MTLCommandBufferErrorInvalidResource: return "MTLCommandBufferErrorInvalidResource";
    case MTLCommandBufferErrorDeviceRemoved: return "MTLCommandBufferErrorDeviceRemoved";
    default: return "MTLCommandBufferError";
    }
}

gokv_status mtl_cb_error(mtl_device *d, NSInteger code, const char *text, const char *op) {
    gokv_status st = GOKV_EDEVICE;
    const char *hint = "";
    switch (code) {
    case MTLCommandBufferErrorOutOfMemory: st = GOKV_ENOMEM; break;
    case MTLCommandBufferErrorDeviceRemoved:
    case MTLCommandBufferErrorAccessRevoked:
    case MTLCommandBufferErrorNotPermitted:
        hint = "; the device is lost: close it and open a new one";
        if (d) d->lost = 1;
        break;
    default: break;
    }
    gokv_log(GOKV_LOG_ERROR, MTL_BACKEND, op, "command buffer failed: %s (%ld): %s%s", cb_error_name(code), (long)code,
             text, hint);
    return gokv_set_error(st, "%s: metal: command buffer failed: %s (%ld): %s%s", op, cb_error_name(code), (long)code,
                          text, hint);
}

gokv_status mtl_buffer_new(mtl_device *d, uint64_t size, const char *op, const char *what, id<MTLBuffer> *out) {
    *out = nil;
    if (size < 16) size = 16;
    if (size > d->max_buffer)
        return gokv_set_error(GOKV_ENOMEM,
                              "%s: metal: %s needs %llu bytes, more than this device's largest buffer "
                              "(maxBufferLength %llu bytes)",
                              op, what, (unsigned long long)size, (unsigned long long)d->max_buffer);
    const int32_t injected = mtl_take_injected(GOKV_FAULT_ALLOC);
    id<MTLBuffer> b = injected ? nil : [d->dev newBufferWithLength:(NSUInteger)size options:MTLResourceStorageModeShared];
    if (!b) {
        gokv_log(GOKV_LOG_ERROR, MTL_BACKEND, op, "newBufferWithLength:%llu failed for %s%s", (unsigned long long)size,
                 what, injected ? " (injected)" : "");
        return gokv_set_error(GOKV_ENOMEM, "%s: metal: cannot allocate %llu bytes for %s (newBufferWithLength returned nil%s)",
                              op, (unsigned long long)size, what, injected ? ", injected" : "");
    }
    *out = b;
    return GOKV_OK;
}

/* ---- device choice ---- */

static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v && v[0] && strcmp(v, "0") != 0;
}

/* Fills names with "0: Apple M2, 1: ..." for messages. */
static void list_names(NSArray *all, char *names, size_t cap) {
    names[0] = 0;
    for (NSUInteger i = 0; i < [all count]; i++) {
        id<MTLDevice> dv = [all objectAtIndex:i];
        const char *n = [[dv name] UTF8String];
        const size_t len = strlen(names);
        snprintf(names + len, cap - len, "%s%lu: %s", i ? ", " : "", (unsigned long)i, n ? n : "?");
    }
}

/* The device desc asks for, retained (+1), or nil with the error set. */
static id<MTLDevice> pick_device(const gokv_device_desc *desc, gokv_status *st) {
    const char *op = "gokv_device_open";
    NSArray *all = MTLCopyAllDevices(); /* +1; empty in some headless or virtualized sessions */
    id<MTLDevice> sys = MTLCreateSystemDefaultDevice(); /* +1, may be nil */
    NSArray *list = all;
    if ((!all || [all count] == 0) && sys) list = [NSArray arrayWithObject:sys];
    id<MTLDevice> chosen = nil;
    char names[512];
    list_names(list ? list : [NSArray array], names, sizeof names);
    const NSUInteger n = list ? [list count] : 0;
    *st = GOKV_OK;
    if (n == 0) {
        *st = gokv_set_error(GOKV_ENODEV, "%s: metal: no Metal device found (headless or virtualized session?)", op);
    } else if (desc->device_name && desc->device_name[0]) {
        for (NSUInteger i = 0; i < n && !chosen; i++) {
            id<MTLDevice> dv = [list objectAtIndex:i];
            const char *nm = [[dv name] UTF8String];
            if (nm && strstr(nm, desc->device_name)) chosen = dv;
        }
        if (!chosen)
            *st = gokv_set_error(GOKV_ENODEV, "%s: metal: no device named like \"%s\" (devices: %s)", op,
                                 desc->device_name, names);
    } else if (desc->device_index >= 0) {
        if ((NSUInteger)desc->device_index >= n)
            *st = gokv_set_error(GOKV_ENODEV, "%s: metal: device_index %d out of range: %lu device(s) (%s)", op,
                                 desc->device_index, (unsigned long)n, names);
        else
            chosen = [list objectAtIndex:(NSUInteger)desc->device_index];
    } else { /* the GPU macOS prefers (Apple silicon has one); the first listed where it names none */
        chosen = sys ? sys : [list objectAtIndex:0];
    }
    [chosen retain];
    [sys release];
    [all release];
    return chosen;
}

/* ---- open, close, info ---- */

static void fill_caps(mtl_device *d) {
    gpu_caps *c = &d->base.caps;
    c->wg_size = 128;          /* four simdgroups */
    c->subgroup_size = 32;     /* every Apple GPU; checked per pipeline (threadExecutionWidth) */
    c->subgroup_min = 32;
    c->chunk_size = 512;
    const NSUInteger tg = [d->dev maxThreadgroupMemoryLength];
    c->max_shared_bytes = tg > UINT32_MAX ? UINT32_MAX : (uint32_t)tg;
    c->shared_budget = c->max_shared_bytes / 2 < 16384u ? c->max_shared_bytes / 2 : 16384u;
    /* Metal states no smaller limit on threadgroups per grid dimension; the plan's 2D grids stay within
     * 65535, which every device allows. */
    c->max_groups[0] = c->max_groups[1] = c->max_groups[2] = 65535u;
    /* Kernels address a binding in 32-bit words with 32-bit offsets: at most 4 GiB, as the emulator assumes. */
    c->max_binding_bytes = d->max_buffer < 0xfffffffcull ? d->max_buffer : 0xfffffffcull;
    c->memory_bytes = d->working_set;
    c->stage_inputs = d->unified ? 0 : 1; /* a discrete GPU reads shared buffers across the bus */
}

void mtl_device_close(void *dev_) {
    mtl_device *d = dev_;
    if (!d) return;
    @autoreleasepool {
        @try {
            mtl_pipelines_free(d);
            [d->up release];
            [d->scratch release];
            [d->down release];
            [d->dummy release];
            [d->pattern release];
            [d->lib release];
            [d->queue release];
            [d->dev release];
        } @catch (id e) {
            gokv_log(GOKV_LOG_ERROR, MTL_BACKEND, "gokv_device_close", "exception while releasing the device");
        }
    }
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->pipe_mu);
    free(d);
}

static gokv_status open_device(mtl_device *d, const gokv_device_desc *desc) {
    const char *op = "gokv_device_open";
    gokv_status st;
    d->dev = pick_device(desc, &st);
    if (st) return st;
    const char *nm = [[d->dev name] UTF8String];
    snprintf(d->name, sizeof d->name, "%.127s", nm ? nm : "Metal device");
    d->unified = [d->dev hasUnifiedMemory] ? 1 : 0;
    d->working_set = (uint64_t)[d->dev recommendedMaxWorkingSetSize];
    d->max_buffer = (uint64_t)[d->dev maxBufferLength] & ~(uint64_t)3u;
    d->serial = env_flag("GOKV_METAL_SERIAL");
    fill_caps(d);
    d->queue = [d->dev newCommandQueue];
    if (!d->queue) return gokv_set_error(GOKV_ENODEV, "%s: metal: newCommandQueue failed on %s", op, d->name);
    if ((st = mtl_library_load(d)) != GOKV_OK) return st;
    if ((st = mtl_buffer_new(d, 256, op, "the dummy ring buffer", &d->dummy)) != GOKV_OK) return st;
    if ((st = mtl_buffer_new(d, 1u << 20, op, "the upload buffer", &d->up)) != GOKV_OK) return st;
    if ((st = mtl_buffer_new(d, 1u << 20, op, "the scratch buffer", &d->scratch)) != GOKV_OK) return st;
    if ((st = mtl_buffer_new(d, 1u << 20, op, "the download buffer", &d->down)) != GOKV_OK) return st;
    return mtl_buffer_new(d, 16u * MTL_PATTERN_BLOCK, op, "the fill patterns", &d->pattern);
}

gokv_status mtl_device_open(const gokv_device_desc *desc, void **impl) {
    mtl_device *d = calloc(1, sizeof *d);
    if (!d) return gokv_set_error(GOKV_ENOMEM, "gokv_device_open: metal: out of memory");
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->pipe_mu, NULL);
    d->base.ops = &mtl_ops;
    d->base.backend = MTL_BACKEND;
    gokv_status st;
    @autoreleasepool {
        @try {
            st = open_device(d, desc);
        } @catch (NSException *e) {
            const char *why = [[e reason] UTF8String];
            st = gokv_set_error(GOKV_EINTERNAL, "gokv_device_open: metal: exception %s: %s", [[e name] UTF8String],
                                why ? why : "");
        } @catch (id e) {
            st = gokv_set_error(GOKV_EINTERNAL, "gokv_device_open: metal: unexpected exception");
        }
    }
    if (st != GOKV_OK) {
        char msg[1024];
        gokv_last_error_copy(msg, sizeof msg);
        mtl_device_close(d);
        return gokv_set_error(st, "%s", msg);
    }
    gokv_log(GOKV_LOG_INFO, MTL_BACKEND, "device_open", "%s, %s memory, working set %llu MiB, threadgroup memory %u, "
             "workgroup %u, chunk %d%s", d->name, d->unified ? "unified" : "discrete",
             (unsigned long long)(d->working_set >> 20), d->base.caps.max_shared_bytes, d->base.caps.wg_size,
             d->base.caps.chunk_size, d->serial ? ", serial encoders" : "");
    *impl = d;
    return GOKV_OK;
}

gokv_status mtl_device_info(void *dev_, gokv_device_info *out) {
    mtl_device *d = dev_;
    const gpu_caps *c = &d->base.caps;
    snprintf(out->name, sizeof out->name, "%s", d->name);
    snprintf(out->features, sizeof out->features, "metal simdgroup %u wg %u chunk %d threadgroup %u%s%s",
             c->subgroup_size, c->wg_size, c->chunk_size, c->max_shared_bytes, d->unified ? " unified" : "",
             d->serial ? " serial" : "");
    out->memory_bytes = d->working_set;
    out->subgroup_size = (int32_t)c->subgroup_size;
    out->n_threads = 1;
    out->caps = GOKV_CAP_DECODE | GOKV_CAP_PREFILL | GOKV_CAP_LEARNED_SINKS | GOKV_CAP_WINDOW | GOKV_CAP_MLA |
                GOKV_CAP_HOLES | GOKV_CAP_BASELINE | GOKV_CAP_MASS | GOKV_CAP_KV_HEAD_MASKS | GOKV_CAP_QUEST;
    out->formats = (1u << GOKV_FORMAT_COUNT_) - 1u;
    return GOKV_OK;
}
