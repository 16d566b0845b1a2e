/*
 * mtl_emu_backend.c: the Metal module's backend table, "metal", with its kernels run on the CPU by the SIMT
 * emulator (native/metal/emu/README.md): where there is no Mac (Linux, CI), the unchanged .metal sources
 * compiled as C++ against the MSL shim. The ops are the GPU dispatch plan's (native/gpu), exactly as the
 * macOS host runs them; this file holds the slots, the pools' buffers and the test hooks. The device,
 * its caps and its buffers are mtl_emu_device.cc's, the plan's gpu_ops mtl_emu_exec.cc's.
 *
 * An emulator is for checking kernels, not for running models: open it by name. The table is marked
 * emulated, so "auto" never picks it.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "gokv_metal.h"
#include "mtl_emu_internal.h"

/* ---- test hooks ---- */

static atomic_int g_fault[2]; /* per GOKV_FAULT_* site: 0, or the code the next submit / allocation fails with */

/* Backend slot inject_fault: site is a validated GOKV_FAULT_* index; any nonzero code arms it (submit: the
 * command buffer fails and the device is lost; allocation: out of memory). */
static gokv_status inject_fault(int32_t site, int32_t code) {
    atomic_store(&g_fault[site], code);
    return GOKV_OK;
}

int32_t mtl_emu_take_fault(int32_t site) { return atomic_exchange(&g_fault[site], 0); }

/* ---- pools ---- */

static gokv_status pool_create(void *dev, const gokv_pool_desc *desc, const gokv_layout *L, void **impl) {
    mtl_emu_device *d = dev;
    const char *op = "gokv_pool_create";
    mtl_emu_pool *p = calloc(1, sizeof *p);
    if (!p) return gokv_set_error(GOKV_ENOMEM, "%s: metal: out of memory", op);
    gokv_status st = gpu_pool_init(&d->base, &p->base, desc, L);
    if (st) return free(p), st;
    const uint64_t page_bytes = (L->page_bytes + L->bounds_bytes) * (uint64_t)desc->n_pages; /* pages, then bounds */
    const uint64_t ring_bytes = L->ring_bytes * (uint64_t)desc->n_residual_slots;
    pthread_mutex_lock(&d->mu);
    st = d->lost ? gokv_set_error(GOKV_EDEVICE, "%s: metal: the device was lost; close it and open a new one", op)
                 : mtl_emu_buffer_reserve(&p->pages, page_bytes, op, "the pool's pages (use fewer pages per pool)");
    if (st == GOKV_OK && ring_bytes) st = mtl_emu_buffer_reserve(&p->rings, ring_bytes, op, "the pool's residual slots");
    pthread_mutex_unlock(&d->mu);
    if (st == GOKV_OK) st = gpu_pool_clear(&d->base, &p->base);
    if (st != GOKV_OK) {
        mtl_emu_buffer_free(&p->pages);
        mtl_emu_buffer_free(&p->rings);
        free(p);
        return st;
    }
    *impl = p;
    return GOKV_OK;
}

static void pool_destroy(void *dev, void *pool) {
    (void)dev;
    mtl_emu_pool *p = pool;
    if (!p) return;
    mtl_emu_buffer_free(&p->pages);
    mtl_emu_buffer_free(&p->rings);
    free(p);
}

/* ---- the backend table ---- */

static const gokv_backend g_metal_backend = {
    .name = "metal",
    .emulated = 1,
    .device_open = mtl_emu_device_open,
    .device_close = mtl_emu_device_close,
    .device_info = mtl_emu_device_info,
    .pool_create = pool_create,
    .pool_destroy = pool_destroy,
    GPU_PLAN_SLOTS,
    .measure = mtl_emu_measure,
    .inject_fault = inject_fault,
};

gokv_status gokv_metal_register(void) { return gokv_register_backend(&g_metal_backend); }
