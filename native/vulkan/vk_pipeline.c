/*
 * vk_pipeline.c: compute pipelines (gpu_ops.pipeline): the embedded SPIR-V looked up by shader name,
 * specialized with the plan's constants (GPU_SPEC_*), and the per-device cache of pipelines by (shader,
 * constants).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

/* ---- pipelines ---- */

static const vkb_spirv *find_spirv(const char *name) {
    for (int32_t i = 0; i < gokv_vk_spirv_count; i++)
        if (strcmp(gokv_vk_spirv[i].name, name) == 0) return &gokv_vk_spirv[i];
    return NULL;
}

static gokv_status create_pipeline(vkb_device *d, const vkb_spirv *code, const uint32_t spec[GPU_SPEC_COUNT],
                                   VkPipeline *out) {
    const char *op = "vulkan pipeline";
    VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                   .codeSize = code->size_bytes,
                                   .pCode = code->code};
    VkShaderModule module;
    VK_TRY(d, vkCreateShaderModule(d->dev, &mi, NULL, &module), op, code->name);

    VkSpecializationMapEntry entries[GPU_SPEC_COUNT];
    for (uint32_t i = 0; i < GPU_SPEC_COUNT; i++)
        entries[i] = (VkSpecializationMapEntry){.constantID = i, .offset = i * 4u, .size = 4u};
    VkSpecializationInfo si = {.mapEntryCount = GPU_SPEC_COUNT,
                               .pMapEntries = entries,
                               .dataSize = sizeof(uint32_t) * GPU_SPEC_COUNT,
                               .pData = spec};
    VkPipelineShaderStageRequiredSubgroupSizeCreateInfoEXT req = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO_EXT,
        .requiredSubgroupSize = d->subgroup_request};
    VkPipelineShaderStageCreateInfo stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                                             .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                                             .module = module,
                                             .pName = "main",
                                             .pSpecializationInfo = &si};
    if (d->subgroup_control && d->subgroup_request) stage.pNext = &req;
    VkComputePipelineCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
                                      .stage = stage,
                                      .layout = d->pipeline_layout};
    VkResult r = vkCreateComputePipelines(d->dev, d->pipeline_cache, 1, &ci, NULL, out);
    vkDestroyShaderModule(d->dev, module, NULL);
    if (r != VK_SUCCESS) return vkb_error(d, r, op, code->name);
    return GOKV_OK;
}

static gokv_status get_pipeline_locked(vkb_device *d, const char *shader, const uint32_t spec[GPU_SPEC_COUNT],
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

gokv_status vkb_pipeline(gpu_device *dev, const char *name, const uint32_t spec[GPU_SPEC_COUNT], gpu_pipeline *out) {
    vkb_device *d = (vkb_device *)dev;
    VkPipeline pl = VK_NULL_HANDLE;
    pthread_mutex_lock(&d->pipe_mu);
    gokv_status st = get_pipeline_locked(d, name, spec, &pl);
    pthread_mutex_unlock(&d->pipe_mu);
    *out = (gpu_pipeline)pl;
    return st;
}
