/*
 * mtl_pipeline.m: the kernels' library (the metallib CMake built from native/metal/kernels and embedded in
 * this library: nothing is read from disk at run time) and the pipeline cache. A request of the plan, a
 * kernel name and its GPU_SPEC_* words, goes through gpu_kernel_instance (native/gpu/gpu_variants.c) to
 * one instance, "<kernel>_<targ>_...": its compute pipeline state is
 * built once per device, and each (name, spec) gets an entry with the spec words that dispatch binds at
 * buffer 6 and the instance's threadgroup memory for that spec.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtl_internal.h"

gokv_status mtl_library_load(mtl_device *d) {
    const char *op = "gokv_device_open";
    /* DISPATCH_DATA_DESTRUCTOR_DEFAULT copies the bytes, so the data object owns what it holds. */
    dispatch_data_t data = dispatch_data_create(gokv_metal_metallib, gokv_metal_metallib_size, NULL,
                                                DISPATCH_DATA_DESTRUCTOR_DEFAULT);
    if (!data) return gokv_set_error(GOKV_ENOMEM, "%s: metal: cannot wrap the embedded metallib", op);
    NSError *err = nil;
    d->lib = [d->dev newLibraryWithData:data error:&err];
    dispatch_release(data);
    if (!d->lib)
        return gokv_set_error(GOKV_ENODEV,
                              "%s: metal: %s cannot load the kernels' library (%zu bytes; built for a newer macOS or "
                              "GPU family?): %s",
                              op, d->name, gokv_metal_metallib_size, mtl_error_text(err));
    return GOKV_OK;
}

void mtl_pipelines_free(mtl_device *d) {
    for (int32_t i = 0; i < d->n_pipelines; i++) free(d->pipelines[i]);
    for (int32_t i = 0; i < d->n_states; i++) [d->states[i].state release];
    free(d->pipelines);
    free(d->states);
    d->pipelines = NULL;
    d->states = NULL;
    d->n_pipelines = d->cap_pipelines = d->n_states = d->cap_states = 0;
}

/* The compiled instance `host`, built on first use (under pipe_mu). */
static gokv_status get_state(mtl_device *d, const char *host, id<MTLComputePipelineState> *out) {
    for (int32_t i = 0; i < d->n_states; i++)
        if (strcmp(d->states[i].host, host) == 0) {
            *out = d->states[i].state;
            return GOKV_OK;
        }
    if (d->n_states == d->cap_states) {
        const int32_t cap = d->cap_states ? d->cap_states * 2 : 32;
        mtl_state *s = realloc(d->states, sizeof *s * (size_t)cap);
        if (!s) return gokv_set_error(GOKV_ENOMEM, "metal: cannot grow the pipeline cache to %d instances", cap);
        d->states = s;
        d->cap_states = cap;
    }
    NSString *fname = [NSString stringWithUTF8String:host];
    id<MTLFunction> fn = fname ? [d->lib newFunctionWithName:fname] : nil;
    if (!fn)
        return gokv_set_error(GOKV_ENOTSUP, "metal: kernel instance \"%s\" is not in the embedded library (no entry "
                              "in the MTL_INSTANCES list of its kernel file)", host);
    NSError *err = nil;
    id<MTLComputePipelineState> ps = [d->dev newComputePipelineStateWithFunction:fn error:&err];
    [fn release];
    if (!ps) return gokv_set_error(GOKV_EDEVICE, "metal: building the pipeline of \"%s\" failed: %s", host, mtl_error_text(err));
    /* The kernels size their threadgroup arrays for simdgroups of caps.subgroup_min threads and run
     * workgroups of caps.wg_size threads: a device that cannot is refused here, never run wrong. */
    const NSUInteger width = [ps threadExecutionWidth], max_threads = [ps maxTotalThreadsPerThreadgroup];
    if (width != d->base.caps.subgroup_size || max_threads < d->base.caps.wg_size) {
        [ps release];
        return gokv_set_error(GOKV_ENOTSUP,
                              "metal: %s runs \"%s\" with simdgroups of %lu threads and at most %lu threads per "
                              "threadgroup; the kernels need simdgroups of %u and threadgroups of %u (Apple GPUs)",
                              d->name, host, (unsigned long)width, (unsigned long)max_threads,
                              d->base.caps.subgroup_size, d->base.caps.wg_size);
    }
    mtl_state *s = &d->states[d->n_states++];
    snprintf(s->host, sizeof s->host, "%s", host);
    s->state = ps;
    *out = ps;
    return GOKV_OK;
}

static gokv_status pipeline_locked(mtl_device *d, const char *name, const uint32_t spec[GPU_SPEC_COUNT], gpu_pipeline *out) {
    for (int32_t i = 0; i < d->n_pipelines; i++) {
        mtl_pipeline *e = d->pipelines[i];
        if (strcmp(e->name, name) == 0 && memcmp(e->spec, spec, sizeof e->spec) == 0) {
            *out = e;
            return GOKV_OK;
        }
    }
    if (strlen(name) >= GPU_MAX_NAME) return gokv_set_error(GOKV_EINTERNAL, "metal: kernel name \"%s\" is too long", name);
    char host[GPU_MAX_NAME];
    uint32_t tg_words;
    gokv_status st = gpu_kernel_instance(&d->base, name, spec, host, &tg_words);
    id<MTLComputePipelineState> ps = nil;
    if (st == GOKV_OK) st = get_state(d, host, &ps);
    if (st != GOKV_OK) return st;
    const NSUInteger fixed = [ps staticThreadgroupMemoryLength];
    const uint64_t tg_bytes = ((uint64_t)tg_words * 4u + 15u) & ~(uint64_t)15u;
    if (tg_bytes + fixed > d->base.caps.max_shared_bytes)
        return gokv_set_error(GOKV_ENOTSUP, "metal: \"%s\" needs %llu + %lu bytes of threadgroup memory; %s has %u", host,
                              (unsigned long long)tg_bytes, (unsigned long)fixed, d->name, d->base.caps.max_shared_bytes);
    if (d->n_pipelines == d->cap_pipelines) {
        const int32_t cap = d->cap_pipelines ? d->cap_pipelines * 2 : 32;
        mtl_pipeline **p = realloc(d->pipelines, sizeof *p * (size_t)cap);
        if (!p) return gokv_set_error(GOKV_ENOMEM, "metal: cannot grow the pipeline cache to %d entries", cap);
        d->pipelines = p;
        d->cap_pipelines = cap;
    }
    mtl_pipeline *e = calloc(1, sizeof *e);
    if (!e) return gokv_set_error(GOKV_ENOMEM, "metal: out of memory for a pipeline entry");
    snprintf(e->name, sizeof e->name, "%s", name);
    memcpy(e->spec, spec, sizeof e->spec);
    e->state = ps;
    e->tg_bytes = tg_bytes ? (uint32_t)tg_bytes : 16u; /* a zero length is not a multiple of 16 to every driver */
    d->pipelines[d->n_pipelines++] = e;
    *out = e;
    return GOKV_OK;
}

/* gpu_ops.pipeline */
gokv_status mtl_pipeline_get(gpu_device *base, const char *name, const uint32_t spec[GPU_SPEC_COUNT], gpu_pipeline *out) {
    mtl_device *d = (mtl_device *)base;
    *out = NULL;
    gokv_status st;
    pthread_mutex_lock(&d->pipe_mu);
    @autoreleasepool {
        @try {
            st = pipeline_locked(d, name, spec, out);
        } @catch (id e) {
            st = gokv_set_error(GOKV_EINTERNAL, "metal: exception while building the pipeline of \"%s\"", name);
        }
    }
    pthread_mutex_unlock(&d->pipe_mu);
    return st;
}
