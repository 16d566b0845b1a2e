/*
 * test_attend_decode.cc: decode attention (one query row per sequence, docs/architecture.md §5) against the
 * float64 reference, over the case table formats x attention types x visibility x lengths, on both the
 * default (SIMD) path and GOKV_ATTEND_FORCE_SCALAR; plus the known-value cases of §8.
 *
 * Tolerances (rel_err, reference.h): f32/f16 1e-5 and quantized 1e-4, both against float64 attention over
 * the K/V that gokv_pool_read returns (fp16-rounded inputs for f16, dequantized codes otherwise).
 */
#include <gtest/gtest.h>

#include <cstring>

#include "reference.h"

using namespace gokvtest;

namespace {

enum Attn { MHA, GQA, MQA, MLA };
enum Vis { PLAIN, LEARNED_SINKS, WINDOW, HOLES };
const char *kAttnNames[] = {"mha", "gqa", "mqa", "mla"};
const char *kVisNames[] = {"plain", "sinks", "window", "holes"};

struct DecodeCase {
    int32_t format, group, residual;
    Attn attn;
    Vis vis;
    int32_t len;
};

std::string decode_name(const testing::TestParamInfo<DecodeCase> &i) {
    const DecodeCase &p = i.param;
    return format_cfg(p.format, p.group, p.residual).name() + "_" + kAttnNames[p.attn] + "_" + kVisNames[p.vis] +
           "_len" + std::to_string(p.len);
}

/* Geometry of an attention type: GQA 4:1 (8:2), MQA 4:1, MLA absorbed form (V = prefix of K, d_k > d_v,
 * both multiples of the group). */
PoolCfg attn_cfg(const DecodeCase &p, int32_t *n_heads_q) {
    PoolCfg c = format_cfg(p.format, p.group, p.residual);
    c.d_k = c.d_v = 128;
    switch (p.attn) {
    case MHA: c.n_kv_heads = 4; *n_heads_q = 4; break;
    case GQA: c.n_kv_heads = 2; *n_heads_q = 8; break;
    case MQA: c.n_kv_heads = 1; *n_heads_q = 4; break;
    case MLA:
        c.n_kv_heads = 1;
        *n_heads_q = 8;
        c.v_is_k_prefix = 1;
        c.d_k = p.group <= 32 ? 96 : 3 * p.group;
        c.d_v = p.group <= 32 ? 64 : p.group;
        break;
    }
    return c;
}

/* The visibility options of a case; may edit the AttnSeq (mask, released pages). */
void apply_vis(Vis vis, int32_t len, int32_t page_size, std::mt19937 &rng, AttnOpts &o, AttnSeq &s) {
    if (vis == LEARNED_SINKS || (vis == WINDOW && len > 1000)) {
        o.sinks = gen_normal(rng, (size_t)o.n_heads_q, 2.0f);
        o.sinks[0] = 6.0f; /* one head dominated by its sink */
    }
    if (vis == WINDOW) {
        o.n_sink_tokens = 4;
        o.window = std::max(3, len / 4);
    }
    if (vis == HOLES) {
        s.mask.assign((size_t)((len + 31) / 32), 0u);
        std::bernoulli_distribution keep(0.75);
        for (int32_t t = 0; t < len; t++)
            if (keep(rng)) s.mask[(size_t)(t / 32)] |= 1u << (t % 32);
        if (len > 2 * page_size) s.pages[0] = -1; /* the oldest page evicted */
    }
}

double tol_for(int32_t format) { return gokv_format_quantized(format) ? 1e-4 : 1e-5; }

class Decode : public testing::TestWithParam<DecodeCase> {};

TEST_P(Decode, MatchesReference) {
    const DecodeCase p = GetParam();
    AttnOpts o;
    PoolCfg c = attn_cfg(p, &o.n_heads_q);
    const uint32_t seed = (uint32_t)(p.format * 1000003 + p.group * 7919 + p.residual * 131 + p.attn * 17 + p.vis * 3 + p.len);
    Cache cache;
    ASSERT_TRUE(build_cache(shared_device(), c, {p.len}, seed, cache));
    std::mt19937 rng(seed + 1);
    AttnSeq s = attn_seq(cache, 0);
    apply_vis(p.vis, p.len, c.page_size, rng, o, s);
    std::vector<float> q = gen_normal(rng, (size_t)o.n_heads_q * (size_t)c.d_k);
    std::vector<float> out_simd, out_scalar;
    check_attend(shared_device(), cache, {s}, q, o, tol_for(p.format), "default path", &out_simd);
    o.flags = GOKV_ATTEND_FORCE_SCALAR;
    check_attend(shared_device(), cache, {s}, q, o, tol_for(p.format), "forced scalar", &out_scalar);
    EXPECT_LE(rel_err(out_simd, out_scalar), 1e-5) << "SIMD vs scalar";
}

std::vector<DecodeCase> decode_cases() {
    struct F {
        int32_t format, group, residual;
    };
    const F formats[] = {
        {GOKV_FORMAT_F32, 0, 0},     {GOKV_FORMAT_F16, 0, 0},     {GOKV_FORMAT_Q8, 32, 0},
        {GOKV_FORMAT_Q4, 32, 0},     {GOKV_FORMAT_Q4, 64, 0},     {GOKV_FORMAT_Q4, 128, 0},
        {GOKV_FORMAT_KIVI2, 32, 0},  {GOKV_FORMAT_KIVI2, 32, 32}, {GOKV_FORMAT_KIVI2, 32, 128},
        {GOKV_FORMAT_KIVI4, 32, 0},  {GOKV_FORMAT_KIVI4, 32, 32}, {GOKV_FORMAT_KIVI4, 32, 128},
        {GOKV_FORMAT_KIVI2, 64, 64},
    };
    std::vector<DecodeCase> v;
    for (const F &f : formats)
        for (Attn a : {MHA, GQA, MQA, MLA})
            for (Vis s : {PLAIN, LEARNED_SINKS, WINDOW, HOLES})
                for (int32_t len : {1, 37, 200}) v.push_back({f.format, f.group, f.residual, a, s, len});
    /* 8K context on a subset: the formats people deploy, GQA and MLA, plain and window + both sinks */
    const F long_formats[] = {{GOKV_FORMAT_F16, 0, 0},      {GOKV_FORMAT_Q8, 32, 0},     {GOKV_FORMAT_Q4, 32, 0},
                              {GOKV_FORMAT_KIVI2, 32, 128}, {GOKV_FORMAT_KIVI4, 32, 32}};
    for (const F &f : long_formats)
        for (Attn a : {GQA, MLA})
            for (Vis s : {PLAIN, WINDOW}) v.push_back({f.format, f.group, f.residual, a, s, 8192});
    return v;
}
INSTANTIATE_TEST_SUITE_P(Table, Decode, testing::ValuesIn(decode_cases()), decode_name);

/* The real DeepSeek-V2 MLA geometry: latent 512 + rope 64, V = the first 512 dims, 16 query heads. */
TEST(DecodeKnown, DeepSeekMlaGeometry) {
    struct F {
        int32_t format, group, residual;
    };
    for (const F &f : {F{GOKV_FORMAT_F16, 0, 0}, F{GOKV_FORMAT_Q4, 64, 0}, F{GOKV_FORMAT_KIVI2, 32, 128}}) {
        PoolCfg c = format_cfg(f.format, f.group, f.residual);
        c.n_kv_heads = 1;
        c.d_k = 576;
        c.d_v = 512;
        c.v_is_k_prefix = 1;
        Cache cache;
        ASSERT_TRUE(build_cache(shared_device(), c, {300, 77}, 4242u, cache));
        AttnOpts o;
        o.n_heads_q = 16;
        o.scale = 1.0f / std::sqrt(192.0f); /* DeepSeek scales by the pre-absorption head dim */
        std::mt19937 rng(1);
        std::vector<float> q = gen_normal(rng, 2 * 16 * 576);
        check_attend(shared_device(), cache, {attn_seq(cache, 0), attn_seq(cache, 1)}, q, o, tol_for(f.format),
                     cache.cfg.name() + " 576/512");
    }
}

/* A cache whose sequences and page tables the known-value tests then edit. */
struct Small {
    Cache cache;
    AttnOpts o;
    std::vector<float> q;
    void init(int32_t format, int32_t group, int32_t residual, std::vector<int32_t> lens, int32_t hq = 4) {
        PoolCfg c = format_cfg(format, group, residual);
        c.n_kv_heads = 2;
        ASSERT_TRUE(build_cache(shared_device(), c, lens, 555u, cache));
        o.n_heads_q = hq;
        std::mt19937 rng(556);
        q = gen_normal(rng, lens.size() * (size_t)hq * (size_t)c.d_k);
    }
};

/* Nothing visible (every token masked out, or every page released) -> exact zeros, also with learned
 * sinks (the sink term alone must not turn 0/σ into NaN or into a non-zero output). */
TEST(DecodeKnown, SinkOnlyAttentionIsZero) {
    for (int32_t fmt : {GOKV_FORMAT_F32, GOKV_FORMAT_Q4, GOKV_FORMAT_KIVI2}) {
        Small s;
        ASSERT_NO_FATAL_FAILURE(s.init(fmt, fmt == GOKV_FORMAT_F32 ? 0 : 32, fmt == GOKV_FORMAT_KIVI2 ? 32 : 0, {100}));
        for (bool sinks : {false, true}) {
            s.o.sinks = sinks ? std::vector<float>{0.5f, -3.0f, 10.0f, 0.0f} : std::vector<float>{};
            AttnSeq masked = attn_seq(s.cache, 0);
            masked.mask.assign(4, 0u);
            std::vector<float> out;
            check_attend(shared_device(), s.cache, {masked}, s.q, s.o, 0.0, s.cache.cfg.name() + " all masked", &out);
            for (float x : out) ASSERT_EQ(x, 0.0f) << s.cache.cfg.name() << " all masked";
            AttnSeq released = attn_seq(s.cache, 0);
            for (auto &pg : released.pages) pg = -1;
            check_attend(shared_device(), s.cache, {released}, s.q, s.o, 0.0, s.cache.cfg.name() + " all released", &out);
            for (float x : out) ASSERT_EQ(x, 0.0f) << s.cache.cfg.name() << " all released";
        }
    }
}

/* A single token: out = v (or v·e^s/(e^s + e^σ) with a learned sink). */
TEST(DecodeKnown, SingleToken) {
    for (int32_t fmt : {GOKV_FORMAT_F32, GOKV_FORMAT_F16, GOKV_FORMAT_Q8, GOKV_FORMAT_KIVI4}) {
        Small s;
        ASSERT_NO_FATAL_FAILURE(s.init(fmt, fmt <= GOKV_FORMAT_F16 ? 0 : 32, 0, {1}));
        std::vector<float> out;
        check_attend(shared_device(), s.cache, {attn_seq(s.cache, 0)}, s.q, s.o, 1e-6, "single token", &out);
        const int32_t dv = s.cache.cfg.d_v;
        for (int32_t h = 0; h < 4; h++)
            for (int32_t j = 0; j < dv; j++)
                ASSERT_EQ(out[(size_t)(h * dv + j)], s.cache.vdq[0][(size_t)((h / 2) * dv + j)]) << "head " << h;
        s.o.sinks = {0.0f, 1.0f, -1.0f, 2.0f};
        check_attend(shared_device(), s.cache, {attn_seq(s.cache, 0)}, s.q, s.o, 1e-5, "single token + sinks");
    }
}

/* Window narrower than the sink span, sinks longer than the sequence, window of 1. */
TEST(DecodeKnown, WindowSmallerThanSinks) {
    Small s;
    ASSERT_NO_FATAL_FAILURE(s.init(GOKV_FORMAT_Q4, 32, 0, {150}));
    struct W {
        int32_t sinks, window;
    };
    for (W w : {W{8, 3}, W{4, 1}, W{200, 2}, W{0, 1}, W{16, 16}}) {
        s.o.n_sink_tokens = w.sinks;
        s.o.window = w.window;
        std::vector<int32_t> nvis;
        std::vector<double> ref;
        ref_attend(s.cache.cfg, {attn_seq(s.cache, 0)}, s.q, s.o, ref, &nvis);
        EXPECT_EQ(nvis[0], std::min(150, w.sinks + w.window));
        check_attend(shared_device(), s.cache, {attn_seq(s.cache, 0)}, s.q, s.o, 1e-4,
                     "sinks " + std::to_string(w.sinks) + " window " + std::to_string(w.window));
    }
}

/* Released pages in the middle and at the end, holes, both together, on KIVI where the released page
 * holds ring tokens (n = 200, R = 128: tokens 64.. are in the ring; page 1 holds 64..127). */
TEST(DecodeKnown, ReleasedPagesAndHoles) {
    for (int32_t fmt : {GOKV_FORMAT_F16, GOKV_FORMAT_Q4, GOKV_FORMAT_KIVI2}) {
        Small s;
        ASSERT_NO_FATAL_FAILURE(s.init(fmt, fmt == GOKV_FORMAT_F16 ? 0 : 32, fmt == GOKV_FORMAT_KIVI2 ? 128 : 0, {200}));
        for (int variant = 0; variant < 4; variant++) {
            AttnSeq a = attn_seq(s.cache, 0);
            if (variant == 0) a.pages[1] = -1;
            if (variant == 1) a.pages[3] = -1; /* the page of the query's own position */
            if (variant >= 2) {
                a.mask.assign(7, 0xffffffffu);
                a.mask[0] = 0x0f0f0f0fu;
                a.mask[3] = 0u;
                a.mask[6] &= ~(1u << (199 % 32)); /* the newest token itself */
            }
            if (variant == 3) a.pages[2] = -1;
            check_attend(shared_device(), s.cache, {a}, s.q, s.o, tol_for(fmt),
                         s.cache.cfg.name() + " variant " + std::to_string(variant));
        }
    }
}

/* Huge and tiny learned sinks: the sink dominates, or vanishes, without overflow. */
TEST(DecodeKnown, ExtremeSinkLogits) {
    Small s;
    ASSERT_NO_FATAL_FAILURE(s.init(GOKV_FORMAT_F32, 0, 0, {64}));
    s.o.sinks = {80.0f, -80.0f, 1e4f, -1e4f};
    std::vector<float> out;
    check_attend(shared_device(), s.cache, {attn_seq(s.cache, 0)}, s.q, s.o, 1e-5, "extreme sinks", &out);
    const int32_t dv = s.cache.cfg.d_v;
    for (int32_t j = 0; j < dv; j++) EXPECT_NEAR(out[(size_t)(2 * dv + j)], 0.0f, 1e-30f);
}

/* Large scores (keys x 30, scores of several hundred) must not overflow the online softmax. Tolerance
 * 1e-4: float score rounding grows with the score magnitude; the point here is finiteness. */
TEST(DecodeKnown, LargeScoresStayFinite) {
    PoolCfg c = format_cfg(GOKV_FORMAT_F16, 0, 0);
    c.n_pages = 16;
    std::mt19937 rng(9);
    std::vector<float> k = gen_keys(rng, 700, 1, c.d_k), v = gen_values(rng, 700, 1, c.d_v);
    for (auto &x : k) x *= 30.0f;
    Cache cache;
    cache.cfg = c;
    cache.pool = make_pool(shared_device(), c);
    ASSERT_TRUE(cache.pool);
    Allocator alloc(c, 1);
    cache.seqs = {alloc.new_seq(700)};
    ASSERT_EQ(append1(cache.pool.get(), c, cache.seqs[0], k, v), GOKV_OK) << gokv_last_error();
    ASSERT_TRUE(reread(cache));
    AttnOpts o;
    o.n_heads_q = 1;
    std::vector<float> q = gen_normal(rng, (size_t)c.d_k, 1.0f);
    check_attend(shared_device(), cache, {attn_seq(cache, 0)}, q, o, 1e-4, "large scores");
    o.chunk = 64;
    check_attend(shared_device(), cache, {attn_seq(cache, 0)}, q, o, 1e-4, "large scores, chunk 64");
}

} // namespace
