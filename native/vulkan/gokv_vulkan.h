/*
 * gokv_vulkan.h: the Vulkan module's entry points outside the backend table: registration (the Go
 * bridge calls it under `//go:build vulkan`, the native tests call it first) and the count of validation
 * messages. Page bytes, copy bandwidth and fault injection are slots of the table (gokv.h).
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

#ifdef __cplusplus
}
#endif
#endif
