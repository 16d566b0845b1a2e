/*
 * gokv_sycl.h: the SYCL module's registration (native/sycl/README.md). One call adds the backend "sycl" to
 * gokv's registry: built with a SYCL 2020 compiler (oneAPI icpx -fsycl), it runs the kernels on Intel GPUs;
 * built with a plain C++17 compiler, the same host code and kernels run on the CPU through the SYCL shim of
 * native/sycl/emu and the SIMT emulator, for tests. The emulated backend says so in gokv_device_info (name
 * and features) and is marked emulated in its backend table, so "auto" never picks it: open it by name.
 */
#ifndef GOKV_SYCL_H
#define GOKV_SYCL_H

#include "gokv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Registers the "sycl" backend (idempotent). GOKV_ENOMEM when the registry is full. */
gokv_status gokv_sycl_register(void);

#ifdef __cplusplus
}
#endif
#endif
