/*
 * vk_internal.h: the Vulkan module's internals, shared by its host files (vk_backend.c: the backend table,
 * test hooks, error mapping; vk_instance.c: instance, device selection and tuning, device open/close/info;
 * vk_memory.c: buffers; vk_pipeline.c: the pipeline cache; vk_submit.c: the module's gpu_ops, command
 * recording and submission; vk_pool.c: pool buffers; vk_bench.c: measurements). Not part of the ABI.
 *
 * The module implements gpu_ops (native/gpu/gpu_plan.h), and its backend slots run the GPU dispatch plan
 * (gpu_pool_write, gpu_attend, ...), which decides every pass; this module does what only Vulkan can. Every
 * ABI call records one command buffer on the device's single compute queue, submits it and waits for it
 * (gpu_plan.h shows the sequence). The plan's five bindings are one descriptor set (set 0, bindings 0..4):
 * GPU_PAGES and GPU_RINGS the pool's device-local buffers (a small dummy where a call has no pool or the
 * pool no ring), GPU_UP and GPU_DOWN host-visible, mapped and coherent, GPU_SCRATCH device-local; the
 * three call buffers grow on demand and are reused. Push constants: at most GPU_PUSH_BYTES, one range for
 * all stages.
 *
 * Shaders are GLSL compute files in shaders/ (compiled to SPIR-V by CMake, embedded, looked up by file
 * name without ".comp"). Specialization constants: constant_id i takes spec[i] (GPU_SPEC_*, filled from
 * the pool's layout by gpu_pool_spec and then per call by the plan); shaders/common.glsl declares them.
 */
#ifndef GOKV_VK_INTERNAL_H
#define GOKV_VK_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <vulkan/vulkan.h>

#include "gokv_backend.h"
#include "gokv_vulkan.h"
#include "gpu_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vkb_buffer {
    VkBuffer buf;
    VkDeviceMemory mem;
    VkDeviceSize size;
    void *map; /* mapped pointer for host-visible buffers, else NULL */
} vkb_buffer;

typedef struct vkb_pipeline_entry {
    char shader[32];
    uint32_t spec[GPU_SPEC_COUNT];
    VkPipeline pipeline;
} vkb_pipeline_entry;

/* A call's recording state (gpu_call.impl points at the device's; the device lock makes it one call's). */
typedef struct vkb_call {
    VkCommandBuffer cmd;
    VkPipeline bound;
} vkb_call;

/* The device. Per-vendor tuning (README "Tuning") is chosen at device open, env vars override:
 * base.caps.wg_size (GOKV_VULKAN_WG), subgroup_request (GOKV_VULKAN_SUBGROUP), base.caps.chunk_size
 * (GOKV_VULKAN_CHUNK), base.caps.shared_budget. */
typedef struct vkb_device {
    gpu_device base;               /* the plan's view: ops, caps (limits, tuning) */
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
    uint32_t subgroup_request;     /* the subgroup size pipelines require, 0 = the driver's choice */
    uint32_t max_wg_invocations;   /* maxComputeWorkGroupInvocations */

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
    vkb_call rec;                  /* the current call's recording state */
    vkb_buffer up, scratch, down;  /* grown on demand, reused across calls */
    vkb_buffer dummy;              /* bound where a pool has no ring */
    pthread_mutex_t pipe_mu;       /* guards the pipeline cache (ops may ask inside or outside a call) */
    vkb_pipeline_entry *pipelines; /* cache by (shader, spec) */
    int32_t n_pipelines, cap_pipelines;
} vkb_device;

typedef struct vkb_pool {
    gpu_pool base;    /* the plan's view: layout, counts, bounds_w, spec */
    vkb_buffer pages; /* GPU_PAGES: n_pages * L.page_bytes, device-local, zero-filled at creation; then
                         (key_bounds) n_pages * L.bounds_bytes of key bounds, from word bounds_w, "no key" */
    vkb_buffer ring;  /* GPU_RINGS: n_slots * L.ring_bytes, device-local (size 0: none) */
} vkb_pool;

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

/* gpu_ops.pipeline: the compute pipeline of shaders/<name>.comp specialized with spec (cached per device;
 * with a subgroup_request, pipelines require that size). */
gokv_status vkb_pipeline(gpu_device *d, const char *name, const uint32_t spec[GPU_SPEC_COUNT], gpu_pipeline *out);

/* ---- vk_submit.c: the module's gpu_ops ---- */

/* begin, dispatch, copy, fill, barrier (all earlier shader and transfer writes visible to later shader,
 * transfer and host reads), submit (maps Vulkan errors to statuses: device lost: GOKV_EDEVICE, and the
 * device is marked lost; out of memory: GOKV_ENOMEM; with a message naming op), end; plus pipeline. */
extern const gpu_ops vkb_ops;

/* The command buffer a call records (vk_bench.c records its own copies into it). */
static inline VkCommandBuffer vkb_cmd(const gpu_call *c) { return ((const vkb_call *)c->impl)->cmd; }

/* ---- vk_pool.c: backend slots pool_create and pool_destroy ---- */
gokv_status vkb_pool_create(void *dev, const gokv_pool_desc *desc, const gokv_layout *L, void **impl);
void vkb_pool_destroy(void *dev, void *pool);

/* ---- vk_bench.c: measurements for gokv bench ---- */

/* Backend slot measure: the copy bandwidth attention is held to. */
gokv_status vkb_measure(void *dev, uint64_t bytes, gokv_device_ceilings *out);

/* Times recorded work with two GPU timestamps (host time where the queue has no timestamps). */
typedef struct vkb_timer {
    VkQueryPool pool;
    struct timespec host0;
} vkb_timer;
gokv_status vkb_timer_create(vkb_device *d, vkb_timer *t, const char *op);
void vkb_timer_start(gpu_call *c, vkb_timer *t);
void vkb_timer_stop(gpu_call *c, vkb_timer *t);
double vkb_timer_ms(vkb_device *d, vkb_timer *t); /* after gpu_call_submit */
void vkb_timer_destroy(vkb_device *d, vkb_timer *t);

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
