/*
 * test_stored_bytes.cc: pages and residual rings written as stored (gokv_pool_set_page_bytes,
 * gokv_pool_set_slot_bytes; gokv.h, docs/architecture.md §4), on every backend that has the optional slots
 * (the others skip, saying so):
 *   - round trip: a pool filled by writes (every format, KIVI with rings, several group sizes, GQA and MLA)
 *     is copied page by page and ring by ring into a second pool through page_bytes / slot_bytes and
 *     set_page_bytes / set_slot_bytes; the second pool's bytes and read-back equal the first's, and its
 *     attention (decode and a short prefill) equals the first's bit for bit and the float64 reference.
 *   - bounds: in key_bounds pools, set_page_bytes rebuilds each page's bounds from its first n_tokens
 *     slots as the writes had left them (full and partial pages, KIVI's quantized part): Quest's bounds
 *     (quest_bounds) and output on the copy equal the original's, although the copy held other keys before.
 *   - validation: every argument's error, bytes that are not finite (NaN or inf in each section, named with
 *     its kv head and slot or token group) rejected, bytes past n_tokens not checked, and no rejected call
 *     changing anything stored.
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "harness.h"

using namespace gokvtest;

namespace {

struct BytesCase {
    Fmt f;
    Attn attn;
};
std::string case_name(const BytesCase &c) { return fmt_name(c.f) + "_" + kAttnNames[c.attn]; }

const BytesCase kCases[] = {
    {{GOKV_FORMAT_F32, 0, 0}, GQA},     {{GOKV_FORMAT_F32, 0, 0}, MLA},     {{GOKV_FORMAT_F16, 0, 0}, GQA},
    {{GOKV_FORMAT_F16, 0, 0}, MLA},     {{GOKV_FORMAT_Q8, 32, 0}, GQA},     {{GOKV_FORMAT_Q8, 128, 0}, MLA},
    {{GOKV_FORMAT_Q4, 32, 0}, GQA},     {{GOKV_FORMAT_Q4, 64, 0}, GQA},     {{GOKV_FORMAT_Q4, 128, 0}, GQA},
    {{GOKV_FORMAT_Q4, 32, 0}, MLA},     {{GOKV_FORMAT_KIVI2, 32, 128}, GQA}, {{GOKV_FORMAT_KIVI2, 32, 64}, MLA},
    {{GOKV_FORMAT_KIVI4, 64, 128}, GQA}, {{GOKV_FORMAT_KIVI4, 32, 32}, MLA},
};

/* How many leading slots of each page of c hold tokens (KIVI: quantized into the page). */
std::vector<int32_t> page_tokens(const Cache &c) {
    std::vector<int32_t> n((size_t)c.cfg.n_pages, 0);
    const int32_t P = c.cfg.page_size;
    for (const Seq &s : c.seqs) {
        const int32_t nq = c.cfg.kivi() ? gokv_kivi_quantized_len(s.len, c.cfg.group, c.cfg.residual) : s.len;
        for (size_t i = 0; i < s.pages.size(); i++)
            n[(size_t)s.pages[i]] = std::max(n[(size_t)s.pages[i]], std::clamp(nq - (int32_t)i * P, 0, P));
    }
    return n;
}

/* Copies every page and ring of `from` into `to` (same configuration) as stored. */
void copy_stored(const Cache &from, gokv_pool *to) {
    const std::vector<int32_t> ntok = page_tokens(from);
    for (int32_t p = 0; p < from.cfg.n_pages; p++) {
        const std::vector<uint8_t> b = page_bytes(from.pool.get(), p);
        ASSERT_EQ(gokv_pool_set_page_bytes(to, p, b.data(), b.size(), ntok[(size_t)p]), GOKV_OK)
            << "page " << p << ": " << gokv_last_error();
    }
    for (int32_t s = 0; s < from.cfg.n_slots; s++) {
        const std::vector<uint8_t> b = slot_bytes(from.pool.get(), s);
        ASSERT_EQ(gokv_pool_set_slot_bytes(to, s, b.data(), b.size()), GOKV_OK) << "slot " << s << ": " << gokv_last_error();
    }
}

/* A view of c's sequences in another pool holding the same bytes. */
Cache same_seqs(const Cache &c, PoolPtr pool) {
    Cache v;
    v.cfg = c.cfg;
    v.pool = std::move(pool);
    v.seqs = c.seqs;
    return v;
}

class StoredBytes : public BackendParamTest<BytesCase> {
protected:
    PoolCfg cfg(int32_t *n_heads_q) const { return attn_cfg(param().f, param().attn, n_heads_q); }
    void SetUp() override {
        BackendParamTest<BytesCase>::SetUp();
        if (!dut_sets_page_bytes()) GTEST_SKIP() << dut_name() << " does not implement set_page_bytes: " << gokv_last_error();
    }
};

TEST_P(StoredBytes, RoundTrip) {
    int32_t Hq = 0;
    const PoolCfg c0 = cfg(&Hq);
    Cache a;
    ASSERT_TRUE(build_cache(dut(), c0, {300, 70, 1}, 31u, a));
    PoolPtr pool2 = make_pool(dut(), a.cfg);
    ASSERT_TRUE(pool2);
    const std::vector<uint8_t> probe(a.cfg.kivi() ? gokv_pool_layout(pool2.get())->ring_bytes : 0, 0);
    if (a.cfg.kivi() && gokv_pool_set_slot_bytes(pool2.get(), 0, probe.data(), probe.size()) == GOKV_ENOTSUP)
        GTEST_SKIP() << dut_name() << " does not implement set_slot_bytes: " << gokv_last_error();
    ASSERT_NO_FATAL_FAILURE(copy_stored(a, pool2.get()));
    Cache b = same_seqs(a, std::move(pool2));
    ASSERT_TRUE(reread(b));
    for (int32_t p = 0; p < a.cfg.n_pages; p++)
        EXPECT_TRUE(page_bytes(a.pool.get(), p) == page_bytes(b.pool.get(), p)) << "page " << p << " differs";
    for (int32_t s = 0; s < a.cfg.n_slots; s++)
        EXPECT_TRUE(slot_bytes(a.pool.get(), s) == slot_bytes(b.pool.get(), s)) << "residual slot " << s << " differs";
    for (size_t i = 0; i < a.seqs.size(); i++) {
        EXPECT_TRUE(a.kdq[i] == b.kdq[i] && a.vdq[i] == b.vdq[i]) << "sequence " << i << " reads back differently";
    }
    std::mt19937 rng(32);
    for (int32_t rows : {1, 5}) {
        std::vector<AttnSeq> sa, sb;
        for (size_t i = 0; i < a.seqs.size(); i++) {
            const int32_t n = std::min(rows, a.seqs[i].len);
            sa.push_back(attn_seq(a, i, n));
            sb.push_back(attn_seq(b, i, n));
        }
        const std::vector<float> q = gen_normal(rng, (size_t)total_rows(sa) * (size_t)Hq * (size_t)a.cfg.d_k);
        AttnOpts o;
        o.n_heads_q = Hq;
        const std::string what = a.cfg.name() + (rows == 1 ? " decode" : " prefill");
        std::vector<float> out_a, out_b;
        check_attend(dut(), a, sa, q, o, tol_for(a.cfg.format), what + " (original)", &out_a);
        check_attend(dut(), b, sb, q, o, tol_for(a.cfg.format), what + " (loaded)", &out_b);
        ASSERT_EQ(out_a.size(), out_b.size());
        EXPECT_EQ(std::memcmp(out_a.data(), out_b.data(), out_a.size() * sizeof(float)), 0)
            << what << ": the loaded pool attends differently from the original";
    }
}

/* Quest's bounds of every page of c's sequences for one decode row each (quest_pages 1). */
gokv_status quest_bounds(const Cache &c, int32_t Hq, const std::vector<float> &q, std::vector<float> &bounds,
                         std::vector<float> &out) {
    std::vector<AttnSeq> seqs;
    size_t entries = 0;
    for (size_t i = 0; i < c.seqs.size(); i++) {
        seqs.push_back(attn_seq(c, i, 1));
        entries += seqs.back().pages.size();
    }
    bounds.assign(entries * (size_t)c.cfg.n_kv_heads, std::numeric_limits<float>::quiet_NaN());
    std::vector<int32_t> selected(c.seqs.size() * (size_t)c.cfg.n_kv_heads, -7);
    AttnOpts o;
    o.n_heads_q = Hq;
    return attend_edited(dut(), c.pool.get(), c.cfg, seqs, q, o, out, nullptr, [&](gokv_attend_desc &a) {
        a.quest_pages = 1;
        a.quest_bounds = bounds.data();
        a.quest_selected = selected.data();
    });
}

TEST_P(StoredBytes, RecomputesKeyBounds) {
    if (!dut_has_caps(GOKV_CAP_QUEST)) GTEST_SKIP() << dut_name() << " keeps no key bounds (GOKV_CAP_QUEST)";
    int32_t Hq = 0;
    PoolCfg c0 = cfg(&Hq);
    c0.key_bounds = 1;
    const std::vector<int32_t> lens = {300, 97, 1}; /* partial last pages; KIVI: a partial quantized page */
    Cache a, b;
    ASSERT_TRUE(build_cache(dut(), c0, lens, 41u, a));
    ASSERT_TRUE(build_cache(dut(), c0, lens, 42u, b)); /* other keys and other pages: its bounds must go */
    ASSERT_EQ(a.cfg.n_pages, b.cfg.n_pages);
    ASSERT_NO_FATAL_FAILURE(copy_stored(a, b.pool.get()));
    Cache v = same_seqs(a, std::move(b.pool));
    ASSERT_TRUE(reread(v));
    std::mt19937 rng(43);
    const std::vector<float> q = gen_normal(rng, a.seqs.size() * (size_t)Hq * (size_t)a.cfg.d_k);
    std::vector<float> bounds_a, bounds_v, out_a, out_v;
    ASSERT_EQ(quest_bounds(a, Hq, q, bounds_a, out_a), GOKV_OK) << gokv_last_error();
    ASSERT_EQ(quest_bounds(v, Hq, q, bounds_v, out_v), GOKV_OK) << gokv_last_error();
    ASSERT_EQ(bounds_a.size(), bounds_v.size());
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < bounds_a.size(); i++)
        if (std::memcmp(&bounds_a[i], &bounds_v[i], sizeof(float)) != 0 && !differ++) first = i;
    EXPECT_EQ(differ, 0u) << a.cfg.name() << ": " << differ << " Quest bounds differ after set_page_bytes, first at entry "
                          << first / (size_t)a.cfg.n_kv_heads << " kv head " << first % (size_t)a.cfg.n_kv_heads << ": "
                          << bounds_a[first] << " written, " << bounds_v[first] << " loaded";
    EXPECT_EQ(std::memcmp(out_a.data(), out_v.data(), out_a.size() * sizeof(float)), 0)
        << a.cfg.name() << ": Quest's output differs after set_page_bytes";
    /* A page loaded with fewer tokens than it holds is bounded by those only: with none, it has no key. */
    const int32_t page0 = a.seqs[0].pages[0];
    const std::vector<uint8_t> p0 = page_bytes(a.pool.get(), page0);
    ASSERT_EQ(gokv_pool_set_page_bytes(v.pool.get(), page0, p0.data(), p0.size(), 0), GOKV_OK) << gokv_last_error();
    ASSERT_EQ(quest_bounds(v, Hq, q, bounds_v, out_v), GOKV_OK) << gokv_last_error();
    for (int32_t h = 0; h < a.cfg.n_kv_heads; h++)
        EXPECT_EQ(bounds_v[(size_t)h], -std::numeric_limits<float>::infinity())
            << a.cfg.name() << ": kv head " << h << " of a page loaded with n_tokens 0 should have no bound";
}

GOKV_INSTANTIATE_CASES(Cases, StoredBytes, kCases);

/* ---- validation ---- */

struct Rejection {
    gokv_status status;
    const char *needle;
};

class StoredBytesValidation : public BackendTest {
protected:
    void SetUp() override {
        BackendTest::SetUp();
        if (!dut_sets_page_bytes()) GTEST_SKIP() << dut_name() << " does not implement set_page_bytes: " << gokv_last_error();
    }
};

/* Everything a pool stores, for before/after comparisons. */
std::vector<std::vector<uint8_t>> stored(const Cache &c) {
    std::vector<std::vector<uint8_t>> v;
    for (int32_t p = 0; p < c.cfg.n_pages; p++) v.push_back(page_bytes(c.pool.get(), p));
    for (int32_t s = 0; s < c.cfg.n_slots; s++) v.push_back(slot_bytes(c.pool.get(), s));
    return v;
}

void expect_rejected(gokv_status got, const Rejection &want, const std::string &what) {
    const std::string msg = gokv_last_error();
    EXPECT_EQ(got, want.status) << what << ": got " << gokv_status_name(got) << " (" << msg << ")";
    EXPECT_NE(msg.find(want.needle), std::string::npos) << what << ": message \"" << msg << "\" should name " << want.needle;
}

void put_half(std::vector<uint8_t> &b, uint64_t off, uint16_t h) { std::memcpy(b.data() + off, &h, 2); }

TEST_P(StoredBytesValidation, SetPageBytesRejects) {
    const uint16_t kHalfNaN = 0x7e00u, kHalfInf = 0xfc00u;
    const float kNaN = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
    struct Poison {
        Fmt f;
        const char *section; /* which one is poisoned */
        bool inf;
        const char *needle;
    };
    const Poison poisons[] = {
        {{GOKV_FORMAT_F32, 0, 0}, "k_codes", false, "kv head 1, slot 3: k_codes[5]"},
        {{GOKV_FORMAT_F32, 0, 0}, "v_codes", true, "kv head 1, slot 3: v_codes[5]"},
        {{GOKV_FORMAT_F16, 0, 0}, "k_codes", true, "kv head 1, slot 3: k_codes[5]"},
        {{GOKV_FORMAT_F16, 0, 0}, "v_codes", false, "kv head 1, slot 3: v_codes[5]"},
        {{GOKV_FORMAT_Q8, 32, 0}, "k_scale", false, "kv head 1, slot 3: k_scale[1]"},
        {{GOKV_FORMAT_Q8, 32, 0}, "v_bias", true, "kv head 1, slot 3: v_bias[1]"},
        {{GOKV_FORMAT_Q4, 32, 0}, "k_bias", false, "kv head 1, slot 3: k_bias[1]"},
        {{GOKV_FORMAT_Q4, 64, 0}, "v_scale", true, "kv head 1, slot 3: v_scale[1]"},
        {{GOKV_FORMAT_KIVI2, 32, 32}, "k_scale", false, "kv head 1, token group 0 (slots 0..31): k_scale[5]"},
        {{GOKV_FORMAT_KIVI4, 32, 32}, "k_bias", true, "kv head 1, token group 0 (slots 0..31): k_bias[5]"},
        {{GOKV_FORMAT_KIVI2, 32, 32}, "v_scale", false, "kv head 1, slot 3: v_scale[1]"},
    };
    for (const Poison &ps : poisons) {
        PoolCfg c0 = format_cfg(ps.f.format, ps.f.group, ps.f.residual);
        c0.n_kv_heads = 2;
        c0.d_k = c0.d_v = 128; /* two groups per row for g 64 */
        Cache c;
        ASSERT_TRUE(build_cache(dut(), c0, {200}, 51u, c));
        const gokv_layout *L = gokv_pool_layout(c.pool.get());
        const std::string what = c.cfg.name() + " " + ps.section;
        const int32_t page = c.seqs[0].pages[0], P = L->page_size;
        const std::vector<std::vector<uint8_t>> before = stored(c);
        std::vector<uint8_t> b = page_bytes(c.pool.get(), page);
        /* kv head 1, slot 3 (KIVI keys: token group 0), element or group 5 (groups: 1) */
        const bool key = ps.section[0] == 'k';
        const uint64_t head = key ? L->k_codes_head : L->v_codes_head;
        uint64_t off = 0;
        if (std::strcmp(ps.section + 2, "codes") == 0) {
            off = (key ? L->k_codes : L->v_codes) + head + 3u * (key ? L->k_row_bytes : L->v_row_bytes);
            if (ps.f.format == GOKV_FORMAT_F32) {
                const float x = ps.inf ? kInf : kNaN;
                std::memcpy(b.data() + off + 5u * 4u, &x, 4);
            } else {
                put_half(b, off + 5u * 2u, ps.inf ? kHalfInf : kHalfNaN);
            }
        } else {
            const bool scale = std::strcmp(ps.section + 2, "scale") == 0;
            off = (key ? (scale ? L->k_scale : L->k_bias) : (scale ? L->v_scale : L->v_bias)) + head;
            if (key && L->kivi)
                off += 5u * 2u; /* token group 0, channel 5 */
            else
                off += (3u * (uint64_t)(key ? L->k_groups : L->v_groups) + 1u) * 2u;
            put_half(b, off, ps.inf ? kHalfInf : kHalfNaN);
        }
        expect_rejected(gokv_pool_set_page_bytes(c.pool.get(), page, b.data(), b.size(), P),
                        {GOKV_EINVAL, ps.needle}, what);
        EXPECT_TRUE(stored(c) == before) << what << ": a rejected set_page_bytes changed the pool";
        /* slots past n_tokens are not checked (KIVI: the group past them) */
        const int32_t n_ok = L->kivi ? 0 : 3;
        EXPECT_EQ(gokv_pool_set_page_bytes(c.pool.get(), page, b.data(), b.size(), n_ok), GOKV_OK)
            << what << " with n_tokens " << n_ok << ": " << gokv_last_error();
    }

    /* arguments */
    PoolCfg c0 = format_cfg(GOKV_FORMAT_KIVI2, 32, 32);
    c0.n_kv_heads = 2;
    Cache c;
    ASSERT_TRUE(build_cache(dut(), c0, {200}, 52u, c));
    const gokv_layout *L = gokv_pool_layout(c.pool.get());
    const std::vector<std::vector<uint8_t>> before = stored(c);
    const std::vector<uint8_t> b = page_bytes(c.pool.get(), 0);
    gokv_pool *pool = c.pool.get();
    const int32_t n = c.cfg.n_pages;
    expect_rejected(gokv_pool_set_page_bytes(nullptr, 0, b.data(), b.size(), 0), {GOKV_EINVAL, "pool is NULL"}, "NULL pool");
    expect_rejected(gokv_pool_set_page_bytes(pool, 0, nullptr, b.size(), 0), {GOKV_EINVAL, "bytes is NULL"}, "NULL bytes");
    expect_rejected(gokv_pool_set_page_bytes(pool, -1, b.data(), b.size(), 0), {GOKV_ERANGE, "page -1"}, "page -1");
    expect_rejected(gokv_pool_set_page_bytes(pool, n, b.data(), b.size(), 0),
                    {GOKV_ERANGE, ("page " + std::to_string(n)).c_str()}, "page n_pages");
    expect_rejected(gokv_pool_set_page_bytes(pool, 0, b.data(), b.size() - 1, 0), {GOKV_EINVAL, "n_bytes"}, "short");
    expect_rejected(gokv_pool_set_page_bytes(pool, 0, b.data(), b.size() + 64, 0), {GOKV_EINVAL, "n_bytes"}, "long");
    expect_rejected(gokv_pool_set_page_bytes(pool, 0, b.data(), b.size(), -1), {GOKV_EINVAL, "n_tokens -1"}, "n_tokens -1");
    expect_rejected(gokv_pool_set_page_bytes(pool, 0, b.data(), b.size(), L->page_size + 1), {GOKV_EINVAL, "n_tokens"},
                    "n_tokens P + 1");
    expect_rejected(gokv_pool_set_page_bytes(pool, 0, b.data(), b.size(), 16), {GOKV_EINVAL, "multiple of group_size"},
                    "KIVI n_tokens not a multiple of g");
    EXPECT_TRUE(stored(c) == before) << "a rejected set_page_bytes changed the pool";
}

TEST_P(StoredBytesValidation, SetSlotBytesRejects) {
    for (const bool mla : {false, true}) {
        PoolCfg c0 = format_cfg(GOKV_FORMAT_KIVI4, 32, 64);
        c0.n_kv_heads = mla ? 1 : 2;
        c0.v_is_k_prefix = mla ? 1 : 0;
        c0.d_v = mla ? 32 : c0.d_v;
        Cache c;
        ASSERT_TRUE(build_cache(dut(), c0, {150}, 61u, c));
        const gokv_layout *L = gokv_pool_layout(c.pool.get());
        const int32_t slot = c.seqs[0].slot;
        std::vector<uint8_t> b = slot_bytes(c.pool.get(), slot);
        if (gokv_pool_set_slot_bytes(c.pool.get(), slot, b.data(), b.size()) == GOKV_ENOTSUP)
            GTEST_SKIP() << dut_name() << " does not implement set_slot_bytes: " << gokv_last_error();
        const std::vector<std::vector<uint8_t>> before = stored(c);
        gokv_pool *pool = c.pool.get();
        const int32_t n = c.cfg.n_slots;
        const std::string tag = mla ? " (mla)" : "";
        expect_rejected(gokv_pool_set_slot_bytes(nullptr, 0, b.data(), b.size()), {GOKV_EINVAL, "pool is NULL"}, "NULL pool");
        expect_rejected(gokv_pool_set_slot_bytes(pool, 0, nullptr, b.size()), {GOKV_EINVAL, "bytes is NULL"}, "NULL bytes");
        expect_rejected(gokv_pool_set_slot_bytes(pool, -1, b.data(), b.size()), {GOKV_ERANGE, "slot -1"}, "slot -1");
        expect_rejected(gokv_pool_set_slot_bytes(pool, n, b.data(), b.size()),
                        {GOKV_ERANGE, ("slot " + std::to_string(n)).c_str()}, "slot n_slots");
        expect_rejected(gokv_pool_set_slot_bytes(pool, slot, b.data(), b.size() - 2), {GOKV_EINVAL, "n_bytes"}, "short");
        /* ring row 7, kv head h, element 3: every fp16 of the ring is checked, rows with tokens or not */
        for (const bool value : {false, true}) {
            if (value && mla) continue;
            const int32_t h = c0.n_kv_heads - 1, d = value ? L->d_v : L->d_k;
            std::vector<uint8_t> bad = b;
            const uint64_t off = (value ? L->ring_v : L->ring_k) + ((7u * (uint64_t)L->n_kv_heads + (uint64_t)h) * (uint64_t)d + 3u) * 2u;
            put_half(bad, off, value ? 0x7c00u : 0x7e01u);
            const std::string needle = "ring row 7, kv head " + std::to_string(h) + ": " + (value ? "ring_v[3]" : "ring_k[3]");
            expect_rejected(gokv_pool_set_slot_bytes(pool, slot, bad.data(), bad.size()), {GOKV_EINVAL, needle.c_str()},
                            needle + tag);
        }
        EXPECT_TRUE(stored(c) == before) << "a rejected set_slot_bytes changed the pool" << tag;
    }
    Cache f;
    ASSERT_TRUE(build_cache(dut(), format_cfg(GOKV_FORMAT_Q8, 32, 0), {10}, 62u, f));
    const std::vector<uint8_t> z(64, 0);
    expect_rejected(gokv_pool_set_slot_bytes(f.pool.get(), 0, z.data(), z.size()), {GOKV_EINVAL, "keeps no residual slots"},
                    "q8 ring");
}

/* Loaded bytes count in the score-range guard (gokv.h: an attention whose scores could leave float32's range
 * is refused) as written ones do: a page of keys near 1e30 copied into a fresh pool makes the same query
 * refused there, where without them it would pass the guard and overflow in the kernel. */
TEST_P(StoredBytesValidation, LoadedPagesCountInTheScoreRange) {
    PoolCfg c0;
    c0.n_pages = 2;
    PoolPtr a = make_pool(dut(), c0), b = make_pool(dut(), c0);
    ASSERT_TRUE(a && b);
    Allocator alloc(c0, 91u);
    Seq s = alloc.new_seq(8);
    ASSERT_EQ(append1(a.get(), c0, s, std::vector<float>(8 * 64, 1e30f), std::vector<float>(8 * 64, 1.0f)), GOKV_OK)
        << gokv_last_error();
    const std::vector<uint8_t> page = page_bytes(a.get(), s.pages[0]);
    ASSERT_EQ(gokv_pool_set_page_bytes(b.get(), s.pages[0], page.data(), page.size(), 8), GOKV_OK) << gokv_last_error();
    AttnSeq as;
    as.kv_len = 8;
    as.q_pos = 7;
    as.pages = s.table(8, c0.page_size);
    const std::vector<float> q(64, 1e7f);
    std::vector<float> out;
    for (gokv_pool *pool : {a.get(), b.get()}) {
        const std::string what = pool == a.get() ? "written pool" : "loaded pool";
        const gokv_status st = attend(dut(), pool, c0, {as}, q, AttnOpts{}, out);
        expect_rejected(st, {GOKV_EINVAL, "largest stored |k|"}, what);
    }
}

GOKV_INSTANTIATE_ON_BACKENDS(StoredBytesValidation);

} // namespace
