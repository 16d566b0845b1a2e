/*
 * gokv_metal.h: the Metal module's registration (native/metal/README.md). One call adds the backend
 * "metal" to gokv's registry: on macOS the Metal host (native/metal/host), elsewhere the same kernels and
 * dispatch plan run on the CPU by the SIMT emulator (native/metal/emu), for tests; the emulated backend
 * reports itself as such in gokv_device_info (name and features) and is for tests: open it by name
 * ("metal"); it is marked emulated in its backend table, so "auto" never picks it.
 */
#ifndef GOKV_METAL_H
#define GOKV_METAL_H

#include "gokv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Registers the "metal" backend (idempotent). GOKV_ENOMEM when the registry is full. */
gokv_status gokv_metal_register(void);

#ifdef __cplusplus
}
#endif
#endif
