/*
 * mtl_emu_internal.h: what the emulated Metal backend's files share (native/metal/emu/README.md). C and C++:
 * mtl_emu_backend.c (the backend table, pools, fault injection), mtl_emu_device.cc (device open, caps,
 * buffers, the environment, the measurement), mtl_emu_exec.cc (the plan's gpu_ops: pipelines, recording, running kernels on
 * native/simt).
 */
#ifndef GOKV_MTL_EMU_INTERNAL_H
#define GOKV_MTL_EMU_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "gpu_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Host memory standing in for an MTLBuffer (shared storage): size bytes at data, rounded up to 64, ending
 * right before an inaccessible guard page, so that a kernel reading or writing past a binding's end
 * faults instead of passing unseen. */
typedef struct mtl_emu_buffer {
    uint8_t *data;
    uint64_t size;     /* bytes usable (a multiple of 64) */
    void *map;         /* the mapping, guard page included */
    uint64_t map_bytes;
} mtl_emu_buffer;

typedef struct mtl_emu_exec mtl_emu_exec; /* mtl_emu_exec.cc: pipelines and the call being recorded */

typedef struct mtl_emu_device {
    gpu_device base; /* first: the plan's view */
    pthread_mutex_t mu; /* one call at a time (gpu_ops begin .. end), pools' buffers */
    int lost;           /* an injected submit failure: every later call is GOKV_EDEVICE */
    /* how the emulator runs kernels (the environment at open, README "Running") */
    int32_t order;       /* simt::RunOrder */
    uint64_t seed;       /* shuffled order: dispatch n uses seed + n */
    uint32_t os_threads; /* OS threads running threadgroups */
    uint64_t stack_bytes;
    mtl_emu_buffer up, scratch, down, dummy;
    mtl_emu_exec *exec;
} mtl_emu_device;

typedef struct mtl_emu_pool {
    gpu_pool base; /* first: the plan's view */
    mtl_emu_buffer pages, rings;
} mtl_emu_pool;

/* mtl_emu_device.cc */
gokv_status mtl_emu_device_open(const gokv_device_desc *desc, void **impl);
void mtl_emu_device_close(void *dev);
gokv_status mtl_emu_device_info(void *dev, gokv_device_info *out);
gokv_status mtl_emu_measure(void *dev, uint64_t bytes, gokv_device_ceilings *out);
/* Makes b hold at least bytes (contents not kept when it grows); op and what name the failure. */
gokv_status mtl_emu_buffer_reserve(mtl_emu_buffer *b, uint64_t bytes, const char *op, const char *what);
void mtl_emu_buffer_free(mtl_emu_buffer *b);

/* mtl_emu_exec.cc */
extern const gpu_ops mtl_emu_ops;
gokv_status mtl_emu_exec_create(mtl_emu_exec **out);
void mtl_emu_exec_destroy(mtl_emu_exec *e);

/* mtl_emu_backend.c: the armed fault code of site GOKV_FAULT_* (taken: disarmed), or 0. */
int32_t mtl_emu_take_fault(int32_t site);

#ifdef __cplusplus
}

namespace gokv_mtl_emu {
struct Entry;
// A pipeline running entry as it is (no kernel family involved), for the emulator's own tests: its
// threadgroup memory and specialization words given here.
gokv_status pipeline_for_entry(gpu_device *d, const Entry *entry, uint32_t tg_words, const uint32_t spec[GPU_SPEC_COUNT],
                               gpu_pipeline *out);
}  // namespace gokv_mtl_emu
#endif
#endif
