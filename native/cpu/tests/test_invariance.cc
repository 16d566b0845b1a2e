/*
 * test_invariance.cc: results must not depend on how the work is cut (docs/architecture.md §8): split-K chunk
 * size, thread count, page size, batch composition, SIMD path; outputs are poisoned with NaN before every
 * call (reference.h: attend) and checked written. Also the formats' own quality on the standard data.
 */
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "reference.h"

using namespace gokvtest;

namespace {

struct F {
    int32_t format, group, residual;
};
const F kInvFormats[] = {{GOKV_FORMAT_F32, 0, 0},     {GOKV_FORMAT_F16, 0, 0},     {GOKV_FORMAT_Q8, 32, 0},
                         {GOKV_FORMAT_Q4, 32, 0},     {GOKV_FORMAT_KIVI2, 32, 0},  {GOKV_FORMAT_KIVI2, 32, 128},
                         {GOKV_FORMAT_KIVI4, 32, 32}};
std::string f_name(const testing::TestParamInfo<F> &i) { return format_cfg(i.param.format, i.param.group, i.param.residual).name(); }
double tol_of(const PoolCfg &c) { return c.quantized() ? 1e-4 : 1e-5; }

class Invariance : public testing::TestWithParam<F> {
protected:
    /* GQA 8:2, a batch of decode sequences of several lengths plus one prefill, window + sinks. */
    PoolCfg cfg() const {
        PoolCfg c = format_cfg(GetParam().format, GetParam().group, GetParam().residual);
        c.n_kv_heads = 2;
        return c;
    }
    std::vector<int32_t> lens() const { return {1, 37, 300, 1000, 90}; }
    std::vector<AttnSeq> seqs(const Cache &c) const {
        std::vector<AttnSeq> s;
        for (size_t i = 0; i + 1 < c.seqs.size(); i++) s.push_back(attn_seq(c, i));
        s.push_back(attn_seq(c, c.seqs.size() - 1, 30)); /* prefill of 30 rows */
        return s;
    }
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

/* Split size: chunks of 1, 16, 17, 64, 512 (default) and 100000 tokens give the same result. */
TEST_P(Invariance, ChunkSize) {
    Cache cache;
    ASSERT_TRUE(build_cache(shared_device(), cfg(), lens(), 10u, cache));
    std::vector<AttnSeq> s = seqs(cache);
    std::mt19937 rng(11);
    std::vector<float> q = gen_normal(rng, (size_t)total_rows(s) * 8 * (size_t)cache.cfg.d_k);
    for (bool window : {false, true}) {
        AttnOpts o = opts(window);
        std::vector<float> base;
        check_attend(shared_device(), cache, s, q, o, tol_of(cache.cfg), "default chunk", &base);
        for (int32_t chunk : {1, 16, 17, 64, 512, 100000}) {
            o.chunk = chunk;
            std::vector<float> out;
            const std::string what = "chunk " + std::to_string(chunk) + (window ? " window" : "");
            check_attend(shared_device(), cache, s, q, o, tol_of(cache.cfg), what, &out);
            EXPECT_LE(rel_err(out, base), 1e-5) << what << " vs default chunk";
        }
    }
}

/* Thread count: devices with 1, 2 and 3 workers (and all CPUs) give the same result. */
TEST_P(Invariance, ThreadCount) {
    std::vector<float> first;
    for (int32_t threads : {1, 2, 3, 0}) {
        DevicePtr dev = open_cpu(threads);
        ASSERT_TRUE(dev);
        gokv_device_info info;
        std::memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        ASSERT_EQ(gokv_device_info_get(dev.get(), &info), GOKV_OK) << gokv_last_error();
        if (threads > 0) {
            EXPECT_EQ(info.n_threads, threads);
        }
        EXPECT_GE(info.n_threads, 1);
        Cache cache;
        ASSERT_TRUE(build_cache(dev.get(), cfg(), lens(), 10u, cache));
        std::vector<AttnSeq> s = seqs(cache);
        std::mt19937 rng(12);
        std::vector<float> q = gen_normal(rng, (size_t)total_rows(s) * 8 * (size_t)cache.cfg.d_k);
        AttnOpts o = opts(true);
        o.chunk = 64;
        std::vector<float> out;
        check_attend(dev.get(), cache, s, q, o, tol_of(cache.cfg), "threads " + std::to_string(threads), &out);
        if (first.empty())
            first = out;
        else
            EXPECT_LE(rel_err(out, first), 1e-6) << "threads " << threads << " vs 1 thread";
    }
}

/* Page size: the same data in pages of 16/32, 24 (not KIVI: a part tile of q4 keys), 64 and 128 tokens reads
 * back identically and attends alike. */
TEST_P(Invariance, PageSize) {
    std::vector<float> first_out;
    std::vector<std::vector<float>> first_k;
    for (int32_t P : {16, 24, 64, 128}) {
        PoolCfg c = cfg();
        if (c.kivi() && P == 24) continue; /* KIVI pages hold whole key groups */
        c.page_size = (c.kivi() && P < c.group) ? c.group : P;
        if (c.kivi() && P == 16) c.page_size = 32;
        Cache cache;
        ASSERT_TRUE(build_cache(shared_device(), c, lens(), 10u, cache));
        if (first_k.empty())
            first_k = cache.kdq;
        else
            for (size_t i = 0; i < first_k.size(); i++) EXPECT_EQ(cache.kdq[i], first_k[i]) << "page size " << P;
        std::vector<AttnSeq> s = seqs(cache);
        std::mt19937 rng(13);
        std::vector<float> q = gen_normal(rng, (size_t)total_rows(s) * 8 * (size_t)c.d_k);
        std::vector<float> out;
        check_attend(shared_device(), cache, s, q, opts(true), tol_of(c), "page " + std::to_string(c.page_size), &out);
        if (first_out.empty())
            first_out = out;
        else
            EXPECT_LE(rel_err(out, first_out), 1e-5) << "page size " << c.page_size;
    }
}

/* Batch composition: each sequence alone, in the full batch, and in a reversed sub-batch. */
TEST_P(Invariance, BatchComposition) {
    Cache cache;
    ASSERT_TRUE(build_cache(shared_device(), cfg(), lens(), 14u, cache));
    std::vector<AttnSeq> s = seqs(cache);
    s[2].mask.assign((size_t)((s[2].kv_len + 31) / 32), 0xfff0fff7u); /* one sequence with holes */
    std::mt19937 rng(15);
    const size_t qrow = 8 * (size_t)cache.cfg.d_k, orow = 8 * (size_t)cache.cfg.d_v;
    std::vector<std::vector<float>> qs;
    for (const auto &a : s) qs.push_back(gen_normal(rng, (size_t)a.n_rows * qrow));
    AttnOpts o = opts(true);
    std::vector<std::vector<float>> alone(s.size());
    for (size_t i = 0; i < s.size(); i++)
        check_attend(shared_device(), cache, {s[i]}, qs[i], o, tol_of(cache.cfg), "alone " + std::to_string(i), &alone[i]);
    for (int order = 0; order < 2; order++) {
        std::vector<size_t> idx = order == 0 ? std::vector<size_t>{0, 1, 2, 3, 4} : std::vector<size_t>{4, 2, 3, 0};
        std::vector<AttnSeq> batch;
        std::vector<float> q;
        for (size_t i : idx) {
            batch.push_back(s[i]);
            q.insert(q.end(), qs[i].begin(), qs[i].end());
        }
        std::vector<float> out;
        check_attend(shared_device(), cache, batch, q, o, tol_of(cache.cfg), "batch order " + std::to_string(order), &out);
        size_t row = 0;
        for (size_t i : idx) {
            std::vector<float> part(out.begin() + (long)(row * orow),
                                    out.begin() + (long)((row + (size_t)s[i].n_rows) * orow));
            EXPECT_LE(rel_err(part, alone[i]), 1e-6) << "sequence " << i << " in batch order " << order;
            row += (size_t)s[i].n_rows;
        }
    }
}

/* SIMD paths: every level the CPU has (capped with gokv_cpu_set_simd_limit) against the reference and
 * the scalar path; writes produce the same bytes on every path (fp16 conversion bit for bit). */
TEST_P(Invariance, SimdLevels) {
    SimdLimitGuard guard;
    const int32_t best = gokv_cpu_simd_level();
    std::vector<int32_t> levels = {GOKV_CPU_SCALAR};
    for (int32_t l : {GOKV_CPU_AVX2, GOKV_CPU_AVX512, GOKV_CPU_NEON})
        if (l <= best && (l != GOKV_CPU_NEON || best == GOKV_CPU_NEON) && (best != GOKV_CPU_NEON || l == GOKV_CPU_NEON))
            levels.push_back(l);
    std::vector<float> scalar_out;
    std::vector<std::vector<uint8_t>> scalar_pages;
    for (int32_t level : levels) {
        const int32_t in_force = gokv_cpu_set_simd_limit(level);
        EXPECT_EQ(in_force, level) << gokv_cpu_simd_name(level);
        EXPECT_NE(gokv_cpu_simd_name(level), nullptr);
        Cache cache;
        ASSERT_TRUE(build_cache(shared_device(), cfg(), lens(), 16u, cache));
        std::vector<std::vector<uint8_t>> pages;
        const gokv_layout *L = gokv_pool_layout(cache.pool.get());
        for (const Seq &sq : cache.seqs) {
            const int32_t full = cache.cfg.kivi() ? gokv_kivi_quantized_len(sq.len, cache.cfg.group, cache.cfg.residual) / cache.cfg.page_size
                                                  : sq.len / cache.cfg.page_size;
            for (int32_t i = 0; i < full; i++) {
                const uint8_t *pb = gokv_cpu_page_bytes(cache.pool.get(), sq.pages[(size_t)i]);
                pages.emplace_back(pb, pb + L->page_bytes);
            }
        }
        std::vector<AttnSeq> s = seqs(cache);
        std::mt19937 rng(17);
        std::vector<float> q = gen_normal(rng, (size_t)total_rows(s) * 8 * (size_t)cache.cfg.d_k);
        std::vector<float> out;
        const std::string what = std::string("simd ") + gokv_cpu_simd_name(level);
        check_attend(shared_device(), cache, s, q, opts(true), tol_of(cache.cfg), what, &out);
        if (level == GOKV_CPU_SCALAR) {
            scalar_out = out;
            scalar_pages = pages;
        } else {
            EXPECT_LE(rel_err(out, scalar_out), 1e-5) << what << " vs scalar";
            EXPECT_TRUE(pages == scalar_pages) << what << ": written pages differ from the scalar path's bytes";
        }
    }
}

/* GOKV_ATTEND_DEQUANT_BASELINE (dequantize, then attend) computes the same attention. */
TEST_P(Invariance, DequantBaselineFlag) {
    Cache cache;
    ASSERT_TRUE(build_cache(shared_device(), cfg(), lens(), 18u, cache));
    std::vector<AttnSeq> s = seqs(cache);
    s[3].pages[1] = -1;
    std::mt19937 rng(19);
    std::vector<float> q = gen_normal(rng, (size_t)total_rows(s) * 8 * (size_t)cache.cfg.d_k);
    AttnOpts o = opts(true);
    std::vector<float> fused, base;
    check_attend(shared_device(), cache, s, q, o, tol_of(cache.cfg), "fused", &fused);
    o.flags = GOKV_ATTEND_DEQUANT_BASELINE;
    check_attend(shared_device(), cache, s, q, o, tol_of(cache.cfg), "dequant baseline", &base);
    EXPECT_LE(rel_err(base, fused), tol_of(cache.cfg));
}

INSTANTIATE_TEST_SUITE_P(Formats, Invariance, testing::ValuesIn(kInvFormats), f_name);

/* The SIMD limit cannot raise the level above what the CPU has, and reports what is in force. */
TEST(Simd, LimitIsCapped) {
    SimdLimitGuard guard;
    const int32_t best = gokv_cpu_simd_level();
    EXPECT_EQ(gokv_cpu_set_simd_limit(GOKV_CPU_SCALAR), GOKV_CPU_SCALAR);
    EXPECT_EQ(gokv_cpu_set_simd_limit(best), best);
    EXPECT_NE(gokv_cpu_simd_name(best), nullptr);
    std::printf("[ INFO     ] CPU SIMD level %d (%s)\n", best, gokv_cpu_simd_name(best));
}

/* Quality of each format on the standard data (N(0,1) keys with 8 of 128 channels x4, N(0,1) values,
 * S = 4096, d = 128, 8 heads, random queries): cosine of the kernel output against exact float64
 * attention over the ORIGINAL (unquantized) data, all heads concatenated. */
struct Quality {
    F f;
    double min_cos;
};
class FormatQuality : public testing::TestWithParam<Quality> {};
TEST_P(FormatQuality, CosineAgainstExactAttention) {
    const Quality p = GetParam();
    PoolCfg c = format_cfg(p.f.format, p.f.group, p.f.residual);
    c.n_kv_heads = 8;
    c.d_k = c.d_v = 128;
    Cache cache;
    ASSERT_TRUE(build_cache(shared_device(), c, {4096}, 4096u, cache));
    AttnOpts o;
    o.n_heads_q = 8;
    std::mt19937 rng(4097);
    std::vector<float> q = gen_normal(rng, 8 * 128);
    std::vector<float> out;
    check_attend(shared_device(), cache, {attn_seq(cache, 0)}, q, o, tol_of(cache.cfg), "quality run", &out);
    /* exact attention over the original inputs */
    Cache orig;
    orig.cfg = cache.cfg;
    orig.seqs = cache.seqs;
    orig.kdq = {cache.seqs[0].k};
    orig.vdq = {cache.seqs[0].v};
    std::vector<double> exact;
    ref_attend(orig.cfg, {attn_seq(orig, 0)}, q, o, exact);
    std::vector<double> got(out.begin(), out.end());
    const double cos = cosine(got, exact);
    double worst = 1.0;
    for (int32_t h = 0; h < 8; h++) {
        std::vector<double> a(got.begin() + h * 128, got.begin() + (h + 1) * 128);
        std::vector<double> b(exact.begin() + h * 128, exact.begin() + (h + 1) * 128);
        worst = std::min(worst, cosine(a, b));
    }
    std::printf("[ QUALITY  ] %-16s cosine %.6f (worst head %.6f, threshold %.5f)\n", cache.cfg.name().c_str(), cos,
                worst, p.min_cos);
    RecordProperty("cosine", std::to_string(cos));
    RecordProperty("worst_head_cosine", std::to_string(worst));
    EXPECT_GE(cos, p.min_cos) << cache.cfg.name();
}
const Quality kQuality[] = {
    {{GOKV_FORMAT_F16, 0, 0}, 0.99999},      {{GOKV_FORMAT_Q8, 32, 0}, 0.9995},
    {{GOKV_FORMAT_Q4, 32, 0}, 0.98},         {{GOKV_FORMAT_Q4, 64, 0}, 0.97},
    {{GOKV_FORMAT_KIVI4, 32, 128}, 0.985},   {{GOKV_FORMAT_KIVI2, 32, 128}, 0.75},
};
std::string q_name(const testing::TestParamInfo<Quality> &i) {
    return format_cfg(i.param.f.format, i.param.f.group, i.param.f.residual).name();
}
INSTANTIATE_TEST_SUITE_P(Formats, FormatQuality, testing::ValuesIn(kQuality), q_name);

} // namespace
