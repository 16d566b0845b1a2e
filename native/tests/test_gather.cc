/*
 * test_gather.cc: gokv_pool_gather_rows (gokv.h), per-kv-head compaction after eviction, on every backend
 * that writes pages as stored (the core builds it on page_bytes + set_page_bytes; the others skip):
 *   - compaction: for f32, f16, q8 and q4 (g 32, 64, 128; q4 keys tiled) and GQA, MQA and MLA shapes, each
 *     kv head of a sequence keeps a random ordered subset of its tokens, gathered in one call (rows in
 *     random order) to the front of destination pages that held other tokens. Every gathered row's bytes
 *     equal its source row's, every other byte of the pool is unchanged (destination rows no entry names
 *     included), and a decode over the compacted sequence, with a per-kv-head mask for the heads that kept
 *     fewer rows than the longest, equals the float64 reference over the survivors and the original
 *     sequence attended with the equivalent per-kv-head mask.
 *   - validation: every argument's error (NULL arrays, each index out of range, a destination named twice, a
 *     destination page that is also a source page, KIVI and key_bounds pools refused), and no rejected call
 *     changing anything stored.
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>

#include "harness.h"

using namespace gokvtest;

namespace {

/* Calls fn(offset) for each byte of kv head h's row of slot t in a page, in row order: key codes (tiled q4
 * keys through gokv_k_code_byte), key scales, key biases, then the values' (absent with v_is_k_prefix). */
void for_each_row_byte(const gokv_layout *L, int32_t t, int32_t h, const std::function<void(uint64_t)> &fn) {
    const uint64_t kc = L->k_codes + (uint64_t)h * L->k_codes_head;
    for (uint64_t b = 0; b < L->k_row_bytes; b++) fn(kc + gokv_k_code_byte(L, t, b));
    for (uint64_t sec : {L->k_scale, L->k_bias})
        for (uint64_t b = 0; b < (uint64_t)L->k_groups * 2u; b++)
            fn(sec + (uint64_t)h * L->k_sb_head + (uint64_t)t * L->k_groups * 2u + b);
    if (L->v_is_k_prefix) return;
    for (uint64_t b = 0; b < L->v_row_bytes; b++) fn(L->v_codes + (uint64_t)h * L->v_codes_head + (uint64_t)t * L->v_row_bytes + b);
    for (uint64_t sec : {L->v_scale, L->v_bias})
        for (uint64_t b = 0; b < (uint64_t)L->v_groups * 2u; b++)
            fn(sec + (uint64_t)h * L->v_sb_head + (uint64_t)t * L->v_groups * 2u + b);
}

std::vector<uint8_t> row_of(const gokv_layout *L, const std::vector<uint8_t> &page, int32_t t, int32_t h) {
    std::vector<uint8_t> r;
    for_each_row_byte(L, t, h, [&](uint64_t off) { r.push_back(page[off]); });
    return r;
}

void put_row(const gokv_layout *L, std::vector<uint8_t> &page, int32_t t, int32_t h, const std::vector<uint8_t> &r) {
    size_t i = 0;
    for_each_row_byte(L, t, h, [&](uint64_t off) { page[off] = r[i++]; });
}

/* The arrays of one gokv_pool_gather_rows call. */
struct GatherRows {
    std::vector<int32_t> src_pages, src_slots, dst_pages, dst_slots, kv_heads;
    void add(int32_t sp, int32_t ss, int32_t dp, int32_t ds, int32_t h) {
        src_pages.push_back(sp), src_slots.push_back(ss), dst_pages.push_back(dp), dst_slots.push_back(ds);
        kv_heads.push_back(h);
    }
    gokv_gather_desc desc() const {
        gokv_gather_desc d;
        std::memset(&d, 0, sizeof d);
        d.struct_size = sizeof d;
        d.n_rows = (int32_t)src_pages.size();
        d.src_pages = src_pages.data();
        d.src_slots = src_slots.data();
        d.dst_pages = dst_pages.data();
        d.dst_slots = dst_slots.data();
        d.kv_heads = kv_heads.data();
        return d;
    }
};

std::vector<std::vector<uint8_t>> all_pages(gokv_pool *pool, int32_t n_pages) {
    std::vector<std::vector<uint8_t>> v;
    for (int32_t p = 0; p < n_pages; p++) v.push_back(page_bytes(pool, p));
    return v;
}

struct GatherCase {
    Fmt f;
    Attn attn;
};
std::string case_name(const GatherCase &c) { return fmt_name(c.f) + "_" + kAttnNames[c.attn]; }

std::vector<GatherCase> gather_cases() {
    std::vector<GatherCase> v;
    const Fmt formats[] = {{GOKV_FORMAT_F32, 0, 0}, {GOKV_FORMAT_F16, 0, 0}, {GOKV_FORMAT_Q8, 32, 0},
                           {GOKV_FORMAT_Q4, 32, 0}, {GOKV_FORMAT_Q4, 64, 0}, {GOKV_FORMAT_Q4, 128, 0}};
    for (const Fmt &f : formats)
        for (Attn a : {GQA, MQA, MLA, MHA}) v.push_back({f, a});
    return v;
}

class Gather : public BackendParamTest<GatherCase> {
protected:
    void SetUp() override {
        BackendParamTest<GatherCase>::SetUp();
        if (!dut_sets_page_bytes()) GTEST_SKIP() << dut_name() << " does not implement set_page_bytes: " << gokv_last_error();
    }
};

TEST_P(Gather, CompactsPerKvHead) {
    if (!dut_has_caps(GOKV_CAP_KV_HEAD_MASKS)) GTEST_SKIP() << dut_name() << " has no per-kv-head masks";
    int32_t Hq = 0;
    PoolCfg c0 = attn_cfg(param().f, param().attn, &Hq);
    c0.page_size = 32;
    const int32_t len = 300, P = c0.page_size;
    Cache c; /* sequence 0: the source; sequence 1: other tokens in the pages the survivors go to */
    ASSERT_TRUE(build_cache(dut(), c0, {len, len}, 71u + (uint32_t)param().attn, c));
    const gokv_layout *L = gokv_pool_layout(c.pool.get());
    const int32_t H = c.cfg.n_kv_heads;
    const Seq &src = c.seqs[0], &dst = c.seqs[1];

    /* each kv head keeps an ordered random subset; head 0 keeps the most, the others fewer */
    std::mt19937 rng(72);
    std::vector<std::vector<int32_t>> keep((size_t)H);
    std::vector<int32_t> all(len);
    for (int32_t t = 0; t < len; t++) all[(size_t)t] = t;
    for (int32_t h = 0; h < H; h++) {
        const int32_t m = h == 0 ? len * 3 / 4 : std::uniform_int_distribution<int32_t>(1, len * 3 / 4)(rng);
        std::sample(all.begin(), all.end(), std::back_inserter(keep[(size_t)h]), m, rng);
    }
    const int32_t M = (int32_t)keep[0].size();
    const std::vector<int32_t> dst_pages = dst.table(M, P);
    std::vector<size_t> order;
    for (int32_t h = 0; h < H; h++)
        for (size_t j = 0; j < keep[(size_t)h].size(); j++) order.push_back((size_t)h << 20 | j);
    std::shuffle(order.begin(), order.end(), rng); /* the order of the entries does not matter */
    GatherRows g;
    for (size_t e : order) {
        const int32_t h = (int32_t)(e >> 20), j = (int32_t)(e & 0xfffff), t = keep[(size_t)h][(size_t)j];
        g.add(src.pages[(size_t)(t / P)], t % P, dst_pages[(size_t)(j / P)], j % P, h);
    }

    const auto before = all_pages(c.pool.get(), c.cfg.n_pages);
    const gokv_gather_desc d = g.desc();
    ASSERT_EQ(gokv_pool_gather_rows(c.pool.get(), &d), GOKV_OK) << gokv_last_error();
    const auto after = all_pages(c.pool.get(), c.cfg.n_pages);

    /* bytes: the gathered rows are their sources', byte for byte; nothing else changed */
    auto expect = before;
    for (int32_t h = 0; h < H; h++)
        for (size_t j = 0; j < keep[(size_t)h].size(); j++) {
            const int32_t t = keep[(size_t)h][j];
            const std::vector<uint8_t> row = row_of(L, before[(size_t)src.pages[(size_t)(t / P)]], t % P, h);
            const int32_t dp = dst_pages[j / (size_t)P];
            EXPECT_TRUE(row_of(L, after[(size_t)dp], (int32_t)j % P, h) == row)
                << "kv head " << h << ": row " << j << " differs from token " << t << "'s";
            put_row(L, expect[(size_t)dp], (int32_t)j % P, h, row);
        }
    for (int32_t p = 0; p < c.cfg.n_pages; p++)
        EXPECT_TRUE(after[(size_t)p] == expect[(size_t)p]) << "page " << p << " changed beyond the gathered rows";

    /* attention: the compacted sequence (per-kv-head masks) against the reference over the survivors, and
     * the original with the equivalent masks */
    std::vector<float> ks((size_t)M * H * c.cfg.d_k, 0.0f), vs((size_t)M * H * c.cfg.d_v, 0.0f);
    const int32_t words_c = (M + 31) / 32, words_o = (len + 31) / 32;
    AttnSeq comp, orig = attn_seq(c, 0, 1);
    comp.kv_len = M;
    comp.q_pos = M - 1;
    comp.pages = dst_pages;
    comp.mask.assign((size_t)H * words_c, 0u);
    orig.mask.assign((size_t)H * words_o, 0u);
    for (int32_t h = 0; h < H; h++)
        for (size_t j = 0; j < keep[(size_t)h].size(); j++) {
            const size_t t = (size_t)keep[(size_t)h][j];
            std::memcpy(&ks[(j * H + h) * c.cfg.d_k], &c.kdq[0][(t * H + h) * c.cfg.d_k], c.cfg.d_k * sizeof(float));
            std::memcpy(&vs[(j * H + h) * c.cfg.d_v], &c.vdq[0][(t * H + h) * c.cfg.d_v], c.cfg.d_v * sizeof(float));
            comp.mask[(size_t)h * words_c + j / 32] |= 1u << (j % 32);
            orig.mask[(size_t)h * words_o + t / 32] |= 1u << (t % 32);
        }
    comp.k = &ks;
    comp.v = &vs;
    Seq read_view;
    read_view.pages = dst_pages;
    read_view.len = M;
    std::vector<float> kr, vr;
    ASSERT_EQ(read_seq(c.pool.get(), c.cfg, read_view, kr, vr), GOKV_OK) << gokv_last_error();
    size_t read_differ = 0;
    for (int32_t h = 0; h < H; h++)
        for (size_t j = 0; j < keep[(size_t)h].size(); j++) {
            read_differ += std::memcmp(&kr[(j * H + h) * c.cfg.d_k], &ks[(j * H + h) * c.cfg.d_k], c.cfg.d_k * sizeof(float)) != 0;
            read_differ += std::memcmp(&vr[(j * H + h) * c.cfg.d_v], &vs[(j * H + h) * c.cfg.d_v], c.cfg.d_v * sizeof(float)) != 0;
        }
    EXPECT_EQ(read_differ, 0u) << "gathered rows read back differently from their sources";
    AttnOpts o;
    o.n_heads_q = Hq;
    o.flags = GOKV_ATTEND_MASK_PER_KV_HEAD;
    const std::vector<float> q = gen_normal(rng, (size_t)Hq * (size_t)c.cfg.d_k);
    const double tol = tol_for(c.cfg.format);
    std::vector<float> out_c, out_o;
    check_attend(dut(), c, {comp}, q, o, tol, c.cfg.name() + " compacted decode", &out_c);
    check_attend(dut(), c, {orig}, q, o, tol, c.cfg.name() + " original decode, masked", &out_o);
    EXPECT_LE(rel_err(out_c, out_o), 2 * tol) << c.cfg.name() << ": compacted vs original with the survivors' masks";
}

GOKV_INSTANTIATE_CASES(Cases, Gather, gather_cases());

/* ---- validation ---- */

class GatherValidation : public BackendTest {
protected:
    void SetUp() override {
        BackendTest::SetUp();
        if (!dut_sets_page_bytes()) GTEST_SKIP() << dut_name() << " does not implement set_page_bytes: " << gokv_last_error();
    }
};

void expect_gather_error(gokv_pool *pool, const gokv_gather_desc *d, gokv_status want, const std::string &needle,
                         const std::string &what) {
    const gokv_status got = gokv_pool_gather_rows(pool, d);
    const std::string msg = gokv_last_error();
    EXPECT_EQ(got, want) << what << ": got " << gokv_status_name(got) << " (" << msg << ")";
    EXPECT_NE(msg.find(needle), std::string::npos) << what << ": message \"" << msg << "\" should name " << needle;
}

TEST_P(GatherValidation, RejectsAndChangesNothing) {
    PoolCfg c0 = format_cfg(GOKV_FORMAT_Q4, 32, 0);
    c0.n_kv_heads = 2;
    c0.page_size = 16;
    Cache c;
    ASSERT_TRUE(build_cache(dut(), c0, {40, 40}, 81u, c));
    gokv_pool *pool = c.pool.get();
    const int32_t n_pages = c.cfg.n_pages, P = c.cfg.page_size, H = c.cfg.n_kv_heads;
    const Seq &s = c.seqs[0], &t = c.seqs[1];
    GatherRows base; /* two heads of one destination slot, and a row of another source page */
    base.add(s.pages[0], 1, t.pages[0], 0, 0);
    base.add(s.pages[0], 2, t.pages[0], 0, 1);
    base.add(s.pages[1], 3, t.pages[1], 5, 1);
    const auto before = all_pages(pool, n_pages);
    auto unchanged = [&](const std::string &what) {
        EXPECT_TRUE(all_pages(pool, n_pages) == before) << what << ": a rejected gather changed the pool";
    };

    gokv_gather_desc d = base.desc();
    expect_gather_error(nullptr, &d, GOKV_EINVAL, "pool is NULL", "NULL pool");
    expect_gather_error(pool, nullptr, GOKV_EINVAL, "desc is NULL", "NULL desc");
    d.struct_size = sizeof d - 4;
    expect_gather_error(pool, &d, GOKV_EVERSION, "struct_size", "old descriptor");
    d = base.desc();
    d.n_rows = -1;
    expect_gather_error(pool, &d, GOKV_EINVAL, "n_rows -1", "negative n_rows");

    const char *const names[5] = {"src_pages", "src_slots", "dst_pages", "dst_slots", "kv_heads"};
    const int32_t limits[5] = {n_pages, P, n_pages, P, H};
    for (int a = 0; a < 5; a++) {
        d = base.desc();
        const int32_t **arr[5] = {&d.src_pages, &d.src_slots, &d.dst_pages, &d.dst_slots, &d.kv_heads};
        *arr[a] = nullptr;
        expect_gather_error(pool, &d, GOKV_EINVAL, std::string(names[a]) + " is NULL", std::string("NULL ") + names[a]);
        for (int32_t bad : {-1, limits[a]}) {
            GatherRows r = base;
            std::vector<int32_t> *vec[5] = {&r.src_pages, &r.src_slots, &r.dst_pages, &r.dst_slots, &r.kv_heads};
            (*vec[a])[1] = bad;
            d = r.desc();
            const std::string needle = std::string(names[a]) + "[1]=" + std::to_string(bad) + " is outside [0, " +
                                       std::to_string(limits[a]) + ")";
            expect_gather_error(pool, &d, GOKV_ERANGE, needle, needle);
        }
    }
    GatherRows dup = base; /* row 3 writes row 0's destination */
    dup.add(s.pages[1], 7, t.pages[0], 0, 0);
    d = dup.desc();
    expect_gather_error(pool, &d, GOKV_EINVAL, "rows 0 and 3 both write kv head 0 of slot 0 of page " + std::to_string(t.pages[0]),
                        "duplicate destination");
    GatherRows overlap = base; /* a destination page read as a source */
    overlap.src_pages[2] = t.pages[0];
    d = overlap.desc();
    expect_gather_error(pool, &d, GOKV_EINVAL, "src_pages[2]=" + std::to_string(t.pages[0]) + " is also a destination page",
                        "destination page as a source");
    GatherRows self = base; /* a page gathered into itself */
    self.src_pages[0] = self.dst_pages[0];
    d = self.desc();
    expect_gather_error(pool, &d, GOKV_EINVAL, "is also a destination page", "source page == destination page");
    unchanged("rejected gathers");
    d = base.desc();
    d.n_rows = 0;
    EXPECT_EQ(gokv_pool_gather_rows(pool, &d), GOKV_OK) << gokv_last_error();
    unchanged("n_rows 0");
    d = base.desc();
    EXPECT_EQ(gokv_pool_gather_rows(pool, &d), GOKV_OK) << gokv_last_error();

    /* formats whose rows are not a token's own, and pools whose pages carry key bounds */
    struct Refused {
        PoolCfg cfg;
        const char *needle;
    } refused[] = {{format_cfg(GOKV_FORMAT_KIVI2, 32, 32), "kivi2 keys are quantized per channel"},
                   {format_cfg(GOKV_FORMAT_KIVI4, 32, 32), "kivi4 keys are quantized per channel"},
                   {format_cfg(GOKV_FORMAT_F16, 0, 0), "key bounds"}};
    refused[2].cfg.key_bounds = 1;
    for (const Refused &r : refused) {
        if (r.cfg.key_bounds && !dut_has_caps(GOKV_CAP_QUEST)) continue;
        Cache k;
        ASSERT_TRUE(build_cache(dut(), r.cfg, {100, 100}, 82u, k));
        GatherRows g;
        g.add(k.seqs[0].pages[0], 0, k.seqs[1].pages[0], 0, 0);
        const auto kb = all_pages(k.pool.get(), k.cfg.n_pages);
        d = g.desc();
        expect_gather_error(k.pool.get(), &d, GOKV_ENOTSUP, r.needle, r.cfg.name() + (r.cfg.key_bounds ? " key_bounds" : ""));
        EXPECT_TRUE(all_pages(k.pool.get(), k.cfg.n_pages) == kb) << r.cfg.name() << ": a refused gather changed the pool";
    }
}

GOKV_INSTANTIATE_ON_BACKENDS(GatherValidation);

} // namespace
