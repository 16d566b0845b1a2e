/*
 * test_attend_prefill.cc: causal prefill and varlen batches on every backend (docs/architecture.md §5): T
 * query rows over a cached prefix plus the T new tokens (written just before), every visibility rule,
 * against the float64 reference and the CPU backend; batches mixing decode and prefill rows of different
 * lengths; gokv_append_attend (one call = write then attend; a rejected step writes nothing).
 */
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "harness.h"

using namespace gokvtest;

namespace {

struct Shape {
    int32_t prefix, T; /* cached tokens, then T new ones that attend */
};
const Shape kShapes[] = {{0, 1}, {0, 37}, {150, 50}, {64, 128}, {3, 200}};
constexpr int32_t kNumShapes = (int32_t)(sizeof kShapes / sizeof kShapes[0]);

struct PrefillCase {
    Fmt f;
    Attn attn; /* MHA (2q/2kv d64), GQA (8q/2kv d64) or MLA (4q over 96, V = first 64) */
    int32_t page_size = 0; /* 0: PoolCfg's (64) */
    int32_t shape = -1;    /* an index into kShapes, or -1: every shape */
};
std::string case_name(const PrefillCase &c) {
    std::string n = fmt_name(c.f) + "_" + kAttnNames[c.attn] + (c.page_size ? "_p" + std::to_string(c.page_size) : "");
    if (c.shape >= 0)
        n += "_prefix" + std::to_string(kShapes[c.shape].prefix) + "_T" + std::to_string(kShapes[c.shape].T);
    return n;
}

/* One test per shape where runs are split (harness.h). */
std::vector<PrefillCase> split_case(const PrefillCase &c) {
    std::vector<PrefillCase> v;
    for (int32_t i = 0; i < kNumShapes; i++) v.push_back({c.f, c.attn, c.page_size, i});
    return v;
}

class Prefill : public BackendParamTest<PrefillCase> {};

/* For each shape (cached prefix, T new tokens) and visibility rule (plain, learned sinks, sink tokens +
 * window, holes + a released page, window narrower than the sinks): the prefix is written first, the T new
 * tokens in a second write (as an engine does), then the T rows attend causally. */
TEST_P(Prefill, MatchesReferenceAndCpu) {
    const PrefillCase p = param();
    PoolCfg c = format_cfg(p.f.format, p.f.group, p.f.residual);
    AttnOpts base;
    if (p.attn == MHA) { c.n_kv_heads = 2; base.n_heads_q = 2; c.d_k = c.d_v = 64; }
    if (p.attn == GQA) { c.n_kv_heads = 2; base.n_heads_q = 8; c.d_k = c.d_v = 64; }
    if (p.attn == MLA) { c.n_kv_heads = 1; base.n_heads_q = 4; c.d_k = 96; c.d_v = 64; c.v_is_k_prefix = 1; }
    if (p.page_size) c.page_size = p.page_size;
    for (int32_t si = 0; si < kNumShapes; si++) {
        if (p.shape >= 0 && si != p.shape) continue;
        const Shape &sh = kShapes[si];
        const uint32_t seed = (uint32_t)(p.f.format * 7777 + p.f.residual * 13 + p.attn * 101 + sh.prefix + sh.T);
        const std::string shape = " prefix " + std::to_string(sh.prefix) + " T " + std::to_string(sh.T);
        Pair pair;
        ASSERT_TRUE(build_pair(c, {sh.prefix}, seed, pair, sh.T)) << shape;
        std::mt19937 rng(seed + 5);
        std::vector<float> k = gen_keys(rng, sh.T, c.n_kv_heads, c.d_k);
        std::vector<float> v = c.v_is_k_prefix ? std::vector<float>() : gen_values(rng, sh.T, c.n_kv_heads, c.d_v);
        ASSERT_TRUE(append_pair(pair, {0}, {k}, {v})) << shape;
        expect_read_parity(pair, c.name() + shape);
        const int32_t L = sh.prefix + sh.T;
        for (int32_t vis = 0; vis < 5; vis++) {
            static const char *const names[] = {" plain", " learned sinks", " sinks+window", " holes", " window<sinks"};
            AttnOpts o = base;
            AttnSeq s = attn_seq(pair.dut, 0, sh.T);
            if (vis == 1) o.sinks = gen_normal(rng, (size_t)o.n_heads_q, 2.0f);
            if (vis == 2) {
                o.n_sink_tokens = 4;
                o.window = std::max(5, L / 5);
            }
            if (vis == 3) {
                s.mask.assign((size_t)((L + 31) / 32), 0u);
                std::bernoulli_distribution keep(0.7);
                for (int32_t t = 0; t < L; t++)
                    if (keep(rng)) s.mask[(size_t)(t / 32)] |= 1u << (t % 32);
                if (L > 2 * c.page_size) s.pages[0] = -1;
            }
            if (vis == 4) {
                o.sinks = gen_normal(rng, (size_t)o.n_heads_q, 2.0f);
                o.n_sink_tokens = 8;
                o.window = 3;
            }
            const std::vector<float> q = gen_normal(rng, (size_t)sh.T * (size_t)o.n_heads_q * (size_t)c.d_k);
            cross_attend(pair, {s}, {0}, q, o, tol_for(c.format), c.name() + " " + kAttnNames[p.attn] + shape + names[vis]);
        }
    }
}

std::vector<PrefillCase> prefill_cases() {
    const Fmt formats[] = {{GOKV_FORMAT_F32, 0, 0},     {GOKV_FORMAT_F16, 0, 0},      {GOKV_FORMAT_Q8, 32, 0},
                           {GOKV_FORMAT_Q4, 32, 0},     {GOKV_FORMAT_Q4, 64, 0},      {GOKV_FORMAT_KIVI2, 32, 0},
                           {GOKV_FORMAT_KIVI2, 32, 128}, {GOKV_FORMAT_KIVI4, 32, 0},  {GOKV_FORMAT_KIVI4, 32, 32},
                           {GOKV_FORMAT_KIVI4, 32, 128}};
    std::vector<PrefillCase> v;
    for (const Fmt &f : formats)
        for (Attn a : {MHA, GQA, MLA}) {
            if (f.group == 64 && a == MLA) continue; /* MLA dims here are multiples of 32 only */
            v.push_back({f, a});
        }
    /* q4 keys in pages that end in a part tile (P % 16 != 0): the new tokens' write and the windows start
     * inside tiles; and MLA's plain q4 rows in such pages */
    v.push_back({{GOKV_FORMAT_Q4, 32, 0}, GQA, 24});
    v.push_back({{GOKV_FORMAT_Q4, 64, 0}, MHA, 40});
    v.push_back({{GOKV_FORMAT_Q4, 32, 0}, MLA, 24});
    return v;
}
GOKV_INSTANTIATE_CASES(Table, Prefill, prefill_cases());

class Batch : public BackendParamTest<Fmt> {};

/* One call over varlen sequences mixing decode and prefill rows (lengths 300, 45, 1, 130, 8), with a
 * released page, holes in one sequence, window + sink tokens + learned sinks; then each sequence alone
 * gives the same rows (1e-6: batch composition must not change a sequence's arithmetic). */
TEST_P(Batch, MixedDecodeAndPrefill) {
    PoolCfg c = format_cfg(param().format, param().group, param().residual);
    c.n_kv_heads = 2;
    Pair pair;
    ASSERT_TRUE(build_pair(c, {300, 45, 1, 130, 8}, 1001u, pair));
    const std::vector<int32_t> rows = {1, 20, 1, 130, 8};
    std::vector<AttnSeq> seqs;
    for (size_t i = 0; i < rows.size(); i++) seqs.push_back(attn_seq(pair.dut, i, rows[i]));
    seqs[0].pages[2] = -1;
    seqs[3].mask.assign((size_t)((seqs[3].kv_len + 31) / 32), 0xfff0fff7u);
    const std::vector<size_t> src = {0, 1, 2, 3, 4};
    for (bool rules : {false, true}) {
        AttnOpts o;
        o.n_heads_q = 6;
        if (rules) {
            o.n_sink_tokens = 2;
            o.window = 40;
            o.sinks = {0.1f, -1.0f, 2.0f, 0.0f, 1.5f, -0.5f};
        }
        std::mt19937 rng(3);
        const std::vector<float> q = gen_normal(rng, (size_t)total_rows(seqs) * 6 * (size_t)c.d_k);
        const std::string what = c.name() + (rules ? " mixed batch, window + sinks" : " mixed batch");
        CrossOut all;
        cross_attend(pair, seqs, src, q, o, tol_for(c.format), what, &all);
        size_t row = 0;
        const size_t qrow = 6 * (size_t)c.d_k, orow = 6 * (size_t)c.d_v;
        for (size_t i = 0; i < seqs.size() && all.dut.size() == (size_t)total_rows(seqs) * orow; i++) {
            const std::vector<float> qi(q.begin() + (long)(row * qrow), q.begin() + (long)((row + (size_t)rows[i]) * qrow));
            std::vector<float> one;
            check_attend(dut(), pair.dut, {seqs[i]}, qi, o, tol_for(c.format), what + " alone", &one);
            const std::vector<float> part(all.dut.begin() + (long)(row * orow),
                                          all.dut.begin() + (long)((row + (size_t)rows[i]) * orow));
            EXPECT_LE(rel_err(part, one), 1e-6) << what << " sequence " << i << ": in the batch vs alone";
            row += (size_t)rows[i];
        }
    }
}

/* Query rows that start before the end (q_pos < kv_len - T: speculative verification over tokens already
 * cached) see only positions <= their own. */
TEST_P(Batch, RowsBeforeTheEndAreCausal) {
    PoolCfg c = format_cfg(param().format, param().group, param().residual);
    Pair pair;
    ASSERT_TRUE(build_pair(c, {200}, 2002u, pair));
    AttnSeq s = attn_seq(pair.dut, 0, 10);
    s.q_pos = 100; /* rows at 100..109 of a 200-token sequence */
    AttnOpts o;
    o.n_heads_q = 1;
    std::mt19937 rng(4);
    const std::vector<float> q = gen_normal(rng, 10 * (size_t)c.d_k);
    cross_attend(pair, {s}, {0}, q, o, tol_for(c.format), c.name() + " rows before the end");
}

/* gokv_append_attend: one call equals a write then an attend (outputs and stored data), and a
 * step rejected for a bad attend argument (NaN sink logit) writes nothing. */
TEST_P(Batch, AppendAttendEqualsWriteThenAttend) {
    PoolCfg c = format_cfg(param().format, param().group, param().residual);
    c.n_kv_heads = 2;
    Pair a, b;
    ASSERT_TRUE(build_pair(c, {120, 40}, 3003u, a, 40));
    ASSERT_TRUE(build_pair(c, {120, 40}, 3003u, b, 40));
    const std::vector<int32_t> n_new = {1, 33};
    std::mt19937 rng(3004);
    std::vector<std::vector<float>> ks, vs;
    for (int32_t n : n_new) {
        ks.push_back(gen_keys(rng, n, 2, c.d_k));
        vs.push_back(gen_values(rng, n, 2, c.d_v));
    }
    /* b.dut: the fused call, built by hand */
    WriteArrays wa;
    for (size_t i = 0; i < 2; i++) wa.add(c, b.dut.seqs[i], ks[i], vs[i]);
    gokv_write_desc w = wa.desc(c);
    /* a: write, then attend, on both backends */
    ASSERT_TRUE(append_pair(a, {0, 1}, ks, vs));
    expect_read_parity(a, c.name() + " after the step's write");
    const std::vector<AttnSeq> seqs = {attn_seq(a.dut, 0, 1), attn_seq(a.dut, 1, 33)};
    AttnOpts o;
    o.n_heads_q = 4;
    o.sinks = {0.5f, -0.5f, 1.0f, 0.0f};
    const std::vector<float> q = gen_normal(rng, 34 * 4 * (size_t)c.d_k);
    CrossOut out_a;
    cross_attend(a, seqs, {0, 1}, q, o, tol_for(c.format), c.name() + " write then attend", &out_a);

    std::vector<int32_t> qind{0, 1, 34}, kvl, qpos;
    for (const auto &s : seqs) {
        kvl.push_back(s.kv_len);
        qpos.push_back(s.q_pos);
    }
    std::vector<float> out_b(out_a.dut.size(), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> bad_sinks = {0.0f, std::numeric_limits<float>::quiet_NaN(), 0.0f, 0.0f};
    gokv_attend_desc at;
    std::memset(&at, 0, sizeof at);
    at.struct_size = sizeof at;
    at.pool = b.dut.pool.get();
    at.n_seqs = 2;
    at.q_indptr = qind.data();
    at.page_indptr = wa.pind.data();
    at.page_ids = wa.pids.data();
    at.kv_len = kvl.data();
    at.q_pos = qpos.data();
    at.residual_slot = c.kivi() ? wa.slots.data() : nullptr;
    at.n_heads_q = 4;
    at.q = q.data();
    at.out = out_b.data();
    at.scale = eff_scale(c, o);
    at.sink_logits = bad_sinks.data();
    EXPECT_EQ(gokv_append_attend(dut(), &w, &at), GOKV_EINVAL) << c.name();
    EXPECT_NE(std::string(gokv_last_error()).find("sink_logits"), std::string::npos) << gokv_last_error();
    std::vector<float> k1, v1;
    ASSERT_EQ(read_seq(b.dut.pool.get(), c, b.dut.seqs[1], k1, v1), GOKV_OK) << gokv_last_error();
    EXPECT_EQ(k1, b.dut.kdq[1]) << c.name() << ": a rejected append_attend changed the cache";

    at.sink_logits = o.sinks.data();
    ASSERT_EQ(gokv_append_attend(dut(), &w, &at), GOKV_OK) << c.name() << ": " << gokv_last_error();
    EXPECT_TRUE(all_finite(out_b)) << c.name() << ": output elements left unwritten";
    EXPECT_LE(rel_err(out_b, out_a.dut), 1e-6) << c.name() << ": fused append_attend vs write then attend";
    for (size_t i = 0; i < 2; i++) {
        b.dut.seqs[i].len += n_new[i];
        std::vector<float> kb, vb;
        ASSERT_EQ(read_seq(b.dut.pool.get(), c, b.dut.seqs[i], kb, vb), GOKV_OK) << gokv_last_error();
        EXPECT_EQ(kb, a.dut.kdq[i]) << c.name() << " sequence " << i << ": K stored by append_attend";
        EXPECT_EQ(vb, a.dut.vdq[i]) << c.name() << " sequence " << i << ": V stored by append_attend";
    }
    /* a NULL write is a plain attend */
    std::fill(out_b.begin(), out_b.end(), std::numeric_limits<float>::quiet_NaN());
    ASSERT_EQ(gokv_append_attend(dut(), nullptr, &at), GOKV_OK) << gokv_last_error();
    EXPECT_LE(rel_err(out_b, out_a.dut), 1e-6) << c.name() << ": append_attend without a write";
}

const Fmt kBatchFormats[] = {{GOKV_FORMAT_F32, 0, 0},      {GOKV_FORMAT_F16, 0, 0},     {GOKV_FORMAT_Q8, 32, 0},
                             {GOKV_FORMAT_Q4, 32, 0},      {GOKV_FORMAT_Q4, 64, 0},     {GOKV_FORMAT_KIVI2, 32, 0},
                             {GOKV_FORMAT_KIVI2, 32, 64},  {GOKV_FORMAT_KIVI4, 32, 128}};
GOKV_INSTANTIATE_CASES(Formats, Batch, kBatchFormats);

} // namespace
