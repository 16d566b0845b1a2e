/*
 * test_attend_prefill.cc: causal prefill (docs/architecture.md §5): T query rows at positions kv_len-T ..
 * kv_len-1 over a cached prefix plus the T new tokens (written before the call), with the same visibility
 * rules, against the float64 reference; and batches mixing decode and prefill sequences in one call.
 */
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "reference.h"

using namespace gokvtest;

namespace {

struct PrefillCase {
    int32_t format, group, residual;
    int32_t attn; /* 0 MHA, 1 GQA, 2 MLA */
    int32_t vis;  /* 0 plain, 1 learned sinks, 2 window + sink tokens, 3 holes + released page */
    int32_t prefix, T;
};
const char *kAttn[] = {"mha", "gqa", "mla"};
const char *kVis[] = {"plain", "sinks", "window", "holes"};

std::string prefill_name(const testing::TestParamInfo<PrefillCase> &i) {
    const PrefillCase &p = i.param;
    return format_cfg(p.format, p.group, p.residual).name() + "_" + kAttn[p.attn] + "_" + kVis[p.vis] + "_prefix" +
           std::to_string(p.prefix) + "_t" + std::to_string(p.T);
}

class Prefill : public testing::TestWithParam<PrefillCase> {};

/* The prefix is written first, the T new tokens in a second write (as an engine does), then attended. */
TEST_P(Prefill, MatchesReference) {
    const PrefillCase p = GetParam();
    PoolCfg c = format_cfg(p.format, p.group, p.residual);
    AttnOpts o;
    if (p.attn == 0) { c.n_kv_heads = 2; o.n_heads_q = 2; c.d_k = c.d_v = 64; }
    if (p.attn == 1) { c.n_kv_heads = 2; o.n_heads_q = 8; c.d_k = c.d_v = 64; }
    if (p.attn == 2) { c.n_kv_heads = 1; o.n_heads_q = 4; c.d_k = 96; c.d_v = 64; c.v_is_k_prefix = 1; }
    const uint32_t seed = (uint32_t)(p.format * 7777 + p.residual * 13 + p.attn * 101 + p.vis * 11 + p.prefix + p.T);
    Cache cache;
    ASSERT_TRUE(build_cache(shared_device(), c, {p.prefix}, seed, cache, p.T));
    std::mt19937 rng(seed + 5);
    std::vector<float> k = gen_keys(rng, p.T, c.n_kv_heads, c.d_k);
    std::vector<float> v = c.v_is_k_prefix ? std::vector<float>() : gen_values(rng, p.T, c.n_kv_heads, c.d_v);
    ASSERT_EQ(append1(cache.pool.get(), cache.cfg, cache.seqs[0], k, v), GOKV_OK) << gokv_last_error();
    ASSERT_TRUE(reread(cache));
    const int32_t L = p.prefix + p.T;
    AttnSeq s = attn_seq(cache, 0, p.T);
    if (p.vis == 1) o.sinks = gen_normal(rng, (size_t)o.n_heads_q, 2.0f);
    if (p.vis == 2) {
        o.n_sink_tokens = 4;
        o.window = std::max(5, L / 5);
    }
    if (p.vis == 3) {
        s.mask.assign((size_t)((L + 31) / 32), 0u);
        std::bernoulli_distribution keep(0.7);
        for (int32_t t = 0; t < L; t++)
            if (keep(rng)) s.mask[(size_t)(t / 32)] |= 1u << (t % 32);
        if (L > 2 * c.page_size) s.pages[0] = -1;
    }
    std::vector<float> q = gen_normal(rng, (size_t)p.T * (size_t)o.n_heads_q * (size_t)c.d_k);
    const double tol = cache.cfg.quantized() ? 1e-4 : 1e-5;
    std::vector<float> a, b;
    check_attend(shared_device(), cache, {s}, q, o, tol, "prefill", &a);
    o.flags = GOKV_ATTEND_FORCE_SCALAR;
    check_attend(shared_device(), cache, {s}, q, o, tol, "prefill, forced scalar", &b);
    EXPECT_LE(rel_err(a, b), 1e-5) << "SIMD vs scalar";
}

std::vector<PrefillCase> prefill_cases() {
    struct F {
        int32_t format, group, residual;
    };
    const F formats[] = {{GOKV_FORMAT_F32, 0, 0},     {GOKV_FORMAT_F16, 0, 0},      {GOKV_FORMAT_Q8, 32, 0},
                         {GOKV_FORMAT_Q4, 32, 0},     {GOKV_FORMAT_Q4, 64, 0},      {GOKV_FORMAT_KIVI2, 32, 0},
                         {GOKV_FORMAT_KIVI2, 32, 128}, {GOKV_FORMAT_KIVI4, 32, 32}};
    struct S {
        int32_t prefix, T;
    };
    const S shapes[] = {{0, 1}, {0, 37}, {150, 50}, {64, 128}, {3, 200}};
    std::vector<PrefillCase> v;
    for (const F &f : formats)
        for (int32_t a = 0; a < 3; a++)
            for (int32_t vis = 0; vis < 4; vis++)
                for (const S &s : shapes) {
                    if (f.group == 64 && a == 2) continue; /* MLA dims here are multiples of 32 only */
                    v.push_back({f.format, f.group, f.residual, a, vis, s.prefix, s.T});
                }
    return v;
}
INSTANTIATE_TEST_SUITE_P(Table, Prefill, testing::ValuesIn(prefill_cases()), prefill_name);

/* One call: two decode sequences and two prefill sequences of different lengths and page tables, with
 * window and learned sinks; equals the reference and the same sequences attended one per call. */
TEST(PrefillBatch, MixedDecodeAndPrefill) {
    struct F {
        int32_t format, group, residual;
    };
    for (const F &f : {F{GOKV_FORMAT_F16, 0, 0}, F{GOKV_FORMAT_Q4, 32, 0}, F{GOKV_FORMAT_KIVI2, 32, 64}}) {
        PoolCfg c = format_cfg(f.format, f.group, f.residual);
        c.n_kv_heads = 2;
        Cache cache;
        ASSERT_TRUE(build_cache(shared_device(), c, {300, 45, 1, 130}, 1001u, cache));
        const std::vector<int32_t> rows = {1, 20, 1, 130};
        std::vector<AttnSeq> seqs;
        for (size_t i = 0; i < rows.size(); i++) seqs.push_back(attn_seq(cache, i, rows[i]));
        AttnOpts o;
        o.n_heads_q = 6;
        o.n_sink_tokens = 2;
        o.window = 40;
        o.sinks = {0.1f, -1.0f, 2.0f, 0.0f, 1.5f, -0.5f};
        std::mt19937 rng(3);
        std::vector<float> q = gen_normal(rng, (size_t)total_rows(seqs) * 6 * (size_t)c.d_k);
        const double tol = cache.cfg.quantized() ? 1e-4 : 1e-5;
        std::vector<float> all;
        check_attend(shared_device(), cache, seqs, q, o, tol, cache.cfg.name() + " mixed batch", &all);
        size_t row = 0;
        const size_t qrow = 6 * (size_t)c.d_k, orow = 6 * (size_t)c.d_v;
        for (size_t i = 0; i < seqs.size(); i++) {
            std::vector<float> qi(q.begin() + (long)(row * qrow), q.begin() + (long)((row + (size_t)rows[i]) * qrow));
            std::vector<float> one;
            check_attend(shared_device(), cache, {seqs[i]}, qi, o, tol, cache.cfg.name() + " alone", &one);
            std::vector<float> part(all.begin() + (long)(row * orow), all.begin() + (long)((row + (size_t)rows[i]) * orow));
            EXPECT_LE(rel_err(part, one), 1e-6) << cache.cfg.name() << " sequence " << i << ": batch vs alone";
            row += (size_t)rows[i];
        }
    }
}

/* Query rows that start before the end (q_pos < kv_len - T: a prefill whose later tokens are already
 * cached, e.g. speculative verification) see only positions <= their own. */
TEST(PrefillBatch, RowsBeforeTheEndAreCausal) {
    PoolCfg c = format_cfg(GOKV_FORMAT_Q8, 32, 0);
    Cache cache;
    ASSERT_TRUE(build_cache(shared_device(), c, {200}, 2002u, cache));
    AttnSeq s = attn_seq(cache, 0, 10);
    s.q_pos = 100; /* rows at 100..109 of a 200-token sequence */
    AttnOpts o;
    o.n_heads_q = 1;
    std::mt19937 rng(4);
    std::vector<float> q = gen_normal(rng, 10 * (size_t)c.d_k);
    check_attend(shared_device(), cache, {s}, q, o, 1e-4, "rows before the end");
}

/* gokv_append_attend: one call equals a write then an attend; a step rejected for a bad attend argument
 * writes nothing. Two sequences (decode of 1 token, prefill of 33) over prefixes. */
TEST(AppendAttend, EqualsWriteThenAttend) {
    struct F {
        int32_t format, group, residual;
    };
    for (const F &f : {F{GOKV_FORMAT_F16, 0, 0}, F{GOKV_FORMAT_Q4, 32, 0}, F{GOKV_FORMAT_KIVI2, 32, 32}}) {
        PoolCfg c = format_cfg(f.format, f.group, f.residual);
        c.n_kv_heads = 2;
        Cache a, b;
        ASSERT_TRUE(build_cache(shared_device(), c, {120, 40}, 3003u, a, 40));
        ASSERT_TRUE(build_cache(shared_device(), c, {120, 40}, 3003u, b, 40));
        const std::vector<int32_t> n_new = {1, 33};
        std::mt19937 rng(3004);
        std::vector<std::vector<float>> ks, vs;
        for (int32_t n : n_new) {
            ks.push_back(gen_keys(rng, n, 2, a.cfg.d_k));
            vs.push_back(gen_values(rng, n, 2, a.cfg.d_v));
        }
        /* b: the fused call, built by hand (the helpers call write and attend separately) */
        WriteArrays wa;
        for (size_t i = 0; i < 2; i++) wa.add(b.cfg, b.seqs[i], ks[i], vs[i]);
        gokv_write_desc w = wa.desc(b.cfg);
        /* a: write, then attend */
        ASSERT_EQ(append(a.pool.get(), a.cfg, {&a.seqs[0], &a.seqs[1]}, ks, vs), GOKV_OK) << gokv_last_error();
        ASSERT_TRUE(reread(a));
        std::vector<AttnSeq> seqs = {attn_seq(a, 0, 1), attn_seq(a, 1, 33)};
        AttnOpts o;
        o.n_heads_q = 4;
        o.sinks = {0.5f, -0.5f, 1.0f, 0.0f};
        std::vector<float> q = gen_normal(rng, 34 * 4 * (size_t)a.cfg.d_k);
        std::vector<float> out_a;
        const double tol = a.cfg.quantized() ? 1e-4 : 1e-5;
        check_attend(shared_device(), a, seqs, q, o, tol, a.cfg.name() + " write then attend", &out_a);

        std::vector<int32_t> qind{0, 1, 34}, apind{0}, apids, kvl, qpos;
        for (const auto &s : seqs) {
            apids.insert(apids.end(), s.pages.begin(), s.pages.end());
            apind.push_back((int32_t)apids.size());
            kvl.push_back(s.kv_len);
            qpos.push_back(s.q_pos);
        }
        std::vector<float> out_b(out_a.size(), std::numeric_limits<float>::quiet_NaN());
        gokv_attend_desc at;
        std::memset(&at, 0, sizeof at);
        at.struct_size = sizeof at;
        at.pool = b.pool.get();
        at.n_seqs = 2;
        at.q_indptr = qind.data();
        at.page_indptr = apind.data();
        at.page_ids = apids.data();
        at.kv_len = kvl.data();
        at.q_pos = qpos.data();
        at.residual_slot = b.cfg.kivi() ? wa.slots.data() : nullptr;
        at.n_heads_q = 4;
        at.q = q.data();
        at.out = out_b.data();
        at.scale = eff_scale(b.cfg, o);
        at.sink_logits = o.sinks.data();

        /* rejected step (NaN sink logit): nothing written */
        std::vector<float> bad_sinks = {0.0f, std::numeric_limits<float>::quiet_NaN(), 0.0f, 0.0f};
        at.sink_logits = bad_sinks.data();
        EXPECT_EQ(gokv_append_attend(shared_device(), &w, &at), GOKV_EINVAL) << b.cfg.name();
        EXPECT_NE(std::string(gokv_last_error()).find("sink_logits"), std::string::npos) << gokv_last_error();
        std::vector<float> k0, v0;
        ASSERT_EQ(read_seq(b.pool.get(), b.cfg, b.seqs[1], k0, v0), GOKV_OK);
        EXPECT_EQ(k0, b.kdq[1]) << b.cfg.name() << ": a rejected append_attend changed the cache";

        at.sink_logits = o.sinks.data();
        ASSERT_EQ(gokv_append_attend(shared_device(), &w, &at), GOKV_OK) << b.cfg.name() << ": " << gokv_last_error();
        EXPECT_TRUE(all_finite(out_b)) << b.cfg.name();
        EXPECT_LE(rel_err(out_b, out_a), 1e-6) << b.cfg.name() << ": fused append_attend vs write then attend";
        for (size_t i = 0; i < 2; i++) {
            b.seqs[i].len += n_new[i];
            std::vector<float> kb, vb;
            ASSERT_EQ(read_seq(b.pool.get(), b.cfg, b.seqs[i], kb, vb), GOKV_OK);
            EXPECT_EQ(kb, a.kdq[i]) << b.cfg.name() << " sequence " << i;
            EXPECT_EQ(vb, a.vdq[i]) << b.cfg.name() << " sequence " << i;
        }
        /* a NULL write is a plain attend */
        std::fill(out_b.begin(), out_b.end(), std::numeric_limits<float>::quiet_NaN());
        ASSERT_EQ(gokv_append_attend(shared_device(), nullptr, &at), GOKV_OK) << gokv_last_error();
        EXPECT_LE(rel_err(out_b, out_a), 1e-6) << b.cfg.name() << ": append_attend without a write";
    }
}

} // namespace
