/*
 * vk_submit.c: one ABI call's command buffer: begin (lock, grow the buffers, bind the descriptor set), record
 * dispatches and barriers, submit and wait, end (vk_internal.h describes the sequence).
 */
#define _GNU_SOURCE
#include <string.h>

#include "vk_internal.h"

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

void vkb_dispatch_linear(vkb_call *c, VkPipeline pipeline, const void *push, uint32_t push_bytes, uint64_t items,
                         uint32_t wg) {
    const uint64_t groups = (items + wg - 1) / wg;
    const uint32_t gx = groups < 65535 ? (uint32_t)groups : 65535u;
    if (gx) vkb_cmd_dispatch(c, pipeline, push, push_bytes, gx, (uint32_t)((groups + gx - 1) / gx), 1);
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
    VkResult r = vkb_take_injected(GOKV_FAULT_SUBMIT);
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
