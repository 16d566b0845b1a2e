/*
 * test_attend_decode.cc: decode attention (one query row per sequence, docs/architecture.md §5) on every
 * backend: the case table, formats x {MHA, GQA 4:1, MQA, MLA} x visibility (plain, learned sinks, sink tokens
 * + window, window narrower than the sinks, holes + released pages) x lengths, each case run on the backend
 * under test and on the CPU with the same inputs and compared with the float64 reference and with each other
 * (harness.h has the tolerances); plus the known-value cases of §8.
 *
 * One test per (format, attention type) runs every visibility rule and length, so that a process compiles
 * its pipelines once (ctest runs each test in its own process).
 */
#include <gtest/gtest.h>

#include <algorithm>

#include "harness.h"

using namespace gokvtest;

namespace {

enum Vis { PLAIN, LEARNED_SINKS, SINKS_WINDOW, WINDOW_BELOW_SINKS, HOLES, SINKS_WINDOW_LEARNED };
const char *const kVisNames[] = {"plain", "learned sinks", "sinks+window", "window<sinks", "holes",
                                 "sinks+window+learned sinks"};
const char *const kVisIds[] = {"plain", "lsinks", "sinkwin", "winltsinks", "holes", "sinkwinls"}; /* in test names */

/* The visibility options of a case; may edit the AttnSeq (mask, released pages). */
void apply_vis(Vis vis, int32_t len, int32_t page_size, std::mt19937 &rng, AttnOpts &o, AttnSeq &s) {
    if (vis == LEARNED_SINKS || vis == WINDOW_BELOW_SINKS || vis == SINKS_WINDOW_LEARNED) {
        o.sinks = gen_normal(rng, (size_t)o.n_heads_q, 2.0f);
        o.sinks[0] = 6.0f; /* one head dominated by its sink */
    }
    if (vis == SINKS_WINDOW || vis == SINKS_WINDOW_LEARNED) {
        o.n_sink_tokens = 4;
        o.window = std::max(3, len / 4);
    }
    if (vis == WINDOW_BELOW_SINKS) {
        o.n_sink_tokens = 8;
        o.window = 3;
    }
    if (vis == HOLES) {
        s.mask.assign((size_t)((len + 31) / 32), 0u);
        std::bernoulli_distribution keep(0.75);
        for (int32_t t = 0; t < len; t++)
            if (keep(rng)) s.mask[(size_t)(t / 32)] |= 1u << (t % 32);
        if (len > 2 * page_size) s.pages[0] = -1;                 /* the oldest page evicted */
        if (len > 3 * page_size) s.pages[s.pages.size() / 2] = -1; /* and one in the middle */
    }
}

struct DecodeCase {
    Fmt f;
    Attn attn;
    std::vector<int32_t> lens;
    std::vector<Vis> vis;
    int32_t page_size = 0; /* 0: PoolCfg's (64) */
};

std::string case_name(const DecodeCase &c) {
    std::string n = fmt_name(c.f) + "_" + kAttnNames[c.attn];
    if (c.lens.size() == 1) n += "_len" + std::to_string(c.lens[0]);
    if (c.vis.size() == 1) n += std::string("_") + kVisIds[c.vis[0]];
    if (c.page_size) n += "_p" + std::to_string(c.page_size);
    return n;
}

/* One test per (length, visibility) where runs are split (harness.h). */
std::vector<DecodeCase> split_case(const DecodeCase &c) {
    std::vector<DecodeCase> v;
    for (int32_t len : c.lens)
        for (Vis vis : c.vis) v.push_back({c.f, c.attn, {len}, {vis}, c.page_size});
    return v;
}

class Decode : public BackendParamTest<DecodeCase> {};

/* Every (visibility, length) of the case on both backends. Each length gets its own pool (as an engine
 * would have one per layer) so a failure names the length. */
TEST_P(Decode, MatchesReferenceAndCpu) {
    const DecodeCase p = param();
    AttnOpts base;
    PoolCfg c = attn_cfg(p.f, p.attn, &base.n_heads_q);
    if (p.page_size) c.page_size = p.page_size;
    for (int32_t len : p.lens) {
        const uint32_t seed = (uint32_t)(p.f.format * 1000003 + p.f.group * 7919 + p.f.residual * 131 + p.attn * 17 + len);
        Pair pair;
        ASSERT_TRUE(build_pair(c, {len}, seed, pair)) << "len " << len;
        expect_read_parity(pair, c.name() + " len " + std::to_string(len));
        for (Vis vis : p.vis) {
            const std::string what = c.name() + " " + kAttnNames[p.attn] + " " + kVisNames[vis] + " len " +
                                     std::to_string(len);
            std::mt19937 rng(seed + 1 + (uint32_t)vis);
            AttnOpts o = base;
            AttnSeq s = attn_seq(pair.dut, 0);
            apply_vis(vis, len, c.page_size, rng, o, s);
            const std::vector<float> q = gen_normal(rng, (size_t)o.n_heads_q * (size_t)c.d_k);
            cross_attend(pair, {s}, {0}, q, o, tol_for(c.format), what);
        }
    }
}

std::vector<DecodeCase> decode_cases() {
    const Fmt formats[] = {
        {GOKV_FORMAT_F32, 0, 0},     {GOKV_FORMAT_F16, 0, 0},      {GOKV_FORMAT_Q8, 32, 0},
        {GOKV_FORMAT_Q4, 32, 0},     {GOKV_FORMAT_Q4, 64, 0},      {GOKV_FORMAT_Q4, 128, 0},
        {GOKV_FORMAT_KIVI2, 32, 0},  {GOKV_FORMAT_KIVI2, 32, 32},  {GOKV_FORMAT_KIVI2, 32, 128},
        {GOKV_FORMAT_KIVI4, 32, 0},  {GOKV_FORMAT_KIVI4, 32, 32},  {GOKV_FORMAT_KIVI4, 32, 128},
        {GOKV_FORMAT_KIVI2, 64, 64},
    };
    const std::vector<Vis> all = {PLAIN, LEARNED_SINKS, SINKS_WINDOW, WINDOW_BELOW_SINKS, HOLES};
    std::vector<DecodeCase> v;
    for (const Fmt &f : formats)
        for (Attn a : {MHA, GQA, MQA, MLA}) v.push_back({f, a, {1, 37, 200}, all});
    /* 8K context on the formats people deploy, GQA and MLA: plain, sinks + window (with and without learned
     * sinks), holes */
    const Fmt long_formats[] = {{GOKV_FORMAT_F16, 0, 0},      {GOKV_FORMAT_Q8, 32, 0},     {GOKV_FORMAT_Q4, 32, 0},
                                {GOKV_FORMAT_KIVI2, 32, 128}, {GOKV_FORMAT_KIVI4, 32, 32}};
    for (const Fmt &f : long_formats)
        for (Attn a : {GQA, MLA}) v.push_back({f, a, {8192}, {PLAIN, SINKS_WINDOW, SINKS_WINDOW_LEARNED, HOLES}});
    /* q4 keys in pages that end in a part tile (P % 16 != 0; windows start inside tiles), and MLA's plain
     * q4 rows in such pages */
    v.push_back({{GOKV_FORMAT_Q4, 32, 0}, GQA, {1, 37, 200}, all, 24});
    v.push_back({{GOKV_FORMAT_Q4, 64, 0}, MHA, {1, 37, 200}, all, 40});
    v.push_back({{GOKV_FORMAT_Q4, 128, 0}, MQA, {37, 200}, all, 8});
    v.push_back({{GOKV_FORMAT_Q4, 32, 0}, MLA, {37, 200}, all, 24});
    return v;
}
GOKV_INSTANTIATE_CASES(Table, Decode, decode_cases());

class DecodeKnown : public BackendTest {};

/* The real DeepSeek-V2 MLA geometry: latent 512 + rope 64, V = the first 512 dims, 16 query heads: the
 * largest head dims the ABI's users have (shared-memory and workgroup limits). */
TEST_P(DecodeKnown, DeepSeekMlaGeometry) {
    for (const Fmt &f : {Fmt{GOKV_FORMAT_F16, 0, 0}, Fmt{GOKV_FORMAT_Q4, 64, 0}, Fmt{GOKV_FORMAT_KIVI2, 32, 128}}) {
        PoolCfg c = format_cfg(f.format, f.group, f.residual);
        c.n_kv_heads = 1;
        c.d_k = 576;
        c.d_v = 512;
        c.v_is_k_prefix = 1;
        Pair pair;
        ASSERT_TRUE(build_pair(c, {300, 77}, 4242u, pair));
        AttnOpts o;
        o.n_heads_q = 16;
        o.scale = 1.0f / std::sqrt(192.0f); /* DeepSeek scales by the pre-absorption head dim */
        std::mt19937 rng(1);
        const std::vector<float> q = gen_normal(rng, 2 * 16 * 576);
        cross_attend(pair, {attn_seq(pair.dut, 0), attn_seq(pair.dut, 1)}, {0, 1}, q, o, tol_for(f.format),
                     c.name() + " 576/512");
    }
}

/* Nothing visible (every token masked out, or every page released) -> exact zeros, with and without
 * learned sinks, alone and next to a sequence that does see tokens. */
TEST_P(DecodeKnown, NothingVisibleIsExactZero) {
    for (const Fmt &f : {Fmt{GOKV_FORMAT_F32, 0, 0}, Fmt{GOKV_FORMAT_Q4, 32, 0}, Fmt{GOKV_FORMAT_KIVI2, 32, 32}}) {
        PoolCfg c = format_cfg(f.format, f.group, f.residual);
        c.n_kv_heads = 2;
        Pair pair;
        ASSERT_TRUE(build_pair(c, {100, 50}, 555u, pair));
        AttnOpts o;
        o.n_heads_q = 4;
        std::mt19937 rng(556);
        const std::vector<float> q = gen_normal(rng, 2 * 4 * (size_t)c.d_k);
        for (bool sinks : {false, true}) {
            o.sinks = sinks ? std::vector<float>{0.5f, -3.0f, 10.0f, 0.0f} : std::vector<float>{};
            const std::string what = c.name() + (sinks ? " with learned sinks" : "");
            AttnSeq masked = attn_seq(pair.dut, 0), released = attn_seq(pair.dut, 0), seen = attn_seq(pair.dut, 1);
            masked.mask.assign(4, 0u);
            for (auto &pg : released.pages) pg = -1;
            for (const AttnSeq &blind : {masked, released}) {
                CrossOut out;
                cross_attend(pair, {blind, seen}, {0, 1}, q, o, tol_for(f.format), what, &out);
                const size_t row = 4 * (size_t)c.d_v;
                for (size_t j = 0; j < row && j < out.dut.size(); j++)
                    ASSERT_EQ(out.dut[j], 0.0f) << what << ": element " << j << " of the blind row";
            }
        }
    }
}

/* Released pages in the middle, at the query's own position and, for KIVI, over tokens still in the
 * residual ring (n = 200, R = 128: tokens 64.. are in the ring, page 1 holds 64..127); holes, the newest
 * token masked, and both together. */
TEST_P(DecodeKnown, ReleasedPagesAndHoles) {
    for (const Fmt &f : {Fmt{GOKV_FORMAT_F16, 0, 0}, Fmt{GOKV_FORMAT_Q4, 32, 0}, Fmt{GOKV_FORMAT_KIVI2, 32, 128}}) {
        PoolCfg c = format_cfg(f.format, f.group, f.residual);
        c.n_kv_heads = 2;
        Pair pair;
        ASSERT_TRUE(build_pair(c, {200}, 555u, pair));
        AttnOpts o;
        o.n_heads_q = 4;
        std::mt19937 rng(556);
        const std::vector<float> q = gen_normal(rng, 4 * (size_t)c.d_k);
        for (int variant = 0; variant < 4; variant++) {
            AttnSeq a = attn_seq(pair.dut, 0);
            if (variant == 0) a.pages[1] = -1;
            if (variant == 1) a.pages[3] = -1; /* the page of the query's own position */
            if (variant >= 2) {
                a.mask.assign(7, 0xffffffffu);
                a.mask[0] = 0x0f0f0f0fu;
                a.mask[3] = 0u;
                a.mask[6] &= ~(1u << (199 % 32)); /* the newest token itself */
            }
            if (variant == 3) a.pages[2] = -1;
            cross_attend(pair, {a}, {0}, q, o, tol_for(f.format), c.name() + " variant " + std::to_string(variant));
        }
    }
}

/* A single token: out = v exactly (one weight of 1), or v·e^s/(e^s + e^σ) with a learned sink. */
TEST_P(DecodeKnown, SingleToken) {
    for (const Fmt &f : {Fmt{GOKV_FORMAT_F32, 0, 0}, Fmt{GOKV_FORMAT_F16, 0, 0}, Fmt{GOKV_FORMAT_Q8, 32, 0},
                         Fmt{GOKV_FORMAT_KIVI4, 32, 0}}) {
        PoolCfg c = format_cfg(f.format, f.group, f.residual);
        c.n_kv_heads = 2;
        Pair pair;
        ASSERT_TRUE(build_pair(c, {1}, 77u, pair));
        AttnOpts o;
        o.n_heads_q = 4;
        std::mt19937 rng(78);
        const std::vector<float> q = gen_normal(rng, 4 * (size_t)c.d_k);
        CrossOut out;
        cross_attend(pair, {attn_seq(pair.dut, 0)}, {0}, q, o, 1e-6, c.name() + " single token", &out);
        const int32_t dv = c.d_v;
        for (int32_t h = 0; h < 4 && out.dut.size() == (size_t)(4 * dv); h++)
            for (int32_t j = 0; j < dv; j++)
                ASSERT_EQ(out.dut[(size_t)(h * dv + j)], pair.dut.vdq[0][(size_t)((h / 2) * dv + j)])
                    << c.name() << " head " << h;
        o.sinks = {0.0f, 1.0f, -1.0f, 2.0f};
        cross_attend(pair, {attn_seq(pair.dut, 0)}, {0}, q, o, 1e-5, c.name() + " single token + sinks");
    }
}

/* Huge and tiny learned sinks, and large scores (keys x 30): no overflow in the online softmax or the
 * split-K combine. Tolerance 1e-4 (float score rounding grows with the score magnitude). */
TEST_P(DecodeKnown, ExtremeLogitsStayFinite) {
    PoolCfg c = format_cfg(GOKV_FORMAT_F16, 0, 0);
    Pair pair;
    ASSERT_TRUE(build_pair(c, {700}, 9u, pair));
    AttnOpts o;
    o.n_heads_q = 4;
    o.sinks = {80.0f, -80.0f, 1e4f, -1e4f};
    std::mt19937 rng(10);
    std::vector<float> q = gen_normal(rng, 4 * (size_t)c.d_k);
    CrossOut out;
    cross_attend(pair, {attn_seq(pair.dut, 0)}, {0}, q, o, 1e-5, "extreme sinks", &out);
    for (int32_t j = 0; j < c.d_v && !out.dut.empty(); j++) EXPECT_NEAR(out.dut[(size_t)(2 * c.d_v + j)], 0.0f, 1e-30f);
    o.sinks.clear();
    for (auto &x : q) x *= 30.0f;
    for (int32_t chunk : {0, 64}) {
        o.chunk = chunk;
        cross_attend(pair, {attn_seq(pair.dut, 0)}, {0}, q, o, 1e-4, "large scores, chunk " + std::to_string(chunk));
    }
}

/* Window narrower than the sink span, sinks longer than the sequence, window of 1: the reference counts
 * the visible tokens, and both backends agree with it. */
TEST_P(DecodeKnown, WindowSmallerThanSinks) {
    PoolCfg c = format_cfg(GOKV_FORMAT_Q4, 32, 0);
    c.n_kv_heads = 2;
    Pair pair;
    ASSERT_TRUE(build_pair(c, {150}, 555u, pair));
    AttnOpts o;
    o.n_heads_q = 4;
    std::mt19937 rng(556);
    const std::vector<float> q = gen_normal(rng, 4 * (size_t)c.d_k);
    struct W {
        int32_t sinks, window;
    };
    for (W w : {W{8, 3}, W{4, 1}, W{200, 2}, W{0, 1}, W{16, 16}}) {
        o.n_sink_tokens = w.sinks;
        o.window = w.window;
        std::vector<int32_t> nvis;
        std::vector<double> ref;
        ref_attend(c, {attn_seq(pair.dut, 0)}, q, o, ref, &nvis);
        EXPECT_EQ(nvis[0], std::min(150, w.sinks + w.window));
        cross_attend(pair, {attn_seq(pair.dut, 0)}, {0}, q, o, 1e-4,
                     "sinks " + std::to_string(w.sinks) + " window " + std::to_string(w.window));
    }
}

/* Large stored keys (x 30, scores of several hundred) must not overflow the online softmax, with the
 * default and a small split. Tolerance 1e-4: float score rounding grows with the score magnitude. */
TEST_P(DecodeKnown, LargeKeysStayFinite) {
    PoolCfg c = format_cfg(GOKV_FORMAT_F16, 0, 0);
    c.n_pages = 16;
    Pair pair;
    ASSERT_TRUE(build_pair(c, {0}, 9u, pair, 700));
    std::mt19937 rng(9);
    std::vector<float> k = gen_keys(rng, 700, 1, c.d_k), v = gen_values(rng, 700, 1, c.d_v);
    for (auto &x : k) x *= 30.0f;
    ASSERT_TRUE(append_pair(pair, {0}, {k}, {v}));
    AttnOpts o;
    o.n_heads_q = 1;
    const std::vector<float> q = gen_normal(rng, (size_t)c.d_k, 1.0f);
    cross_attend(pair, {attn_seq(pair.dut, 0)}, {0}, q, o, 1e-4, "large keys");
    o.chunk = 64;
    cross_attend(pair, {attn_seq(pair.dut, 0)}, {0}, q, o, 1e-4, "large keys, chunk 64");
}

GOKV_INSTANTIATE_ON_BACKENDS(DecodeKnown);

} // namespace
