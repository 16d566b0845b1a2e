/*
 * vk_pipeline.c: compute pipelines: the specialization constants of a pool's layout, the embedded SPIR-V
 * looked up by shader name, and the per-device cache of pipelines by (shader, constants).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

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
