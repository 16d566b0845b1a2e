/*
 * vk_memory.c: memory types and buffers: device-local storage, host-visible mapped upload and download
 * buffers, and the growth of the per-device buffers that calls reuse.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "vk_internal.h"

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
    const VkDeviceSize max_range = d->base.caps.max_binding_bytes;
    if (size > max_range)
        return gokv_set_error(GOKV_ENOMEM,
                              "%s: vulkan: %s needs %llu bytes, more than this device's largest storage buffer "
                              "(maxStorageBufferRange %llu bytes)",
                              op, what, (unsigned long long)size, (unsigned long long)max_range);
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
    VkResult r = vkb_take_injected(GOKV_FAULT_ALLOC);
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
gokv_status vkb_buffer_reserve(vkb_device *d, vkb_buffer *b, VkDeviceSize size, int host, const char *op,
                               const char *what) {
    if (size < 256) size = 256;
    if (b->buf && b->size >= size) return GOKV_OK;
    VkDeviceSize want = b->size * 2 > size ? b->size * 2 : size;
    want = (want + 65535u) & ~(VkDeviceSize)65535u;
    if (want > d->base.caps.max_binding_bytes) want = size;
    vkb_buffer_destroy(d, b);
    return vkb_buffer_create(d, want, host, op, what, b);
}
