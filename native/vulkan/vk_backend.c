/*
 * vk_backend.c: the Vulkan module's backend table (docs/architecture.md §7), its test hooks (fault injection)
 * and the mapping of Vulkan errors to statuses. The ops themselves (write, read, copy, attend, Quest, page
 * bytes) are the GPU dispatch plan's (native/gpu): the slots below pass it the device and pool, and the
 * module supplies the plan's gpu_ops. The module's files: vk_instance.c (instance, validation messages,
 * device selection and tuning into gpu_caps, device open, close and info), vk_memory.c (buffers),
 * vk_pipeline.c (the pipeline cache: embedded SPIR-V specialized per pool layout), vk_submit.c (gpu_ops: one
 * call's command recording and submission), vk_pool.c (pool buffers), vk_bench.c (measurements);
 * vk_internal.h declares what crosses them.
 *
 * Choices:
 * - One compute queue and one command buffer per device. Every ABI call records, submits and waits (the
 *   ABI is synchronous and never retains caller buffers); a mutex serializes the calls of one device.
 * - Pools are one device-local buffer of pages (and one of KIVI rings), zero-filled at creation, bound
 *   whole to the shaders, which address them in 32-bit words: the layout is bridge/gokv_layout.h's, so a
 *   page means the same bytes on every backend.
 * - Inputs (q, k, v, page tables) go through a host-visible upload buffer and outputs through a
 *   host-visible download buffer; split-K partials and baseline copies live in a device-local scratch
 *   buffer. All three grow on demand and are reused.
 * - Subgroup sizes are queried, never assumed; where VK_EXT_subgroup_size_control (core in 1.3) lets a
 *   compute pipeline require a size, the tuning's size is requested (AMD: wave32 by default).
 */
#define _GNU_SOURCE
#include <stdatomic.h>

#include "vk_internal.h"

/* ---- test hooks ---- */

static atomic_int g_inject_result[2]; /* 0: none, else the VkResult the next submit / allocation returns */

/* Backend slot inject_fault: site is a validated GOKV_FAULT_* index. */
static gokv_status inject_fault(int32_t site, int32_t vk_result) {
    atomic_store(&g_inject_result[site], vk_result);
    return GOKV_OK;
}

VkResult vkb_take_injected(int site) { return (VkResult)atomic_exchange(&g_inject_result[site], 0); }

/* ---- errors ---- */

const char *vkb_result_name(VkResult r) {
    switch (r) {
#define R_(x) case x: return #x;
        R_(VK_SUCCESS) R_(VK_NOT_READY) R_(VK_TIMEOUT) R_(VK_INCOMPLETE) R_(VK_ERROR_OUT_OF_HOST_MEMORY)
        R_(VK_ERROR_OUT_OF_DEVICE_MEMORY) R_(VK_ERROR_INITIALIZATION_FAILED) R_(VK_ERROR_DEVICE_LOST)
        R_(VK_ERROR_MEMORY_MAP_FAILED) R_(VK_ERROR_LAYER_NOT_PRESENT) R_(VK_ERROR_EXTENSION_NOT_PRESENT)
        R_(VK_ERROR_FEATURE_NOT_PRESENT) R_(VK_ERROR_INCOMPATIBLE_DRIVER) R_(VK_ERROR_TOO_MANY_OBJECTS)
        R_(VK_ERROR_FORMAT_NOT_SUPPORTED) R_(VK_ERROR_FRAGMENTED_POOL) R_(VK_ERROR_OUT_OF_POOL_MEMORY)
        R_(VK_ERROR_INVALID_SHADER_NV) R_(VK_ERROR_UNKNOWN)
#undef R_
    default: return "VkResult";
    }
}

gokv_status vkb_error(vkb_device *d, VkResult r, const char *op, const char *what) {
    gokv_status st;
    const char *hint = "";
    switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY:
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
    case VK_ERROR_OUT_OF_POOL_MEMORY:
    case VK_ERROR_FRAGMENTED_POOL: st = GOKV_ENOMEM; break;
    case VK_ERROR_INITIALIZATION_FAILED:
    case VK_ERROR_INCOMPATIBLE_DRIVER:
    case VK_ERROR_LAYER_NOT_PRESENT:
    case VK_ERROR_EXTENSION_NOT_PRESENT:
    case VK_ERROR_FEATURE_NOT_PRESENT: st = GOKV_ENODEV; break;
    case VK_ERROR_DEVICE_LOST:
    case VK_TIMEOUT:
        st = GOKV_EDEVICE;
        hint = "; the device is lost: close it and open a new one";
        if (d) d->lost = 1;
        break;
    default: st = GOKV_EDEVICE; break;
    }
    gokv_log(GOKV_LOG_ERROR, "vulkan", op, "%s failed: %s (%d)%s", what, vkb_result_name(r), (int)r, hint);
    return gokv_set_error(st, "%s: vulkan: %s failed: %s (%d)%s", op, what, vkb_result_name(r), (int)r, hint);
}


/* ---- the backend table ---- */

static const gokv_backend g_vulkan_backend = {
    .name = "vulkan",
    .device_open = vkb_device_open,
    .device_close = vkb_device_close,
    .device_info = vkb_device_info,
    .pool_create = vkb_pool_create,
    .pool_destroy = vkb_pool_destroy,
    GPU_PLAN_SLOTS,
    .measure = vkb_measure,
    .inject_fault = inject_fault,
};

const gokv_backend *gokv_vulkan_backend(void) { return &g_vulkan_backend; }

gokv_status gokv_vulkan_register(void) { return gokv_register_backend(&g_vulkan_backend); }
