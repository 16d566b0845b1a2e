/*
 * test_attend_mass.cc: the attention mass output (gokv_attend_desc.mass, mass_rows) and per-kv-head validity
 * masks (GOKV_ATTEND_MASK_PER_KV_HEAD) on every backend (gokv.h; docs/architecture.md §5).
 *
 * Mass: formats x {MHA, GQA, MQA, MLA} x visibility (plain, learned sinks, sink tokens + window + learned
 * sinks, holes + released pages) x {decode, prefill counting every row, prefill counting the last rows},
 * each a batch of several sequences (a long prefill, a short one or a decode row, one with no query rows,
 * a single token), with the default split and with small split-K chunks. Each run is checked against the
 * float64 reference's probabilities (check_attend: every element written, unseen tokens exactly 0, each kv
 * head's sum = its counted queries less their sink shares) and against the CPU (cross_attend).
 *
 * Per-kv-head masks: each kv head sees its own token set (one kv head sees nothing: its query heads output
 * exact zeros), decode and prefill, every format, alone and with the mass (masked tokens have mass 0); the
 * same mask for every kv head gives the outputs of the shared mask.
 *
 * A backend whose device info lacks GOKV_CAP_MASS / GOKV_CAP_KV_HEAD_MASKS skips the tests that need them.
 */
#include <gtest/gtest.h>

#include <algorithm>

#include "harness.h"

using namespace gokvtest;

namespace {

enum MassMode { DECODE, PREFILL_ALL, PREFILL_LAST };
const char *const kModeIds[] = {"decode", "prefill", "prefilllast"};
enum MassVis { M_PLAIN, M_LSINKS, M_SINKWIN, M_HOLES };
const char *const kMassVisIds[] = {"plain", "lsinks", "sinkwinls", "holes"};
constexpr int32_t kLastRows = 6; /* mass_rows of PREFILL_LAST: fewer than the short prefill's rows */

struct MassCase {
    Fmt f;
    Attn attn;
    int32_t page_size = 0; /* 0: PoolCfg's (64) */
    int32_t mode = -1;     /* a MassMode, or -1: every mode */
    int32_t vis = -1;      /* a MassVis, or -1: every rule */
};

std::string case_name(const MassCase &c) {
    std::string n = fmt_name(c.f) + "_" + kAttnNames[c.attn];
    if (c.page_size) n += "_p" + std::to_string(c.page_size);
    if (c.mode >= 0) n += std::string("_") + kModeIds[c.mode];
    if (c.vis >= 0) n += std::string("_") + kMassVisIds[c.vis];
    return n;
}

/* One test per (mode, visibility) where runs are split (harness.h). */
std::vector<MassCase> split_case(const MassCase &c) {
    std::vector<MassCase> v;
    for (int32_t m = 0; m < 3; m++)
        for (int32_t vis = 0; vis < 4; vis++) v.push_back({c.f, c.attn, c.page_size, m, vis});
    return v;
}

class Mass : public BackendParamTest<MassCase> {};

/* The batch: sequences of 260, 45, 90 and 1 tokens; decode: one row each but the third (no rows); prefill:
 * 40 rows (tiles of rows), 12 rows (split like decode), none, 1. */
TEST_P(Mass, MatchesReferenceAndCpu) {
    if (!dut_has_caps(GOKV_CAP_MASS)) GTEST_SKIP() << dut_name() << " has no GOKV_CAP_MASS";
    const MassCase p = param();
    AttnOpts base;
    PoolCfg c = attn_cfg(p.f, p.attn, &base.n_heads_q);
    if (p.page_size) c.page_size = p.page_size;
    const std::vector<int32_t> lens = {260, 45, 90, 1};
    const uint32_t seed = (uint32_t)(p.f.format * 1000003 + p.f.group * 7919 + p.f.residual * 131 + p.attn * 17 + 4242);
    Pair pair;
    ASSERT_TRUE(build_pair(c, lens, seed, pair));
    for (int32_t mode = 0; mode < 3; mode++) {
        if (p.mode >= 0 && mode != p.mode) continue;
        const std::vector<int32_t> rows = mode == DECODE ? std::vector<int32_t>{1, 1, 0, 1} : std::vector<int32_t>{40, 12, 0, 1};
        for (int32_t vis = 0; vis < 4; vis++) {
            if (p.vis >= 0 && vis != p.vis) continue;
            std::mt19937 rng(seed + 1 + (uint32_t)(mode * 4 + vis));
            AttnOpts o = base;
            o.mass = true;
            o.mass_rows = mode == PREFILL_LAST ? kLastRows : 0;
            std::vector<AttnSeq> seqs;
            for (size_t i = 0; i < lens.size(); i++) seqs.push_back(attn_seq(pair.dut, i, rows[i]));
            if (vis == M_LSINKS || vis == M_SINKWIN) {
                o.sinks = gen_normal(rng, (size_t)o.n_heads_q, 2.0f);
                o.sinks[0] = 6.0f; /* one head dominated by its sink */
            }
            if (vis == M_SINKWIN) {
                o.n_sink_tokens = 4;
                o.window = 50;
            }
            if (vis == M_HOLES) {
                for (size_t i = 0; i < seqs.size(); i++) {
                    AttnSeq &s = seqs[i];
                    s.mask.assign((size_t)((s.kv_len + 31) / 32), 0u);
                    std::bernoulli_distribution keep(0.75);
                    for (int32_t t = 0; t < s.kv_len; t++)
                        if (keep(rng)) s.mask[(size_t)(t / 32)] |= 1u << (t % 32);
                }
                seqs[0].pages[0] = -1; /* the oldest page of the long sequence released, and one in the middle */
                seqs[0].pages[2] = -1;
                seqs[2].pages[1] = -1; /* and one of the sequence without rows */
            }
            const std::vector<float> q = gen_normal(rng, (size_t)total_rows(seqs) * (size_t)o.n_heads_q * (size_t)c.d_k);
            for (int32_t chunk : {0, 64}) {
                o.chunk = chunk;
                const std::string what = c.name() + " " + kAttnNames[p.attn] + " " + kModeIds[mode] + " " +
                                         kMassVisIds[vis] + " chunk " + std::to_string(chunk);
                cross_attend(pair, seqs, {0, 1, 2, 3}, q, o, tol_for(c.format), what);
            }
        }
    }
}

std::vector<MassCase> mass_cases() {
    const Fmt formats[] = {
        {GOKV_FORMAT_F32, 0, 0},    {GOKV_FORMAT_F16, 0, 0},     {GOKV_FORMAT_Q8, 32, 0},
        {GOKV_FORMAT_Q4, 32, 0},    {GOKV_FORMAT_Q4, 64, 0},     {GOKV_FORMAT_KIVI2, 32, 0},
        {GOKV_FORMAT_KIVI2, 32, 128}, {GOKV_FORMAT_KIVI4, 32, 32},
    };
    std::vector<MassCase> v;
    for (const Fmt &f : formats)
        for (Attn a : {MHA, GQA, MQA, MLA}) v.push_back({f, a});
    v.push_back({{GOKV_FORMAT_Q4, 32, 0}, GQA, 24}); /* q4 keys in pages that end in a part tile */
    return v;
}
GOKV_INSTANTIATE_CASES(Table, Mass, mass_cases());

/* Long decode (20K tokens: the CPU cuts it by tokens over every kv head, chunks of 4096 and more) beside a
 * short sequence and one without rows; the mass of every token, plain, sinks + window + learned sinks, and
 * holes + released pages; decode and a 4-row speculative step counting its last 2 rows. */
class MassLong : public BackendParamTest<Fmt> {};

TEST_P(MassLong, MatchesReferenceAndCpu) {
    if (!dut_has_caps(GOKV_CAP_MASS)) GTEST_SKIP() << dut_name() << " has no GOKV_CAP_MASS";
    AttnOpts base;
    PoolCfg c = attn_cfg(param(), GQA, &base.n_heads_q);
    const std::vector<int32_t> lens = {20000, 300, 500};
    Pair pair;
    ASSERT_TRUE(build_pair(c, lens, 8181u + (uint32_t)param().format, pair));
    for (int32_t rows : {1, 4}) {
        for (int32_t vis = 0; vis < 3; vis++) {
            std::mt19937 rng(77u + (uint32_t)(rows * 3 + vis));
            AttnOpts o = base;
            o.mass = true;
            o.mass_rows = rows == 4 ? 2 : 0;
            std::vector<AttnSeq> seqs = {attn_seq(pair.dut, 0, rows), attn_seq(pair.dut, 1, rows), attn_seq(pair.dut, 2, 0)};
            if (vis == 1) {
                o.sinks = gen_normal(rng, (size_t)o.n_heads_q, 2.0f);
                o.n_sink_tokens = 4;
                o.window = 3000;
            }
            if (vis == 2) {
                for (AttnSeq &s : seqs) {
                    s.mask.assign((size_t)((s.kv_len + 31) / 32), 0u);
                    std::bernoulli_distribution keep(0.8);
                    for (int32_t t = 0; t < s.kv_len; t++)
                        if (keep(rng)) s.mask[(size_t)(t / 32)] |= 1u << (t % 32);
                }
                seqs[0].pages[3] = -1;
                seqs[0].pages[170] = -1;
            }
            const std::vector<float> q = gen_normal(rng, (size_t)total_rows(seqs) * (size_t)o.n_heads_q * (size_t)c.d_k);
            cross_attend(pair, seqs, {0, 1, 2}, q, o, tol_for(c.format),
                         c.name() + " 20K, rows " + std::to_string(rows) + ", rule " + std::to_string(vis));
        }
    }
}

const Fmt kLongFormats[] = {{GOKV_FORMAT_F16, 0, 0}, {GOKV_FORMAT_Q4, 32, 0}, {GOKV_FORMAT_KIVI2, 32, 128}};
GOKV_INSTANTIATE_CASES(Formats, MassLong, kLongFormats);

/* ---- per-kv-head masks ---- */

struct KvMaskCase {
    Fmt f;
    Attn attn;
    int32_t mode = -1; /* 0 decode, 1 prefill, -1 both */
};

std::string case_name(const KvMaskCase &c) {
    std::string n = fmt_name(c.f) + "_" + kAttnNames[c.attn];
    if (c.mode >= 0) n += c.mode == 0 ? "_decode" : "_prefill";
    return n;
}

std::vector<KvMaskCase> split_case(const KvMaskCase &c) { return {{c.f, c.attn, 0}, {c.f, c.attn, 1}}; }

class KvHeadMasks : public BackendParamTest<KvMaskCase> {};

/* Sequences of 200, 70 and 33 tokens (decode: a row each; prefill: 30, 9 and 1 rows), each kv head with its
 * own random mask; kv head Hkv-1 of the first sequence sees nothing (with one kv head: the third sequence
 * sees nothing). Then learned sinks + sink tokens + window + a released page on top, then the mass with it;
 * and one mask repeated for every kv head equals the shared mask. */
TEST_P(KvHeadMasks, EachHeadSeesItsOwnTokens) {
    if (!dut_has_caps(GOKV_CAP_KV_HEAD_MASKS)) GTEST_SKIP() << dut_name() << " has no GOKV_CAP_KV_HEAD_MASKS";
    const bool has_mass = dut_has_caps(GOKV_CAP_MASS);
    const KvMaskCase p = param();
    AttnOpts base;
    PoolCfg c = attn_cfg(p.f, p.attn, &base.n_heads_q);
    const std::vector<int32_t> lens = {200, 70, 33};
    const int32_t H = c.n_kv_heads;
    const uint32_t seed = (uint32_t)(p.f.format * 7777 + p.f.group * 31 + p.f.residual * 13 + p.attn * 101 + 99);
    Pair pair;
    ASSERT_TRUE(build_pair(c, lens, seed, pair));
    for (int32_t mode = 0; mode < 2; mode++) {
        if (p.mode >= 0 && mode != p.mode) continue;
        const std::vector<int32_t> rows = mode == 0 ? std::vector<int32_t>{1, 1, 1} : std::vector<int32_t>{30, 9, 1};
        std::mt19937 rng(seed + 7 + (uint32_t)mode);
        std::vector<AttnSeq> seqs;
        for (size_t i = 0; i < lens.size(); i++) {
            AttnSeq s = attn_seq(pair.dut, i, rows[i]);
            const size_t W = (size_t)((s.kv_len + 31) / 32);
            s.mask.assign(W * (size_t)H, 0u);
            std::bernoulli_distribution keep(0.7);
            for (int32_t h = 0; h < H; h++) {
                const bool blind = (H > 1 && i == 0 && h == H - 1) || (H == 1 && i == 2);
                for (int32_t t = 0; t < s.kv_len && !blind; t++)
                    if (keep(rng)) s.mask[(size_t)h * W + (size_t)(t / 32)] |= 1u << (t % 32);
            }
            seqs.push_back(s);
        }
        const std::vector<float> q = gen_normal(rng, (size_t)total_rows(seqs) * (size_t)base.n_heads_q * (size_t)c.d_k);
        const std::string what = c.name() + " " + kAttnNames[p.attn] + (mode == 0 ? " decode" : " prefill");
        AttnOpts o = base;
        o.flags = GOKV_ATTEND_MASK_PER_KV_HEAD;
        CrossOut out;
        cross_attend(pair, seqs, {0, 1, 2}, q, o, tol_for(c.format), what + " per-kv-head masks", &out);
        /* the blind kv head's query heads: exact zeros, every row */
        const int32_t G = o.n_heads_q / H, blind_seq = H > 1 ? 0 : 2, blind_h = H - 1;
        int32_t row0 = 0;
        for (int32_t i = 0; i < blind_seq; i++) row0 += rows[(size_t)i];
        for (int32_t r = 0; r < rows[(size_t)blind_seq] && !out.dut.empty(); r++)
            for (int32_t g = 0; g < G; g++)
                for (int32_t j = 0; j < c.d_v; j++)
                    ASSERT_EQ(out.dut[(((size_t)(row0 + r) * (size_t)o.n_heads_q) + (size_t)(blind_h * G + g)) * (size_t)c.d_v +
                                      (size_t)j],
                              0.0f)
                        << what << ": query head " << blind_h * G + g << " of a kv head that sees nothing, row " << r;

        /* learned sinks, sink tokens + window and a released page on top */
        std::vector<AttnSeq> rules = seqs;
        rules[0].pages[1] = -1;
        o.sinks = gen_normal(rng, (size_t)o.n_heads_q, 2.0f);
        o.n_sink_tokens = 4;
        o.window = 40;
        cross_attend(pair, rules, {0, 1, 2}, q, o, tol_for(c.format), what + " per-kv-head masks + window + sinks");

        /* the dequantize-then-attend baseline reads the same masks */
        if (dut_has_caps(GOKV_CAP_BASELINE)) {
            AttnOpts ob = o;
            ob.flags |= GOKV_ATTEND_DEQUANT_BASELINE;
            check_attend(dut(), pair.dut, rules, q, ob, tol_for(c.format), what + " per-kv-head masks + window + sinks, baseline");
        }

        /* with the mass: masked tokens get 0 (check_attend: every token no counted query sees is exactly 0) */
        if (has_mass) {
            o.mass = true;
            for (int32_t mass_rows : {0, 4}) {
                o.mass_rows = mass_rows;
                cross_attend(pair, rules, {0, 1, 2}, q, o, tol_for(c.format),
                             what + " per-kv-head masks + mass, mass_rows " + std::to_string(mass_rows));
            }
            o.mass = false;
        }

        /* one mask repeated for every kv head = the shared mask */
        std::vector<AttnSeq> shared = seqs, repeated = seqs;
        for (size_t i = 0; i < seqs.size(); i++) {
            const size_t W = (size_t)((seqs[i].kv_len + 31) / 32);
            shared[i].mask.assign(seqs[i].mask.begin(), seqs[i].mask.begin() + (long)W);
            repeated[i].mask.clear();
            for (int32_t h = 0; h < H; h++) repeated[i].mask.insert(repeated[i].mask.end(), shared[i].mask.begin(), shared[i].mask.end());
        }
        AttnOpts os = base, orp = base;
        orp.flags = GOKV_ATTEND_MASK_PER_KV_HEAD;
        std::vector<float> a, b;
        ASSERT_EQ(attend(dut(), pair.dut.pool.get(), c, shared, q, os, a), GOKV_OK) << gokv_last_error();
        ASSERT_EQ(attend(dut(), pair.dut.pool.get(), c, repeated, q, orp, b), GOKV_OK) << gokv_last_error();
        EXPECT_LE(rel_err(b, a), 1e-6) << what << ": one mask per kv head, all the same, vs the shared mask";
    }
}

std::vector<KvMaskCase> kv_mask_cases() {
    const Fmt formats[] = {
        {GOKV_FORMAT_F32, 0, 0},     {GOKV_FORMAT_F16, 0, 0},    {GOKV_FORMAT_Q8, 32, 0},
        {GOKV_FORMAT_Q4, 32, 0},     {GOKV_FORMAT_Q4, 64, 0},    {GOKV_FORMAT_KIVI2, 32, 0},
        {GOKV_FORMAT_KIVI2, 32, 128}, {GOKV_FORMAT_KIVI4, 32, 32},
    };
    std::vector<KvMaskCase> v;
    for (const Fmt &f : formats)
        for (Attn a : {MHA, GQA, MQA, MLA}) v.push_back({f, a});
    return v;
}
GOKV_INSTANTIATE_CASES(Table, KvHeadMasks, kv_mask_cases());

} // namespace

namespace {

class MassKnown : public BackendTest {};

/* A call whose sequences have no query rows still writes every mass element (zeros); one token seen alone
 * has mass G per kv head: each of its query heads gives it probability 1 (no learned sink). */
TEST_P(MassKnown, NoRowsAndSingleToken) {
    if (!dut_has_caps(GOKV_CAP_MASS)) GTEST_SKIP() << dut_name() << " has no GOKV_CAP_MASS";
    PoolCfg c = format_cfg(GOKV_FORMAT_F16, 0, 0);
    c.n_kv_heads = 2;
    Cache cache;
    ASSERT_TRUE(build_cache(dut(), c, {70, 1, 33}, 31337u, cache));
    AttnOpts o;
    o.n_heads_q = 6;
    o.mass = true;
    std::vector<float> out, mass;
    const std::vector<AttnSeq> none = {attn_seq(cache, 0, 0), attn_seq(cache, 1, 0), attn_seq(cache, 2, 0)};
    ASSERT_EQ(attend(dut(), cache.pool.get(), c, none, {}, o, out, &mass), GOKV_OK) << gokv_last_error();
    ASSERT_EQ(mass.size(), (size_t)(2 * (70 + 1 + 33)));
    for (size_t i = 0; i < mass.size(); i++) ASSERT_EQ(mass[i], 0.0f) << "element " << i << " of a call without rows";
    std::mt19937 rng(5);
    const std::vector<float> q = gen_normal(rng, 6 * (size_t)c.d_k);
    const std::vector<AttnSeq> one = {attn_seq(cache, 0, 0), attn_seq(cache, 1, 1), attn_seq(cache, 2, 0)};
    check_attend(dut(), cache, one, q, o, 1e-5, "single token", &out, &mass);
    for (int32_t h = 0; h < 2 && mass.size() == (size_t)(2 * 104); h++)
        EXPECT_NEAR(mass[(size_t)(2 * 70 + h)], 3.0f, 3e-6f) << "kv head " << h << ": 3 query heads, probability 1 each";
}
GOKV_INSTANTIATE_ON_BACKENDS(MassKnown);

} // namespace
