/* The emulator's C entry point, for C backend wrappers: launch a kernel (a C function, or a C++ one behind
 * it) and get the rule violations back as a message. Nothing aborts or throws across it. */
#ifndef GOKV_SIMT_C_H
#define GOKV_SIMT_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GOKV_SIMT_OK 0
#define GOKV_SIMT_ERROR 1 /* invalid dispatch, a broken rule, an exception or no memory: see the message */

#define GOKV_SIMT_ORDER_FORWARD 0
#define GOKV_SIMT_ORDER_REVERSE 1
#define GOKV_SIMT_ORDER_SHUFFLED 2

typedef struct gokv_simt_dispatch {
  uint32_t struct_size; /* sizeof(gokv_simt_dispatch) */
  uint32_t grid[3];     /* threadgroups per grid, x y z */
  uint32_t threads[3];  /* threads per threadgroup */
  uint32_t simd_width;
  int32_t order; /* GOKV_SIMT_ORDER_* */
  uint32_t os_threads; /* 0 or 1: every group on the calling thread */
  uint64_t seed;
  uint64_t threadgroup_memory_bytes;
  uint64_t stack_bytes; /* 0: the default */
} gokv_simt_dispatch;

typedef void (*gokv_simt_kernel)(void *user);

/* Runs kernel(user) once per thread. On error, writes a NUL-terminated message (truncated to
 * message_size) when message is not NULL. */
int32_t gokv_simt_launch(const gokv_simt_dispatch *dispatch, gokv_simt_kernel kernel, void *user, char *message,
                         size_t message_size);

#ifdef __cplusplus
}
#endif

#endif
