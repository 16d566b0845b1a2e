/*
 * gpu_pool.c: the plan's pool operations (gpu_plan.h): the checks before a module allocates a pool, the
 * clearing after (pages and rings zero, so untouched pages read as zeros on every backend; with key_bounds
 * every page's Quest key bounds "no key", by store_bounds), page and slot copies (a page's key bounds go with
 * it), and page and slot bytes read and written through the call's up and down buffers.
 */
#include <string.h>

#include "gpu_internal.h"

GPU_PUSH_STRUCT(bounds_push, GOKV_PUSH_STORE_BOUNDS); /* store_bounds */

gokv_status gpu_pool_init(gpu_device *d, gpu_pool *p, const gokv_pool_desc *desc, const gokv_layout *L) {
    const char *op = "gokv_pool_create";
    const uint64_t page_bytes = (L->page_bytes + L->bounds_bytes) * (uint64_t)desc->n_pages; /* pages, then bounds */
    const uint64_t ring_bytes = L->ring_bytes * (uint64_t)desc->n_residual_slots;
    if (page_bytes + ring_bytes > d->caps.memory_bytes)
        return gokv_set_error(GOKV_ENOMEM,
                              "%s: %s: %d pages of %llu bytes (+ %llu bytes of residual slots) need %llu bytes, "
                              "more than the device's %llu bytes of memory",
                              op, d->backend, desc->n_pages, (unsigned long long)L->page_bytes,
                              (unsigned long long)ring_bytes, (unsigned long long)(page_bytes + ring_bytes),
                              (unsigned long long)d->caps.memory_bytes);
    memset(p, 0, sizeof *p);
    p->L = *L;
    p->n_pages = desc->n_pages;
    p->n_slots = desc->n_residual_slots;
    p->bounds_w = (uint32_t)(L->page_bytes / 4u * (uint64_t)desc->n_pages);
    gpu_pool_spec(d, L, p->spec);
    if (L->key_bounds && L->bounds_bytes * (uint64_t)desc->n_pages / 4u / 2u > UINT32_MAX)
        return gokv_set_error(GOKV_ENOMEM, "%s: %s: key bounds of %d pages exceed 2^32 invocations", op, d->backend,
                              desc->n_pages);
    if (L->key_bounds) { /* compiled now, so that a pool is only allocated when it can be cleared */
        gpu_pipeline pl;
        gokv_status st = gpu_get_pipeline(d, "store_bounds", p->spec, &pl);
        if (st) return st;
    }
    return GOKV_OK;
}

gokv_status gpu_pool_clear(gpu_device *d, gpu_pool *p) {
    const char *op = "gokv_pool_create";
    const gokv_layout *L = &p->L;
    gpu_pipeline bounds_pl = NULL;
    gokv_status st = L->key_bounds ? gpu_get_pipeline(d, "store_bounds", p->spec, &bounds_pl) : GOKV_OK;
    if (st) return st;
    gpu_call c;
    if ((st = gpu_call_begin(d, p, 0, 0, 0, &c))) return st;
    const uint64_t ring_bytes = L->ring_bytes * (uint64_t)p->n_slots;
    gpu_fill(&c, GPU_PAGES, 0, (L->page_bytes + L->bounds_bytes) * (uint64_t)p->n_pages, 0);
    if (ring_bytes) gpu_fill(&c, GPU_RINGS, 0, ring_bytes, 0);
    if (bounds_pl) { /* every page's bounds: "no key yet" (min = +inf, max = -inf) */
        gpu_barrier(&c);
        const uint64_t items = (uint64_t)p->n_pages * (uint64_t)L->n_kv_heads * (uint64_t)L->d_k / 2u;
        const bounds_push push = {0, p->bounds_w, 1u, (uint32_t)items};
        gpu_dispatch_linear(&c, bounds_pl, &push, sizeof push, items, p->spec[GPU_SPEC_WG_SIZE]);
    }
    st = gpu_call_submit(&c, op);
    gpu_call_end(&c);
    return st;
}

gokv_status gpu_pool_copy(gpu_device *d, gpu_pool *p, const gokv_copy_desc *desc) {
    const gokv_layout *L = &p->L;
    if (desc->n_pages == 0 && desc->n_slots == 0) return GOKV_OK;
    gpu_call c;
    gokv_status st = gpu_call_begin(d, p, 0, 0, 0, &c);
    if (st) return st;
    for (int32_t i = 0; i < desc->n_pages; i++)
        gpu_copy(&c, GPU_PAGES, (uint64_t)desc->src_pages[i] * L->page_bytes, GPU_PAGES,
                 (uint64_t)desc->dst_pages[i] * L->page_bytes, L->page_bytes);
    for (int32_t i = 0; L->key_bounds && i < desc->n_pages; i++) /* a page's key bounds go with it */
        gpu_copy(&c, GPU_PAGES, (uint64_t)p->bounds_w * 4u + (uint64_t)desc->src_pages[i] * L->bounds_bytes, GPU_PAGES,
                 (uint64_t)p->bounds_w * 4u + (uint64_t)desc->dst_pages[i] * L->bounds_bytes, L->bounds_bytes);
    for (int32_t i = 0; L->ring_bytes * (uint64_t)p->n_slots > 0 && i < desc->n_slots; i++)
        gpu_copy(&c, GPU_RINGS, (uint64_t)desc->src_slots[i] * L->ring_bytes, GPU_RINGS,
                 (uint64_t)desc->dst_slots[i] * L->ring_bytes, L->ring_bytes);
    st = gpu_call_submit(&c, "gokv_pool_copy");
    gpu_call_end(&c);
    return st;
}

/* `bytes` at `offset` of binding src, copied through the down buffer. */
static gokv_status download(gpu_device *d, gpu_pool *p, int32_t src, uint64_t offset, uint64_t bytes, void *out,
                            const char *op) {
    gpu_call c;
    gokv_status st = gpu_call_begin(d, p, 0, 0, bytes, &c);
    if (st) return st;
    gpu_copy(&c, src, offset, GPU_DOWN, 0, bytes);
    st = gpu_call_submit(&c, op);
    if (!st) memcpy(out, c.down, bytes);
    gpu_call_end(&c);
    return st;
}

gokv_status gpu_page_bytes(gpu_device *d, gpu_pool *p, int32_t page, void *out) {
    return download(d, p, GPU_PAGES, (uint64_t)page * p->L.page_bytes, p->L.page_bytes, out, "gokv_pool_page_bytes");
}

gokv_status gpu_slot_bytes(gpu_device *d, gpu_pool *p, int32_t slot, void *out) {
    return download(d, p, GPU_RINGS, (uint64_t)slot * p->L.ring_bytes, p->L.ring_bytes, out, "gokv_pool_slot_bytes");
}

/* The bytes (validated by the core) go through the up buffer into the pool. With key_bounds, store_bounds
 * then recomputes the page's bounds from the stored keys of slots [0, n_tokens) as one record (page, 0,
 * n_tokens): it starts afresh at slot 0, and since its outward rounding is monotone, one record over the
 * slots rounds to the same fp16 bounds as the writes that filled them piece by piece would have;
 * n_tokens == 0 leaves "no key" (min = +inf, max = -inf). */
gokv_status gpu_set_page_bytes(gpu_device *d, gpu_pool *p, int32_t page, const void *bytes, int32_t n_tokens) {
    const gokv_layout *L = &p->L;
    gpu_pipeline bounds_pl = NULL;
    if (L->key_bounds) {
        gokv_status st = gpu_get_pipeline(d, "store_bounds", p->spec, &bounds_pl);
        if (st) return st;
    }
    const uint64_t meta_w = (L->page_bytes + 3u) / 4u;
    gpu_call c;
    gokv_status st = gpu_call_begin(d, p, (meta_w + 3u) * 4u, 0, 0, &c);
    if (st) return st;
    memcpy(c.up, bytes, L->page_bytes);
    gpu_copy(&c, GPU_UP, 0, GPU_PAGES, (uint64_t)page * L->page_bytes, L->page_bytes);
    if (bounds_pl) {
        uint32_t *meta = (uint32_t *)c.up + meta_w;
        meta[0] = (uint32_t)page;
        meta[1] = 0u;
        meta[2] = (uint32_t)n_tokens;
        gpu_barrier(&c);
        const uint64_t items = (uint64_t)L->n_kv_heads * (uint64_t)L->d_k / 2u;
        const bounds_push push = {(uint32_t)meta_w, p->bounds_w, 0u, (uint32_t)items};
        gpu_dispatch_linear(&c, bounds_pl, &push, sizeof push, items, p->spec[GPU_SPEC_WG_SIZE]);
    }
    st = gpu_call_submit(&c, "gokv_pool_set_page_bytes");
    gpu_call_end(&c);
    return st;
}

gokv_status gpu_set_slot_bytes(gpu_device *d, gpu_pool *p, int32_t slot, const void *bytes) {
    const gokv_layout *L = &p->L;
    gpu_call c;
    gokv_status st = gpu_call_begin(d, p, L->ring_bytes, 0, 0, &c);
    if (st) return st;
    memcpy(c.up, bytes, L->ring_bytes);
    gpu_copy(&c, GPU_UP, 0, GPU_RINGS, (uint64_t)slot * L->ring_bytes, L->ring_bytes);
    st = gpu_call_submit(&c, "gokv_pool_set_slot_bytes");
    gpu_call_end(&c);
    return st;
}
