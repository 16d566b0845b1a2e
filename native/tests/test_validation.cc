/*
 * test_validation.cc: on every backend, every invalid argument is rejected, with its status and a message
 * naming the argument (docs/architecture.md §3, gokv.h), and a rejected call changes nothing that was stored
 * (the pool's raw bytes, through gokv_pool_page_bytes / gokv_pool_slot_bytes, before and after); the same bad
 * descriptors give the same status and message as on the CPU. Also the status helpers, the ABI version,
 * and the NULL-safe destroy/close.
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>

#include "harness.h"

using namespace gokvtest;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

/* Checks a failed call: its status, a non-empty message mentioning `needle` (when given), and that
 * gokv_last_error_copy returns the same message, truncated and NUL-terminated. */
void expect_error(gokv_status got, gokv_status want, const char *needle, const std::string &what) {
    const std::string msg = gokv_last_error();
    EXPECT_EQ(got, want) << what << ": got " << gokv_status_name(got) << " (" << msg << ")";
    EXPECT_FALSE(msg.empty()) << what << ": empty gokv_last_error()";
    if (needle) {
        EXPECT_NE(msg.find(needle), std::string::npos) << what << ": message \"" << msg << "\" should name " << needle;
    }
    char buf[8];
    std::memset(buf, 'x', sizeof buf);
    const size_t n = gokv_last_error_copy(buf, sizeof buf);
    EXPECT_EQ(n, msg.size()) << what;
    EXPECT_EQ(std::string(buf), msg.substr(0, 7)) << what;
}

class Status : public BackendTest {};

TEST_P(Status, NamesAndMessages) {
#define GOKV_TEST_STATUS_(name, value, msg)                        \
    EXPECT_STREQ(gokv_status_name(name), #name);                   \
    EXPECT_STREQ(gokv_status_message(name), msg);                  \
    EXPECT_EQ((int)name, value);
    GOKV_STATUS_LIST(GOKV_TEST_STATUS_)
#undef GOKV_TEST_STATUS_
    EXPECT_STREQ(gokv_status_name(GOKV_STATUS_COUNT_), "GOKV_UNKNOWN");
    EXPECT_STREQ(gokv_status_name(-1), "GOKV_UNKNOWN");
    EXPECT_NE(gokv_status_message(12345), nullptr);
    EXPECT_EQ(gokv_abi_version(), GOKV_ABI_VERSION);
}

TEST_P(Status, NullHandlesAreNoOps) {
    gokv_pool_destroy(nullptr);
    gokv_device_close(nullptr);
    SUCCEED();
}

TEST_P(Status, BackendRegistry) {
    ASSERT_GE(gokv_backend_count(), 1);
    EXPECT_STREQ(gokv_backend_name(0), "cpu");
    EXPECT_EQ(gokv_backend_name(-1), nullptr);
    EXPECT_EQ(gokv_backend_name(gokv_backend_count()), nullptr);
    EXPECT_EQ(gokv_set_log_callback(nullptr, nullptr, GOKV_LOG_DEBUG), GOKV_OK);
    restore_log_capture();
    bool listed = false;
    for (int32_t i = 0; i < gokv_backend_count(); i++) listed = listed || dut_name() == gokv_backend_name(i);
    EXPECT_TRUE(listed) << "gokv_backend_name does not list \"" << dut_name() << "\"";
}

/* The last error is per thread: a failure on another thread does not replace this thread's message. */
TEST_P(Status, LastErrorIsThreadLocal) {
    gokv_device *dev = nullptr;
    expect_error(gokv_device_open(nullptr, &dev), GOKV_EINVAL, nullptr, "NULL desc");
    const std::string mine = gokv_last_error();
    std::string theirs;
    std::thread th([&] {
        gokv_pool *p = nullptr;
        gokv_pool_create(nullptr, nullptr, &p);
        theirs = gokv_last_error();
    });
    th.join();
    EXPECT_FALSE(theirs.empty());
    EXPECT_EQ(std::string(gokv_last_error()), mine);
}

GOKV_INSTANTIATE_ON_BACKENDS(Status);

class DeviceValidation : public BackendTest {};

TEST_P(DeviceValidation, RejectsBadDescriptors) {
    gokv_device_desc d;
    std::memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.backend = dut_name().c_str();
    d.device_index = -1;
    gokv_device *dev = nullptr;
    expect_error(gokv_device_open(nullptr, &dev), GOKV_EINVAL, "desc", "NULL desc");
    expect_error(gokv_device_open(&d, nullptr), GOKV_EINVAL, "out", "NULL out");
    gokv_device_desc small = d;
    small.struct_size = 4;
    expect_error(gokv_device_open(&small, &dev), GOKV_EVERSION, "struct_size", "small struct_size");
    small.struct_size = 0;
    expect_error(gokv_device_open(&small, &dev), GOKV_EVERSION, "struct_size", "zero struct_size");
    gokv_device_desc bad = d;
    bad.backend = "no-such-backend";
    expect_error(gokv_device_open(&bad, &dev), GOKV_ENODEV, "no-such-backend", "unknown backend");
    bad.backend = dut_name().c_str();
    bad.n_threads = -1;
    expect_error(gokv_device_open(&bad, &dev), GOKV_EINVAL, "n_threads", "negative n_threads");
    bad.n_threads = 1;
    bad.device_name = "no such processor";
    expect_error(gokv_device_open(&bad, &dev), GOKV_ENODEV, "no such processor", "device name that matches nothing");
    EXPECT_EQ(dev, nullptr);
    if (dut_is_cpu()) {
        bad.device_name = "cpu"; /* the backend's own name picks its one device */
        ASSERT_EQ(gokv_device_open(&bad, &dev), GOKV_OK) << gokv_last_error();
        gokv_device_close(dev);
        dev = nullptr;
    }
    /* auto picks a vendor module if any, else the CPU */
    gokv_device_desc a = d;
    a.backend = "auto";
    ASSERT_EQ(gokv_device_open(&a, &dev), GOKV_OK) << gokv_last_error();
    gokv_device_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = 8;
    expect_error(gokv_device_info_get(dev, &info), GOKV_EVERSION, "struct_size", "info struct_size");
    info.struct_size = sizeof info;
    ASSERT_EQ(gokv_device_info_get(dev, &info), GOKV_OK);
    if (gokv_backend_count() == 1) {
        EXPECT_STREQ(info.backend, "cpu");
    }
    EXPECT_EQ(info.formats & 0x3fu, 0x3fu) << "the CPU backend supports every format";
    expect_error(gokv_device_info_get(nullptr, &info), GOKV_EINVAL, nullptr, "info of NULL device");
    expect_error(gokv_device_info_get(dev, nullptr), GOKV_EINVAL, nullptr, "info into NULL");
    gokv_device_close(dev);
}

GOKV_INSTANTIATE_ON_BACKENDS(DeviceValidation);

class PoolValidation : public BackendTest {};

TEST_P(PoolValidation, RejectsBadDescriptors) {
    gokv_device *dev = dut();
    ASSERT_NE(dev, nullptr);
    PoolCfg base = format_cfg(GOKV_FORMAT_KIVI2, 32, 64);
    base.n_slots = 2;
    gokv_pool *p = nullptr;
    struct Case {
        const char *what;
        std::function<void(gokv_pool_desc &)> edit;
        gokv_status want;
        const char *needle;
    };
    const Case cases[] = {
        {"struct_size too small", [](gokv_pool_desc &d) { d.struct_size = 8; }, GOKV_EVERSION, "struct_size"},
        {"unknown format", [](gokv_pool_desc &d) { d.format = GOKV_FORMAT_COUNT_; }, GOKV_EINVAL, "format"},
        {"negative format", [](gokv_pool_desc &d) { d.format = -1; }, GOKV_EINVAL, "format"},
        {"group 16", [](gokv_pool_desc &d) { d.group_size = 16; }, GOKV_EINVAL, "group_size"},
        {"group 48", [](gokv_pool_desc &d) { d.group_size = 48; }, GOKV_EINVAL, "group_size"},
        {"group not dividing d", [](gokv_pool_desc &d) { d.format = GOKV_FORMAT_Q4; d.residual = 0; d.n_residual_slots = 0;
                                                         d.group_size = 64; d.head_dim_k = 96; }, GOKV_EINVAL, "head_dim_k"},
        {"group not dividing d_v", [](gokv_pool_desc &d) { d.head_dim_v = 48; }, GOKV_EINVAL, "head_dim_v"},
        {"group for f16", [](gokv_pool_desc &d) { d.format = GOKV_FORMAT_F16; d.residual = 0; d.n_residual_slots = 0; }, GOKV_EINVAL, "group_size"},
        {"residual not multiple of g", [](gokv_pool_desc &d) { d.residual = 16; }, GOKV_EINVAL, "residual"},
        {"negative residual", [](gokv_pool_desc &d) { d.residual = -32; }, GOKV_EINVAL, "residual"},
        {"residual on q4", [](gokv_pool_desc &d) { d.format = GOKV_FORMAT_Q4; d.n_residual_slots = 0; }, GOKV_EINVAL, "residual"},
        {"KIVI page not multiple of g", [](gokv_pool_desc &d) { d.page_size = 48; }, GOKV_EINVAL, "page_size"},
        {"page size 7", [](gokv_pool_desc &d) { d.format = GOKV_FORMAT_F32; d.group_size = 0; d.residual = 0; d.n_residual_slots = 0; d.page_size = 7; }, GOKV_EINVAL, "page_size"},
        {"page size 2048", [](gokv_pool_desc &d) { d.page_size = 2048; }, GOKV_EINVAL, "page_size"},
        {"negative page size", [](gokv_pool_desc &d) { d.page_size = -64; }, GOKV_EINVAL, "page_size"},
        {"v prefix longer than k", [](gokv_pool_desc &d) { d.v_is_k_prefix = 1; d.n_kv_heads = 1; d.head_dim_v = 128; d.head_dim_k = 64; }, GOKV_EINVAL, "head_dim_v"},
        {"v_is_k_prefix 2", [](gokv_pool_desc &d) { d.v_is_k_prefix = 2; }, GOKV_EINVAL, "v_is_k_prefix"},
        {"zero kv heads", [](gokv_pool_desc &d) { d.n_kv_heads = 0; }, GOKV_EINVAL, "n_kv_heads"},
        {"negative kv heads", [](gokv_pool_desc &d) { d.n_kv_heads = -2; }, GOKV_EINVAL, "n_kv_heads"},
        {"head_dim_k 0", [](gokv_pool_desc &d) { d.head_dim_k = 0; }, GOKV_EINVAL, "head_dim_k"},
        {"head_dim_k 1056", [](gokv_pool_desc &d) { d.head_dim_k = 1056; }, GOKV_EINVAL, "head_dim_k"},
        {"head_dim_v 6 (f32)", [](gokv_pool_desc &d) { d.format = GOKV_FORMAT_F32; d.group_size = 0; d.residual = 0; d.n_residual_slots = 0; d.head_dim_v = 6; }, GOKV_EINVAL, "head_dim_v"},
        {"zero pages", [](gokv_pool_desc &d) { d.n_pages = 0; }, GOKV_EINVAL, "n_pages"},
        {"negative pages", [](gokv_pool_desc &d) { d.n_pages = -1; }, GOKV_EINVAL, "n_pages"},
        {"negative residual slots", [](gokv_pool_desc &d) { d.n_residual_slots = -1; }, GOKV_EINVAL, "n_residual_slots"},
        {"residual slots on f16", [](gokv_pool_desc &d) { d.format = GOKV_FORMAT_F16; d.group_size = 0; d.residual = 0; }, GOKV_EINVAL, "n_residual_slots"},
    };
    for (const Case &c : cases) {
        gokv_pool_desc d = pool_desc(base);
        c.edit(d);
        p = nullptr;
        expect_error(gokv_pool_create(dev, &d, &p), c.want, c.needle, c.what);
        EXPECT_EQ(p, nullptr) << c.what;
    }
    gokv_pool_desc d = pool_desc(base);
    expect_error(gokv_pool_create(dev, nullptr, &p), GOKV_EINVAL, "desc", "NULL desc");
    expect_error(gokv_pool_create(nullptr, &d, &p), GOKV_EINVAL, "dev", "NULL device");
    expect_error(gokv_pool_create(dev, &d, nullptr), GOKV_EINVAL, "out", "NULL out");
    /* page_size 0 means 64 */
    d.page_size = 0;
    ASSERT_EQ(gokv_pool_create(dev, &d, &p), GOKV_OK) << gokv_last_error();
    EXPECT_EQ(gokv_pool_layout(p)->page_size, 64);
    uint64_t pb = 0, rb = 0;
    expect_error(gokv_pool_sizes(nullptr, &pb, &rb), GOKV_EINVAL, nullptr, "sizes of NULL pool");
    gokv_pool_destroy(p);
}

GOKV_INSTANTIATE_ON_BACKENDS(PoolValidation);

/* A pool with two sequences written, whose bytes are snapshotted around each rejected call. */
class CallValidation : public BackendTest {
protected:
    void SetUp() override {
        BackendTest::SetUp();
        if (HasFatalFailure()) return;
        for (int32_t fmt : {GOKV_FORMAT_F32, GOKV_FORMAT_Q4, GOKV_FORMAT_KIVI2}) {
            PoolCfg c = format_cfg(fmt, fmt == GOKV_FORMAT_F32 ? 0 : 32, fmt == GOKV_FORMAT_KIVI2 ? 32 : 0);
            c.n_kv_heads = 2;
            c.n_pages = 12;
            caches.emplace_back();
            ASSERT_TRUE(build_cache(dut(), c, {100, 70}, 42u, caches.back(), 64));
        }
    }
    std::vector<uint8_t> snapshot(const Cache &c) const {
        std::vector<uint8_t> s;
        const gokv_layout *L = gokv_pool_layout(c.pool.get());
        (void)L;
        for (int32_t p = 0; p < c.cfg.n_pages; p++) {
            const std::vector<uint8_t> b = page_bytes(c.pool.get(), p);
            s.insert(s.end(), b.begin(), b.end());
        }
        for (int32_t r = 0; r < c.cfg.n_slots; r++) {
            const std::vector<uint8_t> b = slot_bytes(c.pool.get(), r);
            s.insert(s.end(), b.begin(), b.end());
        }
        return s;
    }
    std::vector<Cache> caches;
};

/* Writes that fail validation, each made to fail on its last sequence / last element so an
 * implementation that writes before validating everything would leave traces. */
TEST_P(CallValidation, WriteRejectsAndChangesNothing) {
    for (Cache &c : caches) {
        const PoolCfg &cfg = c.cfg;
        std::mt19937 rng(1);
        const int32_t n0 = 40, n1 = 40; /* a: 100 -> 140 tokens, b: 70 -> 110 */
        std::vector<float> k0 = gen_keys(rng, n0, 2, cfg.d_k), v0 = gen_values(rng, n0, 2, cfg.d_v);
        std::vector<float> k1 = gen_keys(rng, n1, 2, cfg.d_k), v1 = gen_values(rng, n1, 2, cfg.d_v);
        struct W {
            std::vector<int32_t> tok, pind, pids, start, slots;
            std::vector<float> k, v;
            gokv_write_desc d;
        };
        auto make = [&]() {
            W w;
            w.tok = {0, n0, n0 + n1};
            const Seq &a = c.seqs[0], &b = c.seqs[1];
            std::vector<int32_t> ta = a.table(a.len + n0, cfg.page_size), tb = b.table(b.len + n1, cfg.page_size);
            w.pids = ta;
            w.pids.insert(w.pids.end(), tb.begin(), tb.end());
            w.pind = {0, (int32_t)ta.size(), (int32_t)(ta.size() + tb.size())};
            w.start = {a.len, b.len};
            w.slots = {a.slot, b.slot};
            w.k = k0;
            w.k.insert(w.k.end(), k1.begin(), k1.end());
            w.v = v0;
            w.v.insert(w.v.end(), v1.begin(), v1.end());
            std::memset(&w.d, 0, sizeof w.d);
            w.d.struct_size = sizeof w.d;
            w.d.n_seqs = 2;
            return w;
        };
        auto bind = [&](W &w) {
            w.d.tok_indptr = w.tok.data();
            w.d.page_indptr = w.pind.data();
            w.d.page_ids = w.pids.data();
            w.d.start_pos = w.start.data();
            w.d.residual_slot = cfg.kivi() ? w.slots.data() : nullptr;
            w.d.k = w.k.data();
            w.d.v = w.v.data();
        };
        const size_t last_k = (size_t)(n0 + n1) * 2 * (size_t)cfg.d_k - 1;
        const size_t last_v = (size_t)(n0 + n1) * 2 * (size_t)cfg.d_v - 1;
        const bool fp16_range = cfg.format != GOKV_FORMAT_F32;
        struct Case {
            const char *what;
            std::function<void(W &)> edit;
            gokv_status want;
            const char *needle;
        };
        std::vector<Case> cases = {
            {"struct_size too small", [](W &w) { w.d.struct_size = 12; }, GOKV_EVERSION, "struct_size"},
            {"negative n_seqs", [](W &w) { w.d.n_seqs = -1; }, GOKV_EINVAL, "n_seqs"},
            {"NULL tok_indptr", [](W &w) { w.d.tok_indptr = nullptr; }, GOKV_EINVAL, "tok_indptr"},
            {"tok_indptr[0] != 0", [](W &w) { w.tok[0] = 1; }, GOKV_EINVAL, "tok_indptr"},
            {"decreasing tok_indptr", [&](W &w) { w.tok[1] = n0 + n1 + 1; }, GOKV_EINVAL, "tok_indptr"},
            {"NULL page_indptr", [](W &w) { w.d.page_indptr = nullptr; }, GOKV_EINVAL, "page_indptr"},
            {"NULL page_ids", [](W &w) { w.d.page_ids = nullptr; }, GOKV_EINVAL, "page_ids"},
            {"NULL start_pos", [](W &w) { w.d.start_pos = nullptr; }, GOKV_EINVAL, "start_pos"},
            {"negative start_pos", [](W &w) { w.start[1] = -1; }, GOKV_EINVAL, "start_pos"},
            {"page table too short", [](W &w) { w.pind[2] -= 1; }, GOKV_EINVAL, "page"},
            {"page id out of range", [&](W &w) { w.pids.back() = cfg.n_pages; }, GOKV_ERANGE, "page_ids"},
            {"page id -2", [](W &w) { w.pids.back() = -2; }, GOKV_ERANGE, "page_ids"},
            {"write into released page", [&](W &w) { w.pids[(size_t)w.pind[1] + (cfg.kivi() ? 0 : 1)] = -1; }, GOKV_EINVAL, "released"},
            {"NULL k", [](W &w) { w.d.k = nullptr; }, GOKV_EINVAL, "k"},
            {"NULL v", [](W &w) { w.d.v = nullptr; }, GOKV_EINVAL, "v"},
            {"NaN key", [&](W &w) { w.k[last_k] = kNaN; }, GOKV_EINVAL, "k"},
            {"inf value", [&](W &w) { w.v[last_v] = -kInf; }, GOKV_EINVAL, "v"},
            {"NaN value", [&](W &w) { w.v[last_v] = kNaN; }, GOKV_EINVAL, "v"},
        };
        if (fp16_range) {
            cases.push_back({"key beyond fp16", [&](W &w) { w.k[last_k] = 65505.0f; }, GOKV_EINVAL, "k"});
            cases.push_back({"value beyond fp16", [&](W &w) { w.v[last_v] = -70000.0f; }, GOKV_EINVAL, "v"});
        }
        if (cfg.kivi()) {
            cases.push_back({"NULL residual_slot", [](W &w) { w.d.residual_slot = nullptr; }, GOKV_EINVAL, "residual_slot"});
            cases.push_back({"residual slot out of range", [&](W &w) { w.slots[1] = cfg.n_slots; }, GOKV_ERANGE, "residual_slot"});
            cases.push_back({"negative residual slot", [](W &w) { w.slots[1] = -1; }, GOKV_ERANGE, "residual_slot"});
            cases.push_back({"same residual slot twice", [](W &w) { w.slots[1] = w.slots[0]; }, GOKV_EINVAL, "residual_slot"});
            /* R 32: a quantizes its tokens 64..95 into its page 1, b its tokens 32..63 into its page 0 */
            cases.push_back({"duplicate page", [&](W &w) { w.pids[(size_t)w.pind[1]] = w.pids[1]; }, GOKV_EINVAL, "page"});
        } else {
            /* a writes slots 36..63 of its page 1, b slots 6..45 of its page 1: made the same page */
            cases.push_back({"duplicate page", [&](W &w) { w.pids[(size_t)w.pind[1] + 1] = w.pids[1]; }, GOKV_EINVAL, "page"});
        }
        for (const Case &cs : cases) {
            const std::string what = cfg.name() + ": " + cs.what;
            W w = make();
            bind(w);
            cs.edit(w);
            const std::vector<uint8_t> before = snapshot(c);
            expect_error(gokv_pool_write(c.pool.get(), &w.d), cs.want, cs.needle, what);
            EXPECT_TRUE(snapshot(c) == before) << what << ": a rejected write changed stored bytes";
        }
        /* f32 stores values beyond the fp16 range */
        if (!fp16_range) {
            W w = make();
            bind(w);
            w.k[last_k] = 1e6f;
            EXPECT_EQ(gokv_pool_write(c.pool.get(), &w.d), GOKV_OK) << gokv_last_error();
        }
        gokv_write_desc d;
        std::memset(&d, 0, sizeof d);
        d.struct_size = sizeof d;
        expect_error(gokv_pool_write(nullptr, &d), GOKV_EINVAL, "pool", cfg.name() + ": NULL pool");
        expect_error(gokv_pool_write(c.pool.get(), nullptr), GOKV_EINVAL, "desc", cfg.name() + ": NULL desc");
        /* a valid empty write is fine */
        std::vector<int32_t> zero{0};
        d.n_seqs = 0;
        d.tok_indptr = zero.data();
        d.page_indptr = zero.data();
        EXPECT_EQ(gokv_pool_write(c.pool.get(), &d), GOKV_OK) << gokv_last_error();
    }
}

/* gokv.h: a write's page table "must cover every position up to the new length with pages >= 0", also
 * for KIVI positions that this call only puts in the ring (their page receives them later). */
TEST_P(CallValidation, KiviWriteRejectsReleasedPageOfRingTokens) {
    Cache &c = caches[2];
    ASSERT_TRUE(c.cfg.kivi());
    Seq &s = c.seqs[1]; /* 70 tokens, R 32: a write of 10 more quantizes nothing into page 1 */
    std::mt19937 rng(3);
    std::vector<float> k = gen_keys(rng, 10, 2, c.cfg.d_k), v = gen_values(rng, 10, 2, c.cfg.d_v);
    std::vector<int32_t> tok{0, 10}, pids = s.table(s.len + 10, c.cfg.page_size), pind{0, (int32_t)pids.size()};
    pids[1] = -1;
    int32_t start = s.len, slot = s.slot;
    gokv_write_desc w;
    std::memset(&w, 0, sizeof w);
    w.struct_size = sizeof w;
    w.n_seqs = 1;
    w.tok_indptr = tok.data();
    w.page_indptr = pind.data();
    w.page_ids = pids.data();
    w.start_pos = &start;
    w.residual_slot = &slot;
    w.k = k.data();
    w.v = v.data();
    const std::vector<uint8_t> before = snapshot(c);
    expect_error(gokv_pool_write(c.pool.get(), &w), GOKV_EINVAL, "released", "ring tokens on a released page");
    EXPECT_TRUE(snapshot(c) == before) << "a rejected write changed stored bytes";
}

TEST_P(CallValidation, ReadRejects) {
    for (Cache &c : caches) {
        const Seq &s = c.seqs[0];
        std::vector<float> k((size_t)s.len * 2 * (size_t)c.cfg.d_k), v((size_t)s.len * 2 * (size_t)c.cfg.d_v);
        std::vector<int32_t> tok{0, s.len}, pind{0}, pids = s.table(s.len, c.cfg.page_size);
        pind.push_back((int32_t)pids.size());
        int32_t kv_len = s.len, start = 0, slot = s.slot;
        auto make = [&]() {
            return one_seq_read(tok.data(), pind.data(), pids.data(), &kv_len, &start, c.cfg.kivi() ? &slot : nullptr,
                                k.data(), v.data());
        };
        gokv_read_desc r = make();
        ASSERT_EQ(gokv_pool_read(c.pool.get(), &r), GOKV_OK) << gokv_last_error();
        const std::string n = c.cfg.name() + ": ";
        r = make(); r.struct_size = 4;
        expect_error(gokv_pool_read(c.pool.get(), &r), GOKV_EVERSION, "struct_size", n + "struct_size");
        r = make(); r.k_out = nullptr;
        expect_error(gokv_pool_read(c.pool.get(), &r), GOKV_EINVAL, "k_out", n + "NULL k_out");
        r = make(); r.kv_len = nullptr;
        expect_error(gokv_pool_read(c.pool.get(), &r), GOKV_EINVAL, "kv_len", n + "NULL kv_len");
        r = make(); r.n_seqs = -3;
        expect_error(gokv_pool_read(c.pool.get(), &r), GOKV_EINVAL, "n_seqs", n + "negative n_seqs");
        kv_len = -1; r = make();
        expect_error(gokv_pool_read(c.pool.get(), &r), GOKV_EINVAL, "kv_len", n + "negative kv_len");
        kv_len = s.len - 1; r = make(); /* reads past the sequence's end */
        expect_error(gokv_pool_read(c.pool.get(), &r), GOKV_EINVAL, nullptr, n + "read past kv_len");
        kv_len = s.len; pids[1] = c.cfg.n_pages + 5; r = make();
        expect_error(gokv_pool_read(c.pool.get(), &r), GOKV_ERANGE, "page_ids", n + "page id out of range");
        pids = s.table(s.len, c.cfg.page_size); pind[1] = 1; r = make();
        expect_error(gokv_pool_read(c.pool.get(), &r), GOKV_EINVAL, "page", n + "page table too short");
        pind[1] = (int32_t)pids.size();
        if (c.cfg.kivi()) {
            r = make(); r.residual_slot = nullptr;
            expect_error(gokv_pool_read(c.pool.get(), &r), GOKV_EINVAL, "residual_slot", n + "NULL residual_slot");
            slot = 99; r = make();
            expect_error(gokv_pool_read(c.pool.get(), &r), GOKV_ERANGE, "residual_slot", n + "residual slot range");
            slot = s.slot;
        }
        expect_error(gokv_pool_read(nullptr, &r), GOKV_EINVAL, "pool", n + "NULL pool");
    }
}

TEST_P(CallValidation, AttendRejects) {
    DevicePtr other = open_backend(dut_name().c_str(), 1);
    ASSERT_TRUE(other);
    for (Cache &c : caches) {
        std::vector<AttnSeq> seqs = {attn_seq(c, 0), attn_seq(c, 1, 3)};
        const int32_t rows = 4, Hq = 4;
        std::mt19937 rng(2);
        std::vector<float> q = gen_normal(rng, (size_t)rows * Hq * (size_t)c.cfg.d_k);
        std::vector<float> out((size_t)rows * Hq * (size_t)c.cfg.d_v);
        std::vector<float> sinks = {0.0f, 1.0f, 2.0f, 3.0f};
        std::vector<int32_t> qind{0, 1, 4}, pind{0}, pids, kvl, qpos, slots, vind{0, 4, 7};
        std::vector<uint32_t> mask(7, 0xffffffffu);
        for (auto &s : seqs) {
            pids.insert(pids.end(), s.pages.begin(), s.pages.end());
            pind.push_back((int32_t)pids.size());
            kvl.push_back(s.kv_len);
            qpos.push_back(s.q_pos);
            slots.push_back(s.slot);
        }
        auto make = [&]() {
            gokv_attend_desc a;
            std::memset(&a, 0, sizeof a);
            a.struct_size = sizeof a;
            a.pool = c.pool.get();
            a.n_seqs = 2;
            a.q_indptr = qind.data();
            a.page_indptr = pind.data();
            a.page_ids = pids.data();
            a.kv_len = kvl.data();
            a.q_pos = qpos.data();
            a.residual_slot = c.cfg.kivi() ? slots.data() : nullptr;
            a.n_heads_q = Hq;
            a.q = q.data();
            a.out = out.data();
            a.scale = 0.125f;
            a.sink_logits = sinks.data();
            return a;
        };
        gokv_attend_desc a = make();
        ASSERT_EQ(gokv_attend(dut(), &a), GOKV_OK) << gokv_last_error();
        a.valid_mask = mask.data();
        a.valid_indptr = vind.data();
        ASSERT_EQ(gokv_attend(dut(), &a), GOKV_OK) << gokv_last_error();
        /* the mass output and per-kv-head masks (2 kv heads: 8 + 6 words), accepted where the backend has them */
        std::vector<float> mass((size_t)c.cfg.n_kv_heads * (size_t)(seqs[0].kv_len + seqs[1].kv_len), 7.0f);
        std::vector<uint32_t> head_masks(14, 0xffffffffu);
        std::vector<int32_t> head_vind{0, 8, 14};
        if (dut_has_caps(GOKV_CAP_MASS | GOKV_CAP_KV_HEAD_MASKS)) {
            a = make();
            a.mass = mass.data();
            a.mass_rows = 2;
            a.valid_mask = head_masks.data();
            a.valid_indptr = head_vind.data();
            a.flags = GOKV_ATTEND_MASK_PER_KV_HEAD;
            ASSERT_EQ(gokv_attend(dut(), &a), GOKV_OK) << gokv_last_error();
        }
        struct Case {
            const char *what;
            std::function<void(gokv_attend_desc &)> edit;
            gokv_status want;
            const char *needle;
        };
        std::vector<Case> cases = {
            {"struct_size too small", [](gokv_attend_desc &a) { a.struct_size = 16; }, GOKV_EVERSION, "struct_size"},
            {"NULL pool", [](gokv_attend_desc &a) { a.pool = nullptr; }, GOKV_EINVAL, "pool"},
            {"negative n_seqs", [](gokv_attend_desc &a) { a.n_seqs = -1; }, GOKV_EINVAL, "n_seqs"},
            {"NULL q_indptr", [](gokv_attend_desc &a) { a.q_indptr = nullptr; }, GOKV_EINVAL, "q_indptr"},
            {"NULL page_indptr", [](gokv_attend_desc &a) { a.page_indptr = nullptr; }, GOKV_EINVAL, "page_indptr"},
            {"NULL page_ids", [](gokv_attend_desc &a) { a.page_ids = nullptr; }, GOKV_EINVAL, "page_ids"},
            {"NULL kv_len", [](gokv_attend_desc &a) { a.kv_len = nullptr; }, GOKV_EINVAL, "kv_len"},
            {"NULL q_pos", [](gokv_attend_desc &a) { a.q_pos = nullptr; }, GOKV_EINVAL, "q_pos"},
            {"NULL q", [](gokv_attend_desc &a) { a.q = nullptr; }, GOKV_EINVAL, "q"},
            {"NULL out", [](gokv_attend_desc &a) { a.out = nullptr; }, GOKV_EINVAL, "out"},
            {"n_heads_q 3 with 2 kv heads", [](gokv_attend_desc &a) { a.n_heads_q = 3; }, GOKV_EINVAL, "n_heads_q"},
            {"n_heads_q 0", [](gokv_attend_desc &a) { a.n_heads_q = 0; }, GOKV_EINVAL, "n_heads_q"},
            {"negative n_heads_q", [](gokv_attend_desc &a) { a.n_heads_q = -4; }, GOKV_EINVAL, "n_heads_q"},
            {"scale 0", [](gokv_attend_desc &a) { a.scale = 0.0f; }, GOKV_EINVAL, "scale"},
            {"negative scale", [](gokv_attend_desc &a) { a.scale = -0.1f; }, GOKV_EINVAL, "scale"},
            {"NaN scale", [](gokv_attend_desc &a) { a.scale = kNaN; }, GOKV_EINVAL, "scale"},
            {"inf scale", [](gokv_attend_desc &a) { a.scale = kInf; }, GOKV_EINVAL, "scale"},
            {"unknown flag", [](gokv_attend_desc &a) { a.flags = 1u << 7; }, GOKV_EINVAL, "flags"},
            {"negative window", [](gokv_attend_desc &a) { a.window = -1; }, GOKV_EINVAL, "window"},
            {"negative n_sink_tokens", [](gokv_attend_desc &a) { a.n_sink_tokens = -1; }, GOKV_EINVAL, "n_sink_tokens"},
            {"negative chunk_size", [](gokv_attend_desc &a) { a.chunk_size = -512; }, GOKV_EINVAL, "chunk_size"},
            {"NaN query", [&](gokv_attend_desc &) { q.back() = kNaN; }, GOKV_EINVAL, "q"},
            {"inf query", [&](gokv_attend_desc &) { q[5] = kInf; }, GOKV_EINVAL, "q"},
            {"NaN sink logit", [&](gokv_attend_desc &) { sinks[3] = kNaN; }, GOKV_EINVAL, "sink_logits"},
            {"inf sink logit", [&](gokv_attend_desc &) { sinks[1] = -kInf; }, GOKV_EINVAL, "sink_logits"},
            {"negative kv_len", [&](gokv_attend_desc &) { kvl[1] = -1; }, GOKV_EINVAL, "kv_len"},
            {"negative q_pos", [&](gokv_attend_desc &) { qpos[1] = -2; }, GOKV_EINVAL, "q_pos"},
            {"page id out of range", [&](gokv_attend_desc &) { pids.back() = c.cfg.n_pages; }, GOKV_ERANGE, "page_ids"},
            {"page id -7", [&](gokv_attend_desc &) { pids[0] = -7; }, GOKV_ERANGE, "page_ids"},
            {"page table too short", [&](gokv_attend_desc &) { pind[2] = pind[1]; }, GOKV_EINVAL, "page"},
            {"kv_len beyond the table", [&](gokv_attend_desc &) { kvl[1] += 2 * c.cfg.page_size; }, GOKV_EINVAL, "page"},
            {"valid_mask too short", [&](gokv_attend_desc &a) { a.valid_mask = mask.data(); vind = {0, 4, 5}; a.valid_indptr = vind.data(); }, GOKV_EINVAL, "valid_mask"},
            {"valid_mask without indptr", [&](gokv_attend_desc &a) { a.valid_mask = mask.data(); a.valid_indptr = nullptr; }, GOKV_EINVAL, "valid_indptr"},
            {"negative mass_rows", [&](gokv_attend_desc &a) { a.mass = mass.data(); a.mass_rows = -1; }, GOKV_EINVAL, "mass_rows"},
            {"negative mass_rows without mass", [&](gokv_attend_desc &a) { a.mass_rows = -3; }, GOKV_EINVAL, "mass_rows"},
            {"mass with the baseline flag", [&](gokv_attend_desc &a) { a.mass = mass.data(); a.flags = GOKV_ATTEND_DEQUANT_BASELINE; }, GOKV_EINVAL, "mass"},
            {"per-kv-head flag without a mask", [&](gokv_attend_desc &a) { a.flags = GOKV_ATTEND_MASK_PER_KV_HEAD; }, GOKV_EINVAL, "valid_mask"},
            {"negative quest_pages", [](gokv_attend_desc &a) { a.quest_pages = -1; }, GOKV_EINVAL, "quest_pages"},
            {"negative quest_recent", [](gokv_attend_desc &a) { a.quest_recent = -2; }, GOKV_EINVAL, "quest_recent"},
            {"quest_bounds without quest_pages", [&](gokv_attend_desc &a) { a.quest_bounds = out.data(); }, GOKV_EINVAL, "quest_pages"},
            {"quest_pages on a pool without key_bounds", [](gokv_attend_desc &a) { a.quest_pages = 2; }, GOKV_EINVAL, "key_bounds"},
            {"per-kv-head mask too short (one mask per sequence)", [&](gokv_attend_desc &a) { a.flags = GOKV_ATTEND_MASK_PER_KV_HEAD; a.valid_mask = mask.data(); a.valid_indptr = vind.data(); }, GOKV_EINVAL, "valid_mask"},
            {"per-kv-head mask a word short", [&](gokv_attend_desc &a) { a.flags = GOKV_ATTEND_MASK_PER_KV_HEAD; a.valid_mask = head_masks.data(); head_vind = {0, 8, 13}; a.valid_indptr = head_vind.data(); }, GOKV_EINVAL, "valid_mask"},
        };
        if (c.cfg.kivi()) {
            cases.push_back({"NULL residual_slot", [](gokv_attend_desc &a) { a.residual_slot = nullptr; }, GOKV_EINVAL, "residual_slot"});
            cases.push_back({"residual slot out of range", [&](gokv_attend_desc &) { slots[1] = c.cfg.n_slots; }, GOKV_ERANGE, "residual_slot"});
        }
        for (const Case &cs : cases) {
            const std::string what = c.cfg.name() + ": " + cs.what;
            gokv_attend_desc d = make();
            cs.edit(d);
            std::fill(out.begin(), out.end(), 7.0f);
            std::fill(mass.begin(), mass.end(), 7.0f);
            expect_error(gokv_attend(dut(), &d), cs.want, cs.needle, what);
            EXPECT_TRUE(std::all_of(mass.begin(), mass.end(), [](float x) { return x == 7.0f; }))
                << what << ": a rejected call wrote the mass";
            head_vind = {0, 8, 14};
            /* restore the shared arrays */
            std::mt19937 r2(2);
            q = gen_normal(r2, (size_t)rows * Hq * (size_t)c.cfg.d_k);
            sinks = {0.0f, 1.0f, 2.0f, 3.0f};
            kvl = {seqs[0].kv_len, seqs[1].kv_len};
            qpos = {seqs[0].q_pos, seqs[1].q_pos};
            slots = {seqs[0].slot, seqs[1].slot};
            vind = {0, 4, 7};
            pids.clear();
            pind = {0};
            for (auto &s : seqs) {
                pids.insert(pids.end(), s.pages.begin(), s.pages.end());
                pind.push_back((int32_t)pids.size());
            }
        }
        a = make();
        expect_error(gokv_attend(nullptr, &a), GOKV_EINVAL, "dev", c.cfg.name() + ": NULL device");
        expect_error(gokv_attend(dut(), nullptr), GOKV_EINVAL, "desc", c.cfg.name() + ": NULL desc");
        expect_error(gokv_attend(other.get(), &a), GOKV_EINVAL, "device", c.cfg.name() + ": pool of another device");
        /* zero sequences is a valid no-op */
        a.n_seqs = 0;
        EXPECT_EQ(gokv_attend(dut(), &a), GOKV_OK) << gokv_last_error();
    }
}

TEST_P(CallValidation, CopyRejects) {
    for (Cache &c : caches) {
        const std::string n = c.cfg.name() + ": ";
        std::vector<int32_t> src = {c.seqs[0].pages[0], c.seqs[0].pages[1]}, dst = {10, 11};
        std::vector<int32_t> ssrc = {0}, sdst = {1};
        auto make = [&]() {
            gokv_copy_desc d;
            std::memset(&d, 0, sizeof d);
            d.struct_size = sizeof d;
            d.n_pages = 2;
            d.src_pages = src.data();
            d.dst_pages = dst.data();
            return d;
        };
        gokv_copy_desc d = make();
        d.struct_size = 4;
        expect_error(gokv_pool_copy(c.pool.get(), &d), GOKV_EVERSION, "struct_size", n + "struct_size");
        d = make(); d.n_pages = -1;
        expect_error(gokv_pool_copy(c.pool.get(), &d), GOKV_EINVAL, "n_pages", n + "negative n_pages");
        d = make(); d.dst_pages = nullptr;
        expect_error(gokv_pool_copy(c.pool.get(), &d), GOKV_EINVAL, "dst_pages", n + "NULL dst_pages");
        dst = {10, 10}; d = make();
        expect_error(gokv_pool_copy(c.pool.get(), &d), GOKV_EINVAL, "dst_pages", n + "duplicate destination");
        dst = {10, src[0]}; d = make();
        expect_error(gokv_pool_copy(c.pool.get(), &d), GOKV_EINVAL, nullptr, n + "destination is a source");
        dst = {10, c.cfg.n_pages}; d = make();
        expect_error(gokv_pool_copy(c.pool.get(), &d), GOKV_ERANGE, "dst_pages", n + "destination out of range");
        dst = {10, 11}; src[1] = -1; d = make();
        expect_error(gokv_pool_copy(c.pool.get(), &d), GOKV_ERANGE, "src_pages", n + "source out of range");
        src[1] = c.seqs[0].pages[1];
        d = make(); d.n_pages = 0; d.n_slots = 1; d.src_slots = ssrc.data(); d.dst_slots = sdst.data();
        if (c.cfg.kivi()) {
            sdst = {c.cfg.n_slots}; d.dst_slots = sdst.data();
            expect_error(gokv_pool_copy(c.pool.get(), &d), GOKV_ERANGE, "dst_slots", n + "slot out of range");
        } else {
            expect_error(gokv_pool_copy(c.pool.get(), &d), GOKV_EINVAL, "n_slots", n + "slots on a pool without rings");
        }
        d = make();
        expect_error(gokv_pool_copy(nullptr, &d), GOKV_EINVAL, "pool", n + "NULL pool");
        expect_error(gokv_pool_copy(c.pool.get(), nullptr), GOKV_EINVAL, "desc", n + "NULL desc");
    }
}

GOKV_INSTANTIATE_ON_BACKENDS(CallValidation);

class Validation : public BackendTest {};

/* The pure size helper validates its arguments too: no signed overflow (UBSan runs this), never more
 * than n, and -1 with a message for what cannot be a KIVI sequence. */
TEST_P(Validation, KiviQuantizedLenArguments) {
    const int32_t max = std::numeric_limits<int32_t>::max(), min = std::numeric_limits<int32_t>::min();
    struct Case { int32_t n, g, r; const char *needle; } bad[] = {
        {max, 32, min, "residual"}, {100, 32, -64, "residual"}, {-1, 32, 0, "n -1"}, {100, 0, 32, "group_size 0"},
        {100, -32, 32, "group_size -32"}, {min, 32, 32, "n"},
    };
    for (const Case &c : bad) {
        EXPECT_EQ(gokv_kivi_quantized_len(c.n, c.g, c.r), -1) << c.n << " " << c.g << " " << c.r;
        EXPECT_NE(std::string(gokv_last_error()).find(c.needle), std::string::npos) << gokv_last_error();
    }
    EXPECT_EQ(gokv_kivi_quantized_len(max, 32, 0), max / 32 * 32);
    EXPECT_EQ(gokv_kivi_quantized_len(max, 128, max), 0);
    EXPECT_EQ(gokv_kivi_quantized_len(max, 1, 65536), max - 65536);
    for (int32_t n = 0; n < 300; n++)
        for (int32_t r : {0, 32, 128}) {
            const int32_t q = gokv_kivi_quantized_len(n, 32, r);
            EXPECT_GE(q, 0);
            EXPECT_LE(q, n);
            EXPECT_EQ(q % 32, 0);
        }
}

/* Validation is the core's, before any backend sees a call: the same bad descriptors give the same status
 * and message on every backend as on the CPU, and a rejected write leaves the pool as it was. */
TEST_P(Validation, RejectsAsOnCpu) {
    PoolCfg c = format_cfg(GOKV_FORMAT_KIVI2, 32, 32);
    c.n_kv_heads = 2;
    c.n_pages = 12;
    Pair pair;
    ASSERT_TRUE(build_pair(c, {100, 70}, 42u, pair, 64));
    c = pair.dut.cfg;
    struct Outcome {
        gokv_status st;
        std::string msg;
    };
    auto same = [](const Outcome &a, const Outcome &b, gokv_status want, const std::string &what) {
        EXPECT_EQ(a.st, want) << what << " on " << dut_name() << ": " << a.msg;
        EXPECT_EQ(a.st, b.st) << what;
        EXPECT_EQ(a.msg, b.msg) << what;
        EXPECT_FALSE(a.msg.empty()) << what;
    };
    /* pool descriptors */
    for (int32_t bad_group : {16, 48}) {
        gokv_pool_desc d = pool_desc(c);
        d.group_size = bad_group;
        Outcome r[2];
        gokv_device *devs[2] = {dut(), cpu_device()};
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
            const Cache &cc = i == 0 ? pair.dut : pair.cpu;
            AttnSeq s0 = attn_seq(cc, 0), s1 = attn_seq(cc, 1);
            AttnOpts o;
            o.n_heads_q = 4;
            std::vector<float> qq = q, out;
            cs.edit(s1, o, qq);
            r[i].st = attend(i == 0 ? dut() : cpu_device(), cc.pool.get(), c, {s0, s1}, qq, o, out);
            r[i].msg = gokv_last_error();
        }
        same(r[0], r[1], cs.want, cs.what);
    }
    /* a pool used on another device */
    if (!dut_is_cpu()) {
        std::vector<float> out;
        AttnOpts o;
        o.n_heads_q = 4;
        const gokv_status st = attend(cpu_device(), pair.dut.pool.get(), c, {attn_seq(pair.dut, 0)}, q, o, out);
        EXPECT_EQ(st, GOKV_EINVAL) << "a " << dut_name() << " pool on the CPU device: " << gokv_last_error();
        EXPECT_NE(std::string(gokv_last_error()).find("device"), std::string::npos) << gokv_last_error();
    }
    /* writes: a NaN key in the last row, a released page in the new range; nothing stored on rejection */
    for (int variant = 0; variant < 2; variant++) {
        Outcome r[2];
        for (int i = 0; i < 2; i++) {
            Cache &cc = i == 0 ? pair.dut : pair.cpu;
            std::mt19937 g(7);
            std::vector<float> k = gen_keys(g, 40, 2, c.d_k), v = gen_values(g, 40, 2, c.d_v);
            Seq s = cc.seqs[1];
            if (variant == 0) k.back() = std::numeric_limits<float>::quiet_NaN();
            if (variant == 1) s.pages[1] = -1;
            r[i].st = append1(cc.pool.get(), c, s, k, v);
            r[i].msg = gokv_last_error();
        }
        same(r[0], r[1], GOKV_EINVAL, variant == 0 ? "NaN key" : "write into a released page");
        const std::vector<std::vector<float>> k_before = pair.dut.kdq, v_before = pair.dut.vdq;
        ASSERT_TRUE(reread(pair.dut));
        EXPECT_TRUE(pair.dut.kdq == k_before && pair.dut.vdq == v_before) << "a rejected write changed the pool";
    }
}

GOKV_INSTANTIATE_ON_BACKENDS(Validation);

} // namespace
