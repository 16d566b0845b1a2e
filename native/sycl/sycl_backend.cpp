// sycl_backend.cpp: the SYCL module's backend table, "sycl" (docs/architecture.md §7, native/sycl/README.md).
// The ops are the GPU dispatch plan's (native/gpu); this file holds the slots, the pools' USM storage and
// the test hooks. Devices are sycl_device.cpp's, the plan's gpu_ops sycl_call.cpp's.
//
// Built against the SYCL shim (GOKV_SYCL_EMULATED), the same code runs the kernels on the CPU under
// native/simt: the table is then marked emulated, so "auto" never picks it.
#include <atomic>
#include <new>

#include "gokv_sycl.h"
#include "sycl_internal.hpp"

namespace gokv_sycl {

namespace {

std::atomic<int32_t> g_fault[2]; // per GOKV_FAULT_* site: 0, or the code the next submit / allocation fails with

// Backend slot inject_fault: site is a validated GOKV_FAULT_* index. SYCL has no status codes of its own to
// inject, so any nonzero code arms a site (allocation: out of memory; submit: the call fails and the device
// is lost), and the message names it.
gokv_status inject_fault(int32_t site, int32_t code) {
    g_fault[site].store(code);
    return GOKV_OK;
}

gokv_status pool_create(void *dev, const gokv_pool_desc *desc, const gokv_layout *L, void **impl) {
    const char *op = "gokv_pool_create";
    sycl_device *d = static_cast<sycl_device *>(dev);
    device_state &s = *d->s;
    sycl_pool *p = new (std::nothrow) sycl_pool{};
    if (!p) return gokv_set_error(GOKV_ENOMEM, "%s: sycl: out of memory", op);
    gokv_status st = gpu_pool_init(&d->base, &p->base, desc, L);
    if (st) {
        delete p;
        return st;
    }
    const uint64_t page_bytes = (L->page_bytes + L->bounds_bytes) * (uint64_t)desc->n_pages; // pages, then bounds
    const uint64_t ring_bytes = L->ring_bytes * (uint64_t)desc->n_residual_slots;
    {
        std::lock_guard<std::mutex> lock(s.mu);
        st = s.lost ? gokv_set_error(GOKV_EDEVICE, "%s: sycl: the device was lost; close it and open a new one", op)
                    : reserve(s.q, p->pages, page_bytes, false, op, "the pool's pages (use fewer pages per pool)");
        if (st == GOKV_OK && ring_bytes) st = reserve(s.q, p->rings, ring_bytes, false, op, "the pool's residual slots");
    }
    if (st == GOKV_OK) st = gpu_pool_clear(&d->base, &p->base);
    if (st != GOKV_OK) {
        release(s.q, p->pages);
        release(s.q, p->rings);
        delete p;
        return st;
    }
    *impl = p;
    return GOKV_OK;
}

void pool_destroy(void *dev, void *pool) {
    sycl_pool *p = static_cast<sycl_pool *>(pool);
    if (!p) return;
    device_state &s = *static_cast<sycl_device *>(dev)->s;
    std::lock_guard<std::mutex> lock(s.mu); // no call of this device is running on the pool's memory
    release(s.q, p->pages);
    release(s.q, p->rings);
    delete p;
}

const gokv_backend g_sycl_backend = {
    .name = "sycl",
#ifdef GOKV_SYCL_EMULATED
    .emulated = 1,
#else
    .emulated = 0,
#endif
    .device_open = device_open,
    .device_close = device_close,
    .device_info = device_info,
    .pool_create = pool_create,
    .pool_destroy = pool_destroy,
    GPU_PLAN_SLOTS,
    .measure = measure,
    .inject_fault = inject_fault,
};

} // namespace

int32_t take_fault(int32_t site) { return g_fault[site].exchange(0); }

} // namespace gokv_sycl

extern "C" gokv_status gokv_sycl_register(void) { return gokv_register_backend(&gokv_sycl::g_sycl_backend); }
