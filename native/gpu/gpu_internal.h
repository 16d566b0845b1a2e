/*
 * gpu_internal.h: what the plan's files share (gpu_call.c: the call helpers and the pool's constants;
 * gpu_pool.c: pool checks, clearing, page copies, page bytes; gpu_store.c: write and read; gpu_attend.c:
 * attention, Quest, mass, the dequantizing baseline). Not for the modules: they see gpu_plan.h only.
 */
#ifndef GOKV_GPU_INTERNAL_H
#define GOKV_GPU_INTERNAL_H

#include <stdint.h>

#include "gpu_plan.h"
#include "gpu_push.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Push constants: GPU_PUSH_STRUCT(tag, LIST) declares the C struct of a gpu_push.h field list and checks
 * that it is laid out as the kernels' block (4-byte fields, no padding: std430 in GLSL, the same in MSL)
 * and fits GPU_PUSH_BYTES. */
#define GPU_PUSH_ONE(type, name) +1
#if defined(__cplusplus)
#define GPU_PUSH_ASSERT static_assert
#else
#define GPU_PUSH_ASSERT _Static_assert
#endif
#define GPU_PUSH_STRUCT(tag, LIST)                                                                         \
    typedef struct tag {                                                                                   \
        LIST(PUSH_FIELD)                                                                                   \
    } tag;                                                                                                 \
    GPU_PUSH_ASSERT(sizeof(tag) == 4u * (0 LIST(GPU_PUSH_ONE)), #tag ": 4-byte fields, laid out as std430"); \
    GPU_PUSH_ASSERT(sizeof(tag) <= GPU_PUSH_BYTES, #tag ": larger than GPU_PUSH_BYTES")

#define GPU_NONE 0xffffffffu /* "none" in a table word or a push constant offset */
#define GPU_MAX_GRID 65535u  /* workgroups per grid dimension that every device allows */

/* The most 4-byte words one binding of a call may hold (caps.max_binding_bytes, at most 2^32 - 1). */
uint64_t gpu_word_limit(const gpu_device *d);

/* n workgroups as a 2D grid (x at most GPU_MAX_GRID); kernels linearize y * groups_x + x and skip the tail. */
void gpu_dispatch_items(gpu_call *c, gpu_pipeline pl, const void *push, uint32_t push_bytes, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
