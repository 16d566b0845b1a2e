/*
 * test_vk_invariance.cc: on the Vulkan backend, results must not depend on how the work is cut
 * (docs/architecture.md §8): the split-K chunk size (1 token to more than the sequence), the page size, and
 * the flags; every run also compared with the CPU backend. Outputs are poisoned with NaN before each call
 * (reference.h: attend).
 */
#include <gtest/gtest.h>

#include "vk_harness.h"

using namespace gokvtest;

namespace {

class VkInvariance : public VkParamTest<Fmt> {
protected:
    /* GQA 8:2, decode sequences of several lengths (one longer than two default chunks) plus a prefill. */
    PoolCfg cfg() const {
        PoolCfg c = format_cfg(GetParam().format, GetParam().group, GetParam().residual);
        c.n_kv_heads = 2;
        return c;
    }
    std::vector<int32_t> lens() const { return {1, 37, 300, 1100, 90}; }
    std::vector<AttnSeq> seqs(const Cache &c) const {
        std::vector<AttnSeq> s;
        for (size_t i = 0; i + 1 < c.seqs.size(); i++) s.push_back(attn_seq(c, i));
        s.push_back(attn_seq(c, c.seqs.size() - 1, 30)); /* prefill of 30 rows */
        return s;
    }
    std::vector<size_t> src() const { return {0, 1, 2, 3, 4}; }
    AttnOpts opts(bool window) const {
        AttnOpts o;
        o.n_heads_q = 8;
        if (window) {
            o.n_sink_tokens = 4;
            o.window = 100;
            o.sinks = {0.0f, 1.0f, -1.0f, 3.0f, 0.5f, -2.0f, 1.5f, 0.25f};
        }
        return o;
    }
};
std::string inv_name(const testing::TestParamInfo<Fmt> &i) { return fmt_name(i.param); }

/* Chunks of 1, 16, 17, 64, 512 and 100000 tokens give the default chunk's result (1e-5, as the CPU suite)
 * and the CPU's. */
TEST_P(VkInvariance, ChunkSize) {
    Pair pair;
    ASSERT_TRUE(build_pair(cfg(), lens(), 10u, pair));
    std::vector<AttnSeq> s = seqs(pair.vk);
    s[3].pages[5] = -1; /* a released page inside the long sequence */
    std::mt19937 rng(11);
    const std::vector<float> q = gen_normal(rng, (size_t)total_rows(s) * 8 * (size_t)pair.vk.cfg.d_k);
    const double tol = tol_for(pair.vk.cfg.format);
    for (bool window : {false, true}) {
        AttnOpts o = opts(window);
        CrossOut base;
        cross_attend(pair, s, src(), q, o, tol, "default chunk" + std::string(window ? " window" : ""), &base);
        for (int32_t chunk : {1, 16, 17, 64, 512, 100000}) {
            o.chunk = chunk;
            CrossOut out;
            const std::string what = "chunk " + std::to_string(chunk) + (window ? " window" : "");
            cross_attend(pair, s, src(), q, o, tol, what, &out);
            EXPECT_LE(rel_err(out.vk, base.vk), 1e-5) << what << " vs the default chunk";
        }
    }
}

/* The same data in pages of 16 (KIVI: 32), 24 (not KIVI: a part tile of q4 keys), 64 and 128 tokens reads back
 * identically and attends alike. */
TEST_P(VkInvariance, PageSize) {
    std::vector<float> first_out;
    std::vector<std::vector<float>> first_k;
    for (int32_t P : {16, 24, 64, 128}) {
        PoolCfg c = cfg();
        if (c.kivi() && P == 24) continue; /* KIVI pages hold whole key groups */
        c.page_size = (c.kivi() && P < c.group) ? c.group : P;
        if (c.kivi() && P == 16) c.page_size = 32;
        Pair pair;
        ASSERT_TRUE(build_pair(c, lens(), 10u, pair));
        expect_read_parity(pair, c.name() + " page " + std::to_string(c.page_size));
        if (first_k.empty())
            first_k = pair.vk.kdq;
        else
            for (size_t i = 0; i < first_k.size(); i++) EXPECT_EQ(pair.vk.kdq[i], first_k[i]) << "page size " << P;
        const std::vector<AttnSeq> s = seqs(pair.vk);
        std::mt19937 rng(13);
        const std::vector<float> q = gen_normal(rng, (size_t)total_rows(s) * 8 * (size_t)c.d_k);
        CrossOut out;
        cross_attend(pair, s, src(), q, opts(true), tol_for(c.format), "page " + std::to_string(c.page_size), &out);
        if (first_out.empty())
            first_out = out.vk;
        else
            EXPECT_LE(rel_err(out.vk, first_out), 1e-5) << "page size " << c.page_size;
    }
}

/* GOKV_ATTEND_FORCE_SCALAR is accepted and changes nothing beyond rounding; GOKV_ATTEND_DEQUANT_BASELINE
 * computes the same attention where the device reports GOKV_CAP_BASELINE (else GOKV_ENOTSUP, by name). */
TEST_P(VkInvariance, Flags) {
    Pair pair;
    ASSERT_TRUE(build_pair(cfg(), lens(), 18u, pair));
    const std::vector<AttnSeq> s = seqs(pair.vk);
    std::mt19937 rng(19);
    const std::vector<float> q = gen_normal(rng, (size_t)total_rows(s) * 8 * (size_t)pair.vk.cfg.d_k);
    const double tol = tol_for(pair.vk.cfg.format);
    AttnOpts o = opts(true);
    CrossOut fused;
    cross_attend(pair, s, src(), q, o, tol, "fused", &fused);
    o.flags = GOKV_ATTEND_FORCE_SCALAR;
    CrossOut scalar;
    cross_attend(pair, s, src(), q, o, tol, "force scalar", &scalar);
    EXPECT_LE(rel_err(scalar.vk, fused.vk), 1e-5) << "GOKV_ATTEND_FORCE_SCALAR";
    o.flags = GOKV_ATTEND_DEQUANT_BASELINE;
    if (device_info(vk_device()).caps & GOKV_CAP_BASELINE) {
        CrossOut base;
        cross_attend(pair, s, src(), q, o, tol, "dequant baseline", &base);
        EXPECT_LE(rel_err(base.vk, fused.vk), tol) << "GOKV_ATTEND_DEQUANT_BASELINE";
    } else {
        std::vector<float> out;
        const gokv_status st = attend(vk_device(), pair.vk.pool.get(), pair.vk.cfg, s, q, o, out);
        EXPECT_TRUE(st == GOKV_ENOTSUP || st == GOKV_OK) << "baseline without GOKV_CAP_BASELINE: " << gokv_status_name(st)
                                                         << ": " << gokv_last_error();
    }
}

const Fmt kInvFormats[] = {{GOKV_FORMAT_F32, 0, 0},     {GOKV_FORMAT_F16, 0, 0},      {GOKV_FORMAT_Q8, 32, 0},
                           {GOKV_FORMAT_Q4, 32, 0},     {GOKV_FORMAT_KIVI2, 32, 0},   {GOKV_FORMAT_KIVI2, 32, 128},
                           {GOKV_FORMAT_KIVI4, 32, 32}};
INSTANTIATE_TEST_SUITE_P(Formats, VkInvariance, testing::ValuesIn(kInvFormats), inv_name);

} // namespace
