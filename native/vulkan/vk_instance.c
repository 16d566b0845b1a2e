/*
 * vk_instance.c: the Vulkan instance (and the validation messenger, GOKV_VULKAN_VALIDATION=1), the choice
 * of physical device, per-vendor tuning and its environment overrides, the logical device and the
 * per-device objects (command buffer, fence, descriptor set, pipeline layout and cache), and the backend
 * slots device_open, device_close and device_info.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

/* ---- validation messages ---- */

static atomic_uint_fast64_t g_validation_messages;

uint64_t gokv_vulkan_validation_messages(void) { return (uint64_t)atomic_load(&g_validation_messages); }

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

/* Per-vendor defaults (README "Tuning"), then the environment's overrides; then the plan's view of the
 * device (gpu_caps) from the limits and the tuning. */
static void choose_tuning(vkb_device *d) {
    gpu_caps *t = &d->base.caps;
    t->wg_size = 64;
    d->subgroup_request = 0;
    t->chunk_size = 512;
    switch (d->props.vendorID) {
    case 0x1002: /* AMD: wave32 (RDNA's native width for compute), two waves per workgroup */
        if (d->subgroup_control && d->subgroup_min <= 32 && d->subgroup_max >= 32) d->subgroup_request = 32;
        break;
    case 0x10DE: /* NVIDIA: warps of 32 */ t->wg_size = 128; break;
    case 0x8086: /* Intel: SIMD16 by default */
        if (d->subgroup_control && d->subgroup_min <= 16 && d->subgroup_max >= 16) d->subgroup_request = 16;
        break;
    default: break;
    }
    uint32_t v;
    if (env_uint("GOKV_VULKAN_WG", &v)) t->wg_size = v;
    if (env_uint("GOKV_VULKAN_SUBGROUP", &v)) {
        if (d->subgroup_control && v >= d->subgroup_min && v <= d->subgroup_max && (v & (v - 1)) == 0)
            d->subgroup_request = v;
        else
            gokv_log(GOKV_LOG_WARN, "vulkan", "device_open",
                     "GOKV_VULKAN_SUBGROUP=%u not applied: this device %s subgroup sizes %u..%u", v,
                     d->subgroup_control ? "allows" : "cannot require a subgroup size; its", d->subgroup_min,
                     d->subgroup_max);
    }
    if (env_uint("GOKV_VULKAN_CHUNK", &v)) t->chunk_size = (int32_t)v;
    if (t->wg_size > d->max_wg_invocations) t->wg_size = d->max_wg_invocations;
    const uint32_t sg = d->subgroup_request ? d->subgroup_request : d->subgroup_max;
    if (t->wg_size < sg) t->wg_size = sg;
    const uint32_t budget = t->max_shared_bytes / 2;
    t->shared_budget = budget < 16384 ? budget : 16384;
    t->subgroup_size = d->subgroup_request ? d->subgroup_request : d->subgroup_size;
    /* a pipeline that requires no size may get any size the device allows */
    t->subgroup_min = d->subgroup_request ? d->subgroup_request
                                          : d->subgroup_min < d->subgroup_size ? d->subgroup_min : d->subgroup_size;
    /* on a discrete GPU the up buffer is host memory across a bus: the plan stages inputs in scratch */
    t->stage_inputs = d->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
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
    gpu_caps *caps = &d->base.caps;
    caps->max_shared_bytes = d->props.limits.maxComputeSharedMemorySize;
    d->max_wg_invocations = d->props.limits.maxComputeWorkGroupInvocations;
    for (int i = 0; i < 3; i++) caps->max_groups[i] = d->props.limits.maxComputeWorkGroupCount[i];
    caps->max_binding_bytes = d->props.limits.maxStorageBufferRange;
    if (m3.maxMemoryAllocationSize && m3.maxMemoryAllocationSize < caps->max_binding_bytes)
        caps->max_binding_bytes = m3.maxMemoryAllocationSize;
    caps->max_binding_bytes &= ~(uint64_t)3u;
    for (uint32_t i = 0; i < d->mem_props.memoryHeapCount; i++) /* the largest device-local heap */
        if ((d->mem_props.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) &&
            d->mem_props.memoryHeaps[i].size > caps->memory_bytes)
            caps->memory_bytes = d->mem_props.memoryHeaps[i].size;
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

    VkDescriptorSetLayoutBinding b[GPU_N_BINDINGS];
    for (uint32_t i = 0; i < GPU_N_BINDINGS; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = i,
                                              .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              .descriptorCount = 1,
                                              .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    VkDescriptorSetLayoutCreateInfo lci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                           .bindingCount = GPU_N_BINDINGS,
                                           .pBindings = b};
    VK_TRY(d, vkCreateDescriptorSetLayout(d->dev, &lci, NULL, &d->set_layout), op, "vkCreateDescriptorSetLayout");
    VkPushConstantRange pr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = GPU_PUSH_BYTES};
    VkPipelineLayoutCreateInfo plci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                       .setLayoutCount = 1,
                                       .pSetLayouts = &d->set_layout,
                                       .pushConstantRangeCount = 1,
                                       .pPushConstantRanges = &pr};
    VK_TRY(d, vkCreatePipelineLayout(d->dev, &plci, NULL, &d->pipeline_layout), op, "vkCreatePipelineLayout");
    VkDescriptorPoolSize ps = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = GPU_N_BINDINGS};
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
    if (st == GOKV_OK) st = vkb_buffer_reserve(d, &d->up, 1u << 20, 1, op, "the upload buffer");
    if (st == GOKV_OK) st = vkb_buffer_reserve(d, &d->scratch, 1u << 20, 0, op, "the scratch buffer");
    if (st == GOKV_OK) st = vkb_buffer_reserve(d, &d->down, 1u << 20, 1, op, "the download buffer");
    return st;
}

void vkb_device_close(void *dev_) {
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

gokv_status vkb_device_open(const gokv_device_desc *desc, void **impl) {
    vkb_device *d = calloc(1, sizeof *d);
    if (!d) return gokv_set_error(GOKV_ENOMEM, "gokv_device_open: vulkan: out of memory");
    d->base.ops = &vkb_ops;
    d->base.backend = "vulkan";
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->pipe_mu, NULL);
    gokv_status st = create_instance(d, env_flag("GOKV_VULKAN_VALIDATION"));
    if (st == GOKV_OK) st = pick_physical(d, desc);
    if (st == GOKV_OK) st = create_device(d);
    if (st == GOKV_OK) st = create_objects(d);
    if (st != GOKV_OK) {
        char msg[1024];
        gokv_last_error_copy(msg, sizeof msg);
        vkb_device_close(d);
        return gokv_set_error(st, "%s", msg);
    }
    gokv_log(GOKV_LOG_INFO, "vulkan", "device_open",
             "%s (vendor 0x%04x), subgroup %u (%u..%u%s), workgroup %u, chunk %d", d->props.deviceName,
             d->props.vendorID, d->subgroup_size, d->subgroup_min, d->subgroup_max,
             d->subgroup_control ? ", size control" : "", d->base.caps.wg_size, d->base.caps.chunk_size);
    *impl = d;
    return GOKV_OK;
}

gokv_status vkb_device_info(void *dev_, gokv_device_info *out) {
    vkb_device *d = dev_;
    snprintf(out->name, sizeof out->name, "%.127s", d->props.deviceName);
    const uint32_t v = d->props.apiVersion;
    const uint32_t sg = d->base.caps.subgroup_size;
    snprintf(out->features, sizeof out->features, "vulkan %u.%u subgroup %u (%u..%u%s) wg %u chunk %d",
             VK_API_VERSION_MAJOR(v), VK_API_VERSION_MINOR(v), sg, d->subgroup_min, d->subgroup_max,
             d->subgroup_control ? ", size control" : "", d->base.caps.wg_size, d->base.caps.chunk_size);
    out->memory_bytes = d->base.caps.memory_bytes;
    out->subgroup_size = (int32_t)sg;
    out->n_threads = 1;
    out->caps = GOKV_CAP_DECODE | GOKV_CAP_PREFILL | GOKV_CAP_LEARNED_SINKS | GOKV_CAP_WINDOW | GOKV_CAP_MLA |
                GOKV_CAP_HOLES | GOKV_CAP_BASELINE | GOKV_CAP_MASS | GOKV_CAP_KV_HEAD_MASKS | GOKV_CAP_QUEST;
    out->formats = (1u << GOKV_FORMAT_COUNT_) - 1u;
    return GOKV_OK;
}
