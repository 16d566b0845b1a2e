/*
 * test_residual.cc: KIVI's residual ring on every backend (docs/architecture.md §4: the newest R tokens in
 * fp16, older ones quantized g at a time; gokv.h: n_quant = max(0, floor((n - R) / g) * g)): token by token
 * and in random chunks, against one write and the stored-format rule. (Copies: test_store.cc.)
 */
#include <gtest/gtest.h>

#include <cstring>

#include "format_check.h"
#include "harness.h"

using namespace gokvtest;

namespace {

class KiviResidual : public BackendTest {};

TEST_P(KiviResidual, QuantizedLenFormula) {
    for (int32_t g : {32, 64, 128})
        for (int32_t R : {0, 32, 64, 128, 256})
            for (int32_t n = 0; n <= 700; n++) {
                const int32_t want = n - R < 0 ? 0 : ((n - R) / g) * g;
                ASSERT_EQ(gokv_kivi_quantized_len(n, g, R), want) << "n " << n << " g " << g << " R " << R;
            }
}

GOKV_INSTANTIATE_ON_BACKENDS(KiviResidual);

struct ResidualCase {
    int32_t format, group, residual;
};
std::string case_name(const ResidualCase &p) { return format_cfg(p.format, p.group, p.residual).name(); }
class KiviRing : public BackendParamTest<ResidualCase> {};

/* Written one token at a time, the split between pages and ring follows gokv_kivi_quantized_len after
 * every write: ring tokens read back as their fp16 inputs exactly (and sit in ring row t % (R+g)),
 * page tokens as quantized values. At the end, the reads equal a single write of all tokens. */
TEST_P(KiviRing, TokenByTokenEqualsAllAtOnce) {
    const ResidualCase p = param();
    PoolCfg c = format_cfg(p.format, p.group, p.residual);
    c.n_kv_heads = 2;
    c.d_k = 64;
    c.d_v = 64;
    c.n_pages = 16;
    c.n_slots = 2;
    const int32_t n = 260;
    std::mt19937 rng(2024);
    std::vector<float> k = gen_keys(rng, n, c.n_kv_heads, c.d_k), v = gen_values(rng, n, c.n_kv_heads, c.d_v);
    const size_t kr = (size_t)c.n_kv_heads * (size_t)c.d_k, vr = (size_t)c.n_kv_heads * (size_t)c.d_v;

    PoolPtr a = make_pool(dut(), c), b = make_pool(dut(), c);
    ASSERT_TRUE(a && b);
    Allocator alloc_a(c, 11), alloc_b(c, 11);
    Seq sa = alloc_a.new_seq(n), sb = alloc_b.new_seq(n);
    ASSERT_EQ(sa.pages, sb.pages);
    ASSERT_EQ(append1(a.get(), c, sa, k, v), GOKV_OK) << gokv_last_error();

    FailBudget fb;
    for (int32_t t = 0; t < n; t++) {
        std::vector<float> k1(k.begin() + (long)((size_t)t * kr), k.begin() + (long)((size_t)(t + 1) * kr));
        std::vector<float> v1(v.begin() + (long)((size_t)t * vr), v.begin() + (long)((size_t)(t + 1) * vr));
        ASSERT_EQ(append1(b.get(), c, sb, k1, v1), GOKV_OK) << "token " << t << ": " << gokv_last_error();
        std::vector<float> kd, vd;
        ASSERT_EQ(read_seq(b.get(), c, sb, kd, vd), GOKV_OK) << gokv_last_error();
        const int32_t nq = gokv_kivi_quantized_len(sb.len, c.group, c.residual);
        for (int32_t u = 0; u < sb.len; u++) {
            bool all_fp16 = true;
            for (size_t j = 0; j < kr; j++) all_fp16 = all_fp16 && kd[(size_t)u * kr + j] == gokv_round_half(k[(size_t)u * kr + j]);
            for (size_t j = 0; j < vr; j++) all_fp16 = all_fp16 && vd[(size_t)u * vr + j] == gokv_round_half(v[(size_t)u * vr + j]);
            if (u >= nq && !all_fp16)
                fb.fail("after " + std::to_string(sb.len) + " tokens, token " + std::to_string(u) +
                        " should be in the ring (n_quant " + std::to_string(nq) + ") and read as its fp16 input");
            if (u < nq && all_fp16)
                fb.fail("after " + std::to_string(sb.len) + " tokens, token " + std::to_string(u) +
                        " should be quantized (n_quant " + std::to_string(nq) + ") but reads as its fp16 input");
        }
        if (t % 37 == 0 || t == n - 1) check_stored_sequence(fb, b.get(), c, sb, kd, vd);
    }
    EXPECT_EQ(fb.total, 0);

    std::vector<float> ka, va, kb, vb;
    ASSERT_EQ(read_seq(a.get(), c, sa, ka, va), GOKV_OK);
    ASSERT_EQ(read_seq(b.get(), c, sb, kb, vb), GOKV_OK);
    EXPECT_EQ(0, std::memcmp(ka.data(), kb.data(), ka.size() * 4)) << "K differs: token-by-token vs all at once";
    EXPECT_EQ(0, std::memcmp(va.data(), vb.data(), va.size() * 4)) << "V differs: token-by-token vs all at once";
    FailBudget fb2;
    check_stored_sequence(fb2, a.get(), c, sa, ka, va);
    EXPECT_EQ(fb2.total, 0);
}

/* Two sequences written in one call per step, with different random chunkings, equal one write each. */
TEST_P(KiviRing, RandomChunksEqualOneWrite) {
    const ResidualCase p = param();
    PoolCfg c = format_cfg(p.format, p.group, p.residual);
    c.d_k = 64;
    c.d_v = 64;
    c.page_size = 128;
    c.n_pages = 16;
    c.n_slots = 4;
    const int32_t n0 = 333, n1 = 290;
    std::mt19937 rng(99);
    std::vector<float> k0 = gen_keys(rng, n0, 1, c.d_k), v0 = gen_values(rng, n0, 1, c.d_v);
    std::vector<float> k1 = gen_keys(rng, n1, 1, c.d_k), v1 = gen_values(rng, n1, 1, c.d_v);
    PoolPtr a = make_pool(dut(), c), b = make_pool(dut(), c);
    ASSERT_TRUE(a && b);
    Allocator aa(c, 5), ab(c, 5);
    Seq a0 = aa.new_seq(n0), a1 = aa.new_seq(n1), b0 = ab.new_seq(n0), b1 = ab.new_seq(n1);
    ASSERT_EQ(append(a.get(), c, {&a0, &a1}, {k0, k1}, {v0, v1}), GOKV_OK) << gokv_last_error();
    std::uniform_int_distribution<int32_t> chunk(0, 70);
    const size_t r = (size_t)c.d_k;
    while (b0.len < n0 || b1.len < n1) {
        int32_t c0 = std::min(chunk(rng), n0 - b0.len), c1 = std::min(chunk(rng), n1 - b1.len);
        auto slice = [&](const std::vector<float> &x, int32_t from, int32_t cnt) {
            return std::vector<float>(x.begin() + (long)((size_t)from * r), x.begin() + (long)((size_t)(from + cnt) * r));
        };
        ASSERT_EQ(append(b.get(), c, {&b0, &b1}, {slice(k0, b0.len, c0), slice(k1, b1.len, c1)},
                         {slice(v0, b0.len, c0), slice(v1, b1.len, c1)}),
                  GOKV_OK)
            << gokv_last_error();
    }
    for (int i = 0; i < 2; i++) {
        std::vector<float> ka, va, kb, vb;
        ASSERT_EQ(read_seq(a.get(), c, i ? a1 : a0, ka, va), GOKV_OK);
        ASSERT_EQ(read_seq(b.get(), c, i ? b1 : b0, kb, vb), GOKV_OK);
        EXPECT_EQ(0, std::memcmp(ka.data(), kb.data(), ka.size() * 4)) << "seq " << i << " K";
        EXPECT_EQ(0, std::memcmp(va.data(), vb.data(), va.size() * 4)) << "seq " << i << " V";
    }
}

const ResidualCase kResidualCases[] = {
    {GOKV_FORMAT_KIVI2, 32, 0},  {GOKV_FORMAT_KIVI2, 32, 32}, {GOKV_FORMAT_KIVI2, 32, 128},
    {GOKV_FORMAT_KIVI4, 32, 0},  {GOKV_FORMAT_KIVI4, 32, 96}, {GOKV_FORMAT_KIVI2, 64, 64},
};
GOKV_INSTANTIATE_CASES(Kivi, KiviRing, kResidualCases);

} // namespace
