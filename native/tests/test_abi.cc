/*
 * test_abi.cc: the ABI's inspection, measurement and fault-injection calls (gokv.h) on every backend:
 * gokv_layout_sizes_get against the pools a backend creates, gokv_pool_page_bytes / gokv_pool_slot_bytes
 * argument errors, gokv_device_measure, gokv_inject_fault's argument errors.
 */
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness.h"

using namespace gokvtest;

namespace {

class Abi : public BackendTest {};

gokv_layout_sizes sizes_of(const gokv_pool_desc &d, gokv_status *st) {
    gokv_layout_sizes s;
    std::memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    *st = gokv_layout_sizes_get(&d, &s);
    return s;
}

/* For many descriptions (every format and group, MHA and MLA, odd page sizes, several heads), the sizes
 * computed with no device equal what a pool of the backend reports (gokv_pool_sizes) and its layout; the
 * code and meta bytes fit in the page and match the layout's sections; at most alignment and tile padding is
 * left over. */
TEST_P(Abi, LayoutSizesMatchThePools) {
    struct F {
        int32_t format, group, residual;
    };
    const F formats[] = {{GOKV_FORMAT_F32, 0, 0},     {GOKV_FORMAT_F16, 0, 0},     {GOKV_FORMAT_Q8, 32, 0},
                         {GOKV_FORMAT_Q8, 128, 0},    {GOKV_FORMAT_Q4, 32, 0},     {GOKV_FORMAT_Q4, 64, 0},
                         {GOKV_FORMAT_KIVI2, 32, 0},  {GOKV_FORMAT_KIVI2, 64, 64}, {GOKV_FORMAT_KIVI4, 32, 128},
                         {GOKV_FORMAT_KIVI4, 128, 128}};
    int checked = 0;
    for (const F &f : formats)
        for (int32_t mla = 0; mla < 2; mla++)
            for (int32_t P : {8, 24, 64, 128, 256})
                for (int32_t H : {1, 3}) {
                    PoolCfg c = format_cfg(f.format, f.group, f.residual);
                    if (c.kivi() && P % f.group != 0) continue;
                    if (mla && H > 1) continue;
                    const int32_t g = f.group ? f.group : 32;
                    c.n_kv_heads = H;
                    c.d_k = mla ? 3 * g : 2 * g;
                    c.d_v = mla ? g : 2 * g;
                    c.v_is_k_prefix = mla;
                    c.page_size = P;
                    c.n_pages = 2;
                    c.n_slots = c.kivi() ? 2 : 0;
                    const gokv_pool_desc d = pool_desc(c);
                    const std::string what = c.name() + " P " + std::to_string(P) + " H " + std::to_string(H) +
                                             (mla ? " mla" : "");
                    gokv_status st;
                    const gokv_layout_sizes s = sizes_of(d, &st);
                    ASSERT_EQ(st, GOKV_OK) << what << ": " << gokv_last_error();
                    PoolPtr pool = make_pool(dut(), c);
                    ASSERT_TRUE(pool) << what;
                    uint64_t pb = 0, rb = 0;
                    ASSERT_EQ(gokv_pool_sizes(pool.get(), &pb, &rb), GOKV_OK) << gokv_last_error();
                    const gokv_layout *L = gokv_pool_layout(pool.get());
                    ASSERT_NE(L, nullptr);
                    EXPECT_EQ(s.page_bytes, pb) << what;
                    EXPECT_EQ(s.page_bytes, L->page_bytes) << what;
                    EXPECT_EQ(s.residual_slot_bytes, rb) << what;
                    EXPECT_EQ(s.residual_slot_bytes, c.kivi() ? L->ring_bytes : 0u) << what;
                    /* the payload: codes of every element, fp16 scale and bias per group */
                    const uint64_t bits = (uint64_t)gokv_format_bits(c.format), Hu = (uint64_t)H, Pu = (uint64_t)P;
                    const uint64_t elems = Hu * Pu * (uint64_t)(c.d_k + (mla ? 0 : c.d_v));
                    EXPECT_GE(s.page_code_bytes, elems * bits / 8) << what;
                    const uint64_t groups = c.quantized() ? elems / (uint64_t)c.group : 0;
                    EXPECT_EQ(s.page_meta_bytes, groups * 4) << what;
                    if (!c.quantized()) {
                        EXPECT_EQ(s.page_code_bytes, elems * bits / 8) << what;
                    }
                    EXPECT_LE(s.page_code_bytes + s.page_meta_bytes, s.page_bytes) << what;
                    /* sections: codes, then scales and biases, each 64-byte aligned, inside a head block */
                    EXPECT_LE(s.page_bytes - s.page_code_bytes - s.page_meta_bytes,
                              Hu * (6 * 64 + (L->k_tiled ? 16 * L->k_row_bytes : 0)) + 64)
                        << what << ": more than alignment and tile padding left over";
                    EXPECT_EQ(s.page_bytes, Hu * L->k_codes_head) << what << ": heads' blocks end to end";
                    checked++;
                }
    EXPECT_GT(checked, 100);
}

/* Invalid descriptions are rejected as gokv_pool_create rejects them, with a message; so are bad out
 * arguments. */
TEST_P(Abi, LayoutSizesRejectInvalidDescriptions) {
    PoolCfg c = format_cfg(GOKV_FORMAT_KIVI2, 32, 64);
    c.n_slots = 2;
    struct Case {
        const char *what;
        void (*edit)(gokv_pool_desc &);
        gokv_status want;
        const char *needle;
    };
    const Case cases[] = {
        {"group 16", [](gokv_pool_desc &d) { d.group_size = 16; }, GOKV_EINVAL, "group_size"},
        {"residual 16", [](gokv_pool_desc &d) { d.residual = 16; }, GOKV_EINVAL, "residual"},
        {"page size 48", [](gokv_pool_desc &d) { d.page_size = 48; }, GOKV_EINVAL, "page_size"},
        {"head_dim_k 1056", [](gokv_pool_desc &d) { d.head_dim_k = 1056; }, GOKV_EINVAL, "head_dim_k"},
        {"zero kv heads", [](gokv_pool_desc &d) { d.n_kv_heads = 0; }, GOKV_EINVAL, "n_kv_heads"},
        {"unknown format", [](gokv_pool_desc &d) { d.format = GOKV_FORMAT_COUNT_; }, GOKV_EINVAL, "format"},
        {"struct_size 8", [](gokv_pool_desc &d) { d.struct_size = 8; }, GOKV_EVERSION, "struct_size"},
    };
    for (const Case &cs : cases) {
        gokv_pool_desc d = pool_desc(c);
        cs.edit(d);
        gokv_status st;
        sizes_of(d, &st);
        const std::string msg = gokv_last_error();
        EXPECT_EQ(st, cs.want) << cs.what << ": " << msg;
        EXPECT_NE(msg.find(cs.needle), std::string::npos) << cs.what << ": \"" << msg << "\" should name " << cs.needle;
        gokv_pool *p = nullptr;
        EXPECT_EQ(gokv_pool_create(dut(), &d, &p), cs.want) << cs.what << ": gokv_pool_create disagrees";
        EXPECT_EQ(p, nullptr);
    }
    const gokv_pool_desc d = pool_desc(c);
    gokv_layout_sizes s;
    std::memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    EXPECT_EQ(gokv_layout_sizes_get(nullptr, &s), GOKV_EINVAL);
    EXPECT_NE(std::string(gokv_last_error()).find("desc"), std::string::npos) << gokv_last_error();
    EXPECT_EQ(gokv_layout_sizes_get(&d, nullptr), GOKV_EINVAL);
    EXPECT_NE(std::string(gokv_last_error()).find("out"), std::string::npos) << gokv_last_error();
    s.struct_size = 8;
    EXPECT_EQ(gokv_layout_sizes_get(&d, &s), GOKV_EVERSION);
    EXPECT_NE(std::string(gokv_last_error()).find("struct_size"), std::string::npos) << gokv_last_error();
}

/* gokv_pool_page_bytes / gokv_pool_slot_bytes: ERANGE for an index out of range, EINVAL for a short or NULL
 * buffer and a NULL pool, each with a message; slots of a pool without rings are out of range. */
TEST_P(Abi, PageAndSlotBytesArguments) {
    for (int32_t fmt : {GOKV_FORMAT_F16, GOKV_FORMAT_KIVI4}) {
        PoolCfg c = format_cfg(fmt, fmt == GOKV_FORMAT_F16 ? 0 : 32, fmt == GOKV_FORMAT_F16 ? 0 : 32);
        c.n_pages = 3;
        c.n_slots = c.kivi() ? 2 : 0;
        PoolPtr pool = make_pool(dut(), c);
        ASSERT_TRUE(pool);
        const gokv_layout *L = gokv_pool_layout(pool.get());
        std::vector<uint8_t> buf(L->page_bytes + L->ring_bytes + 64);
        auto expect = [&](gokv_status got, gokv_status want, const char *needle, const std::string &what) {
            const std::string msg = gokv_last_error();
            EXPECT_EQ(got, want) << c.name() << " " << what << ": " << gokv_status_name(got) << ": " << msg;
            if (want != GOKV_OK) {
                EXPECT_NE(msg.find(needle), std::string::npos) << c.name() << " " << what << ": \"" << msg << "\"";
            }
        };
        expect(gokv_pool_page_bytes(pool.get(), 0, buf.data(), L->page_bytes), GOKV_OK, "", "page 0");
        expect(gokv_pool_page_bytes(pool.get(), 2, buf.data(), buf.size()), GOKV_OK, "", "page 2, larger buffer");
        expect(gokv_pool_page_bytes(pool.get(), 3, buf.data(), buf.size()), GOKV_ERANGE, "page 3", "page n_pages");
        expect(gokv_pool_page_bytes(pool.get(), -1, buf.data(), buf.size()), GOKV_ERANGE, "page -1", "page -1");
        expect(gokv_pool_page_bytes(pool.get(), 0, buf.data(), L->page_bytes - 1), GOKV_EINVAL, "out holds",
               "short buffer");
        expect(gokv_pool_page_bytes(pool.get(), 0, nullptr, L->page_bytes), GOKV_EINVAL, "out", "NULL out");
        expect(gokv_pool_page_bytes(nullptr, 0, buf.data(), buf.size()), GOKV_EINVAL, "pool", "NULL pool");
        if (c.kivi()) {
            expect(gokv_pool_slot_bytes(pool.get(), 1, buf.data(), L->ring_bytes), GOKV_OK, "", "slot 1");
            expect(gokv_pool_slot_bytes(pool.get(), 2, buf.data(), buf.size()), GOKV_ERANGE, "residual slot 2",
                   "slot n_slots");
            expect(gokv_pool_slot_bytes(pool.get(), 0, buf.data(), L->ring_bytes - 1), GOKV_EINVAL, "out holds",
                   "short ring buffer");
        } else {
            expect(gokv_pool_slot_bytes(pool.get(), 0, buf.data(), buf.size()), GOKV_ERANGE, "residual slot 0",
                   "slot of a pool without rings");
        }
        expect(gokv_pool_slot_bytes(pool.get(), -1, buf.data(), buf.size()), GOKV_ERANGE, "residual slot -1", "slot -1");
    }
}

/* gokv_device_measure: a positive bandwidth and a method on every backend that implements it (ENOTSUP
 * skips); sizes below 1 MiB, a NULL out or device and a small struct_size rejected. */
TEST_P(Abi, DeviceMeasure) {
    gokv_device_ceilings c;
    std::memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    EXPECT_EQ(gokv_device_measure(dut(), (1u << 20) - 1, &c), GOKV_EINVAL);
    EXPECT_NE(std::string(gokv_last_error()).find("1 MiB"), std::string::npos) << gokv_last_error();
    EXPECT_EQ(gokv_device_measure(dut(), 4096, &c), GOKV_EINVAL);
    EXPECT_EQ(gokv_device_measure(nullptr, 0, &c), GOKV_EINVAL);
    EXPECT_EQ(gokv_device_measure(dut(), 0, nullptr), GOKV_EINVAL);
    gokv_device_ceilings small = c;
    small.struct_size = 8;
    EXPECT_EQ(gokv_device_measure(dut(), 1u << 24, &small), GOKV_EVERSION);
    const gokv_status st = gokv_device_measure(dut(), 1u << 24, &c);
    if (st == GOKV_ENOTSUP) GTEST_SKIP() << dut_name() << " does not implement gokv_device_measure: " << gokv_last_error();
    ASSERT_EQ(st, GOKV_OK) << gokv_last_error();
    EXPECT_GT(c.read_gbps, 0.0) << c.method;
    EXPECT_GE(c.peak_gflops, 0.0);
    EXPECT_GT(std::strlen(c.method), 0u);
    EXPECT_LT(std::strlen(c.method), sizeof c.method);
    std::printf("[ MEASURE  ] %s: %.2f GB/s, %.1f GFLOP/s (%s)\n", dut_name().c_str(), c.read_gbps, c.peak_gflops,
                c.method);
}

/* "auto" opens a vendor module's device, never one that only emulates its hardware (the Metal module's
 * emulated backend): an emulator is for checking kernels, and a caller asking for the best device must not
 * get one that runs them a thousand times slower than the CPU module. */
TEST_P(Abi, AutoNeverPicksAnEmulator) {
    gokv_device_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    ASSERT_EQ(gokv_device_info_get(dut(), &info), GOKV_OK) << gokv_last_error();
    gokv_device_desc desc;
    std::memset(&desc, 0, sizeof desc);
    desc.struct_size = sizeof desc;
    desc.backend = "auto";
    desc.device_index = -1;
    gokv_device *autodev = nullptr;
    ASSERT_EQ(gokv_device_open(&desc, &autodev), GOKV_OK) << gokv_last_error();
    gokv_device_info ainfo;
    std::memset(&ainfo, 0, sizeof ainfo);
    ainfo.struct_size = sizeof ainfo;
    const gokv_status st = gokv_device_info_get(autodev, &ainfo);
    gokv_device_close(autodev);
    ASSERT_EQ(st, GOKV_OK) << gokv_last_error();
    EXPECT_EQ(std::strstr(ainfo.features, "emulated"), nullptr) << "auto opened " << ainfo.backend << ": " << ainfo.features;
    if (std::strstr(info.features, "emulated")) {
        EXPECT_STRNE(ainfo.backend, info.backend);
    }
}

/* gokv_inject_fault's own arguments: an unknown backend (or "auto", or NULL) and an unknown site; on the
 * backend under test, disarming is accepted wherever injection is implemented. */
TEST_P(Abi, InjectFaultArguments) {
    EXPECT_EQ(gokv_inject_fault("no-such-backend", GOKV_FAULT_SUBMIT, 0), GOKV_ENODEV);
    EXPECT_NE(std::string(gokv_last_error()).find("no-such-backend"), std::string::npos) << gokv_last_error();
    EXPECT_EQ(gokv_inject_fault("auto", GOKV_FAULT_ALLOC, 0), GOKV_ENODEV);
    EXPECT_EQ(gokv_inject_fault(nullptr, GOKV_FAULT_ALLOC, 0), GOKV_EINVAL);
    for (int32_t site : {-1, 2, 99}) {
        EXPECT_EQ(gokv_inject_fault(dut_name().c_str(), site, 0), GOKV_EINVAL) << "site " << site;
        EXPECT_NE(std::string(gokv_last_error()).find("site"), std::string::npos) << gokv_last_error();
    }
    for (int32_t site : {GOKV_FAULT_SUBMIT, GOKV_FAULT_ALLOC}) {
        const gokv_status st = gokv_inject_fault(dut_name().c_str(), site, 0);
        EXPECT_TRUE(st == GOKV_OK || st == GOKV_ENOTSUP) << gokv_status_name(st) << ": " << gokv_last_error();
        if (st == GOKV_ENOTSUP) {
            EXPECT_NE(std::string(gokv_last_error()).find(dut_name()), std::string::npos) << gokv_last_error();
        }
    }
}

GOKV_INSTANTIATE_ON_BACKENDS(Abi);

} // namespace
