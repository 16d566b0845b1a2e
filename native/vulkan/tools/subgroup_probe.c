/*
 * subgroup_probe.c: does the Vulkan driver's subgroup support work at all? Runs subgroup_probe.comp
 * (subgroupMax, subgroupAdd, subgroupElect, gl_SubgroupID, gl_NumSubgroups, a cross-subgroup sum in shared
 * memory, a lane-varying loop) on the first device, 4 workgroups, and checks every value on the host.
 * Written to tell a driver fault from a shader fault: lavapipe forced past its widest vectors
 * (LP_NATIVE_VECTOR_WIDTH=1024, "subgroup 32") fails here, while it passes at 128, 256 and 512 bits
 * (native/vulkan/README.md, Tests). Not part of the build; by hand:
 *   glslc --target-env=vulkan1.1 native/vulkan/tools/subgroup_probe.comp -o /tmp/probe.spv
 *   gcc -O1 native/vulkan/tools/subgroup_probe.c -o /tmp/probe -lvulkan -lm
 *   LP_NATIVE_VECTOR_WIDTH=512 /tmp/probe /tmp/probe.spv [workgroup size, default 64, at most 128]
 * Exit status 0 when every value matches.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vulkan/vulkan.h>

#define CHECK(x)                                                                                                \
    do {                                                                                                        \
        const VkResult r_ = (x);                                                                                \
        if (r_ != VK_SUCCESS) {                                                                                 \
            fprintf(stderr, "%s: VkResult %d\n", #x, r_);                                                       \
            exit(2);                                                                                            \
        }                                                                                                       \
    } while (0)

enum { N_WG = 4, FIELDS = 8 };

static uint32_t *read_spirv(const char *path, size_t *bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *bytes = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint32_t *code = malloc(*bytes + 4);
    if (code && fread(code, 1, *bytes, f) != *bytes) free(code), code = NULL;
    fclose(f);
    return code;
}

/* What invocation l of a workgroup of wg, in subgroups of s, must have written. */
static void expected(uint32_t l, uint32_t wg, uint32_t s, float want[FIELDS]) {
    const uint32_t sg = l / s, first = sg * s, last = first + s - 1 < wg - 1 ? first + s - 1 : wg - 1;
    float sum = 0, total = 0, acc = 0;
    for (uint32_t k = first; k <= last; k++) sum += k * 0.5f + 1;
    for (uint32_t k = 0; k < wg; k++) total += k * 0.5f + 1;
    for (uint32_t k = l; k < 200; k += wg) acc += (float)k;
    const float w[FIELDS] = {last * 0.5f + 1, sum, (float)sg, l == first ? 1.f : 0.f, (float)((wg + s - 1) / s), (float)s,
                             total, acc};
    for (int j = 0; j < FIELDS; j++) want[j] = w[j];
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s probe.spv [workgroup size]\n", argv[0]);
        return 2;
    }
    uint32_t wg = argc > 2 ? (uint32_t)atoi(argv[2]) : 64;
    if (wg < 1 || wg > 128) wg = 64;
    size_t code_bytes = 0;
    uint32_t *code = read_spirv(argv[1], &code_bytes);
    if (!code) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 2;
    }
    const VkApplicationInfo app = {VK_STRUCTURE_TYPE_APPLICATION_INFO, NULL, "subgroup_probe", 1, NULL, 0, VK_API_VERSION_1_1};
    const VkInstanceCreateInfo ici = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, NULL, 0, &app, 0, NULL, 0, NULL};
    VkInstance inst;
    CHECK(vkCreateInstance(&ici, NULL, &inst));
    uint32_t n_pd = 1;
    VkPhysicalDevice pd;
    if (vkEnumeratePhysicalDevices(inst, &n_pd, &pd) < 0 || n_pd == 0) {
        fprintf(stderr, "no Vulkan device\n");
        return 2;
    }
    VkPhysicalDeviceSubgroupProperties sgp = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES, NULL, 0, 0, 0, 0};
    VkPhysicalDeviceProperties2 props = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &sgp, {0}};
    vkGetPhysicalDeviceProperties2(pd, &props);
    const uint32_t s = sgp.subgroupSize;
    printf("%s: subgroup size %u, workgroup %u\n", props.properties.deviceName, s, wg);

    const float prio = 1.0f;
    const VkDeviceQueueCreateInfo qci = {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, NULL, 0, 0, 1, &prio};
    const VkDeviceCreateInfo dci = {VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, NULL, 0, 1, &qci, 0, NULL, 0, NULL, NULL};
    VkDevice dev;
    CHECK(vkCreateDevice(pd, &dci, NULL, &dev));
    VkQueue queue;
    vkGetDeviceQueue(dev, 0, 0, &queue);

    const VkDeviceSize bytes = (VkDeviceSize)wg * N_WG * FIELDS * sizeof(float);
    const VkBufferCreateInfo bci = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, NULL, 0, bytes, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                                    VK_SHARING_MODE_EXCLUSIVE, 0, NULL};
    VkBuffer buf;
    CHECK(vkCreateBuffer(dev, &bci, NULL, &buf));
    VkMemoryRequirements mr;
    vkGetBufferMemoryRequirements(dev, buf, &mr);
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    uint32_t type = 0;
    while (type < mp.memoryTypeCount && !((mr.memoryTypeBits >> type & 1u) && (mp.memoryTypes[type].propertyFlags & host) == host))
        type++;
    if (type == mp.memoryTypeCount) {
        fprintf(stderr, "no host-visible coherent memory\n");
        return 2;
    }
    const VkMemoryAllocateInfo mai = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, NULL, mr.size, type};
    VkDeviceMemory mem;
    CHECK(vkAllocateMemory(dev, &mai, NULL, &mem));
    CHECK(vkBindBufferMemory(dev, buf, mem, 0));

    const VkShaderModuleCreateInfo smi = {VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, NULL, 0, code_bytes, code};
    VkShaderModule module;
    CHECK(vkCreateShaderModule(dev, &smi, NULL, &module));
    const VkDescriptorSetLayoutBinding binding = {0, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL};
    const VkDescriptorSetLayoutCreateInfo dli = {VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, NULL, 0, 1, &binding};
    VkDescriptorSetLayout dsl;
    CHECK(vkCreateDescriptorSetLayout(dev, &dli, NULL, &dsl));
    const VkPipelineLayoutCreateInfo pli = {VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, NULL, 0, 1, &dsl, 0, NULL};
    VkPipelineLayout layout;
    CHECK(vkCreatePipelineLayout(dev, &pli, NULL, &layout));
    const VkSpecializationMapEntry entry = {0, 0, sizeof wg};
    const VkSpecializationInfo spec = {1, &entry, sizeof wg, &wg};
    const VkComputePipelineCreateInfo cpi = {
        VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, NULL, 0,
        {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, NULL, 0, VK_SHADER_STAGE_COMPUTE_BIT, module, "main", &spec},
        layout, VK_NULL_HANDLE, 0};
    VkPipeline pipeline;
    CHECK(vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &cpi, NULL, &pipeline));
    const VkDescriptorPoolSize size = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1};
    const VkDescriptorPoolCreateInfo dpi = {VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, NULL, 0, 1, 1, &size};
    VkDescriptorPool dpool;
    CHECK(vkCreateDescriptorPool(dev, &dpi, NULL, &dpool));
    const VkDescriptorSetAllocateInfo dai = {VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, NULL, dpool, 1, &dsl};
    VkDescriptorSet set;
    CHECK(vkAllocateDescriptorSets(dev, &dai, &set));
    const VkDescriptorBufferInfo dbi = {buf, 0, VK_WHOLE_SIZE};
    const VkWriteDescriptorSet write = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, NULL, set, 0, 0, 1,
                                        VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, NULL, &dbi, NULL};
    vkUpdateDescriptorSets(dev, 1, &write, 0, NULL);

    const VkCommandPoolCreateInfo cpci = {VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, NULL, 0, 0};
    VkCommandPool cpool;
    CHECK(vkCreateCommandPool(dev, &cpci, NULL, &cpool));
    const VkCommandBufferAllocateInfo cbai = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, NULL, cpool,
                                              VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
    VkCommandBuffer cb;
    CHECK(vkAllocateCommandBuffers(dev, &cbai, &cb));
    const VkCommandBufferBeginInfo cbbi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL, 0, NULL};
    CHECK(vkBeginCommandBuffer(cb, &cbbi));
    vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
    vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1, &set, 0, NULL);
    vkCmdDispatch(cb, N_WG, 1, 1);
    CHECK(vkEndCommandBuffer(cb));
    const VkSubmitInfo submit = {VK_STRUCTURE_TYPE_SUBMIT_INFO, NULL, 0, NULL, NULL, 1, &cb, 0, NULL};
    CHECK(vkQueueSubmit(queue, 1, &submit, VK_NULL_HANDLE));
    CHECK(vkQueueWaitIdle(queue));

    float *out;
    CHECK(vkMapMemory(dev, mem, 0, bytes, 0, (void **)&out));
    static const char *const names[FIELDS] = {"subgroupMax", "subgroupAdd", "gl_SubgroupID", "subgroupElect",
                                              "gl_NumSubgroups", "gl_SubgroupSize", "sum across subgroups",
                                              "lane-varying loop"};
    uint32_t bad = 0;
    for (uint32_t g = 0; g < N_WG; g++)
        for (uint32_t l = 0; l < wg; l++) {
            float want[FIELDS];
            expected(l, wg, s, want);
            const float *got = out + ((size_t)g * wg + l) * FIELDS;
            for (int j = 0; j < FIELDS; j++)
                if (fabsf(got[j] - want[j]) > 1e-3f * (1.0f + fabsf(want[j])) && bad++ < 10)
                    printf("workgroup %u invocation %u %s: %g, expected %g\n", g, l, names[j], got[j], want[j]);
        }
    printf("%u of %u values wrong\n", bad, (unsigned)(wg * N_WG * FIELDS));
    vkUnmapMemory(dev, mem);
    vkDestroyCommandPool(dev, cpool, NULL);
    vkDestroyDescriptorPool(dev, dpool, NULL);
    vkDestroyPipeline(dev, pipeline, NULL);
    vkDestroyPipelineLayout(dev, layout, NULL);
    vkDestroyDescriptorSetLayout(dev, dsl, NULL);
    vkDestroyShaderModule(dev, module, NULL);
    vkDestroyBuffer(dev, buf, NULL);
    vkFreeMemory(dev, mem, NULL);
    vkDestroyDevice(dev, NULL);
    vkDestroyInstance(inst, NULL);
    free(code);
    return bad ? 1 : 0;
}
