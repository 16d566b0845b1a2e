/*
 * test_invariance.cc: on every backend, results must not depend on how the work is cut (docs/architecture.md
 * §8): the split-K chunk size (1 token to more than the sequence), the page size, the batch composition and
 * the flags; every run also compared with the CPU backend. Outputs are poisoned with NaN before each call
 * (reference.h: attend). Also the formats' own quality on the standard data. (Thread count and SIMD level
 * are the CPU module's: native/cpu/tests.)
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "harness.h"

using namespace gokvtest;

namespace {

class Invariance : public BackendParamTest<Fmt> {
protected:
    /* GQA 8:2, decode sequences of several lengths (one longer than two default chunks) plus a prefill. */
    PoolCfg cfg() const {
        PoolCfg c = format_cfg(param().format, param().group, param().residual);
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

/* Chunks of 1, 16, 17, 64, 512 and 100000 tokens give the default chunk's result (1e-5)
 * and the CPU's. */
TEST_P(Invariance, ChunkSize) {
    Pair pair;
    ASSERT_TRUE(build_pair(cfg(), lens(), 10u, pair));
    std::vector<AttnSeq> s = seqs(pair.dut);
    s[3].pages[5] = -1; /* a released page inside the long sequence */
    std::mt19937 rng(11);
    const std::vector<float> q = gen_normal(rng, (size_t)total_rows(s) * 8 * (size_t)pair.dut.cfg.d_k);
    const double tol = tol_for(pair.dut.cfg.format);
    for (bool window : {false, true}) {
        AttnOpts o = opts(window);
        CrossOut base;
        cross_attend(pair, s, src(), q, o, tol, "default chunk" + std::string(window ? " window" : ""), &base);
        for (int32_t chunk : {1, 16, 17, 64, 512, 100000}) {
            o.chunk = chunk;
            CrossOut out;
            const std::string what = "chunk " + std::to_string(chunk) + (window ? " window" : "");
            cross_attend(pair, s, src(), q, o, tol, what, &out);
            EXPECT_LE(rel_err(out.dut, base.dut), 1e-5) << what << " vs the default chunk";
        }
    }
}

/* The same data in pages of 16 (KIVI: 32), 24 (not KIVI: a part tile of q4 keys), 64 and 128 tokens reads back
 * identically and attends alike. */
TEST_P(Invariance, PageSize) {
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
            first_k = pair.dut.kdq;
        else
            for (size_t i = 0; i < first_k.size(); i++) EXPECT_EQ(pair.dut.kdq[i], first_k[i]) << "page size " << P;
        const std::vector<AttnSeq> s = seqs(pair.dut);
        std::mt19937 rng(13);
        const std::vector<float> q = gen_normal(rng, (size_t)total_rows(s) * 8 * (size_t)c.d_k);
        CrossOut out;
        cross_attend(pair, s, src(), q, opts(true), tol_for(c.format), "page " + std::to_string(c.page_size), &out);
        if (first_out.empty())
            first_out = out.dut;
        else
            EXPECT_LE(rel_err(out.dut, first_out), 1e-5) << "page size " << c.page_size;
    }
}

/* GOKV_ATTEND_FORCE_SCALAR is accepted and changes nothing beyond rounding; GOKV_ATTEND_DEQUANT_BASELINE
 * computes the same attention where the device reports GOKV_CAP_BASELINE (else GOKV_ENOTSUP, by name). */
TEST_P(Invariance, Flags) {
    Pair pair;
    ASSERT_TRUE(build_pair(cfg(), lens(), 18u, pair));
    const std::vector<AttnSeq> s = seqs(pair.dut);
    std::mt19937 rng(19);
    const std::vector<float> q = gen_normal(rng, (size_t)total_rows(s) * 8 * (size_t)pair.dut.cfg.d_k);
    const double tol = tol_for(pair.dut.cfg.format);
    AttnOpts o = opts(true);
    CrossOut fused;
    cross_attend(pair, s, src(), q, o, tol, "fused", &fused);
    o.flags = GOKV_ATTEND_FORCE_SCALAR;
    CrossOut scalar;
    cross_attend(pair, s, src(), q, o, tol, "force scalar", &scalar);
    EXPECT_LE(rel_err(scalar.dut, fused.dut), 1e-5) << "GOKV_ATTEND_FORCE_SCALAR";
    o.flags = GOKV_ATTEND_DEQUANT_BASELINE;
    if (device_info(dut()).caps & GOKV_CAP_BASELINE) {
        CrossOut base;
        cross_attend(pair, s, src(), q, o, tol, "dequant baseline", &base);
        EXPECT_LE(rel_err(base.dut, fused.dut), tol) << "GOKV_ATTEND_DEQUANT_BASELINE";
    } else {
        std::vector<float> out;
        const gokv_status st = attend(dut(), pair.dut.pool.get(), pair.dut.cfg, s, q, o, out);
        EXPECT_TRUE(st == GOKV_ENOTSUP || st == GOKV_OK) << "baseline without GOKV_CAP_BASELINE: " << gokv_status_name(st)
                                                         << ": " << gokv_last_error();
    }
}

const Fmt kInvFormats[] = {{GOKV_FORMAT_F32, 0, 0},     {GOKV_FORMAT_F16, 0, 0},      {GOKV_FORMAT_Q8, 32, 0},
                           {GOKV_FORMAT_Q4, 32, 0},     {GOKV_FORMAT_KIVI2, 32, 0},   {GOKV_FORMAT_KIVI2, 32, 128},
                           {GOKV_FORMAT_KIVI4, 32, 32}};
GOKV_INSTANTIATE_CASES(Formats, Invariance, kInvFormats);

/* Batch composition: each sequence alone, in the full batch, and in a reversed sub-batch give the same
 * rows (1e-6). */
TEST_P(Invariance, BatchComposition) {
    Pair pair;
    ASSERT_TRUE(build_pair(cfg(), lens(), 14u, pair));
    std::vector<AttnSeq> s = seqs(pair.dut);
    s[2].mask.assign((size_t)((s[2].kv_len + 31) / 32), 0xfff0fff7u); /* one sequence with holes */
    std::mt19937 rng(15);
    const size_t qrow = 8 * (size_t)pair.dut.cfg.d_k, orow = 8 * (size_t)pair.dut.cfg.d_v;
    std::vector<std::vector<float>> qs;
    for (const auto &a : s) qs.push_back(gen_normal(rng, (size_t)a.n_rows * qrow));
    const AttnOpts o = opts(true);
    const double tol = tol_for(pair.dut.cfg.format);
    std::vector<std::vector<float>> alone(s.size());
    for (size_t i = 0; i < s.size(); i++) {
        CrossOut out;
        cross_attend(pair, {s[i]}, {i}, qs[i], o, tol, "alone " + std::to_string(i), &out);
        alone[i] = out.dut;
    }
    for (int order = 0; order < 2; order++) {
        const std::vector<size_t> idx = order == 0 ? std::vector<size_t>{0, 1, 2, 3, 4} : std::vector<size_t>{4, 2, 3, 0};
        std::vector<AttnSeq> batch;
        std::vector<float> q;
        for (size_t i : idx) {
            batch.push_back(s[i]);
            q.insert(q.end(), qs[i].begin(), qs[i].end());
        }
        CrossOut out;
        cross_attend(pair, batch, idx, q, o, tol, "batch order " + std::to_string(order), &out);
        size_t row = 0;
        for (size_t i : idx) {
            if (out.dut.size() < (row + (size_t)s[i].n_rows) * orow) break;
            const std::vector<float> part(out.dut.begin() + (long)(row * orow),
                                          out.dut.begin() + (long)((row + (size_t)s[i].n_rows) * orow));
            EXPECT_LE(rel_err(part, alone[i]), 1e-6) << "sequence " << i << " in batch order " << order;
            row += (size_t)s[i].n_rows;
        }
    }
}

/* Quality of each format on the standard data (N(0,1) keys with 8 of 128 channels x4, N(0,1) values,
 * S = 4096, d = 128, 8 heads, random queries): cosine of the backend's output against exact float64
 * attention over the ORIGINAL (unquantized) data, all heads concatenated. */
struct Quality {
    Fmt f;
    double min_cos;
};
std::string case_name(const Quality &q) { return fmt_name(q.f); }
class FormatQuality : public BackendParamTest<Quality> {};
TEST_P(FormatQuality, CosineAgainstExactAttention) {
    const Quality p = param();
    PoolCfg c = format_cfg(p.f.format, p.f.group, p.f.residual);
    c.n_kv_heads = 8;
    c.d_k = c.d_v = 128;
    Cache cache;
    ASSERT_TRUE(build_cache(dut(), c, {4096}, 4096u, cache));
    AttnOpts o;
    o.n_heads_q = 8;
    std::mt19937 rng(4097);
    const std::vector<float> q = gen_normal(rng, 8 * 128);
    std::vector<float> out;
    check_attend(dut(), cache, {attn_seq(cache, 0)}, q, o, tol_for(c.format), "quality run", &out);
    /* exact attention over the original inputs */
    Cache orig;
    orig.cfg = cache.cfg;
    orig.seqs = cache.seqs;
    orig.kdq = {cache.seqs[0].k};
    orig.vdq = {cache.seqs[0].v};
    std::vector<double> exact;
    ref_attend(orig.cfg, {attn_seq(orig, 0)}, q, o, exact);
    const std::vector<double> got(out.begin(), out.end());
    const double cos = cosine(got, exact);
    double worst = 1.0;
    for (int32_t h = 0; h < 8 && got.size() == exact.size(); h++) {
        const std::vector<double> a(got.begin() + h * 128, got.begin() + (h + 1) * 128);
        const std::vector<double> b(exact.begin() + h * 128, exact.begin() + (h + 1) * 128);
        worst = std::min(worst, cosine(a, b));
    }
    std::printf("[ QUALITY  ] %s %-16s cosine %.6f (worst head %.6f, threshold %.5f)\n", dut_name().c_str(),
                cache.cfg.name().c_str(), cos, worst, p.min_cos);
    RecordProperty("cosine", std::to_string(cos));
    RecordProperty("worst_head_cosine", std::to_string(worst));
    EXPECT_GE(cos, p.min_cos) << cache.cfg.name();
}
const Quality kQuality[] = {
    {{GOKV_FORMAT_F16, 0, 0}, 0.99999},    {{GOKV_FORMAT_Q8, 32, 0}, 0.9995},
    {{GOKV_FORMAT_Q4, 32, 0}, 0.98},       {{GOKV_FORMAT_Q4, 64, 0}, 0.97},
    {{GOKV_FORMAT_KIVI4, 32, 128}, 0.985}, {{GOKV_FORMAT_KIVI2, 32, 128}, 0.75},
};
GOKV_INSTANTIATE_CASES(Formats, FormatQuality, kQuality);

} // namespace
