/*
 * mtl_call.m: the gpu_ops a module supplies to the shared plan (native/gpu/gpu_plan.h): one ABI call is one
 * command buffer. begin locks the device, grows the per-call buffers and opens the command buffer; dispatches
 * go into one compute encoder with every kernel's parameter list bound (native/metal/kernels/mtl_kernel.h:
 * buffers 0..4, push constants at 5, spec words at 6, threadgroup memory 0); copies and fills close it and go
 * into a blit encoder; a barrier is a buffer-scope memory barrier inside the compute encoder, or the end of
 * the blit encoder (Metal orders encoders by hazard tracking); submit commits and waits.
 *
 * dispatch, copy, fill and barrier return nothing: a failure while recording (an exception, a misaligned
 * copy) is kept in the device's mtl_rec, nothing more is recorded, and submit reports it without committing.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "mtl_internal.h"

static mtl_device *dev_of(gpu_call *c) { return (mtl_device *)c->d; }

/* Keeps the first recording error. */
static void rec_fail(mtl_rec *r, gokv_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void rec_fail(mtl_rec *r, gokv_status st, const char *fmt, ...) {
    if (r->err) return;
    r->err = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err_msg, sizeof r->err_msg, fmt, ap);
    va_end(ap);
}

static void rec_exception(mtl_rec *r, id e, const char *what) {
    if (r->err) return;
    r->err = GOKV_EINTERNAL;
    const char *name = "", *why = "";
    if ([e isKindOfClass:[NSException class]]) {
        NSException *x = (NSException *)e;
        name = [[x name] UTF8String] ? [[x name] UTF8String] : "";
        why = [[x reason] UTF8String] ? [[x reason] UTF8String] : "";
    }
    snprintf(r->err_msg, sizeof r->err_msg, "metal: exception while recording %s: %s: %s", what, name, why);
}

static void end_compute(mtl_rec *r) {
    if (!r->compute) return;
    [r->compute endEncoding];
    [r->compute release];
    r->compute = nil;
    r->bound = nil;
}

static void end_blit(mtl_rec *r) {
    if (!r->blit) return;
    [r->blit endEncoding];
    [r->blit release];
    r->blit = nil;
}

/* The open blit encoder, or a new one (nil, with the error kept, when the command buffer gives none: a
 * message to nil does nothing, so work would otherwise be dropped silently). */
static id<MTLBlitCommandEncoder> blit_encoder(mtl_rec *r) {
    end_compute(r);
    if (!r->blit) r->blit = [[r->cb blitCommandEncoder] retain];
    if (!r->blit) rec_fail(r, GOKV_EDEVICE, "metal: the command buffer gave no blit encoder");
    return r->blit;
}

/* Makes b hold at least size bytes (contents are not kept). Only between submissions. */
static gokv_status reserve(mtl_device *d, id<MTLBuffer> *b, uint64_t size, const char *what) {
    if (size < 256) size = 256;
    if (*b && (uint64_t)[*b length] >= size) return GOKV_OK;
    uint64_t want = *b && (uint64_t)[*b length] * 2 > size ? (uint64_t)[*b length] * 2 : size;
    want = (want + 65535u) & ~(uint64_t)65535u;
    if (want > d->max_buffer) want = size;
    [*b release];
    *b = nil;
    return mtl_buffer_new(d, want, "metal call", what, b);
}

/* ---- gpu_ops ---- */

static gokv_status begin_locked(mtl_device *d, gpu_pool *pool, uint64_t up_bytes, uint64_t scratch_bytes,
                                uint64_t down_bytes, gpu_call *c) {
    gokv_status st;
    if (d->lost) return gokv_set_error(GOKV_EDEVICE, "metal: the device was lost earlier; close it and open a new one");
    if ((st = reserve(d, &d->up, up_bytes, "the upload buffer")) != GOKV_OK) return st;
    if ((st = reserve(d, &d->scratch, scratch_bytes, "the scratch buffer")) != GOKV_OK) return st;
    if ((st = reserve(d, &d->down, down_bytes, "the download buffer")) != GOKV_OK) return st;
    mtl_rec *r = &d->rec;
    memset(r, 0, sizeof *r);
    r->cb = [[d->queue commandBuffer] retain];
    if (!r->cb) return gokv_set_error(GOKV_EDEVICE, "metal: the command queue gave no command buffer");
    const mtl_pool *p = (const mtl_pool *)pool;
    r->bind[GPU_PAGES] = p && p->pages ? p->pages : d->dummy;
    r->bind[GPU_RINGS] = p && p->rings ? p->rings : d->dummy;
    r->bind[GPU_UP] = d->up;
    r->bind[GPU_SCRATCH] = d->scratch;
    r->bind[GPU_DOWN] = d->down;
    c->d = &d->base;
    c->p = pool;
    c->up = (uint8_t *)[d->up contents];
    c->down = (uint8_t *)[d->down contents];
    c->up_bytes = up_bytes;
    c->scratch_bytes = scratch_bytes;
    c->down_bytes = down_bytes;
    c->impl = r;
    return GOKV_OK;
}

static gokv_status op_begin(gpu_device *base, gpu_pool *pool, uint64_t up_bytes, uint64_t scratch_bytes,
                            uint64_t down_bytes, gpu_call *c) {
    mtl_device *d = (mtl_device *)base;
    memset(c, 0, sizeof *c);
    pthread_mutex_lock(&d->mu);
    gokv_status st;
    @autoreleasepool {
        @try {
            st = begin_locked(d, pool, up_bytes, scratch_bytes, down_bytes, c);
        } @catch (id e) {
            (void)e;
            st = gokv_set_error(GOKV_EINTERNAL, "metal: exception while opening a command buffer");
        }
    }
    if (st != GOKV_OK) {
        [d->rec.cb release];
        memset(&d->rec, 0, sizeof d->rec);
        memset(c, 0, sizeof *c);
        pthread_mutex_unlock(&d->mu);
    }
    return st;
}

static void op_dispatch(gpu_call *c, gpu_pipeline pl, const void *push, uint32_t push_bytes, uint32_t gx, uint32_t gy,
                        uint32_t gz) {
    mtl_device *d = dev_of(c);
    mtl_rec *r = c->impl;
    const mtl_pipeline *e = pl;
    if (r->err) return;
    if (!e) {
        rec_fail(r, GOKV_EINTERNAL, "metal: a dispatch of %u x %u x %u threadgroups has no pipeline", gx, gy, gz);
        return;
    }
    if (push_bytes > GPU_PUSH_BYTES) {
        rec_fail(r, GOKV_EINTERNAL, "metal: %s: %u push constant bytes, more than %u", e->name, push_bytes,
                 (unsigned)GPU_PUSH_BYTES);
        return;
    }
    @autoreleasepool {
        @try {
            end_blit(r);
            if (!r->compute) {
                const MTLDispatchType type = d->serial ? MTLDispatchTypeSerial : MTLDispatchTypeConcurrent;
                r->compute = [[r->cb computeCommandEncoderWithDispatchType:type] retain];
                if (!r->compute) {
                    rec_fail(r, GOKV_EDEVICE, "metal: the command buffer gave no compute encoder (for %s)", e->name);
                    return;
                }
                for (NSUInteger i = 0; i < GPU_N_BINDINGS; i++) [r->compute setBuffer:r->bind[i] offset:0 atIndex:i];
            }
            if (r->bound != e->state) {
                [r->compute setComputePipelineState:e->state];
                r->bound = e->state;
            }
            /* Buffer 5 always holds a full block, so a kernel never reads past what was set. */
            uint32_t words[MTL_PUSH_WORDS];
            memset(words, 0, sizeof words);
            if (push && push_bytes) memcpy(words, push, push_bytes);
            [r->compute setBytes:words length:sizeof words atIndex:5];
            [r->compute setBytes:e->spec length:sizeof e->spec atIndex:6];
            [r->compute setThreadgroupMemoryLength:e->tg_bytes atIndex:0];
            [r->compute dispatchThreadgroups:MTLSizeMake(gx, gy, gz)
                       threadsPerThreadgroup:MTLSizeMake(d->base.caps.wg_size, 1, 1)];
        } @catch (id x) {
            rec_exception(r, x, e->name);
        }
    }
}

/* Offsets and sizes of blit copies and fills must be multiples of 4 on macOS. */
static int aligned4(mtl_rec *r, const char *what, uint64_t off, uint64_t bytes) {
    if (((off | bytes) & 3u) == 0) return 1;
    rec_fail(r, GOKV_EINTERNAL, "metal: %s of %llu bytes at byte %llu: offsets and sizes must be multiples of 4", what,
             (unsigned long long)bytes, (unsigned long long)off);
    return 0;
}

static int binding_ok(mtl_rec *r, int32_t b, uint64_t off, uint64_t bytes, const char *what) {
    if (b < 0 || b >= GPU_N_BINDINGS) {
        rec_fail(r, GOKV_EINTERNAL, "metal: %s names binding %d of %d", what, (int)b, (int)GPU_N_BINDINGS);
        return 0;
    }
    if (off + bytes > (uint64_t)[r->bind[b] length]) {
        rec_fail(r, GOKV_EINTERNAL, "metal: %s runs past the end of its buffer (byte %llu + %llu of %llu)", what,
                 (unsigned long long)off, (unsigned long long)bytes, (unsigned long long)[r->bind[b] length]);
        return 0;
    }
    return aligned4(r, what, off, bytes);
}

static void op_copy(gpu_call *c, int32_t src, uint64_t src_off, int32_t dst, uint64_t dst_off, uint64_t bytes) {
    mtl_rec *r = c->impl;
    if (r->err || bytes == 0) return;
    @autoreleasepool {
        @try {
            if (!binding_ok(r, src, src_off, bytes, "a copy's source") ||
                !binding_ok(r, dst, dst_off, bytes, "a copy's destination"))
                return;
            [blit_encoder(r) copyFromBuffer:r->bind[src]
                               sourceOffset:(NSUInteger)src_off
                                   toBuffer:r->bind[dst]
                          destinationOffset:(NSUInteger)dst_off
                                       size:(NSUInteger)bytes];
        } @catch (id x) {
            rec_exception(r, x, "a copy");
        }
    }
}

/* A fill whose word is not one byte repeated (fillBuffer:range:value: writes a byte): the word's pattern is
 * written by the CPU into a block of the pattern buffer, copied to the start of the range, then the filled
 * part is doubled, each doubling in its own blit encoder so that it reads what the one before wrote. */
static void fill_pattern(mtl_device *d, mtl_rec *r, id<MTLBuffer> dst, uint64_t off, uint64_t bytes, uint32_t word) {
    if (r->pattern_used + MTL_PATTERN_BLOCK > (uint64_t)[d->pattern length]) {
        /* Commands already recorded keep the old buffer alive (the command buffer retains what it uses). */
        id<MTLBuffer> bigger = nil;
        if (mtl_buffer_new(d, (uint64_t)[d->pattern length] * 2, "metal call", "the fill patterns", &bigger) != GOKV_OK) {
            rec_fail(r, GOKV_ENOMEM, "metal: no room for another fill pattern (%llu bytes, all in use)",
                     (unsigned long long)[d->pattern length]);
            return;
        }
        [d->pattern release];
        d->pattern = bigger;
        r->pattern_used = 0;
    }
    const uint64_t first = bytes < MTL_PATTERN_BLOCK ? bytes : MTL_PATTERN_BLOCK;
    uint32_t *pat = (uint32_t *)((uint8_t *)[d->pattern contents] + r->pattern_used);
    for (uint64_t i = 0; i < first / 4u; i++) pat[i] = word;
    [blit_encoder(r) copyFromBuffer:d->pattern
                       sourceOffset:(NSUInteger)r->pattern_used
                           toBuffer:dst
                  destinationOffset:(NSUInteger)off
                               size:(NSUInteger)first];
    r->pattern_used += MTL_PATTERN_BLOCK;
    for (uint64_t done = first; done < bytes;) {
        const uint64_t n = bytes - done < done ? bytes - done : done;
        end_blit(r);
        [blit_encoder(r) copyFromBuffer:dst
                           sourceOffset:(NSUInteger)off
                               toBuffer:dst
                      destinationOffset:(NSUInteger)(off + done)
                                   size:(NSUInteger)n];
        done += n;
    }
}

static void op_fill(gpu_call *c, int32_t dst, uint64_t off, uint64_t bytes, uint32_t word) {
    mtl_device *d = dev_of(c);
    mtl_rec *r = c->impl;
    if (r->err || bytes == 0) return;
    @autoreleasepool {
        @try {
            if (!binding_ok(r, dst, off, bytes, "a fill")) return;
            const uint8_t byte = (uint8_t)(word & 0xffu);
            if (word == byte * 0x01010101u)
                [blit_encoder(r) fillBuffer:r->bind[dst] range:NSMakeRange((NSUInteger)off, (NSUInteger)bytes) value:byte];
            else
                fill_pattern(d, r, r->bind[dst], off, bytes, word);
        } @catch (id x) {
            rec_exception(r, x, "a fill");
        }
    }
}

static void op_barrier(gpu_call *c) {
    mtl_rec *r = c->impl;
    if (r->err) return;
    @autoreleasepool {
        @try {
            if (r->compute) [r->compute memoryBarrierWithScope:MTLBarrierScopeBuffers];
            end_blit(r); /* the next encoder waits for this one's writes (hazard tracking) */
        } @catch (id x) {
            rec_exception(r, x, "a barrier");
        }
    }
}

static gokv_status submit(mtl_device *d, mtl_rec *r, const char *op) {
    end_compute(r);
    end_blit(r);
    if (r->err) {
        gokv_log(GOKV_LOG_ERROR, MTL_BACKEND, op, "%s", r->err_msg);
        return gokv_set_error(r->err, "%s: %s", op, r->err_msg);
    }
    const int32_t injected = mtl_take_injected(GOKV_FAULT_SUBMIT);
    if (injected) return mtl_cb_error(d, injected, "injected", op);
    [r->cb commit];
    [r->cb waitUntilCompleted];
    if ([r->cb status] == MTLCommandBufferStatusError) {
        NSError *err = [r->cb error];
        return mtl_cb_error(d, err ? [err code] : MTLCommandBufferErrorInternal, mtl_error_text(err), op);
    }
    if ([r->cb status] != MTLCommandBufferStatusCompleted)
        return gokv_set_error(GOKV_EDEVICE, "%s: metal: the command buffer ended in status %lu", op,
                              (unsigned long)[r->cb status]);
    return GOKV_OK;
}

static gokv_status op_submit(gpu_call *c, const char *op) {
    mtl_device *d = dev_of(c);
    mtl_rec *r = c->impl;
    gokv_status st;
    @autoreleasepool {
        @try {
            st = submit(d, r, op);
        } @catch (id x) {
            rec_exception(r, x, "the submission");
            st = gokv_set_error(r->err, "%s: %s", op, r->err_msg);
        }
    }
    return st;
}

static void op_end(gpu_call *c) {
    mtl_device *d = dev_of(c);
    mtl_rec *r = c->impl;
    @autoreleasepool {
        @try {
            end_compute(r); /* a call ended without submit: encoders must still be ended */
            end_blit(r);
            [r->cb release];
        } @catch (id x) {
            (void)x;
            gokv_log(GOKV_LOG_ERROR, MTL_BACKEND, "metal call", "exception while ending a command buffer");
        }
    }
    memset(r, 0, sizeof *r);
    pthread_mutex_unlock(&d->mu);
}

const gpu_ops mtl_ops = {
    .pipeline = mtl_pipeline_get,
    .begin = op_begin,
    .dispatch = op_dispatch,
    .copy = op_copy,
    .fill = op_fill,
    .barrier = op_barrier,
    .submit = op_submit,
    .end = op_end,
};
