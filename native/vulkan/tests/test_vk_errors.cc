/*
 * test_vk_errors.cc: the Vulkan backend's failure paths return errors and never crash (docs/architecture.md
 * §3, §8): out of device memory (a pool far larger than the device, and an injected vkAllocateMemory
 * failure), a lost device (injected at vkQueueSubmit: that call and every later call on the device fail with
 * GOKV_EDEVICE, closing it is clean, a new device works), argument validation identical to the CPU's; and
 * what the device reports about itself.
 */
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>

#include "vk_harness.h"

using namespace gokvtest;

namespace {

/* VkResult values of the injection hook (gokv_vulkan.h), without including vulkan.h here. */
constexpr int32_t kVkErrorOutOfDeviceMemory = -2;
constexpr int32_t kVkErrorDeviceLost = -4;

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
    Pair pair;
    ASSERT_TRUE(build_pair(format_cfg(GOKV_FORMAT_Q4, 32, 0), {100}, 1u, pair)) << "the device after ENOMEM";
}

/* An injected VK_ERROR_OUT_OF_DEVICE_MEMORY: pool creation fails with GOKV_ENOMEM and a message, and the
 * next creation (the hook fires once) succeeds. Then the same at a call that must grow the device's
 * per-call buffers (a batch far larger than any before on a fresh device): ENOMEM, or OK when it needed no
 * allocation (the hook is then disarmed: a VkResult of 0); either way the device keeps working. */
TEST_F(VkDevice, InjectedAllocFailureIsENOMEM) {
    PoolCfg c = format_cfg(GOKV_FORMAT_KIVI2, 32, 32);
    c.n_slots = 2;
    gokv_pool_desc d = pool_desc(c);
    gokv_pool *p = nullptr;
    ASSERT_EQ(gokv_inject_fault("vulkan", GOKV_FAULT_ALLOC, kVkErrorOutOfDeviceMemory), GOKV_OK);
    const gokv_status st = gokv_pool_create(vk_device(), &d, &p);
    const std::string msg = gokv_last_error(); /* before the disarming call clears it */
    ASSERT_EQ(gokv_inject_fault("vulkan", GOKV_FAULT_ALLOC, 0), GOKV_OK);
    EXPECT_EQ(st, GOKV_ENOMEM) << gokv_status_name(st) << ": " << msg;
    EXPECT_FALSE(msg.empty());
    EXPECT_EQ(p, nullptr);
    ASSERT_EQ(gokv_pool_create(vk_device(), &d, &p), GOKV_OK) << "after the injected failure: " << gokv_last_error();
    gokv_pool_destroy(p);

    DevicePtr dev = open_backend(GOKV_VK_TEST_BACKEND, 1);
    ASSERT_TRUE(dev);
    PoolCfg g = format_cfg(GOKV_FORMAT_F16, 0, 0);
    g.n_kv_heads = 2;
    Cache cache;
    ASSERT_TRUE(build_cache(dev.get(), g, {256}, 2u, cache, 0));
    AttnSeq s = attn_seq(cache, 0, 256);
    AttnOpts o;
    o.n_heads_q = 64; /* 256 rows x 64 heads x 64 dims: 4 MiB of queries and of outputs */
    std::mt19937 rng(3);
    const std::vector<float> q = gen_normal(rng, 256 * 64 * (size_t)g.d_k);
    std::vector<float> out;
    ASSERT_EQ(gokv_inject_fault("vulkan", GOKV_FAULT_ALLOC, kVkErrorOutOfDeviceMemory), GOKV_OK);
    const gokv_status st2 = attend(dev.get(), cache.pool.get(), g, {s}, q, o, out);
    const std::string msg2 = gokv_last_error();
    ASSERT_EQ(gokv_inject_fault("vulkan", GOKV_FAULT_ALLOC, 0), GOKV_OK); /* disarm it, had the call allocated nothing */
    if (st2 == GOKV_OK) {
        std::printf("[ INFO     ] the large attend needed no new allocation\n");
    } else {
        EXPECT_EQ(st2, GOKV_ENOMEM) << gokv_status_name(st2) << ": " << msg2;
        EXPECT_FALSE(msg2.empty());
    }
    check_attend(dev.get(), cache, {s}, q, o, 1e-5, "the same attend after the injected failure");
}

/* An injected VK_ERROR_DEVICE_LOST at the submit of a write: that call and every later call on the device
 * return GOKV_EDEVICE with a message; destroying its pool and closing it are clean; the shared device and
 * a newly opened one work. */
TEST_F(VkDevice, DeviceLostIsEDEVICE) {
    DevicePtr dev = open_backend(GOKV_VK_TEST_BACKEND, 1);
    ASSERT_TRUE(dev);
    PoolCfg c = format_cfg(GOKV_FORMAT_Q4, 32, 0);
    c.n_kv_heads = 2;
    Cache cache;
    ASSERT_TRUE(build_cache(dev.get(), c, {100, 40}, 4u, cache, 20));
    std::mt19937 rng(5);
    const std::vector<float> k = gen_keys(rng, 3, 2, c.d_k), v = gen_values(rng, 3, 2, c.d_v);
    ASSERT_EQ(gokv_inject_fault("vulkan", GOKV_FAULT_SUBMIT, kVkErrorDeviceLost), GOKV_OK);
    gokv_status st = append1(cache.pool.get(), c, cache.seqs[0], k, v);
    const std::string msg = gokv_last_error();
    ASSERT_EQ(gokv_inject_fault("vulkan", GOKV_FAULT_SUBMIT, 0), GOKV_OK); /* in case the write submitted nothing */
    EXPECT_EQ(st, GOKV_EDEVICE) << "the call whose submit fails: " << gokv_status_name(st) << ": " << msg;
    EXPECT_FALSE(msg.empty());

    int32_t free_page = 0; /* a page no sequence holds, as a copy destination */
    for (bool used = true; used; free_page += used) {
        used = false;
        for (const Seq &sq : cache.seqs)
            for (int32_t pg : sq.pages) used = used || pg == free_page;
    }
    ASSERT_LT(free_page, cache.cfg.n_pages);
    AttnOpts o;
    o.n_heads_q = 4;
    const std::vector<float> q = gen_normal(rng, 4 * (size_t)c.d_k);
    std::vector<float> out, kr, vr;
    struct Later {
        const char *what;
        std::function<gokv_status()> call;
    };
    const Later later[] = {
        {"gokv_attend", [&] { return attend(dev.get(), cache.pool.get(), c, {attn_seq(cache, 1)}, q, o, out); }},
        {"gokv_pool_read", [&] { return read_seq(cache.pool.get(), c, cache.seqs[1], kr, vr); }},
        {"gokv_pool_write", [&] { return append1(cache.pool.get(), c, cache.seqs[1], k, v); }},
        {"gokv_pool_copy",
         [&] {
             gokv_copy_desc cd;
             std::memset(&cd, 0, sizeof cd);
             cd.struct_size = sizeof cd;
             const int32_t src = cache.seqs[0].pages[0], dst = free_page;
             cd.n_pages = 1;
             cd.src_pages = &src;
             cd.dst_pages = &dst;
             return gokv_pool_copy(cache.pool.get(), &cd);
         }},
        {"gokv_pool_create",
         [&] {
             gokv_pool_desc d = pool_desc(c);
             gokv_pool *p = nullptr;
             const gokv_status s = gokv_pool_create(dev.get(), &d, &p);
             gokv_pool_destroy(p);
             return s;
         }},
    };
    for (const Later &l : later) {
        st = l.call();
        EXPECT_EQ(st, GOKV_EDEVICE) << l.what << " on the lost device: " << gokv_status_name(st) << ": "
                                    << gokv_last_error();
        EXPECT_GT(std::strlen(gokv_last_error()), 0u) << l.what;
    }
    gokv_device_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    st = gokv_device_info_get(dev.get(), &info); /* may still describe it, or report the loss; never crash */
    EXPECT_TRUE(st == GOKV_OK || st == GOKV_EDEVICE) << gokv_status_name(st);
    cache.pool.reset();
    dev.reset();

    Pair pair;
    ASSERT_TRUE(build_pair(c, {100}, 6u, pair)) << "the shared device after another device was lost";
    cross_attend(pair, {attn_seq(pair.vk, 0)}, {0}, q, o, 1e-4, "shared device after a loss elsewhere");
    DevicePtr fresh = open_backend(GOKV_VK_TEST_BACKEND, 1);
    ASSERT_TRUE(fresh);
    Cache again;
    ASSERT_TRUE(build_cache(fresh.get(), c, {100}, 6u, again));
    std::vector<float> out_fresh;
    check_attend(fresh.get(), again, {attn_seq(again, 0)}, q, o, 1e-4, "a newly opened device", &out_fresh);
}

/* Validation is the core's, before any backend sees a call: the same bad descriptors give the same status
 * and message on Vulkan as on the CPU, and a rejected write leaves the Vulkan pool as it was. */
TEST_F(VkDevice, ValidationRejectsAsOnCpu) {
    PoolCfg c = format_cfg(GOKV_FORMAT_KIVI2, 32, 32);
    c.n_kv_heads = 2;
    c.n_pages = 12;
    Pair pair;
    ASSERT_TRUE(build_pair(c, {100, 70}, 42u, pair, 64));
    c = pair.vk.cfg;
    struct Outcome {
        gokv_status st;
        std::string msg;
    };
    auto same = [](const Outcome &a, const Outcome &b, gokv_status want, const std::string &what) {
        EXPECT_EQ(a.st, want) << what << " on " GOKV_VK_TEST_BACKEND ": " << a.msg;
        EXPECT_EQ(a.st, b.st) << what;
        EXPECT_EQ(a.msg, b.msg) << what;
        EXPECT_FALSE(a.msg.empty()) << what;
    };
    /* pool descriptors */
    for (int32_t bad_group : {16, 48}) {
        gokv_pool_desc d = pool_desc(c);
        d.group_size = bad_group;
        Outcome r[2];
        gokv_device *devs[2] = {vk_device(), cpu_device()};
        for (int i = 0; i < 2; i++) {
            gokv_pool *p = nullptr;
            r[i].st = gokv_pool_create(devs[i], &d, &p);
            r[i].msg = gokv_last_error();
            EXPECT_EQ(p, nullptr);
        }
        same(r[0], r[1], GOKV_EINVAL, "group " + std::to_string(bad_group));
    }
    /* attend */
    std::mt19937 rng(2);
    std::vector<float> q = gen_normal(rng, 2 * 4 * (size_t)c.d_k);
    struct Case {
        const char *what;
        std::function<void(AttnSeq &, AttnOpts &, std::vector<float> &)> edit;
        gokv_status want;
    };
    const Case cases[] = {
        {"page id out of range", [&](AttnSeq &s, AttnOpts &, std::vector<float> &) { s.pages.back() = c.n_pages; }, GOKV_ERANGE},
        {"NaN query", [](AttnSeq &, AttnOpts &, std::vector<float> &qq) { qq[5] = std::numeric_limits<float>::quiet_NaN(); }, GOKV_EINVAL},
        {"inf sink logit", [](AttnSeq &, AttnOpts &o, std::vector<float> &) { o.sinks = {0, 0, -std::numeric_limits<float>::infinity(), 0}; }, GOKV_EINVAL},
        {"kv_len beyond the table", [&](AttnSeq &s, AttnOpts &, std::vector<float> &) { s.kv_len += 2 * c.page_size; }, GOKV_EINVAL},
        {"residual slot out of range", [&](AttnSeq &s, AttnOpts &, std::vector<float> &) { s.slot = c.n_slots; }, GOKV_ERANGE},
        {"negative window", [](AttnSeq &, AttnOpts &o, std::vector<float> &) { o.window = -1; }, GOKV_EINVAL},
        {"n_heads_q 3 with 2 kv heads", [](AttnSeq &, AttnOpts &o, std::vector<float> &) { o.n_heads_q = 3; }, GOKV_EINVAL},
    };
    for (const Case &cs : cases) {
        Outcome r[2];
        for (int i = 0; i < 2; i++) {
            const Cache &cc = i == 0 ? pair.vk : pair.cpu;
            AttnSeq s0 = attn_seq(cc, 0), s1 = attn_seq(cc, 1);
            AttnOpts o;
            o.n_heads_q = 4;
            std::vector<float> qq = q, out;
            cs.edit(s1, o, qq);
            r[i].st = attend(i == 0 ? vk_device() : cpu_device(), cc.pool.get(), c, {s0, s1}, qq, o, out);
            r[i].msg = gokv_last_error();
        }
        same(r[0], r[1], cs.want, cs.what);
    }
    /* a pool used on another device */
    {
        std::vector<float> out;
        AttnOpts o;
        o.n_heads_q = 4;
        const gokv_status st = attend(cpu_device(), pair.vk.pool.get(), c, {attn_seq(pair.vk, 0)}, q, o, out);
        EXPECT_EQ(st, GOKV_EINVAL) << "a Vulkan pool on the CPU device: " << gokv_last_error();
        EXPECT_NE(std::string(gokv_last_error()).find("device"), std::string::npos) << gokv_last_error();
    }
    /* writes: a NaN key in the last row, a released page in the new range; nothing stored on rejection */
    for (int variant = 0; variant < 2; variant++) {
        Outcome r[2];
        for (int i = 0; i < 2; i++) {
            Cache &cc = i == 0 ? pair.vk : pair.cpu;
            std::mt19937 g(7);
            std::vector<float> k = gen_keys(g, 40, 2, c.d_k), v = gen_values(g, 40, 2, c.d_v);
            Seq s = cc.seqs[1];
            if (variant == 0) k.back() = std::numeric_limits<float>::quiet_NaN();
            if (variant == 1) s.pages[1] = -1;
            r[i].st = append1(cc.pool.get(), c, s, k, v);
            r[i].msg = gokv_last_error();
        }
        same(r[0], r[1], GOKV_EINVAL, variant == 0 ? "NaN key" : "write into a released page");
        const std::vector<std::vector<float>> k_before = pair.vk.kdq, v_before = pair.vk.vdq;
        ASSERT_TRUE(reread(pair.vk));
        EXPECT_TRUE(pair.vk.kdq == k_before && pair.vk.vdq == v_before) << "a rejected write changed the Vulkan pool";
    }
}

} // namespace
