/*
 * test_vk_device.cc: what the Vulkan device reports about itself (name, memory, the subgroup size of the
 * run, caps, formats), and a pool larger than its memory (GOKV_ENOMEM, no validation message, the device
 * keeps working). Injected faults, validation and every case table run in the conformance suite
 * (native/tests).
 */
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>

#include "vk_harness.h"

using namespace gokvtest;

namespace {

class VkDevice : public VkTest {};

/* Backend "vulkan", a name, memory, a subgroup size the shaders can use; the caps and formats the case
 * table exercises. */
TEST_F(VkDevice, InfoDescribesTheDevice) {
    const gokv_device_info info = device_info(vk_device());
    EXPECT_STREQ(info.backend, "vulkan");
    EXPECT_GT(std::strlen(info.name), 0u);
    EXPECT_GT(info.memory_bytes, 0u);
    const int32_t sg = info.subgroup_size;
    EXPECT_TRUE(sg == 4 || sg == 8 || sg == 16 || sg == 32 || sg == 64 || sg == 128) << "subgroup size " << sg;
    /* ctest runs the suite again on lavapipe at other subgroup sizes (tests/CMakeLists.txt): make sure those
     * runs really got the size they are there for */
    const char *want = std::getenv("GOKV_TEST_LAVAPIPE_SUBGROUP");
    if (want && std::strncmp(info.name, "llvmpipe", 8) == 0) {
        EXPECT_EQ(sg, std::atoi(want)) << "LP_NATIVE_VECTOR_WIDTH=" << (std::getenv("LP_NATIVE_VECTOR_WIDTH") ? std::getenv("LP_NATIVE_VECTOR_WIDTH") : "(unset)");
    }
    EXPECT_EQ(info.formats & 0x3fu, 0x3fu) << "every format (docs/architecture.md §4)";
    const uint32_t need = GOKV_CAP_DECODE | GOKV_CAP_PREFILL | GOKV_CAP_LEARNED_SINKS | GOKV_CAP_WINDOW | GOKV_CAP_MLA |
                          GOKV_CAP_HOLES;
    EXPECT_EQ(info.caps & need, need) << "caps 0x" << std::hex << info.caps;
    EXPECT_GE(info.n_threads, 1);
    bool listed = false;
    for (int32_t i = 0; i < gokv_backend_count(); i++) listed = listed || std::strcmp(gokv_backend_name(i), "vulkan") == 0;
    EXPECT_TRUE(listed) << "gokv_backend_name does not list \"vulkan\"";
    EXPECT_STREQ(gokv_backend_name(0), "cpu");
    EXPECT_EQ(gokv_vulkan_register(), GOKV_OK) << "registering twice must be a no-op";
}

/* A pool far larger than the device's memory: GOKV_ENOMEM with a message, no crash, no validation message
 * (the backend must not ask Vulkan for more than a heap holds), and the device still works. */
TEST_F(VkDevice, PoolLargerThanMemoryIsENOMEM) {
    const gokv_device_info info = device_info(vk_device());
    PoolCfg c = format_cfg(GOKV_FORMAT_F32, 0, 0);
    c.n_kv_heads = 8;
    c.d_k = c.d_v = 1024;
    c.page_size = 1024;
    uint64_t page_bytes = (uint64_t)c.page_size * (uint64_t)c.n_kv_heads * (uint64_t)(c.d_k + c.d_v) * 4u;
    for (uint64_t want : {4 * info.memory_bytes, (uint64_t)(std::numeric_limits<int32_t>::max()) * page_bytes}) {
        c.n_pages = (int32_t)std::min<uint64_t>((want + page_bytes - 1) / page_bytes, std::numeric_limits<int32_t>::max());
        gokv_pool_desc d = pool_desc(c);
        gokv_pool *p = nullptr;
        const gokv_status st = gokv_pool_create(vk_device(), &d, &p);
        EXPECT_EQ(st, GOKV_ENOMEM) << c.n_pages << " pages of " << page_bytes << " bytes: " << gokv_status_name(st)
                                   << ": " << gokv_last_error();
        EXPECT_GT(std::strlen(gokv_last_error()), 0u);
        EXPECT_EQ(p, nullptr);
        gokv_pool_destroy(p);
    }
    Cache cache;
    ASSERT_TRUE(build_cache(vk_device(), format_cfg(GOKV_FORMAT_Q4, 32, 0), {100}, 1u, cache)) << "the device after ENOMEM";
    AttnOpts o;
    std::mt19937 rng(2);
    const std::vector<float> q = gen_normal(rng, (size_t)cache.cfg.d_k);
    check_attend(vk_device(), cache, {attn_seq(cache, 0)}, q, o, 1e-4, "the device after ENOMEM");
}

} // namespace
