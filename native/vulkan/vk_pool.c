/*
 * vk_pool.c: page pools (one device-local buffer of pages and one of KIVI rings, zero-filled at creation; with
 * key_bounds the pages' Quest key bounds follow the pages in the first buffer, set to "no key" at creation by
 * store_bounds.comp and copied with their pages) and the backend slots pool_create, pool_destroy, pool_copy,
 * page_bytes, slot_bytes, set_page_bytes and set_slot_bytes.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

VKB_PUSH_STRUCT(bounds_push, GOKV_PUSH_STORE_BOUNDS); /* store_bounds */

/* ---- pools ---- */

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
    const uint64_t page_bytes = (L->page_bytes + L->bounds_bytes) * (uint64_t)desc->n_pages; /* pages, then bounds */
    const uint64_t ring_bytes = L->ring_bytes * (uint64_t)desc->n_residual_slots;
    if (page_bytes + ring_bytes > d->device_local_bytes)
        return gokv_set_error(GOKV_ENOMEM,
                              "%s: vulkan: %d pages of %llu bytes (+ %llu bytes of residual slots) need %llu bytes, "
                              "more than the device's %llu bytes of device-local memory",
                              op, desc->n_pages, (unsigned long long)L->page_bytes, (unsigned long long)ring_bytes,
                              (unsigned long long)(page_bytes + ring_bytes), (unsigned long long)d->device_local_bytes);
    vkb_pool *p = calloc(1, sizeof *p);
    if (!p) return gokv_set_error(GOKV_ENOMEM, "%s: vulkan: out of memory", op);
    p->L = *L;
    p->n_pages = desc->n_pages;
    p->n_slots = desc->n_residual_slots;
    p->bounds_w = (uint32_t)(L->page_bytes / 4u * (uint64_t)desc->n_pages);
    vkb_pool_spec(d, L, p->spec);
    VkPipeline bounds_pl = VK_NULL_HANDLE;
    if (L->key_bounds && L->bounds_bytes * (uint64_t)desc->n_pages / 4u / 2u > UINT32_MAX)
        return free(p), gokv_set_error(GOKV_ENOMEM, "%s: vulkan: key bounds of %d pages exceed 2^32 invocations", op,
                                       desc->n_pages);
    if (L->key_bounds) {
        gokv_status pst = vkb_get_pipeline(d, "store_bounds", p->spec, &bounds_pl);
        if (pst) return free(p), pst;
    }
    pthread_mutex_lock(&d->mu);
    gokv_status st = d->lost ? gokv_set_error(GOKV_EDEVICE, "%s: vulkan: the device was lost; close it and open a new one", op)
                             : vkb_buffer_create(d, page_bytes, 0, op, "the pool's pages (use fewer pages per pool)", &p->pages);
    if (st == GOKV_OK && ring_bytes) st = vkb_buffer_create(d, ring_bytes, 0, op, "the pool's residual slots", &p->ring);
    pthread_mutex_unlock(&d->mu);
    if (st != GOKV_OK) {
        pool_free(d, p);
        return st;
    }
    /* Zero-fill, so untouched pages read as zeros on every backend. */
    vkb_call c;
    st = vkb_call_begin(d, p, 0, 0, 0, &c);
    if (st == GOKV_OK) {
        vkCmdFillBuffer(c.cmd, p->pages.buf, 0, VK_WHOLE_SIZE, 0);
        if (p->ring.buf) vkCmdFillBuffer(c.cmd, p->ring.buf, 0, VK_WHOLE_SIZE, 0);
        if (bounds_pl) { /* every page's bounds: "no key yet" (min = +inf, max = -inf) */
            vkb_cmd_barrier(&c);
            const uint64_t items = (uint64_t)desc->n_pages * (uint64_t)L->n_kv_heads * (uint64_t)L->d_k / 2u;
            const bounds_push push = {0, p->bounds_w, 1u, (uint32_t)items};
            vkb_dispatch_linear(&c, bounds_pl, &push, sizeof push, items, p->spec[VKB_SPEC_WG_SIZE]);
        }
        st = vkb_call_submit(&c, op);
        vkb_call_end(&c);
    }
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

gokv_status vkb_pool_copy(void *dev_, void *pool_, const gokv_layout *L, const gokv_copy_desc *desc) {
    vkb_device *d = dev_;
    vkb_pool *p = pool_;
    const char *op = "gokv_pool_copy";
    if (desc->n_pages == 0 && desc->n_slots == 0) return GOKV_OK;
    VkBufferCopy *regions = malloc(sizeof *regions * (size_t)(desc->n_pages > desc->n_slots ? desc->n_pages : desc->n_slots));
    if (!regions) return gokv_set_error(GOKV_ENOMEM, "%s: vulkan: out of memory for %d copy regions", op, desc->n_pages);
    vkb_call c;
    gokv_status st = vkb_call_begin(d, p, 0, 0, 0, &c);
    if (st == GOKV_OK) {
        for (int32_t i = 0; i < desc->n_pages; i++)
            regions[i] = (VkBufferCopy){.srcOffset = (VkDeviceSize)desc->src_pages[i] * L->page_bytes,
                                        .dstOffset = (VkDeviceSize)desc->dst_pages[i] * L->page_bytes,
                                        .size = L->page_bytes};
        if (desc->n_pages) vkCmdCopyBuffer(c.cmd, p->pages.buf, p->pages.buf, (uint32_t)desc->n_pages, regions);
        for (int32_t i = 0; L->key_bounds && i < desc->n_pages; i++) /* a page's key bounds go with it */
            regions[i] = (VkBufferCopy){.srcOffset = (VkDeviceSize)p->bounds_w * 4u + (VkDeviceSize)desc->src_pages[i] * L->bounds_bytes,
                                        .dstOffset = (VkDeviceSize)p->bounds_w * 4u + (VkDeviceSize)desc->dst_pages[i] * L->bounds_bytes,
                                        .size = L->bounds_bytes};
        if (L->key_bounds && desc->n_pages) vkCmdCopyBuffer(c.cmd, p->pages.buf, p->pages.buf, (uint32_t)desc->n_pages, regions);
        for (int32_t i = 0; i < desc->n_slots; i++)
            regions[i] = (VkBufferCopy){.srcOffset = (VkDeviceSize)desc->src_slots[i] * L->ring_bytes,
                                        .dstOffset = (VkDeviceSize)desc->dst_slots[i] * L->ring_bytes,
                                        .size = L->ring_bytes};
        if (desc->n_slots && p->ring.buf) vkCmdCopyBuffer(c.cmd, p->ring.buf, p->ring.buf, (uint32_t)desc->n_slots, regions);
        st = vkb_call_submit(&c, op);
        vkb_call_end(&c);
    }
    free(regions);
    return st;
}

/* Backend slots page_bytes and slot_bytes: `bytes` at `offset` of buffer src, copied through the download
 * buffer. */
static gokv_status download(vkb_device *d, vkb_pool *p, VkBuffer src, uint64_t offset, uint64_t bytes, void *out,
                            const char *op) {
    vkb_call c;
    gokv_status st = vkb_call_begin(d, p, 0, 0, bytes, &c);
    if (st) return st;
    const VkBufferCopy region = {.srcOffset = offset, .size = bytes};
    vkCmdCopyBuffer(c.cmd, src, d->down.buf, 1, &region);
    st = vkb_call_submit(&c, op);
    if (!st) memcpy(out, c.down, bytes);
    vkb_call_end(&c);
    return st;
}

gokv_status vkb_page_bytes(void *dev_, void *pool_, const gokv_layout *L, int32_t page, void *out) {
    vkb_pool *p = pool_;
    return download(dev_, p, p->pages.buf, (uint64_t)page * L->page_bytes, L->page_bytes, out, "gokv_pool_page_bytes");
}

gokv_status vkb_slot_bytes(void *dev_, void *pool_, const gokv_layout *L, int32_t slot, void *out) {
    vkb_pool *p = pool_;
    return download(dev_, p, p->ring.buf, (uint64_t)slot * L->ring_bytes, L->ring_bytes, out, "gokv_pool_slot_bytes");
}

/* Backend slots set_page_bytes and set_slot_bytes: the bytes (validated by the core) go through the upload
 * buffer into the pool. With key_bounds, store_bounds.comp then recomputes the page's bounds from the stored
 * keys of slots [0, n_tokens) as one record (page, 0, n_tokens): it starts afresh at slot 0, and since its
 * outward rounding is monotone, one record over the slots rounds to the same fp16 bounds as the writes that
 * filled them piece by piece would have; n_tokens == 0 leaves "no key" (min = +inf, max = -inf). */
gokv_status vkb_set_page_bytes(void *dev_, void *pool_, const gokv_layout *L, int32_t page, const void *bytes,
                               int32_t n_tokens) {
    vkb_device *d = dev_;
    vkb_pool *p = pool_;
    const char *op = "gokv_pool_set_page_bytes";
    VkPipeline bounds_pl = VK_NULL_HANDLE;
    if (L->key_bounds) {
        gokv_status st = vkb_get_pipeline(d, "store_bounds", p->spec, &bounds_pl);
        if (st) return st;
    }
    const uint64_t meta_w = (L->page_bytes + 3u) / 4u;
    vkb_call c;
    gokv_status st = vkb_call_begin(d, p, (meta_w + 3u) * 4u, 0, 0, &c);
    if (st) return st;
    memcpy(c.up, bytes, L->page_bytes);
    const VkBufferCopy region = {.srcOffset = 0, .dstOffset = (VkDeviceSize)page * L->page_bytes, .size = L->page_bytes};
    vkCmdCopyBuffer(c.cmd, d->up.buf, p->pages.buf, 1, &region);
    if (bounds_pl) {
        uint32_t *meta = (uint32_t *)c.up + meta_w;
        meta[0] = (uint32_t)page;
        meta[1] = 0u;
        meta[2] = (uint32_t)n_tokens;
        vkb_cmd_barrier(&c);
        const uint64_t items = (uint64_t)L->n_kv_heads * (uint64_t)L->d_k / 2u;
        const bounds_push push = {(uint32_t)meta_w, p->bounds_w, 0u, (uint32_t)items};
        vkb_dispatch_linear(&c, bounds_pl, &push, sizeof push, items, p->spec[VKB_SPEC_WG_SIZE]);
    }
    st = vkb_call_submit(&c, op);
    vkb_call_end(&c);
    return st;
}

gokv_status vkb_set_slot_bytes(void *dev_, void *pool_, const gokv_layout *L, int32_t slot, const void *bytes) {
    vkb_device *d = dev_;
    vkb_pool *p = pool_;
    vkb_call c;
    gokv_status st = vkb_call_begin(d, p, L->ring_bytes, 0, 0, &c);
    if (st) return st;
    memcpy(c.up, bytes, L->ring_bytes);
    const VkBufferCopy region = {.srcOffset = 0, .dstOffset = (VkDeviceSize)slot * L->ring_bytes, .size = L->ring_bytes};
    vkCmdCopyBuffer(c.cmd, d->up.buf, p->ring.buf, 1, &region);
    st = vkb_call_submit(&c, "gokv_pool_set_slot_bytes");
    vkb_call_end(&c);
    return st;
}
