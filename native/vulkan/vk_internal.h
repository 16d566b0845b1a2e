/*
 * vk_internal.h: the Vulkan module's internals, shared by its host files (vk_backend.c: the backend table,
 * test hooks, error mapping; vk_instance.c: instance, device selection and tuning, device open/close/info;
 * vk_memory.c: buffers; vk_pipeline.c: the pipeline cache; vk_submit.c: command recording and submission;
 * vk_pool.c: pools, page copies and page bytes; vk_store.c: quantize-on-write and dequantize-on-read;
 * vk_attend.c: fused attention; vk_bench.c: measurements). Not part of the ABI.
 *
 * Execution model: every ABI call records one command buffer on the device's single compute queue, submits
 * it and waits for it (the ABI is synchronous, and caller buffers are never retained). A call goes:
 *
 *     vkb_call c;
 *     st = vkb_call_begin(dev, pool, up_bytes, scratch_bytes, down_bytes, &c);   // locks the device
 *     if (st) return st;
 *     ... fill c.up (host-visible, mapped, coherent) with inputs and metadata ...
 *     vkb_cmd_dispatch(&c, pipeline, &push, sizeof push, gx, gy, 1);
 *     vkb_cmd_barrier(&c);                      // between dependent dispatches
 *     st = vkb_call_submit(&c);                  // ends, submits, waits
 *     if (!st) ... read c.down (host-visible, mapped) ...
 *     vkb_call_end(&c);                          // unlocks; always called after a successful begin
 *
 * Every shader sees one descriptor set (set 0) with five storage buffers, bound by vkb_call_begin:
 *     binding 0  pages    the pool's page storage (device-local), page p at byte p * L.page_bytes
 *                         (then, with key_bounds, the pages' key bounds from word vkb_pool.bounds_w)
 *     binding 1  rings    the pool's KIVI residual slots (device-local; a small dummy when there are none)
 *     binding 2  up       this call's inputs (host-visible), up_bytes
 *     binding 3  scratch  this call's device-local scratch (split-K partials, baseline copies), scratch_bytes
 *     binding 4  down     this call's outputs (host-visible), down_bytes
 * Byte offsets inside up/scratch/down are the caller's business (pass them as push constants, in 4-byte
 * words). Push constants: at most VKB_PUSH_BYTES bytes, one range for all stages.
 *
 * Shaders are GLSL compute files in shaders/ (compiled to SPIR-V by CMake, embedded, looked up by file
 * name without ".comp"). Specialization constants: constant_id i takes spec[i] (see VKB_SPEC_*, filled
 * from the pool's layout by vkb_pool_spec and then per call by the op); shaders/common.glsl declares them.
 */
#ifndef GOKV_VK_INTERNAL_H
#define GOKV_VK_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <vulkan/vulkan.h>

#include "gokv_backend.h"
#include "gokv_vulkan.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VKB_PUSH_BYTES 128u
#define VKB_N_BINDINGS 5u

/* Push constants: the field lists of shaders/push.glsl, shared with the shaders. VKB_PUSH_STRUCT(tag, LIST)
 * declares the C struct of a list and checks that it is laid out as the shader's std430 block (4-byte
 * fields, no padding) and fits VKB_PUSH_BYTES. */
#include "shaders/push.glsl"
#define VKB_PUSH_FIELD(type, name) type name;
#define VKB_PUSH_ONE(type, name) +1
#if defined(__cplusplus)
#define VKB_PUSH_ASSERT static_assert
#else
#define VKB_PUSH_ASSERT _Static_assert
#endif
#define VKB_PUSH_STRUCT(tag, LIST)                                                                         \
    typedef struct tag {                                                                                   \
        LIST(VKB_PUSH_FIELD)                                                                               \
    } tag;                                                                                                 \
    VKB_PUSH_ASSERT(sizeof(tag) == 4u * (0 LIST(VKB_PUSH_ONE)), #tag ": 4-byte fields, laid out as std430"); \
    VKB_PUSH_ASSERT(sizeof(tag) <= VKB_PUSH_BYTES, #tag ": larger than VKB_PUSH_BYTES")

/* Specialization constant ids (constant_id in GLSL = the enum value). Keep in sync with common.glsl. */
enum {
    VKB_SPEC_FORMAT = 0,     /* GOKV_FORMAT_* */
    VKB_SPEC_BITS = 1,       /* 32, 16, 8, 4, 2 */
    VKB_SPEC_GROUP = 2,      /* g (0 for f32/f16) */
    VKB_SPEC_PAGE_SIZE = 3,  /* P */
    VKB_SPEC_N_KV_HEADS = 4,
    VKB_SPEC_D_K = 5,
    VKB_SPEC_D_V = 6,
    VKB_SPEC_V_IS_K_PREFIX = 7,
    VKB_SPEC_KIVI = 8,
    VKB_SPEC_RING_ROWS = 9,  /* R + g (KIVI) */
    VKB_SPEC_PAGE_WORDS = 10,      /* page_bytes / 4 */
    VKB_SPEC_K_CODES_W = 11,       /* section offsets inside a page: codes in words, scale/bias in halves */
    VKB_SPEC_K_SCALE_H = 12,
    VKB_SPEC_K_BIAS_H = 13,
    VKB_SPEC_V_CODES_W = 14,
    VKB_SPEC_V_SCALE_H = 15,
    VKB_SPEC_V_BIAS_H = 16,
    VKB_SPEC_K_CODES_HEAD_W = 17,  /* one kv head's share of each section */
    VKB_SPEC_K_SB_HEAD_H = 18,
    VKB_SPEC_V_CODES_HEAD_W = 19,
    VKB_SPEC_V_SB_HEAD_H = 20,
    VKB_SPEC_K_ROW_W = 21,         /* words per token row (KIVI keys: per token group of g) */
    VKB_SPEC_V_ROW_W = 22,
    VKB_SPEC_K_GROUPS = 23,        /* scale/bias entries per row (KIVI keys: d_k per token group) */
    VKB_SPEC_V_GROUPS = 24,
    VKB_SPEC_RING_K_H = 25,        /* ring sections inside a slot, in halves */
    VKB_SPEC_RING_V_H = 26,
    VKB_SPEC_RING_HALVES = 27,     /* ring_bytes / 2 per slot */
    VKB_SPEC_WG_SIZE = 28,         /* local_size_x (local_size_x_id = 28) */
    VKB_SPEC_SUBGROUP_SIZE = 29,   /* the size requested for the pipeline, or the device's default */
    VKB_SPEC_OP0 = 30,             /* free for the op's own constants (e.g. queries per work item) */
    VKB_SPEC_OP1 = 31,
    VKB_SPEC_OP2 = 32,
    VKB_SPEC_OP3 = 33,
    VKB_SPEC_K_TILED = 34,         /* L.k_tiled: key codes in tiles of GOKV_KEY_TILE tokens (q4 keys) */
    VKB_SPEC_OP4 = 35,             /* a fifth op constant (attend, reduce: MASS) */
    VKB_SPEC_COUNT = 36
};

typedef struct vkb_buffer {
    VkBuffer buf;
    VkDeviceMemory mem;
    VkDeviceSize size;
    void *map; /* mapped pointer for host-visible buffers, else NULL */
} vkb_buffer;

typedef struct vkb_pipeline_entry {
    char shader[32];
    uint32_t spec[VKB_SPEC_COUNT];
    VkPipeline pipeline;
} vkb_pipeline_entry;

/* Per-vendor tuning knobs (README "Tuning"); defaults chosen at device open, env vars override. */
typedef struct vkb_tuning {
    uint32_t wg_size;        /* invocations per workgroup for the attention shaders (GOKV_VULKAN_WG) */
    uint32_t subgroup_size;  /* requested subgroup size, 0 = the driver's choice (GOKV_VULKAN_SUBGROUP) */
    int32_t chunk_size;      /* default split-K chunk in tokens when the call passes 0 (GOKV_VULKAN_CHUNK) */
    uint32_t shared_budget;  /* bytes of shared memory an attention workgroup may use for its queries */
} vkb_tuning;

typedef struct vkb_device {
    VkInstance instance;
    VkDebugUtilsMessengerEXT messenger; /* validation messages, when GOKV_VULKAN_VALIDATION=1 */
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue queue;
    uint32_t queue_family;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties mem_props;
    uint32_t subgroup_size;        /* the device's default (VkPhysicalDeviceSubgroupProperties) */
    uint32_t subgroup_min, subgroup_max;
    uint32_t subgroup_ops;         /* VkSubgroupFeatureFlags supported in compute shaders */
    int subgroup_control;          /* 1 when compute pipelines may require a subgroup size */
    uint32_t max_shared_bytes;     /* maxComputeSharedMemorySize */
    uint32_t max_wg_invocations;   /* maxComputeWorkGroupInvocations */
    uint32_t max_groups[3];        /* maxComputeWorkGroupCount */
    VkDeviceSize max_storage_range;/* maxStorageBufferRange */
    uint64_t device_local_bytes;   /* largest device-local heap */
    vkb_tuning tune;

    pthread_mutex_t mu;            /* one call at a time records/submits on this device */
    int lost;                      /* set after VK_ERROR_DEVICE_LOST: every later call fails */
    VkCommandPool cmd_pool;
    VkCommandBuffer cmd;
    VkFence fence;
    VkDescriptorSetLayout set_layout;
    VkPipelineLayout pipeline_layout;
    VkDescriptorPool desc_pool;
    VkDescriptorSet set;
    VkPipelineCache pipeline_cache;
    vkb_buffer up, scratch, down;  /* grown on demand, reused across calls */
    vkb_buffer dummy;              /* bound where a pool has no ring */
    pthread_mutex_t pipe_mu;       /* guards the pipeline cache (ops may ask inside or outside a call) */
    vkb_pipeline_entry *pipelines; /* cache by (shader, spec) */
    int32_t n_pipelines, cap_pipelines;
} vkb_device;

typedef struct vkb_pool {
    gokv_layout L;
    int32_t n_pages, n_slots;
    vkb_buffer pages; /* n_pages * L.page_bytes, device-local, zero-filled at creation; then (key_bounds)
                         n_pages * L.bounds_bytes of key bounds, from word bounds_w, "no key" at creation */
    uint32_t bounds_w;
    vkb_buffer ring;  /* n_slots * L.ring_bytes, device-local (size 0: none) */
    uint32_t spec[VKB_SPEC_COUNT]; /* the layout's constants, see vkb_pool_spec */
} vkb_pool;

typedef struct vkb_call {
    vkb_device *d;
    vkb_pool *p;
    VkCommandBuffer cmd;
    uint8_t *up;   /* mapped inputs, up_bytes */
    uint8_t *down; /* mapped outputs, down_bytes (valid after vkb_call_submit) */
    VkDeviceSize up_bytes, scratch_bytes, down_bytes;
    VkPipeline bound;
} vkb_call;

/* ---- vk_backend.c: error mapping and test hooks ---- */

/* Status and message for a failed Vulkan call (marks the device lost on VK_ERROR_DEVICE_LOST). */
gokv_status vkb_error(vkb_device *d, VkResult r, const char *op, const char *what);
const char *vkb_result_name(VkResult r);

/* Returns from the calling function with vkb_error's status when call fails. */
#define VK_TRY(d, call, op, what)                                                                          \
    do {                                                                                                   \
        VkResult r_ = (call);                                                                              \
        if (r_ != VK_SUCCESS) return vkb_error((d), r_, (op), (what));                                     \
    } while (0)

/* The VkResult injected for the next submit or allocation (site GOKV_FAULT_SUBMIT or GOKV_FAULT_ALLOC), 0 if
 * none; taking it clears it (backend slot inject_fault). */
VkResult vkb_take_injected(int site);

/* ---- vk_instance.c: backend slots device_open, device_close, device_info ---- */
gokv_status vkb_device_open(const gokv_device_desc *desc, void **impl);
void vkb_device_close(void *dev);
gokv_status vkb_device_info(void *dev, gokv_device_info *out);

/* ---- vk_memory.c ---- */

/* Creates a storage (and transfer) buffer of size bytes: device-local, or host-visible, coherent and
 * mapped (host = 1). Errors name op and what. Destroying a zeroed buffer is a no-op. */
gokv_status vkb_buffer_create(vkb_device *d, VkDeviceSize size, int host, const char *op, const char *what,
                              vkb_buffer *out);
void vkb_buffer_destroy(vkb_device *d, vkb_buffer *b);
/* Makes b hold at least size bytes (contents are not kept). Only called between submissions. */
gokv_status vkb_buffer_reserve(vkb_device *d, vkb_buffer *b, VkDeviceSize size, int host, const char *op,
                               const char *what);

/* ---- vk_pipeline.c ---- */

/* Fills spec[] with the pool's layout constants and the device's tuning (WG_SIZE, SUBGROUP_SIZE); the
 * OP slots are 0. Ops copy this and set their own slots before vkb_get_pipeline. */
void vkb_pool_spec(const vkb_device *d, const gokv_layout *L, uint32_t spec[VKB_SPEC_COUNT]);
/* The compute pipeline of shaders/<shader>.comp specialized with spec (cached per device). */
gokv_status vkb_get_pipeline(vkb_device *d, const char *shader, const uint32_t spec[VKB_SPEC_COUNT], VkPipeline *out);

/* ---- vk_submit.c ---- */

gokv_status vkb_call_begin(vkb_device *d, vkb_pool *p, VkDeviceSize up_bytes, VkDeviceSize scratch_bytes,
                           VkDeviceSize down_bytes, vkb_call *c);
/* Binds the pipeline (if not bound), pushes the constants, dispatches gx*gy*gz workgroups. Each count
 * must be within d->max_groups (the op splits larger grids; 65535 is always allowed). */
void vkb_cmd_dispatch(vkb_call *c, VkPipeline pipeline, const void *push, uint32_t push_bytes, uint32_t gx,
                      uint32_t gy, uint32_t gz);
/* Dispatches items invocations in workgroups of wg as a 2D grid (no count above 65535); the shaders
 * linearize (y * num_x + x) * wg + local id and skip the tail. */
void vkb_dispatch_linear(vkb_call *c, VkPipeline pipeline, const void *push, uint32_t push_bytes, uint64_t items,
                         uint32_t wg);
/* Makes all earlier shader and transfer writes visible to later shader, transfer and host reads. */
void vkb_cmd_barrier(vkb_call *c);
/* Ends, submits and waits. Maps Vulkan errors to statuses (device lost: GOKV_EDEVICE, and the device is
 * marked lost; out of memory: GOKV_ENOMEM) with a message naming op. */
gokv_status vkb_call_submit(vkb_call *c, const char *op);
void vkb_call_end(vkb_call *c);

/* ---- vk_pool.c: backend slots pool_create, pool_destroy, pool_copy, page_bytes, slot_bytes, set_page_bytes,
 * set_slot_bytes ---- */
gokv_status vkb_pool_create(void *dev, const gokv_pool_desc *desc, const gokv_layout *L, void **impl);
void vkb_pool_destroy(void *dev, void *pool);
gokv_status vkb_pool_copy(void *dev, void *pool, const gokv_layout *L, const gokv_copy_desc *desc);
gokv_status vkb_page_bytes(void *dev, void *pool, const gokv_layout *L, int32_t page, void *out);
gokv_status vkb_slot_bytes(void *dev, void *pool, const gokv_layout *L, int32_t slot, void *out);
gokv_status vkb_set_page_bytes(void *dev, void *pool, const gokv_layout *L, int32_t page, const void *bytes,
                               int32_t n_tokens);
gokv_status vkb_set_slot_bytes(void *dev, void *pool, const gokv_layout *L, int32_t slot, const void *bytes);

/* ---- vk_bench.c: measurements for gokv bench ---- */

/* Backend slot measure: the copy bandwidth attention is held to. */
gokv_status vkb_measure(void *dev, uint64_t bytes, gokv_device_ceilings *out);

/* Times recorded work with two GPU timestamps (host time where the queue has no timestamps). */
typedef struct vkb_timer {
    VkQueryPool pool;
    struct timespec host0;
} vkb_timer;
gokv_status vkb_timer_create(vkb_device *d, vkb_timer *t, const char *op);
void vkb_timer_start(vkb_call *c, vkb_timer *t);
void vkb_timer_stop(vkb_call *c, vkb_timer *t);
double vkb_timer_ms(vkb_device *d, vkb_timer *t); /* after vkb_call_submit */
void vkb_timer_destroy(vkb_device *d, vkb_timer *t);

/* ---- vk_store.c: backend slots pool_write and pool_read ---- */
gokv_status vkb_pool_write(void *dev, void *pool, const gokv_layout *L, const gokv_write_desc *desc);
gokv_status vkb_pool_read(void *dev, void *pool, const gokv_layout *L, const gokv_read_desc *desc);

/* ---- vk_attend.c: backend slot attend ---- */
gokv_status vkb_attend(void *dev, void *pool, const gokv_layout *L, const gokv_attend_desc *desc);

/* ---- embedded SPIR-V (generated by CMake from the shaders folder) ---- */
typedef struct vkb_spirv {
    const char *name; /* file name without .comp */
    const uint32_t *code;
    size_t size_bytes;
} vkb_spirv;
extern const vkb_spirv gokv_vk_spirv[];
extern const int32_t gokv_vk_spirv_count;

#ifdef __cplusplus
}
#endif
#endif
