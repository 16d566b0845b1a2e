/*
 * test_store.cc: what every backend stores (docs/architecture.md §4): after the same writes, gokv_pool_read
 * gives the CPU's floats bit for bit (harness.h states the one-step exception), for every format; the pages
 * hold bridge/gokv_layout.h's bytes (q4 keys in 16-token tiles, also with a part tile), follow the
 * quantization rule (format_check.h) and equal the CPU's; KIVI appends of every size crossing residual
 * flushes; page and residual slot copies (gokv_pool_copy); released pages read as zeros.
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "format_check.h"
#include "harness.h"

using namespace gokvtest;

namespace {

struct StoreCase {
    Fmt f;
    bool mla;
    int32_t page_size = 0; /* 0: PoolCfg's (64) */
};
std::string page_suffix(int32_t page_size) { return page_size ? "_p" + std::to_string(page_size) : ""; }
std::string case_name(const StoreCase &c) { return fmt_name(c.f) + (c.mla ? "_mla" : "_gqa") + page_suffix(c.page_size); }

class Store : public BackendParamTest<StoreCase> {
protected:
    PoolCfg cfg() const {
        const Fmt f = param().f;
        PoolCfg c = format_cfg(f.format, f.group, f.residual);
        if (param().mla) {
            c.n_kv_heads = 1;
            c.v_is_k_prefix = 1;
            c.d_k = f.group <= 32 ? 96 : 3 * f.group;
            c.d_v = f.group <= 32 ? 64 : f.group;
        } else {
            c.n_kv_heads = 2;
            c.d_k = c.d_v = 128;
        }
        if (param().page_size) { /* as many tokens as the default pages hold */
            c.n_pages = (c.n_pages * c.page_size + param().page_size - 1) / param().page_size;
            c.page_size = param().page_size;
        }
        return c;
    }
};

/* Sequences of several lengths written in one call read back as on the CPU: from position 0, and from
 * positions inside a page, a KIVI group, and the ring. */
TEST_P(Store, WriteReadParity) {
    const PoolCfg c = cfg();
    Pair pair;
    ASSERT_TRUE(build_pair(c, {1, 37, 200, 700}, 21u, pair));
    expect_read_parity(pair, c.name());
    for (int32_t start : {5, 64, 650}) {
        const Seq &sv = pair.dut.seqs[3], &sc = pair.cpu.seqs[3];
        std::vector<float> kv, vv, kc, vc;
        ASSERT_EQ(read_seq(pair.dut.pool.get(), c, sv, kv, vv, start), GOKV_OK) << gokv_last_error();
        ASSERT_EQ(read_seq(pair.cpu.pool.get(), c, sc, kc, vc, start), GOKV_OK) << gokv_last_error();
        EXPECT_TRUE(all_finite(kv) && all_finite(vv)) << "read from " << start << " left elements unwritten";
        expect_seq_parity(pair.cpu.pool.get(), c, sc, start, kv, vv, kc, vc,
                          c.name() + " read from position " + std::to_string(start));
    }
}

/* Appends of random sizes (0 to 70 tokens, two sequences per call, several calls crossing KIVI flushes and
 * page boundaries) read back as on the CPU after every call, and as one write of all tokens at the end. */
TEST_P(Store, RandomAppendsParity) {
    PoolCfg c = cfg();
    c.n_pages = (40 * 64 + c.page_size - 1) / c.page_size; /* as many tokens as 40 pages of 64 */
    c.n_slots = c.kivi() ? 4 : 0;
    Pair pair;
    ASSERT_TRUE(build_pair(c, {0, 0}, 99u, pair, 700));
    std::mt19937 rng(100);
    std::uniform_int_distribution<int32_t> chunk(0, 70);
    const int32_t n0 = 333, n1 = 290;
    int step = 0;
    while (pair.dut.seqs[0].len < n0 || pair.dut.seqs[1].len < n1) {
        const int32_t c0 = std::min(chunk(rng), n0 - pair.dut.seqs[0].len);
        const int32_t c1 = std::min(chunk(rng), n1 - pair.dut.seqs[1].len);
        std::vector<std::vector<float>> ks = {gen_keys(rng, c0, c.n_kv_heads, c.d_k), gen_keys(rng, c1, c.n_kv_heads, c.d_k)};
        std::vector<std::vector<float>> vs;
        if (!c.v_is_k_prefix)
            vs = {gen_values(rng, c0, c.n_kv_heads, c.d_v), gen_values(rng, c1, c.n_kv_heads, c.d_v)};
        else
            vs = {{}, {}};
        ASSERT_TRUE(append_pair(pair, {0, 1}, ks, vs)) << "step " << step;
        expect_read_parity(pair, c.name() + " after step " + std::to_string(step) + " (lengths " +
                                     std::to_string(pair.dut.seqs[0].len) + ", " + std::to_string(pair.dut.seqs[1].len) + ")");
        if (HasFailure()) break;
        step++;
    }
    /* the whole input written at once, on the backend under test */
    PoolPtr one = make_pool(dut(), pair.dut.cfg);
    ASSERT_TRUE(one);
    for (size_t i = 0; i < 2; i++) {
        Seq s;
        s.pages = pair.dut.seqs[i].pages;
        s.slot = pair.dut.seqs[i].slot;
        ASSERT_EQ(append1(one.get(), pair.dut.cfg, s, pair.dut.seqs[i].k, pair.dut.seqs[i].v), GOKV_OK) << gokv_last_error();
        std::vector<float> k, v;
        ASSERT_EQ(read_seq(one.get(), pair.dut.cfg, s, k, v), GOKV_OK) << gokv_last_error();
        EXPECT_EQ(k, pair.dut.kdq[i]) << "sequence " << i << ": K written in steps vs at once";
        EXPECT_EQ(v, pair.dut.vdq[i]) << "sequence " << i << ": V written in steps vs at once";
    }
}

/* Raw page bytes, by page id (gokv_pool_page_bytes). */
std::vector<std::vector<uint8_t>> all_pages(gokv_pool *pool, int32_t n_pages) {
    const uint64_t page_bytes = gokv_pool_layout(pool)->page_bytes;
    std::vector<std::vector<uint8_t>> pages((size_t)n_pages, std::vector<uint8_t>(page_bytes));
    for (int32_t pg = 0; pg < n_pages; pg++) {
        const gokv_status st = gokv_pool_page_bytes(pool, pg, pages[(size_t)pg].data(), page_bytes);
        EXPECT_EQ(st, GOKV_OK) << "page " << pg << ": " << gokv_last_error();
        if (st != GOKV_OK) break;
    }
    return pages;
}

/* The pages hold bridge/gokv_layout.h's bytes. (a) Per-token quantized pools: every key and value element
 * decoded from the pool's raw pages, at the offsets the layout gives (gokv_k_code_byte: q4 keys in
 * tiles of 16 tokens, dword-column-major, the last one part-filled when P % 16 != 0; MLA's plain rows), is
 * what gokv_pool_read returned, bit for bit. (b) Every page equals the CPU backend's byte for byte, but
 * for codes one step apart (harness.h's near-ties, at most 1 in 1000 elements): so the tiles' padding
 * and every byte between the sections are untouched too. */
TEST_P(Store, PagesHoldTheLayoutsBytes) {
    const PoolCfg c = cfg();
    Pair pair;
    ASSERT_TRUE(build_pair(c, {1, 37, 200, 700}, 21u, pair));
    const gokv_layout &L = *gokv_pool_layout(pair.dut.pool.get());
    ASSERT_EQ(L.k_tiled, c.format == GOKV_FORMAT_Q4 && !c.v_is_k_prefix) << "q4 keys are tiled unless MLA's";
    ASSERT_EQ(L.page_bytes, gokv_pool_layout(pair.cpu.pool.get())->page_bytes);
    const std::vector<std::vector<uint8_t>> pages = all_pages(pair.dut.pool.get(), c.n_pages);
    const std::vector<std::vector<uint8_t>> cpu_pages = all_pages(pair.cpu.pool.get(), c.n_pages);
    ASSERT_FALSE(HasFailure());
    const int32_t H = c.n_kv_heads, P = c.page_size, g = c.group, bits = L.bits;
    const size_t row = (size_t)H * (size_t)(c.d_k + (c.v_is_k_prefix ? 0 : c.d_v)); /* elements per token */
    size_t n_elems = 0;
    for (const Seq &s : pair.dut.seqs) n_elems += (size_t)s.len * row;

    if (c.quantized() && !c.kivi()) { /* (a) */
        size_t bad = 0;
        std::string first_bad;
        /* element ch of kv head h's row at slot of page: its code's byte in its codes section, scale, bias */
        auto elem = [&](const uint8_t *page, uint64_t code_byte, int32_t ch, uint64_t scale, uint64_t bias) {
            const uint32_t q = (page[code_byte] >> ((uint32_t)(ch * bits) % 8u)) & ((1u << bits) - 1u);
            const uint64_t j = (uint64_t)(ch / g) * 2u;
            return (float)q * half_at(page, scale + j) + half_at(page, bias + j);
        };
        auto check = [&](float got, float want, const char *what, size_t seq, int32_t t, int32_t h, int32_t ch) {
            if (std::memcmp(&got, &want, 4) == 0) return;
            if (bad++ == 0)
                first_bad = std::string(what) + " of sequence " + std::to_string(seq) + " token " +
                            std::to_string(t) + " head " + std::to_string(h) + " channel " + std::to_string(ch) +
                            ": the page's bytes give " + std::to_string(got) + ", gokv_pool_read " +
                            std::to_string(want);
        };
        for (size_t i = 0; i < pair.dut.seqs.size(); i++) {
            const Seq &s = pair.dut.seqs[i];
            for (int32_t t = 0; t < s.len; t++) {
                const uint8_t *page = pages[(size_t)s.pages[(size_t)(t / P)]].data();
                const int32_t slot = t % P;
                for (int32_t h = 0; h < H; h++) {
                    const size_t at = (size_t)t * (size_t)H + (size_t)h;
                    const uint64_t kc = L.k_codes + h * L.k_codes_head;
                    const uint64_t ksb = h * L.k_sb_head + (uint64_t)slot * (uint64_t)L.k_groups * 2u;
                    for (int32_t ch = 0; ch < c.d_k; ch++) {
                        const uint64_t b = kc + gokv_k_code_byte(&L, slot, (uint64_t)(ch * bits / 8));
                        const float x = elem(page, b, ch, L.k_scale + ksb, L.k_bias + ksb);
                        check(x, pair.dut.kdq[i][at * (size_t)c.d_k + (size_t)ch], "K", i, t, h, ch);
                    }
                    if (c.v_is_k_prefix) continue; /* MLA's values are the keys' first d_v channels */
                    const uint64_t vc = L.v_codes + h * L.v_codes_head + (uint64_t)slot * L.v_row_bytes;
                    const uint64_t vsb = h * L.v_sb_head + (uint64_t)slot * (uint64_t)L.v_groups * 2u;
                    for (int32_t ch = 0; ch < c.d_v; ch++) {
                        const float x = elem(page, vc + (uint64_t)(ch * bits / 8), ch, L.v_scale + vsb, L.v_bias + vsb);
                        check(x, pair.dut.vdq[i][at * (size_t)c.d_v + (size_t)ch], "V", i, t, h, ch);
                    }
                }
            }
        }
        EXPECT_EQ(bad, 0u) << c.name() << ": " << bad << " of " << n_elems << " elements decoded from the pages at "
                           << "gokv_layout.h's offsets differ from gokv_pool_read; first: " << first_bad;
    }

    /* (b) */
    size_t code_steps = 0, bad = 0;
    std::string first_bad;
    const uint32_t mask = c.quantized() ? (1u << bits) - 1u : 0u;
    for (int32_t pg = 0; pg < c.n_pages; pg++) {
        const uint8_t *cpu = cpu_pages[(size_t)pg].data();
        const std::vector<uint8_t> &vk = pages[(size_t)pg];
        for (uint64_t o = 0; o < L.page_bytes; o++) {
            if (vk[o] == cpu[o]) continue;
            const uint64_t r = o % L.k_codes_head; /* offset in the head's block */
            const bool codes =
                c.quantized() && ((r >= L.k_codes && r < L.k_scale) || (r >= L.v_codes && r < L.v_scale));
            bool step = codes;
            for (int32_t sh = 0; codes && sh < 8; sh += bits) {
                const int32_t a = (int32_t)((vk[o] >> sh) & mask), b = (int32_t)((cpu[o] >> sh) & mask);
                if (a != b) step = step && std::abs(a - b) == 1;
                if (a != b && step) code_steps++;
            }
            if (step) continue;
            if (bad++ == 0)
                first_bad = "page " + std::to_string(pg) + " byte " + std::to_string(o) + " (offset " +
                            std::to_string(r) + " of head " + std::to_string(o / L.k_codes_head) + "'s block" +
                            (codes ? ", codes" : "") + "): " + dut_name() + " " + std::to_string(vk[o]) + ", cpu " +
                            std::to_string(cpu[o]);
        }
    }
    EXPECT_EQ(bad, 0u) << c.name() << ": " << bad << " page bytes differ from the CPU's other than by one code step; "
                       << "first: " << first_bad;
    EXPECT_LE(code_steps, std::max<size_t>(1, n_elems / 1000))
        << c.name() << ": " << code_steps << " codes of " << n_elems << " elements one step from the CPU's";
}

const StoreCase kStoreCases[] = {
    {{GOKV_FORMAT_F32, 0, 0}, false},     {{GOKV_FORMAT_F16, 0, 0}, false},     {{GOKV_FORMAT_Q8, 32, 0}, false},
    {{GOKV_FORMAT_Q4, 32, 0}, false},     {{GOKV_FORMAT_Q4, 64, 0}, false},     {{GOKV_FORMAT_Q4, 128, 0}, false},
    {{GOKV_FORMAT_KIVI2, 32, 0}, false},  {{GOKV_FORMAT_KIVI2, 32, 128}, false}, {{GOKV_FORMAT_KIVI4, 32, 0}, false},
    {{GOKV_FORMAT_KIVI4, 32, 128}, false}, {{GOKV_FORMAT_KIVI2, 64, 64}, false}, {{GOKV_FORMAT_KIVI4, 32, 32}, false},
    {{GOKV_FORMAT_F16, 0, 0}, true},      {{GOKV_FORMAT_Q8, 32, 0}, true},      {{GOKV_FORMAT_Q4, 64, 0}, true},
    {{GOKV_FORMAT_KIVI2, 32, 128}, true}, {{GOKV_FORMAT_KIVI4, 32, 0}, true},
    /* pages that end in a part tile of q4 keys (P % 16 != 0), and MLA's plain q4 rows, q8, in such pages */
    {{GOKV_FORMAT_Q4, 32, 0}, false, 24}, {{GOKV_FORMAT_Q4, 64, 0}, false, 40}, {{GOKV_FORMAT_Q4, 128, 0}, false, 8},
    {{GOKV_FORMAT_Q4, 32, 0}, true, 24},  {{GOKV_FORMAT_Q8, 32, 0}, false, 40},
};
GOKV_INSTANTIATE_CASES(Formats, Store, kStoreCases);

class KiviRingParity : public BackendParamTest<Fmt> {};

/* One token per call (the decode loop) across many flushes: after every call the split between pages and
 * ring follows gokv_kivi_quantized_len (ring tokens read as their fp16 inputs) and the reads equal the
 * CPU's. */
TEST_P(KiviRingParity, TokenByTokenParity) {
    PoolCfg c = format_cfg(param().format, param().group, param().residual);
    c.n_kv_heads = 2;
    c.d_k = c.d_v = 64;
    c.n_pages = 16;
    c.n_slots = 2;
    const int32_t n = 260;
    Pair pair;
    ASSERT_TRUE(build_pair(c, {0}, 2024u, pair, n));
    std::mt19937 rng(2025);
    const size_t kr = (size_t)c.n_kv_heads * (size_t)c.d_k, vr = (size_t)c.n_kv_heads * (size_t)c.d_v;
    for (int32_t t = 0; t < n; t++) {
        const std::vector<float> k = gen_keys(rng, 1, c.n_kv_heads, c.d_k), v = gen_values(rng, 1, c.n_kv_heads, c.d_v);
        ASSERT_TRUE(append_pair(pair, {0}, {k}, {v})) << "token " << t;
        const Seq &s = pair.dut.seqs[0];
        const int32_t nq = gokv_kivi_quantized_len(s.len, c.group, c.residual);
        for (int32_t u = nq; u < s.len; u++) {
            bool ring_exact = true;
            for (size_t j = 0; j < kr; j++)
                ring_exact = ring_exact && pair.dut.kdq[0][(size_t)u * kr + j] == gokv_round_half(s.k[(size_t)u * kr + j]);
            for (size_t j = 0; j < vr; j++)
                ring_exact = ring_exact && pair.dut.vdq[0][(size_t)u * vr + j] == gokv_round_half(s.v[(size_t)u * vr + j]);
            ASSERT_TRUE(ring_exact) << "after " << s.len << " tokens, token " << u << " should be in the ring (n_quant "
                                    << nq << ") and read as its fp16 input";
        }
        expect_read_parity(pair, c.name() + " after " + std::to_string(s.len) + " tokens");
        if (HasFailure()) break;
    }
}

const Fmt kRingFormats[] = {{GOKV_FORMAT_KIVI2, 32, 0},  {GOKV_FORMAT_KIVI2, 32, 32}, {GOKV_FORMAT_KIVI2, 32, 128},
                            {GOKV_FORMAT_KIVI4, 32, 96}, {GOKV_FORMAT_KIVI2, 64, 64}};
GOKV_INSTANTIATE_CASES(Kivi, KiviRingParity, kRingFormats);

class Copy : public BackendParamTest<Fmt> {};

/* gokv_pool_copy: a fork (pages and residual slot copied into free ones) reads back as the
 * original; then both grow with different tokens and each equals its whole input written at once, and the
 * CPU doing the same. */
TEST_P(Copy, ForkReadsIdenticallyAndGrowsIndependently) {
    PoolCfg c = format_cfg(param().format, param().group, param().residual);
    c.n_kv_heads = 2;
    c.n_pages = 16;
    c.n_slots = c.kivi() ? 3 : 0;
    const int32_t n = 150, more = 40;
    Pair pair;
    ASSERT_TRUE(build_pair(c, {n}, 31u, pair, more));
    c = pair.dut.cfg;
    /* the fork: free pages and slot */
    std::vector<bool> used((size_t)c.n_pages, false), slot_used((size_t)std::max(c.n_slots, 1), false);
    for (int32_t pg : pair.dut.seqs[0].pages) used[(size_t)pg] = true;
    if (pair.dut.seqs[0].slot >= 0) slot_used[(size_t)pair.dut.seqs[0].slot] = true;
    Seq fork;
    for (int32_t pg = 0; pg < c.n_pages && fork.pages.size() < pair.dut.seqs[0].pages.size(); pg++)
        if (!used[(size_t)pg]) fork.pages.push_back(pg);
    ASSERT_EQ(fork.pages.size(), pair.dut.seqs[0].pages.size());
    for (int32_t sl = 0; c.kivi() && sl < c.n_slots; sl++)
        if (!slot_used[(size_t)sl]) {
            fork.slot = sl;
            break;
        }
    const int32_t npg = (n + c.page_size - 1) / c.page_size;
    for (Cache *cc : {&pair.dut, &pair.cpu}) {
        Seq &orig = cc->seqs[0];
        Seq f = fork;
        f.len = orig.len;
        f.k = orig.k;
        f.v = orig.v;
        gokv_copy_desc cd;
        std::memset(&cd, 0, sizeof cd);
        cd.struct_size = sizeof cd;
        cd.n_pages = npg;
        cd.src_pages = orig.pages.data();
        cd.dst_pages = f.pages.data();
        cd.n_slots = c.kivi() ? 1 : 0;
        cd.src_slots = c.kivi() ? &orig.slot : nullptr;
        cd.dst_slots = c.kivi() ? &f.slot : nullptr;
        ASSERT_EQ(gokv_pool_copy(cc->pool.get(), &cd), GOKV_OK) << gokv_last_error();
        cc->seqs.push_back(f);
    }
    ASSERT_TRUE(reread(pair.dut) && reread(pair.cpu));
    for (int32_t i = 0; i < npg; i++) { /* the copies hold the same bytes */
        EXPECT_TRUE(page_bytes(pair.dut.pool.get(), pair.dut.seqs[0].pages[(size_t)i]) ==
                    page_bytes(pair.dut.pool.get(), pair.dut.seqs[1].pages[(size_t)i]))
            << "page " << i << " of the fork differs from the original's bytes";
    }
    if (c.kivi()) {
        EXPECT_TRUE(slot_bytes(pair.dut.pool.get(), pair.dut.seqs[0].slot) == slot_bytes(pair.dut.pool.get(), pair.dut.seqs[1].slot))
            << "the fork's residual slot differs from the original's bytes";
    }
    EXPECT_EQ(pair.dut.kdq[1], pair.dut.kdq[0]) << "the fork's K differs from the original's";
    EXPECT_EQ(pair.dut.vdq[1], pair.dut.vdq[0]) << "the fork's V differs from the original's";
    expect_read_parity(pair, c.name() + " after the fork");

    std::mt19937 rng(8);
    const std::vector<float> ko = gen_keys(rng, more, 2, c.d_k), vo = gen_values(rng, more, 2, c.d_v);
    const std::vector<float> kk = gen_keys(rng, more, 2, c.d_k), vk = gen_values(rng, more, 2, c.d_v);
    ASSERT_TRUE(append_pair(pair, {0, 1}, {ko, kk}, {vo, vk}));
    expect_read_parity(pair, c.name() + " after both grew");
    for (size_t i = 0; i < 2; i++) {
        const Seq &s = pair.dut.seqs[i];
        PoolPtr fresh = make_pool(dut(), c);
        ASSERT_TRUE(fresh);
        Seq one;
        one.pages = s.pages;
        one.slot = s.slot;
        ASSERT_EQ(append1(fresh.get(), c, one, s.k, s.v), GOKV_OK) << gokv_last_error();
        std::vector<float> k1, v1;
        ASSERT_EQ(read_seq(fresh.get(), c, one, k1, v1), GOKV_OK) << gokv_last_error();
        EXPECT_EQ(k1, pair.dut.kdq[i]) << (i ? "fork" : "original") << " K after growing";
        EXPECT_EQ(v1, pair.dut.vdq[i]) << (i ? "fork" : "original") << " V after growing";
    }
    /* and the fork attends like the original did before growing: covered by the decode table; here one
     * decode of each over the grown sequences, on both backends */
    AttnOpts o;
    o.n_heads_q = 4;
    const std::vector<float> q = gen_normal(rng, 2 * 4 * (size_t)c.d_k);
    cross_attend(pair, {attn_seq(pair.dut, 0), attn_seq(pair.dut, 1)}, {0, 1}, q, o, tol_for(c.format),
                 c.name() + " original and fork");
}

/* Copies of residual slots alone (a fork whose pages are still shared), several pages in one call. */
TEST_P(Copy, SlotOnlyAndManyPages) {
    PoolCfg c = format_cfg(param().format, param().group, param().residual);
    c.n_pages = 24;
    c.n_slots = c.kivi() ? 4 : 0;
    Pair pair;
    ASSERT_TRUE(build_pair(c, {300, 90}, 41u, pair));
    c = pair.dut.cfg;
    std::vector<bool> used((size_t)c.n_pages, false);
    for (const Seq &s : pair.dut.seqs)
        for (int32_t pg : s.pages) used[(size_t)pg] = true;
    std::vector<int32_t> src, dst;
    for (int32_t pg = 0, i = 0; pg < c.n_pages && i < 4; pg++)
        if (!used[(size_t)pg]) {
            src.push_back(pair.dut.seqs[0].pages[(size_t)i++]);
            dst.push_back(pg);
        }
    ASSERT_EQ(src.size(), 4u);
    int32_t ssrc = pair.dut.seqs[1].slot, sdst = -1;
    for (int32_t sl = 0; c.kivi() && sl < c.n_slots; sl++)
        if (sl != pair.dut.seqs[0].slot && sl != pair.dut.seqs[1].slot) sdst = sl;
    for (Cache *cc : {&pair.dut, &pair.cpu}) {
        gokv_copy_desc cd;
        std::memset(&cd, 0, sizeof cd);
        cd.struct_size = sizeof cd;
        cd.n_pages = (int32_t)src.size();
        cd.src_pages = src.data();
        cd.dst_pages = dst.data();
        ASSERT_EQ(gokv_pool_copy(cc->pool.get(), &cd), GOKV_OK) << gokv_last_error();
        if (c.kivi()) {
            std::memset(&cd, 0, sizeof cd);
            cd.struct_size = sizeof cd;
            cd.n_slots = 1;
            cd.src_slots = &ssrc;
            cd.dst_slots = &sdst;
            ASSERT_EQ(gokv_pool_copy(cc->pool.get(), &cd), GOKV_OK) << gokv_last_error();
        }
        /* sequence 2: sequence 0 with its first 4 pages replaced by the copies; sequence 3: sequence 1
         * with the copied ring */
        Seq a = cc->seqs[0];
        std::copy(dst.begin(), dst.end(), a.pages.begin());
        cc->seqs.push_back(a);
        if (c.kivi()) {
            Seq b = cc->seqs[1];
            b.slot = sdst;
            cc->seqs.push_back(b);
        }
    }
    ASSERT_TRUE(reread(pair.dut) && reread(pair.cpu));
    expect_read_parity(pair, c.name() + " after the copies");
    if (c.kivi()) {
        EXPECT_EQ(pair.dut.kdq[3], pair.dut.kdq[1]) << "K through the copied ring";
        EXPECT_EQ(pair.dut.vdq[3], pair.dut.vdq[1]) << "V through the copied ring";
    }
    EXPECT_EQ(pair.dut.kdq[2], pair.dut.kdq[0]) << "K through the copied pages";
    EXPECT_EQ(pair.dut.vdq[2], pair.dut.vdq[0]) << "V through the copied pages";
}

const Fmt kCopyFormats[] = {{GOKV_FORMAT_F16, 0, 0}, {GOKV_FORMAT_Q4, 32, 0}, {GOKV_FORMAT_KIVI2, 32, 32},
                            {GOKV_FORMAT_KIVI4, 32, 128}};
GOKV_INSTANTIATE_CASES(Formats, Copy, kCopyFormats);

class StoreKnown : public BackendTest {};

/* Released pages (-1) in a read's page table read as zeros, as on the CPU; KIVI's [1,2,3,4] -> s 1, b 1,
 * codes 0..3 reads back exactly; a constant group reads back exactly. */
TEST_P(StoreKnown, ReleasedPagesAndKnownValues) {
    PoolCfg c = format_cfg(GOKV_FORMAT_Q4, 32, 0);
    Pair pair;
    ASSERT_TRUE(build_pair(c, {200}, 51u, pair));
    for (Cache *cc : {&pair.dut, &pair.cpu}) {
        Seq s = cc->seqs[0];
        s.pages[1] = -1;
        std::vector<float> k, v;
        ASSERT_EQ(read_seq(cc->pool.get(), c, s, k, v), GOKV_OK) << gokv_last_error();
        const size_t kr = (size_t)c.n_kv_heads * (size_t)c.d_k;
        for (size_t j = 64 * kr; j < 128 * kr; j++) ASSERT_EQ(k[j], 0.0f) << "released page element " << j;
        for (size_t j = 0; j < 64 * kr; j++) ASSERT_EQ(k[j], cc->kdq[0][j]);
    }
    /* KIVI2 g32: channel values 1,2,3,4 repeating over 32 tokens (min 1, max 4: s = 1, b = 1), and a
     * constant channel; R = 0 so all 64 tokens are quantized */
    PoolCfg kc = format_cfg(GOKV_FORMAT_KIVI2, 32, 0);
    kc.n_slots = 1;
    kc.n_pages = 2;
    PoolPtr pool = make_pool(dut(), kc);
    ASSERT_TRUE(pool);
    Seq s;
    s.pages = {1};
    s.slot = 0;
    std::vector<float> k((size_t)64 * (size_t)kc.d_k), v((size_t)64 * (size_t)kc.d_v);
    for (int32_t t = 0; t < 64; t++)
        for (int32_t ch = 0; ch < kc.d_k; ch++) {
            k[(size_t)(t * kc.d_k + ch)] = ch == 7 ? 0.375f : (float)(1 + t % 4);
            v[(size_t)(t * kc.d_v + ch)] = (float)(1 + ch % 4);
        }
    ASSERT_EQ(append1(pool.get(), kc, s, k, v), GOKV_OK) << gokv_last_error();
    std::vector<float> kr, vr;
    ASSERT_EQ(read_seq(pool.get(), kc, s, kr, vr), GOKV_OK) << gokv_last_error();
    EXPECT_EQ(kr, k) << "KIVI2 keys [1,2,3,4] and a constant channel must read back exactly";
    EXPECT_EQ(vr, v) << "KIVI2 values [1,2,3,4] per group must read back exactly";
}

GOKV_INSTANTIATE_ON_BACKENDS(StoreKnown);

/* The quantization rule on the raw bytes (format_check.h): every stored byte of a few sequences (random
 * data with outlier channels) follows the rule, and reads back as q*s+b (ring rows as fp16 inputs). */
struct RuleCase {
    int32_t format, group, residual, page_size, d_k, d_v, mla;
};
std::string case_name(const RuleCase &p) {
    return format_cfg(p.format, p.group, p.residual).name() + "_p" + std::to_string(p.page_size) + "_d" +
           std::to_string(p.d_k) + "x" + std::to_string(p.d_v) + (p.mla ? "_mla" : "");
}
class StoredFormat : public BackendParamTest<RuleCase> {};
TEST_P(StoredFormat, FollowsTheQuantizationRule) {
    const RuleCase p = param();
    PoolCfg c = format_cfg(p.format, p.group, p.residual);
    c.n_kv_heads = 2;
    c.d_k = p.d_k;
    c.d_v = p.d_v;
    c.v_is_k_prefix = p.mla;
    if (p.mla) c.n_kv_heads = 1;
    c.page_size = p.page_size;
    Cache cache;
    ASSERT_TRUE(build_cache(dut(), c, {300, 1, 37, 130}, 1234u, cache));
    FailBudget fb;
    for (size_t i = 0; i < cache.seqs.size(); i++)
        check_stored_sequence(fb, cache.pool.get(), cache.cfg, cache.seqs[i], cache.kdq[i], cache.vdq[i]);
    EXPECT_EQ(fb.total, 0) << "violations of the stored-format rule";
}
const RuleCase kRuleCases[] = {
    {GOKV_FORMAT_F32, 0, 0, 64, 128, 64, 0},         {GOKV_FORMAT_F16, 0, 0, 16, 128, 64, 0},
    {GOKV_FORMAT_Q8, 32, 0, 64, 128, 64, 0},         {GOKV_FORMAT_Q8, 64, 0, 16, 128, 128, 0},
    {GOKV_FORMAT_Q4, 32, 0, 64, 128, 96, 0},         {GOKV_FORMAT_Q4, 64, 0, 64, 128, 128, 0},
    {GOKV_FORMAT_Q4, 128, 0, 128, 128, 128, 0},      {GOKV_FORMAT_Q4, 32, 0, 64, 96, 64, 1},
    {GOKV_FORMAT_KIVI2, 32, 0, 64, 128, 64, 0},      {GOKV_FORMAT_KIVI2, 32, 32, 32, 128, 128, 0},
    {GOKV_FORMAT_KIVI2, 32, 128, 64, 64, 64, 0},     {GOKV_FORMAT_KIVI4, 32, 0, 64, 128, 128, 0},
    {GOKV_FORMAT_KIVI4, 32, 64, 128, 96, 64, 1},     {GOKV_FORMAT_KIVI2, 64, 64, 64, 128, 128, 0},
    {GOKV_FORMAT_KIVI4, 128, 128, 128, 128, 128, 0}, {GOKV_FORMAT_KIVI2, 32, 32, 64, 96, 64, 1},
    {GOKV_FORMAT_Q4, 32, 0, 24, 128, 64, 0},         {GOKV_FORMAT_Q4, 32, 0, 40, 96, 96, 0}, /* q4 keys' last tile padded */
};
GOKV_INSTANTIATE_CASES(Formats, StoredFormat, kRuleCases);

} // namespace
