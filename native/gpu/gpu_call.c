/*
 * gpu_call.c: the call helpers (through the module's gpu_ops), the grids a plan dispatches, and a pool's
 * specialization constants (gpu_plan.h).
 */
#include <stdio.h>
#include <string.h>

#include "gpu_internal.h"

/* ---- calls ---- */

gokv_status gpu_call_begin(gpu_device *d, gpu_pool *p, uint64_t up_bytes, uint64_t scratch_bytes, uint64_t down_bytes,
                           gpu_call *c) {
    memset(c, 0, sizeof *c);
    return d->ops->begin(d, p, up_bytes, scratch_bytes, down_bytes, c);
}

gokv_status gpu_get_pipeline(gpu_device *d, const char *name, const uint32_t spec[GPU_SPEC_COUNT], gpu_pipeline *out) {
    return d->ops->pipeline(d, name, spec, out);
}

void gpu_dispatch(gpu_call *c, gpu_pipeline pl, const void *push, uint32_t push_bytes, uint32_t gx, uint32_t gy,
                  uint32_t gz) {
    if (gx == 0 || gy == 0 || gz == 0) return;
    c->d->ops->dispatch(c, pl, push, push_bytes, gx, gy, gz);
}

void gpu_dispatch_linear(gpu_call *c, gpu_pipeline pl, const void *push, uint32_t push_bytes, uint64_t items,
                         uint32_t wg) {
    const uint64_t groups = (items + wg - 1) / wg;
    const uint32_t gx = groups < GPU_MAX_GRID ? (uint32_t)groups : GPU_MAX_GRID;
    if (gx) gpu_dispatch(c, pl, push, push_bytes, gx, (uint32_t)((groups + gx - 1) / gx), 1);
}

void gpu_dispatch_items(gpu_call *c, gpu_pipeline pl, const void *push, uint32_t push_bytes, int64_t n) {
    if (n <= 0) return;
    const uint32_t gx = n < (int64_t)GPU_MAX_GRID ? (uint32_t)n : GPU_MAX_GRID;
    gpu_dispatch(c, pl, push, push_bytes, gx, (uint32_t)((n + gx - 1) / gx), 1);
}

/* The bytes of binding b this call may touch: the pool's buffers whole, the staging buffers as asked for. */
static uint64_t binding_bytes(const gpu_call *c, int32_t b) {
    const gpu_pool *p = c->p;
    switch (b) {
    case GPU_PAGES: return p ? (uint64_t)(p->L.page_bytes + p->L.bounds_bytes) * (uint64_t)p->n_pages : 0;
    case GPU_RINGS: return p ? (uint64_t)p->L.ring_bytes * (uint64_t)p->n_slots : 0;
    case GPU_UP: return c->up_bytes;
    case GPU_SCRATCH: return c->scratch_bytes;
    case GPU_DOWN: return c->down_bytes;
    default: return 0;
    }
}

static int in_binding(const gpu_call *c, int32_t b, uint64_t off, uint64_t bytes) {
    const uint64_t n = binding_bytes(c, b);
    return off <= n && bytes <= n - off;
}

void gpu_copy(gpu_call *c, int32_t src, uint64_t src_off, int32_t dst, uint64_t dst_off, uint64_t bytes) {
    if (bytes == 0 || c->fault[0]) return;
    if (!in_binding(c, src, src_off, bytes) || !in_binding(c, dst, dst_off, bytes)) {
        snprintf(c->fault, sizeof c->fault, "copy of %llu bytes from binding %d at %llu to binding %d at %llu is outside them",
                 (unsigned long long)bytes, src, (unsigned long long)src_off, dst, (unsigned long long)dst_off);
        return;
    }
    c->d->ops->copy(c, src, src_off, dst, dst_off, bytes);
}

void gpu_fill(gpu_call *c, int32_t dst, uint64_t off, uint64_t bytes, uint32_t word) {
    if (bytes == 0 || c->fault[0]) return;
    if (!in_binding(c, dst, off, bytes) || off % 4u != 0) {
        snprintf(c->fault, sizeof c->fault, "fill of %llu bytes of binding %d at %llu is outside it or unaligned",
                 (unsigned long long)bytes, dst, (unsigned long long)off);
        return;
    }
    c->d->ops->fill(c, dst, off, bytes, word);
}

void gpu_barrier(gpu_call *c) { c->d->ops->barrier(c); }

/* A call with a fault is not submitted: gpu_call_end discards what it recorded, so it changes nothing. */
gokv_status gpu_call_submit(gpu_call *c, const char *op) {
    if (c->fault[0]) return gokv_set_error(GOKV_EDEVICE, "%s: %s", op, c->fault);
    return c->d->ops->submit(c, op);
}

void gpu_call_end(gpu_call *c) {
    if (c->d) c->d->ops->end(c);
    memset(c, 0, sizeof *c);
}

uint64_t gpu_word_limit(const gpu_device *d) {
    const uint64_t w = d->caps.max_binding_bytes / 4u;
    return w < UINT32_MAX ? w : UINT32_MAX;
}

/* ---- a pool's constants ---- */

void gpu_pool_spec(const gpu_device *d, const gokv_layout *L, uint32_t spec[GPU_SPEC_COUNT]) {
    memset(spec, 0, sizeof(uint32_t) * GPU_SPEC_COUNT);
    spec[GPU_SPEC_FORMAT] = (uint32_t)L->format;
    spec[GPU_SPEC_BITS] = (uint32_t)L->bits;
    spec[GPU_SPEC_GROUP] = (uint32_t)L->group;
    spec[GPU_SPEC_PAGE_SIZE] = (uint32_t)L->page_size;
    spec[GPU_SPEC_N_KV_HEADS] = (uint32_t)L->n_kv_heads;
    spec[GPU_SPEC_D_K] = (uint32_t)L->d_k;
    spec[GPU_SPEC_D_V] = (uint32_t)L->d_v;
    spec[GPU_SPEC_V_IS_K_PREFIX] = (uint32_t)L->v_is_k_prefix;
    spec[GPU_SPEC_KIVI] = (uint32_t)L->kivi;
    spec[GPU_SPEC_RING_ROWS] = (uint32_t)L->ring_rows;
    spec[GPU_SPEC_PAGE_WORDS] = (uint32_t)(L->page_bytes / 4u);
    spec[GPU_SPEC_K_CODES_W] = (uint32_t)(L->k_codes / 4u);
    spec[GPU_SPEC_K_SCALE_H] = (uint32_t)(L->k_scale / 2u);
    spec[GPU_SPEC_K_BIAS_H] = (uint32_t)(L->k_bias / 2u);
    spec[GPU_SPEC_V_CODES_W] = (uint32_t)(L->v_codes / 4u);
    spec[GPU_SPEC_V_SCALE_H] = (uint32_t)(L->v_scale / 2u);
    spec[GPU_SPEC_V_BIAS_H] = (uint32_t)(L->v_bias / 2u);
    spec[GPU_SPEC_K_CODES_HEAD_W] = (uint32_t)(L->k_codes_head / 4u);
    spec[GPU_SPEC_K_SB_HEAD_H] = (uint32_t)(L->k_sb_head / 2u);
    spec[GPU_SPEC_V_CODES_HEAD_W] = (uint32_t)(L->v_codes_head / 4u);
    spec[GPU_SPEC_V_SB_HEAD_H] = (uint32_t)(L->v_sb_head / 2u);
    spec[GPU_SPEC_K_ROW_W] = (uint32_t)(L->k_row_bytes / 4u);
    spec[GPU_SPEC_V_ROW_W] = (uint32_t)(L->v_row_bytes / 4u);
    spec[GPU_SPEC_K_GROUPS] = (uint32_t)L->k_groups;
    spec[GPU_SPEC_V_GROUPS] = (uint32_t)L->v_groups;
    spec[GPU_SPEC_RING_K_H] = (uint32_t)(L->ring_k / 2u);
    spec[GPU_SPEC_RING_V_H] = (uint32_t)(L->ring_v / 2u);
    spec[GPU_SPEC_RING_HALVES] = (uint32_t)(L->ring_bytes / 2u);
    spec[GPU_SPEC_K_TILED] = (uint32_t)L->k_tiled;
    spec[GPU_SPEC_WG_SIZE] = d->caps.wg_size;
    spec[GPU_SPEC_SUBGROUP_SIZE] = d->caps.subgroup_size;
}
