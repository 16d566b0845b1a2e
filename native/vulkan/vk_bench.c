/*
 * vk_bench.c: what `gokv bench --backend vulkan` measures besides the ABI calls: the device's copy bandwidth
 * (the floor that attention's speed is reported against, docs/architecture.md §9) and attention timed as an
 * engine runs it (many layers' dispatches in one submission, GPU timestamps, no host round trip per layer).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vk_internal.h"

/* GPU timer: two timestamps around recorded work; falls back to host time when the queue has none. */
gokv_status vkb_timer_create(vkb_device *d, vkb_timer *t, const char *op) {
    memset(t, 0, sizeof *t);
    uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(d->phys, &n, NULL);
    VkQueueFamilyProperties *qf = calloc(n ? n : 1, sizeof *qf);
    if (!qf) return gokv_set_error(GOKV_ENOMEM, "%s: vulkan: out of memory", op);
    vkGetPhysicalDeviceQueueFamilyProperties(d->phys, &n, qf);
    const int has = d->queue_family < n && qf[d->queue_family].timestampValidBits > 0 &&
                    d->props.limits.timestampPeriod > 0;
    free(qf);
    if (!has) return GOKV_OK;
    VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                .queryCount = 2};
    VkResult r = vkCreateQueryPool(d->dev, &qi, NULL, &t->pool);
    if (r != VK_SUCCESS) return vkb_error(d, r, op, "vkCreateQueryPool");
    return GOKV_OK;
}

void vkb_timer_start(gpu_call *c, vkb_timer *t) {
    if (t->pool) {
        vkCmdResetQueryPool(vkb_cmd(c), t->pool, 0, 2);
        vkCmdWriteTimestamp(vkb_cmd(c), VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, t->pool, 0);
    }
    clock_gettime(CLOCK_MONOTONIC, &t->host0);
}

void vkb_timer_stop(gpu_call *c, vkb_timer *t) {
    if (t->pool) vkCmdWriteTimestamp(vkb_cmd(c), VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, t->pool, 1);
}

/* Milliseconds between start and stop, after the call was submitted; host time (submission included)
 * without timestamps. */
double vkb_timer_ms(vkb_device *d, vkb_timer *t) {
    if (t->pool) {
        uint64_t ts[2];
        if (vkGetQueryPoolResults(d->dev, t->pool, 0, 2, sizeof ts, ts, sizeof ts[0],
                                  VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) == VK_SUCCESS)
            return (double)(ts[1] - ts[0]) * d->props.limits.timestampPeriod * 1e-6;
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t->host0.tv_sec) * 1e3 + (double)(now.tv_nsec - t->host0.tv_nsec) * 1e-6;
}

void vkb_timer_destroy(vkb_device *d, vkb_timer *t) {
    if (t->pool) vkDestroyQueryPool(d->dev, t->pool, NULL);
    memset(t, 0, sizeof *t);
}

/* Backend slot measure: the device's copy bandwidth (read + write) between two device-local buffers of
 * `bytes` each (0: 256 MiB; clamped to the device's limits), GPU timestamps, best of three rounds. Attention
 * reads its bytes once, so a kernel at this bandwidth is at the floor. Compute peak is not measured (decode
 * attention on compressed K/V is memory-bound on GPUs). */
gokv_status vkb_measure(void *dev_, uint64_t bytes, gokv_device_ceilings *out) {
    const char *op = "gokv_device_measure";
    vkb_device *d = dev_;
    if (bytes == 0) bytes = 256u << 20;
    if (bytes > d->base.caps.max_binding_bytes) bytes = d->base.caps.max_binding_bytes;
    if (bytes > d->base.caps.memory_bytes / 4) bytes = d->base.caps.memory_bytes / 4;
    bytes &= ~(uint64_t)255u;
    enum { REPS = 8 };
    vkb_buffer a, b;
    pthread_mutex_lock(&d->mu);
    gokv_status st = vkb_buffer_create(d, bytes, 0, op, "the copy source", &a);
    if (st == GOKV_OK && (st = vkb_buffer_create(d, bytes, 0, op, "the copy destination", &b)) != GOKV_OK)
        vkb_buffer_destroy(d, &a);
    pthread_mutex_unlock(&d->mu);
    if (st != GOKV_OK) return st;
    vkb_timer t;
    st = vkb_timer_create(d, &t, op);
    double best = 0;
    for (int round = 0; round < 3 && st == GOKV_OK; round++) {
        gpu_call c;
        if ((st = gpu_call_begin(&d->base, NULL, 0, 0, 0, &c)) != GOKV_OK) break;
        const VkBufferCopy region = {.srcOffset = 0, .dstOffset = 0, .size = bytes};
        vkCmdFillBuffer(vkb_cmd(&c), a.buf, 0, VK_WHOLE_SIZE, (uint32_t)round);
        gpu_barrier(&c);
        vkb_timer_start(&c, &t);
        for (int i = 0; i < REPS; i++) {
            vkCmdCopyBuffer(vkb_cmd(&c), i % 2 ? b.buf : a.buf, i % 2 ? a.buf : b.buf, 1, &region);
            gpu_barrier(&c);
        }
        vkb_timer_stop(&c, &t);
        st = gpu_call_submit(&c, op);
        gpu_call_end(&c);
        if (st == GOKV_OK) {
            const double ms = vkb_timer_ms(d, &t);
            const double g = ms > 0 ? 2.0 * (double)bytes * REPS / (ms * 1e-3) / 1e9 : 0;
            if (g > best) best = g;
        }
    }
    const int t_had_timestamps = t.pool != VK_NULL_HANDLE;
    vkb_timer_destroy(d, &t);
    pthread_mutex_lock(&d->mu);
    vkb_buffer_destroy(d, &a);
    vkb_buffer_destroy(d, &b);
    pthread_mutex_unlock(&d->mu);
    if (st == GOKV_OK) {
        out->read_gbps = best;
        snprintf(out->method, sizeof out->method, "buffer copy, read + write, %s timestamps",
                 t_had_timestamps ? "GPU" : "host");
    }
    return st;
}
