/*
 * vk_pool.c: page pools' buffers and the backend slots pool_create and pool_destroy. A pool is one
 * device-local buffer of pages (GPU_PAGES; with key_bounds the pages' Quest key bounds follow the pages in
 * it) and one of KIVI rings (GPU_RINGS); the plan checks the pool first (gpu_pool_init) and clears the
 * buffers after (gpu_pool_clear: zeros, key bounds "no key").
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

static void pool_free(vkb_device *d, vkb_pool *p) {
    pthread_mutex_lock(&d->mu);
    vkb_buffer_destroy(d, &p->pages);
    vkb_buffer_destroy(d, &p->ring);
    pthread_mutex_unlock(&d->mu);
    free(p);
}

gokv_status vkb_pool_create(void *dev_, const gokv_pool_desc *desc, const gokv_layout *L, void **impl) {
    vkb_device *d = dev_;
    const char *op = "gokv_pool_create";
    vkb_pool *p = calloc(1, sizeof *p);
    if (!p) return gokv_set_error(GOKV_ENOMEM, "%s: vulkan: out of memory", op);
    gokv_status st = gpu_pool_init(&d->base, &p->base, desc, L);
    if (st) return free(p), st;
    const uint64_t page_bytes = (L->page_bytes + L->bounds_bytes) * (uint64_t)desc->n_pages; /* pages, then bounds */
    const uint64_t ring_bytes = L->ring_bytes * (uint64_t)desc->n_residual_slots;
    pthread_mutex_lock(&d->mu);
    st = d->lost ? gokv_set_error(GOKV_EDEVICE, "%s: vulkan: the device was lost; close it and open a new one", op)
                 : vkb_buffer_create(d, page_bytes, 0, op, "the pool's pages (use fewer pages per pool)", &p->pages);
    if (st == GOKV_OK && ring_bytes) st = vkb_buffer_create(d, ring_bytes, 0, op, "the pool's residual slots", &p->ring);
    pthread_mutex_unlock(&d->mu);
    if (st == GOKV_OK) st = gpu_pool_clear(&d->base, &p->base);
    if (st != GOKV_OK) {
        pool_free(d, p);
        return st;
    }
    *impl = p;
    return GOKV_OK;
}

void vkb_pool_destroy(void *dev_, void *pool) {
    if (pool) pool_free(dev_, pool);
}
