/*
 * mtl_backend.m: the Metal module's backend table ("metal", docs/architecture.md §7) and its registration:
 * pools (shared MTLBuffers of pages and of KIVI residual slots, sized and cleared by the shared plan), every
 * other slot handed to the plan (native/gpu/gpu_plan.h), which encodes its passes through mtl_call.m, and
 * the copy bandwidth that `gokv bench` reports attention against.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gokv_metal.h"
#include "mtl_internal.h"

/* ---- pools ---- */

static void pool_free(mtl_device *d, mtl_pool *p) {
    pthread_mutex_lock(&d->mu);
    @autoreleasepool {
        [p->pages release];
        [p->rings release];
    }
    pthread_mutex_unlock(&d->mu);
    free(p);
}

static gokv_status pool_create(void *dev_, const gokv_pool_desc *desc, const gokv_layout *L, void **impl) {
    mtl_device *d = dev_;
    const char *op = "gokv_pool_create";
    mtl_pool *p = calloc(1, sizeof *p);
    if (!p) return gokv_set_error(GOKV_ENOMEM, "%s: metal: out of memory", op);
    gokv_status st = gpu_pool_init(&d->base, &p->base, desc, L);
    if (st != GOKV_OK) {
        free(p);
        return st;
    }
    const uint64_t page_bytes = (L->page_bytes + L->bounds_bytes) * (uint64_t)desc->n_pages; /* pages, then bounds */
    const uint64_t ring_bytes = L->ring_bytes * (uint64_t)desc->n_residual_slots;
    pthread_mutex_lock(&d->mu);
    @autoreleasepool {
        @try {
            if (d->lost)
                st = gokv_set_error(GOKV_EDEVICE, "%s: metal: the device was lost; close it and open a new one", op);
            else
                st = mtl_buffer_new(d, page_bytes, op, "the pool's pages (use fewer pages per pool)", &p->pages);
            if (st == GOKV_OK && ring_bytes) st = mtl_buffer_new(d, ring_bytes, op, "the pool's residual slots", &p->rings);
        } @catch (id e) {
            (void)e;
            st = gokv_set_error(GOKV_EINTERNAL, "%s: metal: exception while allocating the pool", op);
        }
    }
    pthread_mutex_unlock(&d->mu);
    if (st == GOKV_OK) st = gpu_pool_clear(&d->base, &p->base); /* zero pages and rings, bounds "no key" */
    if (st != GOKV_OK) {
        pool_free(d, p);
        return st;
    }
    *impl = p;
    return GOKV_OK;
}

static void pool_destroy(void *dev, void *pool) {
    if (pool) pool_free(dev, pool);
}

/* ---- measure ---- */

/* One round: `reps` copies of `bytes` alternating between a and b, each in its own blit encoder (so each
 * waits for the one before, as attention's reads would), timed by the command buffer's GPU start and end. */
static gokv_status copy_round(mtl_device *d, id<MTLBuffer> a, id<MTLBuffer> b, uint64_t bytes, int reps, double *seconds,
                              const char *op) {
    id<MTLCommandBuffer> cb = [d->queue commandBuffer];
    if (!cb) return gokv_set_error(GOKV_EDEVICE, "%s: metal: the command queue gave no command buffer", op);
    for (int i = 0; i < reps; i++) {
        id<MTLBlitCommandEncoder> blit = [cb blitCommandEncoder];
        [blit copyFromBuffer:(i % 2 ? b : a) sourceOffset:0 toBuffer:(i % 2 ? a : b) destinationOffset:0 size:(NSUInteger)bytes];
        [blit endEncoding];
    }
    [cb commit];
    [cb waitUntilCompleted];
    if ([cb status] == MTLCommandBufferStatusError) {
        NSError *err = [cb error];
        return mtl_cb_error(d, err ? [err code] : MTLCommandBufferErrorInternal, mtl_error_text(err), op);
    }
    *seconds = [cb GPUEndTime] - [cb GPUStartTime];
    return GOKV_OK;
}

/* Backend slot measure: the copy bandwidth (read + write) between two device buffers of `bytes` each (0: 256
 * MiB; clamped to the device's limits), best of three rounds. Attention reads its bytes once, so a kernel at
 * this bandwidth is at the floor. Compute peak is not measured (decode attention is memory-bound). */
gokv_status mtl_measure(void *dev_, uint64_t bytes, gokv_device_ceilings *out) {
    const char *op = "gokv_device_measure";
    mtl_device *d = dev_;
    if (bytes == 0) bytes = 256u << 20;
    if (bytes > d->max_buffer) bytes = d->max_buffer;
    if (bytes > d->working_set / 4) bytes = d->working_set / 4;
    bytes &= ~(uint64_t)255u;
    if (bytes == 0) return gokv_set_error(GOKV_ENOMEM, "%s: metal: no room for the copy buffers", op);
    enum { REPS = 8 };
    gokv_status st;
    double best = 0;
    pthread_mutex_lock(&d->mu);
    @autoreleasepool {
        @try {
            id<MTLBuffer> a = nil, b = nil;
            st = d->lost ? gokv_set_error(GOKV_EDEVICE, "%s: metal: the device was lost; close it and open a new one", op)
                         : mtl_buffer_new(d, bytes, op, "the copy source", &a);
            if (st == GOKV_OK) st = mtl_buffer_new(d, bytes, op, "the copy destination", &b);
            if (st == GOKV_OK) memset([a contents], 1, (size_t)bytes); /* touch every page before timing */
            for (int round = 0; round < 3 && st == GOKV_OK; round++) {
                double s = 0;
                st = copy_round(d, a, b, bytes, REPS, &s, op);
                const double g = s > 0 ? 2.0 * (double)bytes * REPS / s / 1e9 : 0;
                if (st == GOKV_OK && g > best) best = g;
            }
            [a release];
            [b release];
        } @catch (id e) {
            (void)e;
            st = gokv_set_error(GOKV_EINTERNAL, "%s: metal: exception while measuring", op);
        }
    }
    pthread_mutex_unlock(&d->mu);
    if (st == GOKV_OK) {
        out->read_gbps = best;
        snprintf(out->method, sizeof out->method, "buffer copy, read + write, GPU time");
    }
    return st;
}

/* ---- the table ---- */

static const gokv_backend g_metal_backend = {
    .name = MTL_BACKEND,
    .device_open = mtl_device_open,
    .device_close = mtl_device_close,
    .device_info = mtl_device_info,
    .pool_create = pool_create,
    .pool_destroy = pool_destroy,
    GPU_PLAN_SLOTS,
    .measure = mtl_measure,
    .inject_fault = mtl_inject_fault,
};

gokv_status gokv_metal_register(void) { return gokv_register_backend(&g_metal_backend); }
