/*
 * gpu_plan.h: the dispatch plan every GPU module shares (Vulkan, Metal; SYCL next). Portable C, no vendor
 * header: it turns an ABI call (write, read, copy, attend, page bytes) into passes over the pool (which
 * kernel, which grid, which push constants, where each input lies in the call's buffers, which pass waits
 * for which), and a module only supplies the few operations a device has to do itself (gpu_ops: pipelines,
 * buffers, dispatch, copy, barrier, submit). So the chunking, tables and offsets that decide what a kernel
 * reads are written once, and the Metal module's emulated backend runs the very plan its macOS host encodes.
 * Internal to gokv: not part of the ABI.
 *
 * Execution model: every ABI call records one sequence of passes, submits it and waits (the ABI is
 * synchronous, and caller buffers are never retained):
 *
 *     gpu_call c;
 *     st = gpu_call_begin(dev, pool, up_bytes, scratch_bytes, down_bytes, &c);   // locks the device
 *     if (st) return st;
 *     ... fill c.up (host-visible) with inputs and tables ...
 *     gpu_dispatch(&c, pipeline, &push, sizeof push, gx, gy, 1);
 *     gpu_barrier(&c);                      // between dependent passes
 *     st = gpu_call_submit(&c, "gokv_attend");   // ends, submits, waits
 *     if (!st) ... read c.down ...
 *     gpu_call_end(&c);                     // unlocks; always called after a successful begin
 *
 * Every kernel sees five buffers, bound by begin (Vulkan: set 0, bindings 0..4; Metal: buffer indices 0..4):
 *     GPU_PAGES    the pool's page storage, page p at byte p * L.page_bytes (then, with key_bounds, the pages'
 *                  key bounds from word gpu_pool.bounds_w)
 *     GPU_RINGS    the pool's KIVI residual slots (a small dummy when there are none)
 *     GPU_UP       this call's inputs (host-visible), up_bytes
 *     GPU_SCRATCH  this call's device scratch (split-K partials, baseline copies, staged inputs)
 *     GPU_DOWN     this call's outputs (host-visible), down_bytes
 * plus the push constants (at most GPU_PUSH_BYTES; Metal: buffer 5) and the pipeline's specialization
 * constants (GPU_SPEC_*; Vulkan: specialization constants; Metal: buffer 6 as uint32 words, with the values
 * that size arrays chosen at compile time as template parameters). Offsets inside up/scratch/down are in
 * 4-byte words, passed as push constants. The kernels' push constant blocks are the field lists of
 * gpu_push.h, shared by the host code and every kernel language.
 */
#ifndef GOKV_GPU_PLAN_H
#define GOKV_GPU_PLAN_H

#include <stdint.h>

#include "gokv_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GPU_PUSH_BYTES 128u

enum { GPU_PAGES = 0, GPU_RINGS = 1, GPU_UP = 2, GPU_SCRATCH = 3, GPU_DOWN = 4, GPU_N_BINDINGS = 5 };

#include "gpu_spec.h" /* GPU_SPEC_*: the specialization constant ids */

/* What the plan needs to know of a device, filled by the module at device open. */
typedef struct gpu_caps {
    uint32_t wg_size;            /* threads per workgroup of every kernel */
    uint32_t subgroup_size;      /* the simdgroup size pipelines get (requested, or the device's default) */
    uint32_t subgroup_min;       /* the smallest simdgroup size a pipeline may get (sizes shared arrays) */
    int32_t chunk_size;          /* default split-K chunk in tokens when a call passes 0 */
    uint32_t shared_budget;      /* bytes of shared memory an attention workgroup may use for its queries */
    uint32_t max_shared_bytes;   /* shared (threadgroup) memory per workgroup */
    uint32_t max_groups[3];      /* workgroups per grid dimension */
    uint64_t max_binding_bytes;  /* bytes one buffer binding may address */
    uint64_t memory_bytes;       /* what pools may take in all (device-local heap, or unified memory) */
    int stage_inputs;            /* 1: copy the inputs from up into scratch first (up is host memory across a
                                    bus); Quest always stages (its masks are written there) */
} gpu_caps;

typedef struct gpu_ops gpu_ops;

/* The plan's view of a device: a module's device struct starts with this. */
typedef struct gpu_device {
    const gpu_ops *ops;
    const char *backend; /* for messages: "vulkan", "metal" */
    gpu_caps caps;
} gpu_device;

/* The plan's view of a pool: a module's pool struct starts with this. */
typedef struct gpu_pool {
    gokv_layout L;
    int32_t n_pages, n_slots;
    uint32_t bounds_w;                /* first word of the key bounds in GPU_PAGES (after the pages) */
    uint32_t spec[GPU_SPEC_COUNT];    /* the layout's constants (gpu_pool_spec) */
} gpu_pool;

typedef void *gpu_pipeline; /* a module's compiled kernel for one (name, spec) */

/* One call being recorded. up and down are host pointers valid from begin (up) and after submit (down). */
typedef struct gpu_call {
    gpu_device *d;
    gpu_pool *p;
    uint8_t *up, *down;
    uint64_t up_bytes, scratch_bytes, down_bytes;
    void *impl; /* the module's recording state */
    char fault[160]; /* the first copy or fill outside its bindings (gpu_copy, gpu_fill); submit reports it */
} gpu_call;

/* What a module implements. Errors set a message (gokv_set_error) naming the op and return its status. */
struct gpu_ops {
    /* The kernel `name` (Vulkan: shaders/<name>.comp; Metal: <name> in the kernels' instance table)
     * specialized with spec; cached by the module, valid until the device closes. */
    gokv_status (*pipeline)(gpu_device *d, const char *name, const uint32_t spec[GPU_SPEC_COUNT], gpu_pipeline *out);
    /* Locks the device, makes up/scratch/down hold at least the given bytes and binds them with the pool's
     * buffers (pool may be NULL: dummies); earlier calls' writes are visible. */
    gokv_status (*begin)(gpu_device *d, gpu_pool *p, uint64_t up_bytes, uint64_t scratch_bytes, uint64_t down_bytes,
                         gpu_call *c);
    /* gx*gy*gz workgroups of caps.wg_size threads (each within caps.max_groups; 0 in any: nothing). */
    void (*dispatch)(gpu_call *c, gpu_pipeline pl, const void *push, uint32_t push_bytes, uint32_t gx, uint32_t gy,
                     uint32_t gz);
    /* Copies bytes between bindings (regions of one copy do not overlap); fill sets bytes to a 32-bit word.
     * Called through gpu_copy / gpu_fill, which have checked the ranges against the call's bindings. */
    void (*copy)(gpu_call *c, int32_t src, uint64_t src_off, int32_t dst, uint64_t dst_off, uint64_t bytes);
    void (*fill)(gpu_call *c, int32_t dst, uint64_t off, uint64_t bytes, uint32_t word);
    /* Makes every earlier write (dispatch, copy, fill) visible to every later read. */
    void (*barrier)(gpu_call *c);
    /* Ends, submits, waits; device errors become statuses naming op. */
    gokv_status (*submit)(gpu_call *c, const char *op);
    void (*end)(gpu_call *c); /* unlocks; after every successful begin */
};


/* ---- the plan: each is the body of a backend slot (bridge/gokv_backend.h); a module's slot passes its
 * device and pool (which start with gpu_device / gpu_pool). Arguments are validated by the core. ---- */

/* The layout's constants and the device's (WG_SIZE, SUBGROUP_SIZE); the OP slots are 0. */
void gpu_pool_spec(const gpu_device *d, const gokv_layout *L, uint32_t spec[GPU_SPEC_COUNT]);
/* Fills p (layout, counts, bounds_w, spec) and checks the pool against the device's limits, before the
 * module allocates anything: GPU_PAGES then holds (L.page_bytes + L.bounds_bytes) * n_pages bytes and
 * GPU_RINGS L.ring_bytes * n_slots. */
gokv_status gpu_pool_init(gpu_device *d, gpu_pool *p, const gokv_pool_desc *desc, const gokv_layout *L);
/* After the module allocated the pool's buffers: zero pages and rings, key bounds "no key". */
gokv_status gpu_pool_clear(gpu_device *d, gpu_pool *p);
gokv_status gpu_pool_write(gpu_device *d, gpu_pool *p, const gokv_write_desc *desc);
gokv_status gpu_pool_read(gpu_device *d, gpu_pool *p, const gokv_read_desc *desc);
gokv_status gpu_pool_copy(gpu_device *d, gpu_pool *p, const gokv_copy_desc *desc);
gokv_status gpu_attend(gpu_device *d, gpu_pool *p, const gokv_attend_desc *desc);
gokv_status gpu_page_bytes(gpu_device *d, gpu_pool *p, int32_t page, void *out);
gokv_status gpu_slot_bytes(gpu_device *d, gpu_pool *p, int32_t slot, void *out);
gokv_status gpu_set_page_bytes(gpu_device *d, gpu_pool *p, int32_t page, const void *bytes, int32_t n_tokens);
gokv_status gpu_set_slot_bytes(gpu_device *d, gpu_pool *p, int32_t slot, const void *bytes);

/* The compiled instance "<name>_<arg>_..." of a kernel that runs pipeline request (name, spec) where a
 * kernel language has no specialization constants (Metal, SYCL: template parameters), and the local memory
 * it needs in 32-bit words (gpu_variants.c). GOKV_ENOTSUP names the kernel when none has that name, or the
 * instance when it needs more local memory than caps.max_shared_bytes. */
#define GPU_MAX_NAME 64
gokv_status gpu_kernel_instance(const gpu_device *d, const char *name, const uint32_t spec[GPU_SPEC_COUNT],
                                char instance[GPU_MAX_NAME], uint32_t *local_words);

/* The same entry points with the backend table's signatures (gpu_slots.c), for a module's gokv_backend
 * initializer: `.pool_write = ..., GPU_PLAN_SLOTS, .measure = ...`. */
gokv_status gpu_slot_pool_write(void *dev, void *pool, const gokv_layout *L, const gokv_write_desc *desc);
gokv_status gpu_slot_pool_read(void *dev, void *pool, const gokv_layout *L, const gokv_read_desc *desc);
gokv_status gpu_slot_pool_copy(void *dev, void *pool, const gokv_layout *L, const gokv_copy_desc *desc);
gokv_status gpu_slot_attend(void *dev, void *pool, const gokv_layout *L, const gokv_attend_desc *desc);
gokv_status gpu_slot_page_bytes(void *dev, void *pool, const gokv_layout *L, int32_t page, void *out);
gokv_status gpu_slot_slot_bytes(void *dev, void *pool, const gokv_layout *L, int32_t slot, void *out);
gokv_status gpu_slot_set_page_bytes(void *dev, void *pool, const gokv_layout *L, int32_t page, const void *bytes,
                                    int32_t n_tokens);
gokv_status gpu_slot_set_slot_bytes(void *dev, void *pool, const gokv_layout *L, int32_t slot, const void *bytes);
#define GPU_PLAN_SLOTS                                                                                      \
    .pool_write = gpu_slot_pool_write, .pool_read = gpu_slot_pool_read, .pool_copy = gpu_slot_pool_copy,    \
    .attend = gpu_slot_attend, .page_bytes = gpu_slot_page_bytes, .slot_bytes = gpu_slot_slot_bytes,        \
    .set_page_bytes = gpu_slot_set_page_bytes, .set_slot_bytes = gpu_slot_set_slot_bytes

/* The call helpers, through d->ops. */
gokv_status gpu_call_begin(gpu_device *d, gpu_pool *p, uint64_t up_bytes, uint64_t scratch_bytes, uint64_t down_bytes,
                           gpu_call *c);
gokv_status gpu_get_pipeline(gpu_device *d, const char *name, const uint32_t spec[GPU_SPEC_COUNT], gpu_pipeline *out);
void gpu_dispatch(gpu_call *c, gpu_pipeline pl, const void *push, uint32_t push_bytes, uint32_t gx, uint32_t gy,
                  uint32_t gz);
/* items threads in workgroups of wg as a 2D grid (x at most 65535); kernels linearize
 * (y * groups_x + x) * wg + local id and skip the tail. */
void gpu_dispatch_linear(gpu_call *c, gpu_pipeline pl, const void *push, uint32_t push_bytes, uint64_t items,
                         uint32_t wg);
/* A copy between bindings and a fill of one (bytes 0: nothing). A range outside its binding (the pool's pages
 * and rings, or the bytes begin asked for) or a fill off a 4-byte boundary is recorded as the call's fault
 * instead: nothing of the call runs, and gpu_call_submit fails naming it. */
void gpu_copy(gpu_call *c, int32_t src, uint64_t src_off, int32_t dst, uint64_t dst_off, uint64_t bytes);
void gpu_fill(gpu_call *c, int32_t dst, uint64_t off, uint64_t bytes, uint32_t word);
void gpu_barrier(gpu_call *c);
gokv_status gpu_call_submit(gpu_call *c, const char *op);
void gpu_call_end(gpu_call *c);

#ifdef __cplusplus
}
#endif
#endif
