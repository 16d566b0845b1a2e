/*
 * mtl_internal.h: the macOS Metal host's internals, shared by its files (Objective-C, manual reference
 * counting: every object kept in a C struct is owned by an explicit retain or a new/copy/Create call and
 * released once; CMake compiles these files with -fno-objc-arc). Not part of the ABI.
 *
 *     mtl_device.m    device choice, open, close, info, caps; error mapping; the fault hooks
 *     mtl_pipeline.m  the embedded metallib and the pipeline cache (gpu_ops.pipeline)
 *     mtl_call.m      one ABI call's command buffer (gpu_ops begin ... end) and the per-call buffers
 *     mtl_backend.m   pools, the backend table, registration, measure
 *
 * The shared plan (native/gpu/gpu_plan.h) decides every pass; this host only encodes them:
 * - One command buffer per ABI call, committed and waited for at submit (the ABI is synchronous).
 * - Dispatches go into one compute encoder (concurrent dispatch type: the plan's barriers order it; a
 *   barrier is memoryBarrierWithScope:MTLBarrierScopeBuffers). Copies and fills end it and go into a
 *   blit encoder; encoders are ordered by Metal's hazard tracking (every buffer here is tracked).
 * - Every buffer is MTLResourceStorageModeShared: pools, and the per-call up / scratch / down buffers,
 *   which grow on demand and are reused. On unified memory (Apple silicon) the CPU writes inputs and reads
 *   outputs in place.
 * - A mutex per device serializes calls; a second one guards the pipeline cache.
 * - No Objective-C exception leaves a C entry point (each catches them and returns GOKV_EINTERNAL or
 *   records the error for submit); nothing aborts.
 */
#ifndef GOKV_MTL_INTERNAL_H
#define GOKV_MTL_INTERNAL_H

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <pthread.h>
#include <stdint.h>

#include "gokv_backend.h"
#include "gpu_plan.h"

#define MTL_BACKEND "metal"
#define MTL_PUSH_WORDS (GPU_PUSH_BYTES / 4u)
#define MTL_PATTERN_BLOCK 4096u /* bytes of one fill pattern (fills whose word is not one repeated byte) */

/* One compiled kernel instance (host name "<kernel>_<targ>_..."), shared by every spec that maps to it. */
typedef struct mtl_state {
    char host[GPU_MAX_NAME];
    id<MTLComputePipelineState> state; /* owned */
} mtl_state;

/* What gpu_ops.pipeline hands out: an instance, the spec words bound at buffer 6 and the threadgroup memory,
 * for one (kernel name, spec). Entries never move (the cache holds pointers), so the handle stays valid
 * until the device closes. */
typedef struct mtl_pipeline {
    char name[GPU_MAX_NAME];
    uint32_t spec[GPU_SPEC_COUNT];
    id<MTLComputePipelineState> state; /* not owned: the mtl_state's */
    uint32_t tg_bytes;                 /* threadgroup(0) length, a multiple of 16, at least 16 */
} mtl_pipeline;

/* The recording state of the call in flight (one per device: the device mutex is held from begin to end). */
typedef struct mtl_rec {
    id<MTLCommandBuffer> cb;               /* owned */
    id<MTLComputeCommandEncoder> compute;  /* owned, the open compute encoder or nil */
    id<MTLBlitCommandEncoder> blit;        /* owned, the open blit encoder or nil */
    id<MTLComputePipelineState> bound;
    id<MTLBuffer> bind[GPU_N_BINDINGS];    /* not owned */
    uint64_t pattern_used;                 /* bytes of the pattern buffer this call used */
    gokv_status err;                       /* the first recording error (reported by submit) */
    char err_msg[384];
} mtl_rec;

typedef struct mtl_device {
    gpu_device base; /* first: the plan's view */
    id<MTLDevice> dev;
    id<MTLCommandQueue> queue;
    id<MTLLibrary> lib;
    char name[128];
    int unified;                  /* hasUnifiedMemory */
    int serial;                   /* GOKV_METAL_SERIAL=1: serial compute encoders (debugging the barriers) */
    uint64_t working_set;         /* recommendedMaxWorkingSetSize */
    uint64_t max_buffer;          /* maxBufferLength */

    pthread_mutex_t mu;           /* one call at a time */
    int lost;                     /* after a removed device or revoked access: every later call fails */
    id<MTLBuffer> up, scratch, down; /* grown on demand, reused */
    id<MTLBuffer> dummy;          /* bound where a pool has no rings, or a call no pool */
    id<MTLBuffer> pattern;        /* fill patterns, MTL_PATTERN_BLOCK bytes each, reused per call */
    mtl_rec rec;

    pthread_mutex_t pipe_mu;      /* the pipeline cache (the plan asks inside and outside calls) */
    mtl_state *states;
    int32_t n_states, cap_states;
    mtl_pipeline **pipelines;
    int32_t n_pipelines, cap_pipelines;
} mtl_device;

typedef struct mtl_pool {
    gpu_pool base;        /* first: the plan's view */
    id<MTLBuffer> pages;  /* pages, then (key_bounds) their key bounds */
    id<MTLBuffer> rings;  /* KIVI residual slots, or nil */
} mtl_pool;

/* ---- mtl_device.m ---- */
gokv_status mtl_device_open(const gokv_device_desc *desc, void **impl);
void mtl_device_close(void *dev);
gokv_status mtl_device_info(void *dev, gokv_device_info *out);
/* The NSError's text (or "unknown error") as a C string, for messages. */
const char *mtl_error_text(NSError *e);
/* Status and message for a failed command buffer (code: MTLCommandBufferError); marks the device lost when
 * the device is gone. */
gokv_status mtl_cb_error(mtl_device *d, NSInteger code, const char *text, const char *op);
/* The code armed for site GOKV_FAULT_*, 0 if none; taking it disarms it. */
int32_t mtl_take_injected(int site);
gokv_status mtl_inject_fault(int32_t site, int32_t code);
/* A new shared buffer of size bytes (at least 16), or ENOMEM naming op and what (injected faults too). */
gokv_status mtl_buffer_new(mtl_device *d, uint64_t size, const char *op, const char *what, id<MTLBuffer> *out);

/* ---- mtl_pipeline.m ---- */
gokv_status mtl_library_load(mtl_device *d); /* at open: the embedded metallib */
void mtl_pipelines_free(mtl_device *d);
gokv_status mtl_pipeline_get(gpu_device *d, const char *name, const uint32_t spec[GPU_SPEC_COUNT], gpu_pipeline *out);

/* ---- mtl_call.m: the gpu_ops table ---- */
extern const gpu_ops mtl_ops;

/* ---- mtl_backend.m ---- */
gokv_status mtl_measure(void *dev, uint64_t bytes, gokv_device_ceilings *out);

/* ---- the embedded metallib (generated by CMake from native/metal/kernels) ---- */
extern const unsigned char gokv_metal_metallib[];
extern const size_t gokv_metal_metallib_size;

#endif
