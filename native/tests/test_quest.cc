/*
 * test_quest.cc: Quest (gokv_pool_desc.key_bounds; gokv_attend_desc.quest_pages, quest_recent, quest_bounds,
 * quest_selected) on every backend whose device info has GOKV_CAP_QUEST (gokv.h, gokv_layout.h).
 *
 * Every format x {MHA, GQA, MLA}, a batch of decode rows (sequences of 700, 200 and 1 tokens), parts:
 *   - select: under several (K, recent, sink tokens) settings, one with released pages, learned sinks and
 *     per-kv-head masks, one with GOKV_ATTEND_FORCE_SCALAR: (a) each page's bound B >= q_h·k (scale-free) for every key the page holds (from
 *     gokv_pool_read) and every query head h of its kv head, and B matches the bound of the read-back keys'
 *     per-channel min and max rounded outward to fp16; released pages and pages with no key -inf; (b) the
 *     selection equals the top K of the bounds (ties to the older page) among the pages that are neither sink
 *     nor recent pages; (c) the output equals the float64 reference over exactly the chosen, sink and recent
 *     pages (and a KIVI ring's tokens), as per-kv-head masks; with GOKV_CAP_MASS, the attention mass too
 *     (tokens not read: exactly 0).
 *   - full: K at least the competing pages gives the full attention, and lists every competing page.
 *   - copy: the bounds follow a page through gokv_pool_copy, and start afresh when a page is written again from
 *     slot 0 (a sequence of small keys reusing a sequence's pages).
 * The validation (quest_pages without a key_bounds pool, with a window, with several rows) is the core's:
 * test_validation.cc.
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "harness.h"

using namespace gokvtest;

namespace {

enum Part { P_SELECT, P_FULL, P_COPY };
const char *const kPartIds[] = {"select", "full", "copy"};

struct QuestCase {
    Fmt f;
    Attn attn;
    int32_t part = -1; /* a Part, or -1: every part */
};

std::string case_name(const QuestCase &c) {
    std::string n = fmt_name(c.f) + "_" + kAttnNames[c.attn];
    if (c.part >= 0) n += std::string("_") + kPartIds[c.part];
    return n;
}

std::vector<QuestCase> split_case(const QuestCase &c) {
    std::vector<QuestCase> v;
    for (int32_t p = 0; p < 3; p++) v.push_back({c.f, c.attn, p});
    return v;
}

struct QuestOpts {
    int32_t pages = 0, recent = 0;
};

struct QuestOut {
    std::vector<float> out, bounds, mass; /* mass: with GOKV_CAP_MASS */
    std::vector<int32_t> selected;
};

/* gokv_attend with Quest: one decode row per sequence. */
gokv_status quest_attend(gokv_device *dev, gokv_pool *pool, const PoolCfg &c, const std::vector<AttnSeq> &seqs,
                         const std::vector<float> &q, const AttnOpts &o, const QuestOpts &qo, QuestOut &r) {
    size_t n_entries = 0;
    for (const auto &s : seqs) n_entries += s.pages.size();
    r.bounds.assign(n_entries * (size_t)c.n_kv_heads, std::numeric_limits<float>::quiet_NaN());
    r.selected.assign(seqs.size() * (size_t)c.n_kv_heads * (size_t)qo.pages, -7);
    AttnOpts om = o;
    om.mass = dut_has_caps(GOKV_CAP_MASS);
    om.mass_rows = 0;
    r.mass.clear();
    return attend_edited(dev, pool, c, seqs, q, om, r.out, om.mass ? &r.mass : nullptr, [&](gokv_attend_desc &a) {
        a.quest_pages = qo.pages;
        a.quest_recent = qo.recent;
        a.quest_bounds = r.bounds.data();
        a.quest_selected = r.selected.data();
    });
}

uint16_t half_down(float x) {
    uint16_t h = gokv_float_to_half(x);
    if (!(gokv_half_to_float(h) > x)) return h;
    return (h & 0x7fffu) == 0 ? 0x8001u : (h & 0x8000u) ? (uint16_t)(h + 1u) : (uint16_t)(h - 1u);
}
uint16_t half_up(float x) {
    uint16_t h = gokv_float_to_half(x);
    if (!(gokv_half_to_float(h) < x)) return h;
    return (h & 0x7fffu) == 0 ? 0x0001u : (h & 0x8000u) ? (uint16_t)(h - 1u) : (uint16_t)(h + 1u);
}

int32_t n_quant(const PoolCfg &c, int32_t len) {
    return c.kivi() ? gokv_kivi_quantized_len(len, c.group, c.residual) : len;
}

/* The reference bound of entry i of s for kv head h (query row qrow of q), with its tolerance: -inf for released
 * pages and pages with no key in them yet. */
double ref_bound(const PoolCfg &c, const AttnSeq &s, const std::vector<float> &q, int32_t qrow, int32_t Hq, int32_t i,
                 int32_t h, double *tol) {
    const int32_t P = c.page_size, nq = std::min(n_quant(c, s.kv_len), s.kv_len), G = Hq / c.n_kv_heads;
    *tol = 0;
    if (s.pages[(size_t)i] < 0 || (int64_t)i * P >= nq) return -INFINITY;
    const int32_t t1 = std::min(i * P + P, nq);
    double best = -INFINITY;
    for (int32_t g = 0; g < G; g++) {
        const float *qg = q.data() + ((size_t)qrow * Hq + (size_t)h * G + g) * c.d_k;
        double acc = 0, mag = 0;
        for (int32_t ch = 0; ch < c.d_k; ch++) {
            float mn = INFINITY, mx = -INFINITY;
            for (int32_t t = i * P; t < t1; t++) {
                const float x = (*s.k)[((size_t)t * c.n_kv_heads + h) * c.d_k + ch];
                mn = std::min(mn, x), mx = std::max(mx, x);
            }
            const double lo = gokv_half_to_float(half_down(mn)), hi = gokv_half_to_float(half_up(mx));
            acc += std::max((double)qg[ch] * lo, (double)qg[ch] * hi);
            mag += std::fabs((double)qg[ch]) * std::max(std::fabs(lo), std::fabs(hi));
        }
        best = std::max(best, acc);
        *tol = std::max(*tol, 1e-5 * mag + 1e-6);
    }
    return best;
}

/* Checks one Quest call's bounds, selection and output against the reference; returns false on a failure. */
void check_quest(const Cache &cache, const std::vector<AttnSeq> &seqs, const std::vector<float> &q, const AttnOpts &o,
                 const QuestOpts &qo, const std::string &what, bool expect_full = false) {
    const PoolCfg &c = cache.cfg;
    const int32_t H = c.n_kv_heads, G = o.n_heads_q / H, P = c.page_size, K = qo.pages;
    QuestOut r;
    ASSERT_EQ(quest_attend(dut(), cache.pool.get(), c, seqs, q, o, qo, r), GOKV_OK) << what << ": " << gokv_last_error();
    std::vector<AttnSeq> ref_seqs = seqs;
    size_t e0 = 0;
    for (size_t si = 0; si < seqs.size(); si++) {
        const AttnSeq &s = seqs[si];
        const int32_t n = (int32_t)s.pages.size(), nqt = n_quant(c, s.kv_len);
        const int32_t W = (s.kv_len + 31) / 32;
        std::vector<uint32_t> m((size_t)W * H, 0u);
        for (int32_t h = 0; h < H; h++) {
            const std::string at = what + " seq " + std::to_string(si) + " kv head " + std::to_string(h);
            /* (a) bounds */
            std::vector<float> B((size_t)n);
            for (int32_t i = 0; i < n; i++) {
                B[(size_t)i] = r.bounds[(e0 + (size_t)i) * H + (size_t)h];
                double tol;
                const double ref = ref_bound(c, s, q, (int32_t)si, o.n_heads_q, i, h, &tol);
                if (ref == -INFINITY) {
                    EXPECT_EQ(B[(size_t)i], -INFINITY) << at << " entry " << i;
                    continue;
                }
                EXPECT_NEAR(B[(size_t)i], ref, tol) << at << " entry " << i;
                for (int32_t g = 0; g < G; g++) {
                    const float *qg = q.data() + ((size_t)si * o.n_heads_q + (size_t)h * G + g) * c.d_k;
                    for (int32_t t = i * P; t < std::min(i * P + P, nqt); t++) {
                        double dot = 0;
                        for (int32_t ch = 0; ch < c.d_k; ch++) dot += (double)qg[ch] * (*s.k)[((size_t)t * H + h) * c.d_k + ch];
                        ASSERT_GE((double)B[(size_t)i], dot - tol) << at << " entry " << i << " token " << t;
                    }
                }
            }
            /* (b) selection: the top K of the competing pages by the bounds returned, ties to the older page */
            std::vector<int32_t> cand, keep((size_t)n, 0);
            for (int32_t i = 0; i < n; i++) {
                const int64_t first = (int64_t)i * P;
                if (first >= s.kv_len) continue;
                if (first < o.n_sink_tokens || (qo.recent > 0 && first + P > (int64_t)s.kv_len - qo.recent)) {
                    keep[(size_t)i] = 1;
                    continue;
                }
                if (B[(size_t)i] != -INFINITY) cand.push_back(i);
            }
            std::stable_sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) { return B[(size_t)a] > B[(size_t)b]; });
            if (expect_full) {
                EXPECT_LE(cand.size(), (size_t)K) << at;
            }
            if ((int32_t)cand.size() > K) cand.resize((size_t)K);
            std::sort(cand.begin(), cand.end());
            std::vector<int32_t> want(cand);
            want.resize((size_t)K, -1);
            const std::vector<int32_t> got(r.selected.begin() + (long)((si * H + h) * K),
                                           r.selected.begin() + (long)((si * H + h + 1) * K));
            EXPECT_EQ(got, want) << at;
            for (int32_t i : cand) keep[(size_t)i] = 1;
            /* (c) the tokens read: kept pages and the ring's tokens, within the call's own mask */
            for (int32_t t = 0; t < s.kv_len; t++) {
                const bool read = keep[(size_t)(t / P)] || t >= nqt;
                bool valid = true;
                if (!s.mask.empty()) {
                    const size_t w = (o.flags & GOKV_ATTEND_MASK_PER_KV_HEAD) ? (size_t)h * W : 0;
                    valid = (s.mask[w + (size_t)(t / 32)] >> (t % 32)) & 1u;
                }
                if (read && valid) m[(size_t)h * W + (size_t)(t / 32)] |= 1u << (t % 32);
            }
        }
        ref_seqs[si].mask = m;
        e0 += (size_t)n;
    }
    AttnOpts ro = o;
    ro.flags |= GOKV_ATTEND_MASK_PER_KV_HEAD;
    std::vector<double> ref, ref_mass;
    ref_attend(c, ref_seqs, q, ro, ref, nullptr, &ref_mass);
    EXPECT_TRUE(all_finite(r.out)) << what;
    EXPECT_LE(rel_err(r.out, ref), tol_for(c.format)) << what;
    if (!r.mass.empty()) { /* tokens not read have mass 0 */
        ASSERT_EQ(r.mass.size(), ref_mass.size()) << what;
        EXPECT_TRUE(all_finite(r.mass)) << what << " (mass)";
        EXPECT_LE(mass_err(r.mass, ref_mass), tol_for(c.format)) << what << " (mass)";
        for (size_t i = 0; i < r.mass.size(); i++)
            if (ref_mass[i] == 0.0) {
                EXPECT_EQ(r.mass[i], 0.0f) << what << " mass element " << i;
                if (r.mass[i] != 0.0f) break;
            }
    }
    if (expect_full) { /* the full attention itself, without Quest */
        std::vector<double> full;
        ref_attend(c, seqs, q, o, full);
        EXPECT_LE(rel_err(r.out, full), tol_for(c.format)) << what << " (full)";
    }
}

class Quest : public BackendParamTest<QuestCase> {};

TEST_P(Quest, MatchesReference) {
    if (!dut_has_caps(GOKV_CAP_QUEST)) GTEST_SKIP() << dut_name() << " has no GOKV_CAP_QUEST";
    const QuestCase p = param();
    AttnOpts base;
    PoolCfg c = attn_cfg(p.f, p.attn, &base.n_heads_q);
    c.key_bounds = 1;
    const std::vector<int32_t> lens = {700, 200, 1};
    const uint32_t seed = (uint32_t)(p.f.format * 1000003 + p.f.group * 7919 + p.f.residual * 131 + p.attn * 17 + 777);
    Cache cache;
    ASSERT_TRUE(build_cache(dut(), c, lens, seed, cache, 64));
    std::vector<AttnSeq> seqs;
    for (size_t i = 0; i < lens.size(); i++) seqs.push_back(attn_seq(cache, i, 1));
    std::mt19937 rng(seed + 1);
    const std::vector<float> q = gen_normal(rng, seqs.size() * (size_t)base.n_heads_q * (size_t)c.d_k);
    const std::string name = c.name() + " " + kAttnNames[p.attn];
    if (p.part < 0 || p.part == P_SELECT) {
        struct Setting {
            int32_t pages, recent, sinks;
            bool holes, scalar;
        };
        for (const Setting st : {Setting{3, 0, 0, false, false}, Setting{2, 64, 4, false, false}, Setting{2, 64, 4, false, true},
                                 Setting{4, 100, 70, true, false}, Setting{1, 1, 1, false, false}}) {
            AttnOpts o = base;
            o.n_sink_tokens = st.sinks;
            if (st.scalar) o.flags |= GOKV_ATTEND_FORCE_SCALAR;
            std::vector<AttnSeq> ss = seqs;
            if (st.holes) {
                ss[0].pages[2] = -1;
                ss[0].pages[5] = -1;
                o.sinks = gen_normal(rng, (size_t)o.n_heads_q, 1.0f);
                o.flags |= GOKV_ATTEND_MASK_PER_KV_HEAD;
                for (AttnSeq &s : ss) {
                    const int32_t W = (s.kv_len + 31) / 32;
                    s.mask.assign((size_t)W * c.n_kv_heads, 0u);
                    std::bernoulli_distribution keepb(0.8);
                    for (int32_t h = 0; h < c.n_kv_heads; h++)
                        for (int32_t t = 0; t < s.kv_len; t++)
                            if (keepb(rng)) s.mask[(size_t)h * W + (size_t)(t / 32)] |= 1u << (t % 32);
                }
            }
            check_quest(cache, ss, q, o, {st.pages, st.recent},
                        name + " K " + std::to_string(st.pages) + " recent " + std::to_string(st.recent) + " sinks " +
                            std::to_string(st.sinks) + (st.holes ? " holes" : "") + (st.scalar ? " scalar" : ""));
        }
    }
    if (p.part < 0 || p.part == P_FULL) {
        for (int32_t recent : {0, 64}) {
            AttnOpts o = base;
            check_quest(cache, seqs, q, o, {64, recent}, name + " full, recent " + std::to_string(recent), true);
        }
    }
    if (p.part < 0 || p.part == P_COPY) {
        /* copy sequence 1's pages to free pages: the copies' bounds are the originals' */
        const Seq &s1 = cache.seqs[1];
        const int32_t n1 = (s1.len + c.page_size - 1) / c.page_size;
        std::vector<int32_t> used(c.n_pages, 0), dst;
        for (const Seq &s : cache.seqs)
            for (int32_t id : s.pages) used[(size_t)id] = 1;
        for (int32_t id = c.n_pages - 1; id >= 0 && (int32_t)dst.size() < n1; id--)
            if (!used[(size_t)id]) dst.push_back(id);
        ASSERT_EQ((int32_t)dst.size(), n1) << "pool too small";
        gokv_copy_desc cd;
        std::memset(&cd, 0, sizeof cd);
        cd.struct_size = sizeof cd;
        cd.n_pages = n1;
        cd.src_pages = s1.pages.data();
        cd.dst_pages = dst.data();
        ASSERT_EQ(gokv_pool_copy(cache.pool.get(), &cd), GOKV_OK) << gokv_last_error();
        AttnOpts o = base;
        std::vector<AttnSeq> orig = {seqs[1]}, copy = {seqs[1]};
        for (int32_t i = 0; i < n1; i++) copy[0].pages[(size_t)i] = dst[(size_t)i];
        const std::vector<float> q1(q.begin() + (long)base.n_heads_q * c.d_k, q.begin() + 2L * base.n_heads_q * c.d_k);
        QuestOut ra, rb;
        ASSERT_EQ(quest_attend(dut(), cache.pool.get(), c, orig, q1, o, {2, 0}, ra), GOKV_OK) << gokv_last_error();
        ASSERT_EQ(quest_attend(dut(), cache.pool.get(), c, copy, q1, o, {2, 0}, rb), GOKV_OK) << gokv_last_error();
        for (size_t i = 0; i < ra.bounds.size(); i++) {
            if (std::isinf(ra.bounds[i])) EXPECT_EQ(ra.bounds[i], rb.bounds[i]) << name << " copy, entry " << i;
            else EXPECT_NEAR(rb.bounds[i], ra.bounds[i], 1e-5 * std::fabs(ra.bounds[i]) + 1e-6) << name << " copy, entry " << i;
        }
        EXPECT_EQ(ra.selected, rb.selected) << name << " copy";
        check_quest(cache, copy, q1, o, {2, 0}, name + " copied pages");
        /* sequence 0's pages written again from slot 0 with small keys: its bounds are the new keys' alone */
        Seq again;
        again.pages = cache.seqs[0].pages;
        again.slot = cache.seqs[0].slot;
        const int32_t n_new = 300;
        std::vector<float> k = gen_keys(rng, n_new, c.n_kv_heads, c.d_k), v = gen_values(rng, n_new, c.n_kv_heads, c.d_v);
        for (float &x : k) x *= 0.01f;
        ASSERT_EQ(append1(cache.pool.get(), c, again, k, v), GOKV_OK) << gokv_last_error();
        std::vector<float> kd, vd;
        ASSERT_EQ(read_seq(cache.pool.get(), c, again, kd, vd), GOKV_OK) << gokv_last_error();
        AttnSeq a;
        a.kv_len = again.len;
        a.q_pos = again.len - 1;
        a.slot = again.slot;
        a.pages = again.table(again.len, c.page_size);
        a.k = &kd;
        a.v = &vd;
        const std::vector<float> q0(q.begin(), q.begin() + (long)base.n_heads_q * c.d_k);
        check_quest(cache, {a}, q0, o, {2, 64}, name + " pages written again");
    }
}

std::vector<QuestCase> quest_cases() {
    const Fmt formats[] = {
        {GOKV_FORMAT_F32, 0, 0},    {GOKV_FORMAT_F16, 0, 0},       {GOKV_FORMAT_Q8, 32, 0},
        {GOKV_FORMAT_Q4, 32, 0},    {GOKV_FORMAT_Q4, 64, 0},       {GOKV_FORMAT_KIVI2, 32, 0},
        {GOKV_FORMAT_KIVI2, 32, 128}, {GOKV_FORMAT_KIVI4, 32, 32},
    };
    std::vector<QuestCase> v;
    for (const Fmt &f : formats)
        for (Attn a : {MHA, GQA, MLA}) v.push_back({f, a});
    return v;
}
GOKV_INSTANTIATE_CASES(Table, Quest, quest_cases());

/* What the core rejects only on a pool with key_bounds (test_validation.cc has the rest): Quest with a window,
 * with a sequence of several query rows, with the baseline; a rejected call writes no Quest output. */
class QuestValidation : public BackendTest {};

TEST_P(QuestValidation, RejectsAndWritesNothing) {
    if (!dut_has_caps(GOKV_CAP_QUEST)) GTEST_SKIP() << dut_name() << " has no GOKV_CAP_QUEST";
    AttnOpts o;
    PoolCfg c = attn_cfg({GOKV_FORMAT_Q4, 32, 0}, GQA, &o.n_heads_q);
    c.key_bounds = 1;
    Cache cache;
    ASSERT_TRUE(build_cache(dut(), c, {300, 100}, 5u, cache));
    std::vector<AttnSeq> seqs = {attn_seq(cache, 0, 1), attn_seq(cache, 1, 1)};
    std::mt19937 rng(6);
    std::vector<float> q = gen_normal(rng, 3 * (size_t)o.n_heads_q * (size_t)c.d_k);
    QuestOut r;
    ASSERT_EQ(quest_attend(dut(), cache.pool.get(), c, seqs, q, o, {2, 0}, r), GOKV_OK) << gokv_last_error();
    struct Bad {
        const char *what, *needle;
        int32_t window, rows;
        uint32_t flags;
    };
    for (const Bad &b : {Bad{"window", "window", 16, 1, 0u}, Bad{"two rows", "rows", 0, 2, 0u},
                         Bad{"baseline", "baseline", 0, 1, (uint32_t)GOKV_ATTEND_DEQUANT_BASELINE}}) {
        AttnOpts ob = o;
        ob.window = b.window;
        ob.flags = b.flags;
        std::vector<AttnSeq> sb = seqs;
        sb[1].n_rows = b.rows;
        sb[1].q_pos = sb[1].kv_len - b.rows;
        QuestOut rb;
        const gokv_status st = quest_attend(dut(), cache.pool.get(), c, sb, q, ob, {2, 0}, rb);
        EXPECT_EQ(st, GOKV_EINVAL) << b.what;
        EXPECT_NE(std::string(gokv_last_error()).find(b.needle), std::string::npos) << b.what << ": " << gokv_last_error();
        EXPECT_TRUE(std::all_of(rb.bounds.begin(), rb.bounds.end(), [](float x) { return std::isnan(x); })) << b.what;
        EXPECT_TRUE(std::all_of(rb.selected.begin(), rb.selected.end(), [](int32_t x) { return x == -7; })) << b.what;
    }
}
GOKV_INSTANTIATE_ON_BACKENDS(QuestValidation);

} // namespace
