/*
 * vk_pool.c: page pools (one device-local buffer of pages and one of KIVI rings, zero-filled at creation) and
 * the backend slots pool_create, pool_destroy, pool_copy, page_bytes and slot_bytes.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

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
    const uint64_t page_bytes = L->page_bytes * (uint64_t)desc->n_pages;
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
    vkb_pool_spec(d, L, p->spec);
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
