/*
 * vk_submit.c: the module's gpu_ops (native/gpu/gpu_plan.h): one ABI call's command buffer: begin (lock,
 * grow the buffers, bind the descriptor set), record dispatches, copies, fills and barriers, submit and
 * wait, end.
 */
#define _GNU_SOURCE
#include <string.h>

#include "vk_internal.h"

/* ---- calls ---- */

static void write_descriptors(vkb_device *d, vkb_pool *p) {
    const VkBuffer bufs[GPU_N_BINDINGS] = {
        p && p->pages.buf ? p->pages.buf : d->dummy.buf,
        p && p->ring.buf ? p->ring.buf : d->dummy.buf,
        d->up.buf,
        d->scratch.buf,
        d->down.buf,
    };
    VkDescriptorBufferInfo infos[GPU_N_BINDINGS];
    VkWriteDescriptorSet writes[GPU_N_BINDINGS];
    for (uint32_t i = 0; i < GPU_N_BINDINGS; i++) {
        infos[i] = (VkDescriptorBufferInfo){.buffer = bufs[i], .offset = 0, .range = VK_WHOLE_SIZE};
        writes[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                           .dstSet = d->set,
                                           .dstBinding = i,
                                           .descriptorCount = 1,
                                           .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                           .pBufferInfo = &infos[i]};
    }
    vkUpdateDescriptorSets(d->dev, GPU_N_BINDINGS, writes, 0, NULL);
}

static void full_barrier(VkCommandBuffer cmd, VkPipelineStageFlags src, VkPipelineStageFlags dst, VkAccessFlags dst_access) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = dst_access};
    vkCmdPipelineBarrier(cmd, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

static gokv_status call_begin(gpu_device *dev, gpu_pool *pool, uint64_t up_bytes, uint64_t scratch_bytes,
                              uint64_t down_bytes, gpu_call *c) {
    vkb_device *d = (vkb_device *)dev;
    vkb_pool *p = (vkb_pool *)pool;
    memset(c, 0, sizeof *c);
    pthread_mutex_lock(&d->mu);
    gokv_status st = GOKV_OK;
    if (d->lost) {
        st = gokv_set_error(GOKV_EDEVICE, "vulkan: the device was lost earlier; close it and open a new one");
        goto fail;
    }
    if ((st = vkb_buffer_reserve(d, &d->up, up_bytes, 1, "vulkan call", "the upload buffer")) != GOKV_OK) goto fail;
    if ((st = vkb_buffer_reserve(d, &d->scratch, scratch_bytes, 0, "vulkan call", "the scratch buffer")) != GOKV_OK) goto fail;
    if ((st = vkb_buffer_reserve(d, &d->down, down_bytes, 1, "vulkan call", "the download buffer")) != GOKV_OK) goto fail;
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
    d->rec = (vkb_call){.cmd = d->cmd, .bound = VK_NULL_HANDLE};
    c->d = dev;
    c->p = pool;
    c->up = d->up.map;
    c->down = d->down.map;
    c->up_bytes = up_bytes;
    c->scratch_bytes = scratch_bytes;
    c->down_bytes = down_bytes;
    c->impl = &d->rec;
    return GOKV_OK;
fail:
    pthread_mutex_unlock(&d->mu);
    memset(c, 0, sizeof *c);
    return st;
}

/* Binds the pipeline (if not bound), pushes the constants, dispatches gx*gy*gz workgroups. */
static void call_dispatch(gpu_call *c, gpu_pipeline pipeline, const void *push, uint32_t push_bytes, uint32_t gx,
                          uint32_t gy, uint32_t gz) {
    if (gx == 0 || gy == 0 || gz == 0) return;
    vkb_call *rec = c->impl;
    const VkPipeline pl = (VkPipeline)pipeline;
    if (rec->bound != pl) {
        vkCmdBindPipeline(rec->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pl);
        rec->bound = pl;
    }
    if (push && push_bytes)
        vkCmdPushConstants(rec->cmd, ((vkb_device *)c->d)->pipeline_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
    vkCmdDispatch(rec->cmd, gx, gy, gz);
}

/* The buffer bound at a GPU_* binding in this call. */
static const vkb_buffer *binding_buffer(gpu_call *c, int32_t binding) {
    vkb_device *d = (vkb_device *)c->d;
    vkb_pool *p = (vkb_pool *)c->p;
    switch (binding) {
    case GPU_PAGES: return p && p->pages.buf ? &p->pages : &d->dummy;
    case GPU_RINGS: return p && p->ring.buf ? &p->ring : &d->dummy;
    case GPU_UP: return &d->up;
    case GPU_SCRATCH: return &d->scratch;
    default: return &d->down;
    }
}

static void call_copy(gpu_call *c, int32_t src, uint64_t src_off, int32_t dst, uint64_t dst_off, uint64_t bytes) {
    if (bytes == 0) return;
    const VkBufferCopy region = {.srcOffset = src_off, .dstOffset = dst_off, .size = bytes};
    vkCmdCopyBuffer(vkb_cmd(c), binding_buffer(c, src)->buf, binding_buffer(c, dst)->buf, 1, &region);
}

static void call_fill(gpu_call *c, int32_t dst, uint64_t off, uint64_t bytes, uint32_t word) {
    if (bytes == 0) return;
    const vkb_buffer *b = binding_buffer(c, dst);
    /* up to the end of the buffer: VK_WHOLE_SIZE, which needs no multiple of 4 */
    vkCmdFillBuffer(vkb_cmd(c), b->buf, off, off + bytes >= b->size ? VK_WHOLE_SIZE : bytes, word);
}

static void call_barrier(gpu_call *c) {
    full_barrier(vkb_cmd(c), VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                 VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                 VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT);
}

static gokv_status call_submit(gpu_call *c, const char *op) {
    vkb_device *d = (vkb_device *)c->d;
    VkCommandBuffer cmd = vkb_cmd(c);
    full_barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                 VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    VK_TRY(d, vkEndCommandBuffer(cmd), op, "ending the command buffer");
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cmd};
    VkResult r = vkb_take_injected(GOKV_FAULT_SUBMIT);
    if (r == VK_SUCCESS) r = vkQueueSubmit(d->queue, 1, &si, d->fence);
    if (r != VK_SUCCESS) return vkb_error(d, r, op, "vkQueueSubmit");
    /* A generous bound: a healthy call takes milliseconds on a GPU, seconds at most on lavapipe. */
    r = vkWaitForFences(d->dev, 1, &d->fence, VK_TRUE, 300ull * 1000 * 1000 * 1000);
    if (r != VK_SUCCESS) return vkb_error(d, r, op, "waiting for the submission");
    VK_TRY(d, vkResetFences(d->dev, 1, &d->fence), op, "vkResetFences");
    return GOKV_OK;
}

static void call_end(gpu_call *c) {
    if (c->d) pthread_mutex_unlock(&((vkb_device *)c->d)->mu);
    memset(c, 0, sizeof *c);
}

const gpu_ops vkb_ops = {
    .pipeline = vkb_pipeline,
    .begin = call_begin,
    .dispatch = call_dispatch,
    .copy = call_copy,
    .fill = call_fill,
    .barrier = call_barrier,
    .submit = call_submit,
    .end = call_end,
};
