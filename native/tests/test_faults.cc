/*
 * test_faults.cc: the failure paths of every backend that implements fault injection (gokv_inject_fault;
 * GOKV_ENOTSUP skips): an injected allocation failure is GOKV_ENOMEM and the next allocation works; a device
 * lost at a submit makes that call and every later call on the device GOKV_EDEVICE, closing it is clean and
 * other devices keep working. The codes to inject are the backend's own: its run environment names them,
 * GOKV_TEST_FAULT_ALLOC and GOKV_TEST_FAULT_SUBMIT (e.g. Vulkan's VkResult values, set in
 * native/vulkan/tests/CMakeLists.txt); a backend that implements injection without naming codes is skipped.
 * These tests expect the backend to log errors (expect_backend_errors).
 */
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>

#include "harness.h"

using namespace gokvtest;

namespace {

struct FaultCodes {
    bool skip = false;
    std::string why;
    int32_t alloc = 0, submit = 0;
};

/* The backend's codes for the sites, and whether it implements injection at all (probed by disarming). */
FaultCodes fault_codes(int32_t site) {
    FaultCodes c;
    const gokv_status st = gokv_inject_fault(dut_name().c_str(), site, 0);
    if (st == GOKV_ENOTSUP) {
        c.skip = true;
        c.why = dut_name() + " does not implement gokv_inject_fault: " + gokv_last_error();
        return c;
    }
    EXPECT_EQ(st, GOKV_OK) << gokv_last_error();
    const char *a = std::getenv("GOKV_TEST_FAULT_ALLOC"), *s = std::getenv("GOKV_TEST_FAULT_SUBMIT");
    const char *need = site == GOKV_FAULT_ALLOC ? a : s;
    if (!need || !*need) {
        c.skip = true;
        c.why = std::string("the run environment of ") + dut_name() + " names no code for this site (" +
                (site == GOKV_FAULT_ALLOC ? "GOKV_TEST_FAULT_ALLOC" : "GOKV_TEST_FAULT_SUBMIT") + ")";
        return c;
    }
    if (a && *a) c.alloc = std::atoi(a);
    if (s && *s) c.submit = std::atoi(s);
    expect_backend_errors();
    return c;
}

class Faults : public BackendTest {};

/* An injected allocation failure (the backend's out-of-memory code): pool creation fails with GOKV_ENOMEM and a message, and the
 * next creation (the hook fires once) succeeds. Then the same at a call that must grow the device's
 * per-call buffers (a batch far larger than any before on a fresh device): ENOMEM, or OK when it needed no
 * allocation (the hook is then disarmed: a code of 0); either way the device keeps working. */
TEST_P(Faults, InjectedAllocFailureIsENOMEM) {
    const FaultCodes codes = fault_codes(GOKV_FAULT_ALLOC);
    if (codes.skip) GTEST_SKIP() << codes.why;
    PoolCfg c = format_cfg(GOKV_FORMAT_KIVI2, 32, 32);
    c.n_slots = 2;
    gokv_pool_desc d = pool_desc(c);
    gokv_pool *p = nullptr;
    ASSERT_EQ(gokv_inject_fault(dut_name().c_str(), GOKV_FAULT_ALLOC, codes.alloc), GOKV_OK);
    const gokv_status st = gokv_pool_create(dut(), &d, &p);
    const std::string msg = gokv_last_error(); /* before the disarming call clears it */
    ASSERT_EQ(gokv_inject_fault(dut_name().c_str(), GOKV_FAULT_ALLOC, 0), GOKV_OK);
    EXPECT_EQ(st, GOKV_ENOMEM) << gokv_status_name(st) << ": " << msg;
    EXPECT_FALSE(msg.empty());
    EXPECT_EQ(p, nullptr);
    ASSERT_EQ(gokv_pool_create(dut(), &d, &p), GOKV_OK) << "after the injected failure: " << gokv_last_error();
    gokv_pool_destroy(p);

    DevicePtr dev = open_backend(dut_name().c_str(), 1);
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
    ASSERT_EQ(gokv_inject_fault(dut_name().c_str(), GOKV_FAULT_ALLOC, codes.alloc), GOKV_OK);
    const gokv_status st2 = attend(dev.get(), cache.pool.get(), g, {s}, q, o, out);
    const std::string msg2 = gokv_last_error();
    ASSERT_EQ(gokv_inject_fault(dut_name().c_str(), GOKV_FAULT_ALLOC, 0), GOKV_OK); /* disarm it, had the call allocated nothing */
    if (st2 == GOKV_OK) {
        std::printf("[ INFO     ] the large attend needed no new allocation\n");
    } else {
        EXPECT_EQ(st2, GOKV_ENOMEM) << gokv_status_name(st2) << ": " << msg2;
        EXPECT_FALSE(msg2.empty());
    }
    check_attend(dev.get(), cache, {s}, q, o, 1e-5, "the same attend after the injected failure");
}

/* An injected device loss (the backend's code for it) at the submit of a write: that call and every later call on the device
 * return GOKV_EDEVICE with a message; destroying its pool and closing it are clean; the shared device and
 * a newly opened one work. */
TEST_P(Faults, DeviceLostIsEDEVICE) {
    const FaultCodes codes = fault_codes(GOKV_FAULT_SUBMIT);
    if (codes.skip) GTEST_SKIP() << codes.why;
    DevicePtr dev = open_backend(dut_name().c_str(), 1);
    ASSERT_TRUE(dev);
    PoolCfg c = format_cfg(GOKV_FORMAT_Q4, 32, 0);
    c.n_kv_heads = 2;
    Cache cache;
    ASSERT_TRUE(build_cache(dev.get(), c, {100, 40}, 4u, cache, 20));
    std::mt19937 rng(5);
    const std::vector<float> k = gen_keys(rng, 3, 2, c.d_k), v = gen_values(rng, 3, 2, c.d_v);
    ASSERT_EQ(gokv_inject_fault(dut_name().c_str(), GOKV_FAULT_SUBMIT, codes.submit), GOKV_OK);
    gokv_status st = append1(cache.pool.get(), c, cache.seqs[0], k, v);
    const std::string msg = gokv_last_error();
    ASSERT_EQ(gokv_inject_fault(dut_name().c_str(), GOKV_FAULT_SUBMIT, 0), GOKV_OK); /* in case the write submitted nothing */
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
    cross_attend(pair, {attn_seq(pair.dut, 0)}, {0}, q, o, 1e-4, "shared device after a loss elsewhere");
    DevicePtr fresh = open_backend(dut_name().c_str(), 1);
    ASSERT_TRUE(fresh);
    Cache again;
    ASSERT_TRUE(build_cache(fresh.get(), c, {100}, 6u, again));
    std::vector<float> out_fresh;
    check_attend(fresh.get(), again, {attn_seq(again, 0)}, q, o, 1e-4, "a newly opened device", &out_fresh);
}

GOKV_INSTANTIATE_ON_BACKENDS(Faults);

} // namespace
