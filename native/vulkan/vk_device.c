/*
 * vk_device.c: the Vulkan module's runtime (docs/architecture.md §7). Instance and device selection, device
 * info, memory and buffers, the pipeline cache (embedded SPIR-V specialized per pool layout), one-call
 * command recording and submission, page pools and page copies, error mapping, the validation messenger, and
 * the backend table. The ops live in vk_store.c (write, read) and vk_attend.c (attention).
 *
 * Choices:
 * - One compute queue and one command buffer per device. Every ABI call records, submits and waits (the
 *   ABI is synchronous and never retains caller buffers); a mutex serializes the calls of one device.
 * - Pools are one device-local buffer of pages (and one of KIVI rings), zero-filled at creation, bound
 *   whole to the shaders, which address them in 32-bit words: the layout is bridge/gokv_layout.h's, so a
 *   page means the same bytes on every backend.
 * - Inputs (q, k, v, page tables) go through a host-visible upload buffer and outputs through a
 *   host-visible download buffer; split-K partials and baseline copies live in a device-local scratch
 *   buffer. All three grow on demand and are reused.
 * - Subgroup sizes are queried, never assumed; where VK_EXT_subgroup_size_control (core in 1.3) lets a
 *   compute pipeline require a size, the tuning's size is requested (AMD: wave32 by default).
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

/* ---- process-wide counters and test hooks ---- */

static atomic_uint_fast64_t g_validation_messages;
static atomic_int g_inject_result[2]; /* 0: none, else the VkResult the next submit / allocation returns */

uint64_t gokv_vulkan_validation_messages(void) { return (uint64_t)atomic_load(&g_validation_messages); }

/* Backend slot inject_fault: site is a validated GOKV_FAULT_* index. */
static gokv_status inject_fault(int32_t site, int32_t vk_result) {
    atomic_store(&g_inject_result[site], vk_result);
    return GOKV_OK;
}

static VkResult take_injected(int site) { return (VkResult)atomic_exchange(&g_inject_result[site], 0); }

/* ---- errors ---- */

const char *vkb_result_name(VkResult r) {
    switch (r) {
#define R_(x) case x: return #x;
        R_(VK_SUCCESS) R_(VK_NOT_READY) R_(VK_TIMEOUT) R_(VK_INCOMPLETE) R_(VK_ERROR_OUT_OF_HOST_MEMORY)
        R_(VK_ERROR_OUT_OF_DEVICE_MEMORY) R_(VK_ERROR_INITIALIZATION_FAILED) R_(VK_ERROR_DEVICE_LOST)
        R_(VK_ERROR_MEMORY_MAP_FAILED) R_(VK_ERROR_LAYER_NOT_PRESENT) R_(VK_ERROR_EXTENSION_NOT_PRESENT)
        R_(VK_ERROR_FEATURE_NOT_PRESENT) R_(VK_ERROR_INCOMPATIBLE_DRIVER) R_(VK_ERROR_TOO_MANY_OBJECTS)
        R_(VK_ERROR_FORMAT_NOT_SUPPORTED) R_(VK_ERROR_FRAGMENTED_POOL) R_(VK_ERROR_OUT_OF_POOL_MEMORY)
        R_(VK_ERROR_INVALID_SHADER_NV) R_(VK_ERROR_UNKNOWN)
#undef R_
    default: return "VkResult";
    }
}

gokv_status vkb_error(vkb_device *d, VkResult r, const char *op, const char *what) {
    gokv_status st;
    const char *hint = "";
    switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY:
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
    case VK_ERROR_OUT_OF_POOL_MEMORY:
    case VK_ERROR_FRAGMENTED_POOL: st = GOKV_ENOMEM; break;
    case VK_ERROR_INITIALIZATION_FAILED:
    case VK_ERROR_INCOMPATIBLE_DRIVER:
    case VK_ERROR_LAYER_NOT_PRESENT:
    case VK_ERROR_EXTENSION_NOT_PRESENT:
    case VK_ERROR_FEATURE_NOT_PRESENT: st = GOKV_ENODEV; break;
    case VK_ERROR_DEVICE_LOST:
    case VK_TIMEOUT:
        st = GOKV_EDEVICE;
        hint = "; the device is lost: close it and open a new one";
        if (d) d->lost = 1;
        break;
    default: st = GOKV_EDEVICE; break;
    }
    gokv_log(GOKV_LOG_ERROR, "vulkan", op, "%s failed: %s (%d)%s", what, vkb_result_name(r), (int)r, hint);
    return gokv_set_error(st, "%s: vulkan: %s failed: %s (%d)%s", op, what, vkb_result_name(r), (int)r, hint);
}

#define VK_TRY(d, call, op, what)                                                                          \
    do {                                                                                                   \
        VkResult r_ = (call);                                                                              \
        if (r_ != VK_SUCCESS) return vkb_error((d), r_, (op), (what));                                     \
    } while (0)

/* ---- validation messages ---- */

static VKAPI_ATTR VkBool32 VKAPI_CALL on_debug_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                       VkDebugUtilsMessageTypeFlagsEXT types,
                                                       const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
    (void)types;
    (void)user;
    if (severity < VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) return VK_FALSE;
    atomic_fetch_add(&g_validation_messages, 1);
    const int level = severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT ? GOKV_LOG_ERROR : GOKV_LOG_WARN;
    gokv_log(level, "vulkan", "validation", "%s: %s", data && data->pMessageIdName ? data->pMessageIdName : "",
             data && data->pMessage ? data->pMessage : "");
    return VK_FALSE;
}

static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v && v[0] && strcmp(v, "0") != 0;
}

static int env_uint(const char *name, uint32_t *out) {
    const char *v = getenv(name);
    if (!v || !v[0]) return 0;
    char *end;
    unsigned long x = strtoul(v, &end, 10);
    if (*end || x == 0 || x > 65536) {
        gokv_log(GOKV_LOG_WARN, "vulkan", "device_open", "ignoring %s=\"%s\" (not a positive integer)", name, v);
        return 0;
    }
    *out = (uint32_t)x;
    return 1;
}

/* ---- memory ---- */

static int32_t find_memory_type(const vkb_device *d, uint32_t type_bits, VkMemoryPropertyFlags want,
                                VkMemoryPropertyFlags prefer) {
    int32_t fallback = -1;
    for (uint32_t i = 0; i < d->mem_props.memoryTypeCount; i++) {
        if (!(type_bits & (1u << i))) continue;
        const VkMemoryPropertyFlags f = d->mem_props.memoryTypes[i].propertyFlags;
        if ((f & want) != want) continue;
        if ((f & prefer) == prefer) return (int32_t)i;
        if (fallback < 0) fallback = (int32_t)i;
    }
    return fallback;
}

void vkb_buffer_destroy(vkb_device *d, vkb_buffer *b) {
    if (b->map) vkUnmapMemory(d->dev, b->mem);
    if (b->buf) vkDestroyBuffer(d->dev, b->buf, NULL);
    if (b->mem) vkFreeMemory(d->dev, b->mem, NULL);
    memset(b, 0, sizeof *b);
}

gokv_status vkb_buffer_create(vkb_device *d, VkDeviceSize size, int host, const char *op, const char *what,
                                 vkb_buffer *out) {
    memset(out, 0, sizeof *out);
    if (size > d->max_storage_range)
        return gokv_set_error(GOKV_ENOMEM,
                              "%s: vulkan: %s needs %llu bytes, more than this device's largest storage buffer "
                              "(maxStorageBufferRange %llu bytes)",
                              op, what, (unsigned long long)size, (unsigned long long)d->max_storage_range);
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                             .size = size,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VK_TRY(d, vkCreateBuffer(d->dev, &bi, NULL, &out->buf), op, what);
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(d->dev, out->buf, &req);
    const VkMemoryPropertyFlags want =
        host ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    const VkMemoryPropertyFlags prefer = host ? want | VK_MEMORY_PROPERTY_HOST_CACHED_BIT : want;
    int32_t type = find_memory_type(d, req.memoryTypeBits, want, prefer);
    if (type < 0 && !host) type = find_memory_type(d, req.memoryTypeBits, 0, 0);
    if (type < 0) {
        vkb_buffer_destroy(d, out);
        return gokv_set_error(GOKV_ENOMEM, "%s: vulkan: no %s memory type for %s", op,
                              host ? "host-visible coherent" : "device", what);
    }
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                               .allocationSize = req.size,
                               .memoryTypeIndex = (uint32_t)type};
    VkResult r = take_injected(GOKV_FAULT_ALLOC);
    if (r == VK_SUCCESS) r = vkAllocateMemory(d->dev, &ai, NULL, &out->mem);
    if (r != VK_SUCCESS) {
        out->mem = VK_NULL_HANDLE;
        vkb_buffer_destroy(d, out);
        char w[160];
        snprintf(w, sizeof w, "allocating %llu bytes for %s", (unsigned long long)req.size, what);
        return vkb_error(d, r, op, w);
    }
    r = vkBindBufferMemory(d->dev, out->buf, out->mem, 0);
    if (r == VK_SUCCESS && host) r = vkMapMemory(d->dev, out->mem, 0, VK_WHOLE_SIZE, 0, &out->map);
    if (r != VK_SUCCESS) {
        vkb_buffer_destroy(d, out);
        return vkb_error(d, r, op, what);
    }
    out->size = size;
    return GOKV_OK;
}

/* Makes b hold at least size bytes (contents are not kept). Only called between submissions. */
static gokv_status buffer_reserve(vkb_device *d, vkb_buffer *b, VkDeviceSize size, int host, const char *op,
                                  const char *what) {
    if (size < 256) size = 256;
    if (b->buf && b->size >= size) return GOKV_OK;
    VkDeviceSize want = b->size * 2 > size ? b->size * 2 : size;
    want = (want + 65535u) & ~(VkDeviceSize)65535u;
    if (want > d->max_storage_range) want = size;
    vkb_buffer_destroy(d, b);
    return vkb_buffer_create(d, want, host, op, what, b);
}

/* ---- pipelines ---- */

void vkb_pool_spec(const vkb_device *d, const gokv_layout *L, uint32_t spec[VKB_SPEC_COUNT]) {
    memset(spec, 0, sizeof(uint32_t) * VKB_SPEC_COUNT);
    spec[VKB_SPEC_FORMAT] = (uint32_t)L->format;
    spec[VKB_SPEC_BITS] = (uint32_t)L->bits;
    spec[VKB_SPEC_GROUP] = (uint32_t)L->group;
    spec[VKB_SPEC_PAGE_SIZE] = (uint32_t)L->page_size;
    spec[VKB_SPEC_N_KV_HEADS] = (uint32_t)L->n_kv_heads;
    spec[VKB_SPEC_D_K] = (uint32_t)L->d_k;
    spec[VKB_SPEC_D_V] = (uint32_t)L->d_v;
    spec[VKB_SPEC_V_IS_K_PREFIX] = (uint32_t)L->v_is_k_prefix;
    spec[VKB_SPEC_KIVI] = (uint32_t)L->kivi;
    spec[VKB_SPEC_RING_ROWS] = (uint32_t)L->ring_rows;
    spec[VKB_SPEC_PAGE_WORDS] = (uint32_t)(L->page_bytes / 4u);
    spec[VKB_SPEC_K_CODES_W] = (uint32_t)(L->k_codes / 4u);
    spec[VKB_SPEC_K_SCALE_H] = (uint32_t)(L->k_scale / 2u);
    spec[VKB_SPEC_K_BIAS_H] = (uint32_t)(L->k_bias / 2u);
    spec[VKB_SPEC_V_CODES_W] = (uint32_t)(L->v_codes / 4u);
    spec[VKB_SPEC_V_SCALE_H] = (uint32_t)(L->v_scale / 2u);
    spec[VKB_SPEC_V_BIAS_H] = (uint32_t)(L->v_bias / 2u);
    spec[VKB_SPEC_K_CODES_HEAD_W] = (uint32_t)(L->k_codes_head / 4u);
    spec[VKB_SPEC_K_SB_HEAD_H] = (uint32_t)(L->k_sb_head / 2u);
    spec[VKB_SPEC_V_CODES_HEAD_W] = (uint32_t)(L->v_codes_head / 4u);
    spec[VKB_SPEC_V_SB_HEAD_H] = (uint32_t)(L->v_sb_head / 2u);
    spec[VKB_SPEC_K_ROW_W] = (uint32_t)(L->k_row_bytes / 4u);
    spec[VKB_SPEC_V_ROW_W] = (uint32_t)(L->v_row_bytes / 4u);
    spec[VKB_SPEC_K_GROUPS] = (uint32_t)L->k_groups;
    spec[VKB_SPEC_V_GROUPS] = (uint32_t)L->v_groups;
    spec[VKB_SPEC_RING_K_H] = (uint32_t)(L->ring_k / 2u);
    spec[VKB_SPEC_RING_V_H] = (uint32_t)(L->ring_v / 2u);
    spec[VKB_SPEC_RING_HALVES] = (uint32_t)(L->ring_bytes / 2u);
    spec[VKB_SPEC_K_TILED] = (uint32_t)L->k_tiled;
    spec[VKB_SPEC_WG_SIZE] = d->tune.wg_size;
    spec[VKB_SPEC_SUBGROUP_SIZE] = d->tune.subgroup_size ? d->tune.subgroup_size : d->subgroup_size;
}

static const vkb_spirv *find_spirv(const char *name) {
    for (int32_t i = 0; i < gokv_vk_spirv_count; i++)
        if (strcmp(gokv_vk_spirv[i].name, name) == 0) return &gokv_vk_spirv[i];
    return NULL;
}

static gokv_status create_pipeline(vkb_device *d, const vkb_spirv *code, const uint32_t spec[VKB_SPEC_COUNT],
                                   VkPipeline *out) {
    const char *op = "vulkan pipeline";
    VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                   .codeSize = code->size_bytes,
                                   .pCode = code->code};
    VkShaderModule module;
    VK_TRY(d, vkCreateShaderModule(d->dev, &mi, NULL, &module), op, code->name);

    VkSpecializationMapEntry entries[VKB_SPEC_COUNT];
    for (uint32_t i = 0; i < VKB_SPEC_COUNT; i++)
        entries[i] = (VkSpecializationMapEntry){.constantID = i, .offset = i * 4u, .size = 4u};
    VkSpecializationInfo si = {.mapEntryCount = VKB_SPEC_COUNT,
                               .pMapEntries = entries,
                               .dataSize = sizeof(uint32_t) * VKB_SPEC_COUNT,
                               .pData = spec};
    VkPipelineShaderStageRequiredSubgroupSizeCreateInfoEXT req = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO_EXT,
        .requiredSubgroupSize = d->tune.subgroup_size};
    VkPipelineShaderStageCreateInfo stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                                             .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                                             .module = module,
                                             .pName = "main",
                                             .pSpecializationInfo = &si};
    if (d->subgroup_control && d->tune.subgroup_size) stage.pNext = &req;
    VkComputePipelineCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
                                      .stage = stage,
                                      .layout = d->pipeline_layout};
    VkResult r = vkCreateComputePipelines(d->dev, d->pipeline_cache, 1, &ci, NULL, out);
    vkDestroyShaderModule(d->dev, module, NULL);
    if (r != VK_SUCCESS) return vkb_error(d, r, op, code->name);
    return GOKV_OK;
}

static gokv_status get_pipeline_locked(vkb_device *d, const char *shader, const uint32_t spec[VKB_SPEC_COUNT],
                                       VkPipeline *out) {
    const vkb_spirv *code = find_spirv(shader);
    if (!code) return gokv_set_error(GOKV_EINTERNAL, "vulkan: shader \"%s\" is not embedded in this build", shader);
    if (strlen(shader) >= sizeof d->pipelines[0].shader)
        return gokv_set_error(GOKV_EINTERNAL, "vulkan: shader name \"%s\" is too long", shader);
    for (int32_t i = 0; i < d->n_pipelines; i++) {
        const vkb_pipeline_entry *e = &d->pipelines[i];
        if (strcmp(e->shader, shader) == 0 && memcmp(e->spec, spec, sizeof e->spec) == 0) {
            *out = e->pipeline;
            return GOKV_OK;
        }
    }
    if (d->n_pipelines == d->cap_pipelines) {
        const int32_t cap = d->cap_pipelines ? d->cap_pipelines * 2 : 32;
        vkb_pipeline_entry *p = realloc(d->pipelines, sizeof *p * (size_t)cap);
        if (!p) return gokv_set_error(GOKV_ENOMEM, "vulkan: cannot grow the pipeline cache to %d entries", cap);
        d->pipelines = p;
        d->cap_pipelines = cap;
    }
    VkPipeline pl;
    gokv_status st = create_pipeline(d, code, spec, &pl);
    if (st != GOKV_OK) return st;
    vkb_pipeline_entry *e = &d->pipelines[d->n_pipelines++];
    snprintf(e->shader, sizeof e->shader, "%s", shader);
    memcpy(e->spec, spec, sizeof e->spec);
    e->pipeline = pl;
    *out = pl;
    return GOKV_OK;
}

gokv_status vkb_get_pipeline(vkb_device *d, const char *shader, const uint32_t spec[VKB_SPEC_COUNT], VkPipeline *out) {
    pthread_mutex_lock(&d->pipe_mu);
    gokv_status st = get_pipeline_locked(d, shader, spec, out);
    pthread_mutex_unlock(&d->pipe_mu);
    return st;
}

/* ---- calls ---- */

static void write_descriptors(vkb_device *d, vkb_pool *p) {
    const VkBuffer bufs[VKB_N_BINDINGS] = {
        p && p->pages.buf ? p->pages.buf : d->dummy.buf,
        p && p->ring.buf ? p->ring.buf : d->dummy.buf,
        d->up.buf,
        d->scratch.buf,
        d->down.buf,
    };
    VkDescriptorBufferInfo infos[VKB_N_BINDINGS];
    VkWriteDescriptorSet writes[VKB_N_BINDINGS];
    for (uint32_t i = 0; i < VKB_N_BINDINGS; i++) {
        infos[i] = (VkDescriptorBufferInfo){.buffer = bufs[i], .offset = 0, .range = VK_WHOLE_SIZE};
        writes[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                           .dstSet = d->set,
                                           .dstBinding = i,
                                           .descriptorCount = 1,
                                           .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                           .pBufferInfo = &infos[i]};
    }
    vkUpdateDescriptorSets(d->dev, VKB_N_BINDINGS, writes, 0, NULL);
}

static void full_barrier(VkCommandBuffer cmd, VkPipelineStageFlags src, VkPipelineStageFlags dst, VkAccessFlags dst_access) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = dst_access};
    vkCmdPipelineBarrier(cmd, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

gokv_status vkb_call_begin(vkb_device *d, vkb_pool *p, VkDeviceSize up_bytes, VkDeviceSize scratch_bytes,
                           VkDeviceSize down_bytes, vkb_call *c) {
    memset(c, 0, sizeof *c);
    pthread_mutex_lock(&d->mu);
    gokv_status st = GOKV_OK;
    if (d->lost) {
        st = gokv_set_error(GOKV_EDEVICE, "vulkan: the device was lost earlier; close it and open a new one");
        goto fail;
    }
    if ((st = buffer_reserve(d, &d->up, up_bytes, 1, "vulkan call", "the upload buffer")) != GOKV_OK) goto fail;
    if ((st = buffer_reserve(d, &d->scratch, scratch_bytes, 0, "vulkan call", "the scratch buffer")) != GOKV_OK) goto fail;
    if ((st = buffer_reserve(d, &d->down, down_bytes, 1, "vulkan call", "the download buffer")) != GOKV_OK) goto fail;
    write_descriptors(d, p);
    VkResult r = vkResetCommandBuffer(d->cmd, 0);
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    if (r == VK_SUCCESS) r = vkBeginCommandBuffer(d->cmd, &bi);
    if (r != VK_SUCCESS) {
        st = vkb_error(d, r, "vulkan call", "beginning the command buffer");
        goto fail;
    }
    /* Earlier calls' writes (a separate submission) become visible to this one. */
    full_barrier(d->cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                 VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT);
    vkCmdBindDescriptorSets(d->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, d->pipeline_layout, 0, 1, &d->set, 0, NULL);
    c->d = d;
    c->p = p;
    c->cmd = d->cmd;
    c->up = d->up.map;
    c->down = d->down.map;
    c->up_bytes = up_bytes;
    c->scratch_bytes = scratch_bytes;
    c->down_bytes = down_bytes;
    return GOKV_OK;
fail:
    pthread_mutex_unlock(&d->mu);
    memset(c, 0, sizeof *c);
    return st;
}

void vkb_cmd_dispatch(vkb_call *c, VkPipeline pipeline, const void *push, uint32_t push_bytes, uint32_t gx,
                      uint32_t gy, uint32_t gz) {
    if (gx == 0 || gy == 0 || gz == 0) return;
    if (c->bound != pipeline) {
        vkCmdBindPipeline(c->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
        c->bound = pipeline;
    }
    if (push && push_bytes) vkCmdPushConstants(c->cmd, c->d->pipeline_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
    vkCmdDispatch(c->cmd, gx, gy, gz);
}

void vkb_cmd_barrier(vkb_call *c) {
    full_barrier(c->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                 VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                 VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT);
}

gokv_status vkb_call_submit(vkb_call *c, const char *op) {
    vkb_device *d = c->d;
    full_barrier(c->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                 VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    VK_TRY(d, vkEndCommandBuffer(c->cmd), op, "ending the command buffer");
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &c->cmd};
    VkResult r = take_injected(GOKV_FAULT_SUBMIT);
    if (r == VK_SUCCESS) r = vkQueueSubmit(d->queue, 1, &si, d->fence);
    if (r != VK_SUCCESS) return vkb_error(d, r, op, "vkQueueSubmit");
    /* A generous bound: a healthy call takes milliseconds on a GPU, seconds at most on lavapipe. */
    r = vkWaitForFences(d->dev, 1, &d->fence, VK_TRUE, 300ull * 1000 * 1000 * 1000);
    if (r != VK_SUCCESS) return vkb_error(d, r, op, "waiting for the submission");
    VK_TRY(d, vkResetFences(d->dev, 1, &d->fence), op, "vkResetFences");
    return GOKV_OK;
}

void vkb_call_end(vkb_call *c) {
    if (c->d) pthread_mutex_unlock(&c->d->mu);
    memset(c, 0, sizeof *c);
}

/* ---- device selection ---- */

static int type_rank(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
    }
}

static int compute_family(VkPhysicalDevice pd, uint32_t *family) {
    uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, NULL);
    VkQueueFamilyProperties qf[32];
    if (n > 32) n = 32;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, qf);
    for (uint32_t i = 0; i < n; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            *family = i;
            return 1;
        }
    return 0;
}

static int usable(VkPhysicalDevice pd) {
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(pd, &p);
    uint32_t fam;
    return p.apiVersion >= VK_API_VERSION_1_2 && compute_family(pd, &fam);
}

static gokv_status pick_physical(vkb_device *d, const gokv_device_desc *desc) {
    const char *op = "gokv_device_open";
    uint32_t n = 0;
    VK_TRY(d, vkEnumeratePhysicalDevices(d->instance, &n, NULL), op, "vkEnumeratePhysicalDevices");
    VkPhysicalDevice list[16];
    if (n > 16) n = 16;
    VkResult r = vkEnumeratePhysicalDevices(d->instance, &n, list);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) return vkb_error(d, r, op, "vkEnumeratePhysicalDevices");
    if (n == 0) return gokv_set_error(GOKV_ENODEV, "%s: vulkan: no Vulkan device found (is a driver installed?)", op);

    char names[512] = "";
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(list[i], &p);
        size_t len = strlen(names);
        snprintf(names + len, sizeof names - len, "%s%u: %s", i ? ", " : "", i, p.deviceName);
    }
    int32_t best = -1;
    if (desc->device_name && desc->device_name[0]) {
        for (uint32_t i = 0; i < n && best < 0; i++) {
            VkPhysicalDeviceProperties p;
            vkGetPhysicalDeviceProperties(list[i], &p);
            if (strstr(p.deviceName, desc->device_name) && usable(list[i])) best = (int32_t)i;
        }
        if (best < 0)
            return gokv_set_error(GOKV_ENODEV, "%s: vulkan: no usable device named like \"%s\" (devices: %s)", op,
                                  desc->device_name, names);
    } else if (desc->device_index >= 0) {
        if ((uint32_t)desc->device_index >= n)
            return gokv_set_error(GOKV_ENODEV, "%s: vulkan: device_index %d out of range: %u device(s) (%s)", op,
                                  desc->device_index, n, names);
        if (!usable(list[desc->device_index]))
            return gokv_set_error(GOKV_ENODEV, "%s: vulkan: device %d lacks Vulkan 1.2 or a compute queue (%s)", op,
                                  desc->device_index, names);
        best = desc->device_index;
    } else {
        int best_rank = 99;
        for (uint32_t i = 0; i < n; i++) {
            if (!usable(list[i])) continue;
            VkPhysicalDeviceProperties p;
            vkGetPhysicalDeviceProperties(list[i], &p);
            if (type_rank(p.deviceType) < best_rank) {
                best_rank = type_rank(p.deviceType);
                best = (int32_t)i;
            }
        }
        if (best < 0)
            return gokv_set_error(GOKV_ENODEV, "%s: vulkan: no device with Vulkan 1.2 and a compute queue (%s)", op, names);
    }
    d->phys = list[best];
    compute_family(d->phys, &d->queue_family);
    return GOKV_OK;
}

static int has_extension(const VkExtensionProperties *ext, uint32_t n, const char *name) {
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(ext[i].extensionName, name) == 0) return 1;
    return 0;
}

/* Per-vendor defaults (README "Tuning"), then the environment's overrides. */
static void choose_tuning(vkb_device *d) {
    vkb_tuning *t = &d->tune;
    t->wg_size = 64;
    t->subgroup_size = 0;
    t->chunk_size = 512;
    switch (d->props.vendorID) {
    case 0x1002: /* AMD: wave32 (RDNA's native width for compute), two waves per workgroup */
        if (d->subgroup_control && d->subgroup_min <= 32 && d->subgroup_max >= 32) t->subgroup_size = 32;
        break;
    case 0x10DE: /* NVIDIA: warps of 32 */ t->wg_size = 128; break;
    case 0x8086: /* Intel: SIMD16 by default */
        if (d->subgroup_control && d->subgroup_min <= 16 && d->subgroup_max >= 16) t->subgroup_size = 16;
        break;
    default: break;
    }
    uint32_t v;
    if (env_uint("GOKV_VULKAN_WG", &v)) t->wg_size = v;
    if (env_uint("GOKV_VULKAN_SUBGROUP", &v)) {
        if (d->subgroup_control && v >= d->subgroup_min && v <= d->subgroup_max && (v & (v - 1)) == 0)
            t->subgroup_size = v;
        else
            gokv_log(GOKV_LOG_WARN, "vulkan", "device_open",
                     "GOKV_VULKAN_SUBGROUP=%u not applied: this device %s subgroup sizes %u..%u", v,
                     d->subgroup_control ? "allows" : "cannot require a subgroup size; its", d->subgroup_min,
                     d->subgroup_max);
    }
    if (env_uint("GOKV_VULKAN_CHUNK", &v)) t->chunk_size = (int32_t)v;
    if (t->wg_size > d->max_wg_invocations) t->wg_size = d->max_wg_invocations;
    const uint32_t sg = t->subgroup_size ? t->subgroup_size : d->subgroup_max;
    if (t->wg_size < sg) t->wg_size = sg;
    const uint32_t budget = d->max_shared_bytes / 2;
    t->shared_budget = budget < 16384 ? budget : 16384;
}

static void query_properties(vkb_device *d, int api13, int ext_sgc) {
    VkPhysicalDeviceSubgroupSizeControlPropertiesEXT sgc = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES_EXT};
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceMaintenance3Properties m3 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES,
                                                 .pNext = &sg};
    if (api13 || ext_sgc) sg.pNext = &sgc;
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &m3};
    vkGetPhysicalDeviceProperties2(d->phys, &p2);
    d->props = p2.properties;
    vkGetPhysicalDeviceMemoryProperties(d->phys, &d->mem_props);
    d->subgroup_size = sg.subgroupSize;
    d->subgroup_ops = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) ? sg.supportedOperations : 0;
    d->subgroup_min = (api13 || ext_sgc) && sgc.minSubgroupSize ? sgc.minSubgroupSize : sg.subgroupSize;
    d->subgroup_max = (api13 || ext_sgc) && sgc.maxSubgroupSize ? sgc.maxSubgroupSize : sg.subgroupSize;
    d->subgroup_control = (api13 || ext_sgc) && (sgc.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT);
    d->max_shared_bytes = d->props.limits.maxComputeSharedMemorySize;
    d->max_wg_invocations = d->props.limits.maxComputeWorkGroupInvocations;
    for (int i = 0; i < 3; i++) d->max_groups[i] = d->props.limits.maxComputeWorkGroupCount[i];
    d->max_storage_range = d->props.limits.maxStorageBufferRange;
    if (m3.maxMemoryAllocationSize && m3.maxMemoryAllocationSize < d->max_storage_range)
        d->max_storage_range = m3.maxMemoryAllocationSize;
    d->max_storage_range &= ~(VkDeviceSize)3u;
    for (uint32_t i = 0; i < d->mem_props.memoryHeapCount; i++)
        if ((d->mem_props.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) &&
            d->mem_props.memoryHeaps[i].size > d->device_local_bytes)
            d->device_local_bytes = d->mem_props.memoryHeaps[i].size;
}

static gokv_status create_instance(vkb_device *d, int validation) {
    const char *op = "gokv_device_open";
    uint32_t api = VK_API_VERSION_1_2;
    uint32_t loader_api = VK_API_VERSION_1_0;
    if (vkEnumerateInstanceVersion(&loader_api) == VK_SUCCESS && loader_api >= VK_API_VERSION_1_3) api = VK_API_VERSION_1_3;
    if (loader_api < VK_API_VERSION_1_2)
        return gokv_set_error(GOKV_ENODEV, "%s: vulkan: the Vulkan loader is older than 1.2", op);
    const char *layers[1] = {"VK_LAYER_KHRONOS_validation"};
    const char *exts[1] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
    VkDebugUtilsMessengerCreateInfoEXT mci = {
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
        .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
        .pfnUserCallback = on_debug_message};
    if (validation) {
        uint32_t n = 0;
        vkEnumerateInstanceLayerProperties(&n, NULL);
        VkLayerProperties *lp = calloc(n ? n : 1, sizeof *lp);
        if (!lp) return gokv_set_error(GOKV_ENOMEM, "%s: vulkan: out of memory listing layers", op);
        vkEnumerateInstanceLayerProperties(&n, lp);
        int found = 0;
        for (uint32_t i = 0; i < n; i++) found |= strcmp(lp[i].layerName, layers[0]) == 0;
        free(lp);
        if (!found)
            return gokv_set_error(GOKV_ENODEV,
                                  "%s: vulkan: GOKV_VULKAN_VALIDATION is set but VK_LAYER_KHRONOS_validation is not "
                                  "installed (Debian: apt install vulkan-validationlayers)", op);
    }
    /* Synchronization validation too: lavapipe runs dispatches one after the other, so a missing
     * barrier would pass there and fail on a real GPU. */
    const VkValidationFeatureEnableEXT enables[1] = {VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
    VkValidationFeaturesEXT features = {.sType = VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT,
                                        .enabledValidationFeatureCount = 1,
                                        .pEnabledValidationFeatures = enables,
                                        .pNext = &mci};
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                             .pApplicationName = "gokv",
                             .pEngineName = "gokv",
                             .apiVersion = api};
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                               .pNext = validation ? &features : NULL,
                               .pApplicationInfo = &app,
                               .enabledLayerCount = validation ? 1u : 0u,
                               .ppEnabledLayerNames = layers,
                               .enabledExtensionCount = validation ? 1u : 0u,
                               .ppEnabledExtensionNames = exts};
    VK_TRY(d, vkCreateInstance(&ci, NULL, &d->instance), op, "vkCreateInstance");
    if (validation) {
        PFN_vkCreateDebugUtilsMessengerEXT create =
            (PFN_vkCreateDebugUtilsMessengerEXT)vkGetInstanceProcAddr(d->instance, "vkCreateDebugUtilsMessengerEXT");
        if (!create) return gokv_set_error(GOKV_ENODEV, "%s: vulkan: VK_EXT_debug_utils is not available", op);
        VK_TRY(d, create(d->instance, &mci, NULL, &d->messenger), op, "vkCreateDebugUtilsMessengerEXT");
    }
    return GOKV_OK;
}

static gokv_status create_device(vkb_device *d) {
    const char *op = "gokv_device_open";
    uint32_t n_ext = 0;
    VK_TRY(d, vkEnumerateDeviceExtensionProperties(d->phys, NULL, &n_ext, NULL), op, "listing device extensions");
    VkExtensionProperties *ext = calloc(n_ext ? n_ext : 1, sizeof *ext);
    if (!ext) return gokv_set_error(GOKV_ENOMEM, "%s: vulkan: out of memory listing extensions", op);
    vkEnumerateDeviceExtensionProperties(d->phys, NULL, &n_ext, ext);
    VkPhysicalDeviceProperties base;
    vkGetPhysicalDeviceProperties(d->phys, &base);
    const int api13 = base.apiVersion >= VK_API_VERSION_1_3;
    const int ext_sgc = !api13 && has_extension(ext, n_ext, VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
    free(ext);
    query_properties(d, api13, ext_sgc);
    const VkSubgroupFeatureFlags need = VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_ARITHMETIC_BIT;
    if ((d->subgroup_ops & need) != need)
        return gokv_set_error(GOKV_ENODEV,
                              "%s: vulkan: %s lacks subgroup arithmetic in compute shaders (supportedOperations 0x%x), "
                              "which the attention shaders need", op, d->props.deviceName, d->subgroup_ops);

    /* Subgroup size control is a feature too: enable it only when the device has it. */
    VkPhysicalDeviceSubgroupSizeControlFeaturesEXT sgf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    if (api13 || ext_sgc) {
        f2.pNext = &sgf;
        vkGetPhysicalDeviceFeatures2(d->phys, &f2);
        if (!sgf.subgroupSizeControl) d->subgroup_control = 0;
        sgf.computeFullSubgroups = VK_FALSE;
    } else {
        d->subgroup_control = 0;
    }
    choose_tuning(d);

    const float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                  .queueFamilyIndex = d->queue_family,
                                  .queueCount = 1,
                                  .pQueuePriorities = &prio};
    const char *dev_exts[1] = {VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME};
    VkDeviceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                             .pNext = d->subgroup_control ? (void *)&sgf : NULL,
                             .queueCreateInfoCount = 1,
                             .pQueueCreateInfos = &qi,
                             .enabledExtensionCount = d->subgroup_control && ext_sgc ? 1u : 0u,
                             .ppEnabledExtensionNames = dev_exts};
    if (d->subgroup_control) sgf.pNext = NULL;
    VK_TRY(d, vkCreateDevice(d->phys, &ci, NULL, &d->dev), op, "vkCreateDevice");
    vkGetDeviceQueue(d->dev, d->queue_family, 0, &d->queue);
    return GOKV_OK;
}

static gokv_status create_objects(vkb_device *d) {
    const char *op = "gokv_device_open";
    VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = d->queue_family};
    VK_TRY(d, vkCreateCommandPool(d->dev, &pci, NULL, &d->cmd_pool), op, "vkCreateCommandPool");
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                       .commandPool = d->cmd_pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                       .commandBufferCount = 1};
    VK_TRY(d, vkAllocateCommandBuffers(d->dev, &cai, &d->cmd), op, "vkAllocateCommandBuffers");
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VK_TRY(d, vkCreateFence(d->dev, &fci, NULL, &d->fence), op, "vkCreateFence");

    VkDescriptorSetLayoutBinding b[VKB_N_BINDINGS];
    for (uint32_t i = 0; i < VKB_N_BINDINGS; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = i,
                                              .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              .descriptorCount = 1,
                                              .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    VkDescriptorSetLayoutCreateInfo lci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                           .bindingCount = VKB_N_BINDINGS,
                                           .pBindings = b};
    VK_TRY(d, vkCreateDescriptorSetLayout(d->dev, &lci, NULL, &d->set_layout), op, "vkCreateDescriptorSetLayout");
    VkPushConstantRange pr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = VKB_PUSH_BYTES};
    VkPipelineLayoutCreateInfo plci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                       .setLayoutCount = 1,
                                       .pSetLayouts = &d->set_layout,
                                       .pushConstantRangeCount = 1,
                                       .pPushConstantRanges = &pr};
    VK_TRY(d, vkCreatePipelineLayout(d->dev, &plci, NULL, &d->pipeline_layout), op, "vkCreatePipelineLayout");
    VkDescriptorPoolSize ps = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = VKB_N_BINDINGS};
    VkDescriptorPoolCreateInfo dpci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                       .maxSets = 1,
                                       .poolSizeCount = 1,
                                       .pPoolSizes = &ps};
    VK_TRY(d, vkCreateDescriptorPool(d->dev, &dpci, NULL, &d->desc_pool), op, "vkCreateDescriptorPool");
    VkDescriptorSetAllocateInfo dsai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                        .descriptorPool = d->desc_pool,
                                        .descriptorSetCount = 1,
                                        .pSetLayouts = &d->set_layout};
    VK_TRY(d, vkAllocateDescriptorSets(d->dev, &dsai, &d->set), op, "vkAllocateDescriptorSets");
    VkPipelineCacheCreateInfo pcci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
    VK_TRY(d, vkCreatePipelineCache(d->dev, &pcci, NULL, &d->pipeline_cache), op, "vkCreatePipelineCache");
    gokv_status st = vkb_buffer_create(d, 256, 0, op, "the dummy ring buffer", &d->dummy);
    if (st == GOKV_OK) st = buffer_reserve(d, &d->up, 1u << 20, 1, op, "the upload buffer");
    if (st == GOKV_OK) st = buffer_reserve(d, &d->scratch, 1u << 20, 0, op, "the scratch buffer");
    if (st == GOKV_OK) st = buffer_reserve(d, &d->down, 1u << 20, 1, op, "the download buffer");
    return st;
}

static void device_close(void *dev_) {
    vkb_device *d = dev_;
    if (!d) return;
    if (d->dev) {
        vkDeviceWaitIdle(d->dev);
        for (int32_t i = 0; i < d->n_pipelines; i++) vkDestroyPipeline(d->dev, d->pipelines[i].pipeline, NULL);
        vkb_buffer_destroy(d, &d->up);
        vkb_buffer_destroy(d, &d->scratch);
        vkb_buffer_destroy(d, &d->down);
        vkb_buffer_destroy(d, &d->dummy);
        if (d->pipeline_cache) vkDestroyPipelineCache(d->dev, d->pipeline_cache, NULL);
        if (d->desc_pool) vkDestroyDescriptorPool(d->dev, d->desc_pool, NULL);
        if (d->pipeline_layout) vkDestroyPipelineLayout(d->dev, d->pipeline_layout, NULL);
        if (d->set_layout) vkDestroyDescriptorSetLayout(d->dev, d->set_layout, NULL);
        if (d->fence) vkDestroyFence(d->dev, d->fence, NULL);
        if (d->cmd_pool) vkDestroyCommandPool(d->dev, d->cmd_pool, NULL);
        vkDestroyDevice(d->dev, NULL);
    }
    if (d->messenger) {
        PFN_vkDestroyDebugUtilsMessengerEXT destroy =
            (PFN_vkDestroyDebugUtilsMessengerEXT)vkGetInstanceProcAddr(d->instance, "vkDestroyDebugUtilsMessengerEXT");
        if (destroy) destroy(d->instance, d->messenger, NULL);
    }
    if (d->instance) vkDestroyInstance(d->instance, NULL);
    free(d->pipelines);
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->pipe_mu);
    free(d);
}

static gokv_status device_open(const gokv_device_desc *desc, void **impl) {
    vkb_device *d = calloc(1, sizeof *d);
    if (!d) return gokv_set_error(GOKV_ENOMEM, "gokv_device_open: vulkan: out of memory");
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->pipe_mu, NULL);
    gokv_status st = create_instance(d, env_flag("GOKV_VULKAN_VALIDATION"));
    if (st == GOKV_OK) st = pick_physical(d, desc);
    if (st == GOKV_OK) st = create_device(d);
    if (st == GOKV_OK) st = create_objects(d);
    if (st != GOKV_OK) {
        char msg[1024];
        gokv_last_error_copy(msg, sizeof msg);
        device_close(d);
        return gokv_set_error(st, "%s", msg);
    }
    gokv_log(GOKV_LOG_INFO, "vulkan", "device_open",
             "%s (vendor 0x%04x), subgroup %u (%u..%u%s), workgroup %u, chunk %d", d->props.deviceName,
             d->props.vendorID, d->subgroup_size, d->subgroup_min, d->subgroup_max,
             d->subgroup_control ? ", size control" : "", d->tune.wg_size, d->tune.chunk_size);
    *impl = d;
    return GOKV_OK;
}

static gokv_status device_info(void *dev_, gokv_device_info *out) {
    vkb_device *d = dev_;
    snprintf(out->name, sizeof out->name, "%.127s", d->props.deviceName);
    const uint32_t v = d->props.apiVersion;
    const uint32_t sg = d->tune.subgroup_size ? d->tune.subgroup_size : d->subgroup_size;
    snprintf(out->features, sizeof out->features, "vulkan %u.%u subgroup %u (%u..%u%s) wg %u chunk %d",
             VK_API_VERSION_MAJOR(v), VK_API_VERSION_MINOR(v), sg, d->subgroup_min, d->subgroup_max,
             d->subgroup_control ? ", size control" : "", d->tune.wg_size, d->tune.chunk_size);
    out->memory_bytes = d->device_local_bytes;
    out->subgroup_size = (int32_t)sg;
    out->n_threads = 1;
    out->caps = GOKV_CAP_DECODE | GOKV_CAP_PREFILL | GOKV_CAP_LEARNED_SINKS | GOKV_CAP_WINDOW | GOKV_CAP_MLA |
                GOKV_CAP_HOLES | GOKV_CAP_BASELINE;
    out->formats = (1u << GOKV_FORMAT_COUNT_) - 1u;
    return GOKV_OK;
}

/* ---- pools ---- */

static void pool_free(vkb_device *d, vkb_pool *p) {
    pthread_mutex_lock(&d->mu);
    vkb_buffer_destroy(d, &p->pages);
    vkb_buffer_destroy(d, &p->ring);
    pthread_mutex_unlock(&d->mu);
    free(p);
}

static gokv_status pool_create(void *dev_, const gokv_pool_desc *desc, const gokv_layout *L, void **impl) {
    vkb_device *d = dev_;
    const char *op = "gokv_pool_create";
    const uint64_t page_bytes = L->page_bytes * (uint64_t)desc->n_pages;
    const uint64_t ring_bytes = L->ring_bytes * (uint64_t)desc->n_residual_slots;
    if (page_bytes + ring_bytes > d->device_local_bytes)
        return gokv_set_error(GOKV_ENOMEM,
                              "%s: vulkan: %d pages of %llu bytes (+ %llu bytes of residual slots) need %llu bytes, "
                              "more than the device's %llu bytes of device-local memory",
                              op, desc->n_pages, (unsigned long long)L->page_bytes, (unsigned long long)ring_bytes,
                              (unsigned long long)(page_bytes + ring_bytes), (unsigned long long)d->device_local_bytes);
    vkb_pool *p = calloc(1, sizeof *p);
    if (!p) return gokv_set_error(GOKV_ENOMEM, "%s: vulkan: out of memory", op);
    p->L = *L;
    p->n_pages = desc->n_pages;
    p->n_slots = desc->n_residual_slots;
    vkb_pool_spec(d, L, p->spec);
    pthread_mutex_lock(&d->mu);
    gokv_status st = d->lost ? gokv_set_error(GOKV_EDEVICE, "%s: vulkan: the device was lost; close it and open a new one", op)
                             : vkb_buffer_create(d, page_bytes, 0, op, "the pool's pages (use fewer pages per pool)", &p->pages);
    if (st == GOKV_OK && ring_bytes) st = vkb_buffer_create(d, ring_bytes, 0, op, "the pool's residual slots", &p->ring);
    pthread_mutex_unlock(&d->mu);
    if (st != GOKV_OK) {
        pool_free(d, p);
        return st;
    }
    /* Zero-fill, so untouched pages read as zeros on every backend. */
    vkb_call c;
    st = vkb_call_begin(d, p, 0, 0, 0, &c);
    if (st == GOKV_OK) {
        vkCmdFillBuffer(c.cmd, p->pages.buf, 0, VK_WHOLE_SIZE, 0);
        if (p->ring.buf) vkCmdFillBuffer(c.cmd, p->ring.buf, 0, VK_WHOLE_SIZE, 0);
        st = vkb_call_submit(&c, op);
        vkb_call_end(&c);
    }
    if (st != GOKV_OK) {
        pool_free(d, p);
        return st;
    }
    *impl = p;
    return GOKV_OK;
}

static void pool_destroy(void *dev_, void *pool) {
    if (pool) pool_free(dev_, pool);
}

static gokv_status pool_copy(void *dev_, void *pool_, const gokv_layout *L, const gokv_copy_desc *desc) {
    vkb_device *d = dev_;
    vkb_pool *p = pool_;
    const char *op = "gokv_pool_copy";
    if (desc->n_pages == 0 && desc->n_slots == 0) return GOKV_OK;
    VkBufferCopy *regions = malloc(sizeof *regions * (size_t)(desc->n_pages > desc->n_slots ? desc->n_pages : desc->n_slots));
    if (!regions) return gokv_set_error(GOKV_ENOMEM, "%s: vulkan: out of memory for %d copy regions", op, desc->n_pages);
    vkb_call c;
    gokv_status st = vkb_call_begin(d, p, 0, 0, 0, &c);
    if (st == GOKV_OK) {
        for (int32_t i = 0; i < desc->n_pages; i++)
            regions[i] = (VkBufferCopy){.srcOffset = (VkDeviceSize)desc->src_pages[i] * L->page_bytes,
                                        .dstOffset = (VkDeviceSize)desc->dst_pages[i] * L->page_bytes,
                                        .size = L->page_bytes};
        if (desc->n_pages) vkCmdCopyBuffer(c.cmd, p->pages.buf, p->pages.buf, (uint32_t)desc->n_pages, regions);
        for (int32_t i = 0; i < desc->n_slots; i++)
            regions[i] = (VkBufferCopy){.srcOffset = (VkDeviceSize)desc->src_slots[i] * L->ring_bytes,
                                        .dstOffset = (VkDeviceSize)desc->dst_slots[i] * L->ring_bytes,
                                        .size = L->ring_bytes};
        if (desc->n_slots && p->ring.buf) vkCmdCopyBuffer(c.cmd, p->ring.buf, p->ring.buf, (uint32_t)desc->n_slots, regions);
        st = vkb_call_submit(&c, op);
        vkb_call_end(&c);
    }
    free(regions);
    return st;
}

/* Backend slots page_bytes and slot_bytes: `bytes` at `offset` of buffer src, copied through the download
 * buffer. */
static gokv_status download(vkb_device *d, vkb_pool *p, VkBuffer src, uint64_t offset, uint64_t bytes, void *out,
                            const char *op) {
    vkb_call c;
    gokv_status st = vkb_call_begin(d, p, 0, 0, bytes, &c);
    if (st) return st;
    const VkBufferCopy region = {.srcOffset = offset, .size = bytes};
    vkCmdCopyBuffer(c.cmd, src, d->down.buf, 1, &region);
    st = vkb_call_submit(&c, op);
    if (!st) memcpy(out, c.down, bytes);
    vkb_call_end(&c);
    return st;
}

static gokv_status page_bytes(void *dev_, void *pool_, const gokv_layout *L, int32_t page, void *out) {
    vkb_pool *p = pool_;
    return download(dev_, p, p->pages.buf, (uint64_t)page * L->page_bytes, L->page_bytes, out, "gokv_pool_page_bytes");
}

static gokv_status slot_bytes(void *dev_, void *pool_, const gokv_layout *L, int32_t slot, void *out) {
    vkb_pool *p = pool_;
    return download(dev_, p, p->ring.buf, (uint64_t)slot * L->ring_bytes, L->ring_bytes, out, "gokv_pool_slot_bytes");
}

/* ---- the backend table ---- */

static const gokv_backend g_vulkan_backend = {
    .name = "vulkan",
    .device_open = device_open,
    .device_close = device_close,
    .device_info = device_info,
    .pool_create = pool_create,
    .pool_destroy = pool_destroy,
    .pool_write = vkb_pool_write,
    .pool_read = vkb_pool_read,
    .pool_copy = pool_copy,
    .attend = vkb_attend,
    .page_bytes = page_bytes,
    .slot_bytes = slot_bytes,
    .measure = vkb_measure,
    .inject_fault = inject_fault,
};

const gokv_backend *gokv_vulkan_backend(void) { return &g_vulkan_backend; }

gokv_status gokv_vulkan_register(void) { return gokv_register_backend(&g_vulkan_backend); }
