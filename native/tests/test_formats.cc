/*
 * test_formats.cc: the stored formats on every backend (docs/architecture.md §4, gokv_layout.h): KIVI's and
 * the 4-bit known values on the raw page bytes (gokv_pool_page_bytes), constant groups, released pages,
 * reads from a start position, pool sizes and sections. (The rule on every stored byte: test_store.cc.)
 */
#include <gtest/gtest.h>

#include <cstring>

#include "format_check.h"
#include "harness.h"

using namespace gokvtest;

namespace {

struct StoreCase {
    int32_t format, group, residual, page_size, d_k, d_v, mla;
};

std::string case_name(const StoreCase &p) {
    PoolCfg c = format_cfg(p.format, p.group, p.residual);
    return c.name() + "_p" + std::to_string(p.page_size) + "_d" + std::to_string(p.d_k) + "x" + std::to_string(p.d_v) +
           (p.mla ? "_mla" : "");
}

const StoreCase kStoreCases[] = {
    {GOKV_FORMAT_F32, 0, 0, 64, 128, 64, 0},    {GOKV_FORMAT_F16, 0, 0, 16, 128, 64, 0},
    {GOKV_FORMAT_Q8, 32, 0, 64, 128, 64, 0},    {GOKV_FORMAT_Q8, 64, 0, 16, 128, 128, 0},
    {GOKV_FORMAT_Q4, 32, 0, 64, 128, 96, 0},    {GOKV_FORMAT_Q4, 64, 0, 64, 128, 128, 0},
    {GOKV_FORMAT_Q4, 128, 0, 128, 128, 128, 0}, {GOKV_FORMAT_Q4, 32, 0, 64, 96, 64, 1},
    {GOKV_FORMAT_KIVI2, 32, 0, 64, 128, 64, 0}, {GOKV_FORMAT_KIVI2, 32, 32, 32, 128, 128, 0},
    {GOKV_FORMAT_KIVI2, 32, 128, 64, 64, 64, 0}, {GOKV_FORMAT_KIVI4, 32, 0, 64, 128, 128, 0},
    {GOKV_FORMAT_KIVI4, 32, 64, 128, 96, 64, 1}, {GOKV_FORMAT_KIVI2, 64, 64, 64, 128, 128, 0},
    {GOKV_FORMAT_KIVI4, 128, 128, 128, 128, 128, 0}, {GOKV_FORMAT_KIVI2, 32, 32, 64, 96, 64, 1},
    {GOKV_FORMAT_Q4, 32, 0, 24, 128, 64, 0},    {GOKV_FORMAT_Q4, 32, 0, 40, 96, 96, 0}, /* q4 keys' last tile padded */
};

/* Writes n tokens of one kv head into a fresh pool; k and v rows given. */
struct OneSeq {
    PoolCfg cfg;
    PoolPtr pool;
    Seq seq;
    std::vector<float> kdq, vdq;
};
void write_one(const PoolCfg &c, const std::vector<float> &k, const std::vector<float> &v, OneSeq &o) {
    o.cfg = c;
    if (o.cfg.kivi()) o.cfg.n_slots = 2;
    o.pool = make_pool(dut(), o.cfg);
    ASSERT_TRUE(o.pool);
    Allocator alloc(o.cfg, 7);
    const int32_t n = (int32_t)(k.size() / ((size_t)c.n_kv_heads * (size_t)c.d_k));
    o.seq = alloc.new_seq(n);
    gokv_status st = append1(o.pool.get(), o.cfg, o.seq, k, v);
    ASSERT_EQ(st, GOKV_OK) << gokv_last_error();
    ASSERT_EQ(read_seq(o.pool.get(), o.cfg, o.seq, o.kdq, o.vdq), GOKV_OK) << gokv_last_error();
}

class KnownValues : public BackendTest {};

/* KIVI's known value: key channel 5 holds 1,2,3,4,1,2,3,4,... over a 32-token group -> s = 1, b = 1,
 * codes 0,1,2,3, every byte 0 | 1<<2 | 2<<4 | 3<<6 = 228, exact round trip. */
TEST_P(KnownValues, Kivi2Channel1234Packs228) {
    PoolCfg c = format_cfg(GOKV_FORMAT_KIVI2, 32, 0);
    c.d_k = 64;
    c.d_v = 64;
    std::mt19937 rng(5);
    const int32_t n = 32, ch = 5;
    std::vector<float> k = gen_keys(rng, n, 1, c.d_k), v = gen_values(rng, n, 1, c.d_v);
    for (int32_t t = 0; t < n; t++) k[(size_t)t * (size_t)c.d_k + ch] = (float)(1 + t % 4);
    OneSeq o;
    ASSERT_NO_FATAL_FAILURE(write_one(c, k, v, o));
    ASSERT_EQ(gokv_kivi_quantized_len(n, 32, 0), 32);
    const gokv_layout *L = gokv_pool_layout(o.pool.get());
    ASSERT_NE(L, nullptr);
    EXPECT_EQ(L->k_row_bytes, (uint64_t)c.d_k * 32 * 2 / 8);
    const std::vector<uint8_t> page_v = page_bytes(o.pool.get(), o.seq.pages[0]);
    ASSERT_FALSE(page_v.empty());
    const uint8_t *page = page_v.data();
    const uint8_t *codes = page + L->k_codes + (uint64_t)ch * 8; /* head 0, token group 0, channel ch */
    for (int i = 0; i < 8; i++) EXPECT_EQ(codes[i], 228) << "byte " << i << " of channel " << ch;
    uint16_t s, b;
    std::memcpy(&s, page + L->k_scale + 2 * (uint64_t)ch, 2);
    std::memcpy(&b, page + L->k_bias + 2 * (uint64_t)ch, 2);
    EXPECT_EQ(s, gokv_float_to_half(1.0f)) << "scale " << gokv_half_to_float(s);
    EXPECT_EQ(b, gokv_float_to_half(1.0f)) << "bias " << gokv_half_to_float(b);
    for (int32_t t = 0; t < n; t++)
        EXPECT_EQ(o.kdq[(size_t)t * (size_t)c.d_k + ch], (float)(1 + t % 4)) << "token " << t;
}

/* 4-bit known values: 0..15 -> s = 1, b = 0, byte = q0 | q1<<4. Per token along head_dim (q4, and KIVI
 * values), and per channel along tokens (kivi4 keys). */
TEST_P(KnownValues, Q4PerTokenNibbles) {
    PoolCfg c = format_cfg(GOKV_FORMAT_Q4, 32, 0);
    c.d_k = 64;
    c.d_v = 64;
    std::vector<float> k((size_t)c.d_k), v((size_t)c.d_v);
    for (int32_t j = 0; j < c.d_k; j++) k[(size_t)j] = (float)(j % 16);
    for (int32_t j = 0; j < c.d_v; j++) v[(size_t)j] = (float)(15 - j % 16) * 0.5f - 2.0f; /* s = .5, b = -2 */
    OneSeq o;
    ASSERT_NO_FATAL_FAILURE(write_one(c, k, v, o));
    const gokv_layout *L = gokv_pool_layout(o.pool.get());
    const std::vector<uint8_t> page_v = page_bytes(o.pool.get(), o.seq.pages[0]);
    ASSERT_FALSE(page_v.empty());
    const uint8_t *page = page_v.data();
    EXPECT_EQ(L->k_row_bytes, 32u);
    EXPECT_EQ(L->k_tiled, 1); /* q4 keys: dword j of slot 0's row is column j's lane 0, 64 bytes apart */
    for (int i = 0; i < 32; i++) {
        const int q0 = (2 * i) % 16, q1 = (2 * i + 1) % 16;
        const uint64_t k_at = L->k_codes + (uint64_t)(i / 4) * 64 + (uint64_t)(i % 4);
        EXPECT_EQ(page[k_at], (uint8_t)(q0 | q1 << 4)) << "K byte " << i;
        EXPECT_EQ(page[L->v_codes + (uint64_t)i], (uint8_t)((15 - q0) | (15 - q1) << 4)) << "V byte " << i;
    }
    for (int j = 0; j < 2; j++) {
        EXPECT_EQ(half_at(page, L->k_scale + 2 * (uint64_t)j), 1.0f);
        EXPECT_EQ(half_at(page, L->k_bias + 2 * (uint64_t)j), 0.0f);
        EXPECT_EQ(half_at(page, L->v_scale + 2 * (uint64_t)j), 0.5f);
        EXPECT_EQ(half_at(page, L->v_bias + 2 * (uint64_t)j), -2.0f);
    }
    EXPECT_EQ(o.kdq, k);
    EXPECT_EQ(o.vdq, v);
}

TEST_P(KnownValues, Kivi4ChannelNibbles) {
    PoolCfg c = format_cfg(GOKV_FORMAT_KIVI4, 32, 0);
    c.d_k = 32;
    c.d_v = 32;
    const int32_t n = 32, ch = 3;
    std::mt19937 rng(6);
    std::vector<float> k = gen_keys(rng, n, 1, c.d_k), v((size_t)n * (size_t)c.d_v);
    for (int32_t t = 0; t < n; t++) k[(size_t)t * (size_t)c.d_k + ch] = (float)(t % 16);
    for (int32_t t = 0; t < n; t++) /* values: per token, 0..15 along head_dim */
        for (int32_t j = 0; j < c.d_v; j++) v[(size_t)t * (size_t)c.d_v + (size_t)j] = (float)((j + t) % 16);
    OneSeq o;
    ASSERT_NO_FATAL_FAILURE(write_one(c, k, v, o));
    const gokv_layout *L = gokv_pool_layout(o.pool.get());
    const std::vector<uint8_t> page_v = page_bytes(o.pool.get(), o.seq.pages[0]);
    ASSERT_FALSE(page_v.empty());
    const uint8_t *page = page_v.data();
    const uint8_t *codes = page + L->k_codes + (uint64_t)ch * 16;
    for (int i = 0; i < 16; i++)
        EXPECT_EQ(codes[i], (uint8_t)((2 * i) % 16 | ((2 * i + 1) % 16) << 4)) << "K channel byte " << i;
    EXPECT_EQ(half_at(page, L->k_scale + 2 * (uint64_t)ch), 1.0f);
    EXPECT_EQ(half_at(page, L->k_bias + 2 * (uint64_t)ch), 0.0f);
    for (int32_t t = 0; t < n; t++) {
        EXPECT_EQ(o.kdq[(size_t)t * (size_t)c.d_k + ch], (float)(t % 16)) << "token " << t;
        const uint8_t *vrow = page + L->v_codes + (uint64_t)t * L->v_row_bytes;
        EXPECT_EQ(vrow[0], (uint8_t)((t % 16) | ((t + 1) % 16) << 4)) << "V token " << t;
    }
    EXPECT_EQ(o.vdq, v);
}

/* q8: 0..31 with one 255 per group -> s = 1, b = 0, exact. */
TEST_P(KnownValues, Q8Exact) {
    PoolCfg c = format_cfg(GOKV_FORMAT_Q8, 32, 0);
    c.d_k = 64;
    c.d_v = 64;
    std::vector<float> k((size_t)c.d_k), v((size_t)c.d_v);
    for (int32_t j = 0; j < 64; j++) k[(size_t)j] = (j % 32 == 7) ? 255.0f : (float)(j % 32);
    for (int32_t j = 0; j < 64; j++) v[(size_t)j] = (j % 32 == 1) ? -255.0f : -(float)(j % 32); /* b = -255 */
    OneSeq o;
    ASSERT_NO_FATAL_FAILURE(write_one(c, k, v, o));
    const gokv_layout *L = gokv_pool_layout(o.pool.get());
    const std::vector<uint8_t> page_v = page_bytes(o.pool.get(), o.seq.pages[0]);
    ASSERT_FALSE(page_v.empty());
    const uint8_t *page = page_v.data();
    for (int32_t j = 0; j < 64; j++) {
        EXPECT_EQ(page[L->k_codes + (uint64_t)j], (uint8_t)k[(size_t)j]) << j;
        EXPECT_EQ(page[L->v_codes + (uint64_t)j], (uint8_t)(v[(size_t)j] + 255.0f)) << j;
    }
    EXPECT_EQ(o.kdq, k);
    EXPECT_EQ(o.vdq, v);
}

GOKV_INSTANTIATE_ON_BACKENDS(KnownValues);

/* Constant groups (fp16-representable constants): s = 0 stored, no NaN, exact reconstruction. */
class ConstantGroups : public BackendParamTest<StoreCase> {};
TEST_P(ConstantGroups, ReconstructExactly) {
    const StoreCase p = param();
    PoolCfg c = format_cfg(p.format, gokv_format_quantized(p.format) ? p.group : 0, p.residual);
    c.d_k = p.d_k;
    c.d_v = p.d_v;
    c.page_size = p.page_size;
    const int32_t gp = p.group ? p.group : 32;
    const int32_t n = 2 * p.page_size + 5; /* KIVI: whole quantized groups and a ring */
    const float consts[] = {0.0f, 0.375f, -2.5f, 1000.0f, -65504.0f, 65504.0f, 6.103515625e-05f /* 2^-14 */};
    std::vector<float> k((size_t)n * (size_t)c.d_k), v((size_t)n * (size_t)c.d_v);
    /* key channel ch is constant consts[ch % 7] on all tokens (KIVI groups per channel constant); for
     * per-token formats every group of a row is constant: value depends on (token + group index). */
    for (int32_t t = 0; t < n; t++) {
        for (int32_t j = 0; j < c.d_k; j++)
            k[(size_t)t * (size_t)c.d_k + (size_t)j] = c.kivi() ? consts[j % 7] : consts[(t + j / gp) % 7];
        for (int32_t j = 0; j < c.d_v; j++) v[(size_t)t * (size_t)c.d_v + (size_t)j] = consts[(t + 3 + j / gp) % 7];
    }
    OneSeq o;
    ASSERT_NO_FATAL_FAILURE(write_one(c, k, v, o));
    EXPECT_TRUE(all_finite(o.kdq));
    EXPECT_TRUE(all_finite(o.vdq));
    EXPECT_EQ(o.kdq, k);
    EXPECT_EQ(o.vdq, v);
    FailBudget fb;
    check_stored_sequence(fb, o.pool.get(), o.cfg, o.seq, o.kdq, o.vdq);
    EXPECT_EQ(fb.total, 0);

    /* Attention over constant values returns that constant exactly up to rounding, never NaN. */
    std::vector<float> vconst((size_t)n * (size_t)c.d_v, 0.375f);
    OneSeq o2;
    ASSERT_NO_FATAL_FAILURE(write_one(c, k, vconst, o2));
    Cache cache;
    cache.cfg = o2.cfg;
    cache.pool = std::move(o2.pool);
    cache.seqs = {o2.seq};
    cache.kdq = {o2.kdq};
    cache.vdq = {o2.vdq};
    AttnOpts opts;
    opts.n_heads_q = 2;
    std::mt19937 rng(3);
    std::vector<float> q = gen_normal(rng, 2 * (size_t)c.d_k);
    std::vector<float> out;
    check_attend(dut(), cache, {attn_seq(cache, 0)}, q, opts, 1e-5, "constant values", &out);
    for (float x : out) ASSERT_NEAR(x, 0.375f, 1e-6f);
}
const StoreCase kConstCases[] = {
    {GOKV_FORMAT_F16, 0, 0, 64, 64, 64, 0},      {GOKV_FORMAT_Q8, 32, 0, 64, 64, 64, 0},
    {GOKV_FORMAT_Q4, 32, 0, 64, 64, 64, 0},      {GOKV_FORMAT_Q4, 64, 0, 64, 128, 64, 0},
    {GOKV_FORMAT_KIVI2, 32, 0, 64, 64, 64, 0},   {GOKV_FORMAT_KIVI4, 32, 32, 64, 64, 64, 0},
    {GOKV_FORMAT_KIVI2, 64, 64, 128, 128, 128, 0},
};
GOKV_INSTANTIATE_CASES(Formats, ConstantGroups, kConstCases);

class Read : public BackendTest {};

/* Released pages (-1 in the table) read as zeros; the other pages read as before. */
TEST_P(Read, ReleasedPagesReadAsZeros) {
    /* the last case releases a page whose tokens (64..127) sit in the KIVI ring (n = 200, R = 128) */
    for (int32_t fmt : {(int32_t)GOKV_FORMAT_F32, (int32_t)GOKV_FORMAT_Q4, (int32_t)GOKV_FORMAT_KIVI2, (int32_t)GOKV_FORMAT_KIVI4 + 100}) {
        const int32_t residual = fmt >= 100 ? 128 : 0;
        fmt %= 100;
        PoolCfg c = format_cfg(fmt, fmt == GOKV_FORMAT_F32 ? 0 : 32, residual);
        Cache cache;
        ASSERT_TRUE(build_cache(dut(), c, {200}, 77u, cache));
        const Seq &s = cache.seqs[0];
        std::vector<int32_t> table = s.table(s.len, c.page_size);
        table[1] = -1;
        const size_t kr = (size_t)c.n_kv_heads * (size_t)c.d_k, vr = (size_t)c.n_kv_heads * (size_t)c.d_v;
        std::vector<float> k((size_t)s.len * kr, 123.0f), v((size_t)s.len * vr, 123.0f);
        std::vector<int32_t> tok{0, s.len}, pind{0, (int32_t)table.size()};
        int32_t kv_len = s.len, start = 0, slot = s.slot;
        gokv_read_desc r = one_seq_read(tok.data(), pind.data(), table.data(), &kv_len, &start,
                                        cache.cfg.kivi() ? &slot : nullptr, k.data(), v.data());
        ASSERT_EQ(gokv_pool_read(cache.pool.get(), &r), GOKV_OK) << cache.cfg.name() << ": " << gokv_last_error();
        for (int32_t t = 0; t < s.len; t++) {
            const bool released = t / c.page_size == 1;
            for (size_t j = 0; j < kr; j++) {
                const float want = released ? 0.0f : cache.kdq[0][(size_t)t * kr + j];
                ASSERT_EQ(k[(size_t)t * kr + j], want) << cache.cfg.name() << " K token " << t;
            }
            for (size_t j = 0; j < vr; j++) {
                const float want = released ? 0.0f : cache.vdq[0][(size_t)t * vr + j];
                ASSERT_EQ(v[(size_t)t * vr + j], want) << cache.cfg.name() << " V token " << t;
            }
        }
    }
}

/* Reading from a start position returns the same rows as a full read. */
TEST_P(Read, StartPositionReadsTheTail) {
    PoolCfg c = format_cfg(GOKV_FORMAT_KIVI4, 32, 64);
    Cache cache;
    ASSERT_TRUE(build_cache(dut(), c, {250}, 78u, cache));
    for (int32_t start : {0, 1, 63, 64, 130, 249}) {
        std::vector<float> k, v;
        ASSERT_EQ(read_seq(cache.pool.get(), cache.cfg, cache.seqs[0], k, v, start), GOKV_OK) << gokv_last_error();
        const size_t kr = (size_t)c.d_k * (size_t)c.n_kv_heads, vr = (size_t)c.d_v * (size_t)c.n_kv_heads;
        EXPECT_TRUE(std::equal(k.begin(), k.end(), cache.kdq[0].begin() + (long)((size_t)start * kr))) << start;
        EXPECT_TRUE(std::equal(v.begin(), v.end(), cache.vdq[0].begin() + (long)((size_t)start * vr))) << start;
    }
}

GOKV_INSTANTIATE_ON_BACKENDS(Read);

class Layout : public BackendTest {};

/* Sizes: gokv_pool_sizes agrees with the layout; sections are 64-byte aligned and hold what they must. */
TEST_P(Layout, SizesAndSections) {
    for (const StoreCase &p : kStoreCases) {
        PoolCfg c = format_cfg(p.format, p.group, p.residual);
        c.n_kv_heads = p.mla ? 1 : 3;
        c.d_k = p.d_k;
        c.d_v = p.d_v;
        c.v_is_k_prefix = p.mla;
        c.page_size = p.page_size;
        c.n_pages = 3;
        c.n_slots = c.kivi() ? 2 : 0;
        PoolPtr pool = make_pool(dut(), c);
        ASSERT_TRUE(pool);
        const gokv_layout *L = gokv_pool_layout(pool.get());
        ASSERT_NE(L, nullptr);
        uint64_t page_bytes = 0, slot_bytes = 0;
        ASSERT_EQ(gokv_pool_sizes(pool.get(), &page_bytes, &slot_bytes), GOKV_OK);
        EXPECT_EQ(page_bytes, L->page_bytes) << c.name();
        EXPECT_EQ(slot_bytes, c.kivi() ? L->ring_bytes : 0u) << c.name();
        EXPECT_EQ(L->bits, gokv_format_bits(c.format));
        const uint64_t offs[] = {L->k_codes, L->k_scale, L->k_bias, L->v_codes, L->v_scale, L->v_bias};
        for (uint64_t o : offs) EXPECT_EQ(o % 64, 0u) << c.name();
        /* payload lower bound: codes + scales + biases of every head */
        const uint64_t H = (uint64_t)c.n_kv_heads, P = (uint64_t)c.page_size;
        const uint64_t bits = (uint64_t)L->bits;
        uint64_t need = H * P * (uint64_t)c.d_k * bits / 8;
        if (c.quantized()) need += H * P * (uint64_t)c.d_k / (uint64_t)c.group * 4;
        if (!c.v_is_k_prefix) {
            need += H * P * (uint64_t)c.d_v * bits / 8;
            if (c.quantized()) need += H * P * (uint64_t)c.d_v / (uint64_t)c.group * 4;
        }
        EXPECT_EQ(L->k_tiled, c.format == GOKV_FORMAT_Q4 && !c.v_is_k_prefix) << c.name();
        /* tiled q4 keys pad a page of P % 16 != 0 tokens to whole tiles of 16 */
        const uint64_t tile_pad = L->k_tiled ? H * ((P + 15) / 16 * 16 - P) * (uint64_t)c.d_k * bits / 8 : 0;
        EXPECT_GE(page_bytes, need + tile_pad) << c.name();
        EXPECT_LE(page_bytes, need + tile_pad + 6 * 64 * H + 64)
            << c.name() << ": more padding than alignment and tiles need";
        if (c.kivi()) {
            EXPECT_EQ(L->ring_rows, c.residual + c.group);
            EXPECT_GE(L->ring_bytes, (uint64_t)L->ring_rows * H * (uint64_t)(c.d_k + (c.v_is_k_prefix ? 0 : c.d_v)) * 2);
            std::vector<uint8_t> ring(L->ring_bytes);
            EXPECT_EQ(gokv_pool_slot_bytes(pool.get(), 1, ring.data(), ring.size()), GOKV_OK) << gokv_last_error();
            EXPECT_EQ(gokv_pool_slot_bytes(pool.get(), 2, ring.data(), ring.size()), GOKV_ERANGE) << c.name();
        }
        std::vector<uint8_t> pb(L->page_bytes);
        EXPECT_EQ(gokv_pool_page_bytes(pool.get(), 2, pb.data(), pb.size()), GOKV_OK) << gokv_last_error();
        EXPECT_EQ(gokv_pool_page_bytes(pool.get(), 3, pb.data(), pb.size()), GOKV_ERANGE) << c.name();
        EXPECT_EQ(gokv_pool_page_bytes(pool.get(), -1, pb.data(), pb.size()), GOKV_ERANGE) << c.name();
    }
}

TEST_P(Layout, FormatNames) {
    EXPECT_STREQ(gokv_format_name(GOKV_FORMAT_F32), "f32");
    EXPECT_STREQ(gokv_format_name(GOKV_FORMAT_F16), "f16");
    EXPECT_STREQ(gokv_format_name(GOKV_FORMAT_Q8), "q8");
    EXPECT_STREQ(gokv_format_name(GOKV_FORMAT_Q4), "q4");
    EXPECT_STREQ(gokv_format_name(GOKV_FORMAT_KIVI2), "kivi2");
    EXPECT_STREQ(gokv_format_name(GOKV_FORMAT_KIVI4), "kivi4");
    EXPECT_EQ(gokv_format_name(GOKV_FORMAT_COUNT_), nullptr);
    EXPECT_EQ(gokv_format_name(-1), nullptr);
}

GOKV_INSTANTIATE_ON_BACKENDS(Layout);

} // namespace
