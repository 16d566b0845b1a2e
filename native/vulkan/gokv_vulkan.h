/*
 * gokv_vulkan.h: the Vulkan module's entry points outside the backend table: registration (the Go
 * bridge calls it under `//go:build vulkan`, the native tests call it first) and test hooks.
 *
 * Environment (read when a device is opened):
 *   GOKV_VULKAN_VALIDATION=1  enables VK_LAYER_KHRONOS_validation with a debug messenger; every message
 *                             goes to the gokv log (warning or error level) and is counted. Opening fails
 *                             if the layer is not installed.
 *   GOKV_VULKAN_WG, GOKV_VULKAN_SUBGROUP, GOKV_VULKAN_CHUNK: tuning knobs (README "Tuning").
 */
#ifndef GOKV_VULKAN_H
#define GOKV_VULKAN_H

#include "gokv_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

const gokv_backend *gokv_vulkan_backend(void);
/* Registers the "vulkan" backend (idempotent). */
gokv_status gokv_vulkan_register(void);

/* Validation messages (warning or error severity) received since the process started. */
uint64_t gokv_vulkan_validation_messages(void);

/* The device's copy bandwidth in GB/s: bytes read plus bytes written per second by vkCmdCopyBuffer
 * between two device-local buffers of `bytes` each (clamped to the device's limits), timed with GPU
 * timestamps, best of three rounds. The floor `gokv bench --backend vulkan` reports against. */
gokv_status gokv_vulkan_measure_copy_gbps(gokv_device *dev, uint64_t bytes, double *gbps);

/* Test hooks: the next vkQueueSubmit (site 0) or vkAllocateMemory (site 1) of any device fails with
 * vk_result (e.g. VK_ERROR_DEVICE_LOST = -4, VK_ERROR_OUT_OF_DEVICE_MEMORY = -2) instead of running. */
enum { GOKV_VULKAN_INJECT_SUBMIT = 0, GOKV_VULKAN_INJECT_ALLOC = 1 };
void gokv_vulkan_test_inject(int32_t site, int32_t vk_result);

/* Test hook: copies page `page` of a Vulkan pool (page_bytes of its layout) to out, so that tests can hold
 * what the shaders stored against bridge/gokv_layout.h and the CPU backend's pages byte by byte. */
gokv_status gokv_vulkan_test_page_bytes(gokv_pool *pool, int32_t page, void *out);

#ifdef __cplusplus
}
#endif
#endif
