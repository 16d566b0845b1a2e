/* format_check.cc: see format_check.h. */
#include "format_check.h"

#include <map>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace gokvtest {

void FailBudget::fail(const std::string &msg) {
    total++;
    if (reported < 8) {
        reported++;
        ADD_FAILURE() << msg;
    }
}

static uint16_t half_bits_at(const uint8_t *p, uint64_t off) {
    uint16_t h;
    std::memcpy(&h, p + off, 2);
    return h;
}

/* Distance in representable fp16 steps between two finite non-negative halves. */
static int half_ulps(uint16_t a, uint16_t b) { return std::abs((int)(a & 0x7fff) - (int)(b & 0x7fff)) + (((a ^ b) & 0x8000) ? 1 << 15 : 0); }

void check_group(FailBudget &fb, const std::string &what, const std::vector<float> &x, const std::vector<uint32_t> &q,
                 uint16_t s_bits, uint16_t b_bits, const std::vector<float> &dq, int32_t bits) {
    const float mn = *std::min_element(x.begin(), x.end()), mx = *std::max_element(x.begin(), x.end());
    const uint32_t levels = (1u << bits) - 1u;
    const float s = gokv_half_to_float(s_bits), b = gokv_half_to_float(b_bits);
    std::ostringstream ctx;
    ctx << what << " (min " << mn << ", max " << mx << ", stored s " << s << ", b " << b << ")";
    if (b_bits != gokv_float_to_half(mn)) {
        fb.fail(ctx.str() + ": bias is not fp16(min)");
        return;
    }
    if (mn == mx) {
        if (s != 0.0f) fb.fail(ctx.str() + ": constant group must store s = 0");
    } else {
        const uint16_t want = gokv_float_to_half((mx - mn) / (float)levels);
        if (half_ulps(s_bits, want) > 1) {
            fb.fail(ctx.str() + ": scale is not fp16((max-min)/(2^bits-1))");
            return;
        }
    }
    for (size_t i = 0; i < x.size(); i++) {
        if (q[i] > levels) {
            fb.fail(ctx.str() + ": code out of range");
            return;
        }
        if (s > 0.0f) {
            const double r = ((double)x[i] - (double)b) / (double)s;
            const double rc = std::min(std::max(r, 0.0), (double)levels);
            const double want = std::nearbyint(rc);
            const bool near_tie = std::fabs(std::fabs(rc - std::floor(rc)) - 0.5) < 1e-3;
            if ((double)q[i] != want && !(near_tie && std::fabs((double)q[i] - rc) < 0.51)) {
                std::ostringstream m;
                m << ctx.str() << ": element " << i << " x=" << x[i] << " code " << q[i] << ", expected "
                  << want << " (= clamp(round((x-b)/s)), r=" << r << ")";
                fb.fail(m.str());
                return;
            }
        }
        const float recon = (float)q[i] * s + b;
        const double tol = 3e-7 * (std::fabs((double)q[i] * s) + std::fabs(b)) + 1e-12;
        if (!(std::fabs((double)dq[i] - (double)recon) <= tol)) {
            std::ostringstream m;
            m << ctx.str() << ": element " << i << " reads " << dq[i] << ", stored code gives q*s+b = " << recon;
            fb.fail(m.str());
            return;
        }
        const double bound = 0.5 * s + ((double)(mx - mn) + std::fabs(mn)) * std::ldexp(1.0, -10) + 1e-6;
        if (!(std::fabs((double)dq[i] - (double)x[i]) <= bound)) {
            std::ostringstream m;
            m << ctx.str() << ": element " << i << " x=" << x[i] << " reads " << dq[i] << ", error above s/2 bound "
              << bound;
            fb.fail(m.str());
            return;
        }
    }
}

/* One per-token row (d elements) of a per-token section. */
static void check_token_row(FailBudget &fb, const std::string &what, const uint8_t *page, const gokv_layout &L,
                            bool is_v, int32_t h, int32_t slot, const float *x_in, const float *dq_in, bool round_in) {
    const int32_t d = is_v ? L.d_v : L.d_k;
    const uint64_t codes = (is_v ? L.v_codes : L.k_codes) + (uint64_t)h * (is_v ? L.v_codes_head : L.k_codes_head) +
                           (uint64_t)slot * (is_v ? L.v_row_bytes : L.k_row_bytes);
    if (L.format == GOKV_FORMAT_F32 || L.format == GOKV_FORMAT_F16) {
        for (int32_t j = 0; j < d; j++) {
            bool ok;
            if (L.format == GOKV_FORMAT_F32) {
                float f;
                std::memcpy(&f, page + codes + 4 * (uint64_t)j, 4);
                ok = std::memcmp(&f, &x_in[j], 4) == 0 && std::memcmp(&dq_in[j], &x_in[j], 4) == 0;
            } else {
                const uint16_t hb = half_bits_at(page, codes + 2 * (uint64_t)j);
                ok = hb == gokv_float_to_half(x_in[j]) && dq_in[j] == gokv_round_half(x_in[j]);
            }
            if (!ok) {
                fb.fail(what + ": f32/f16 element " + std::to_string(j) + " not stored/read exactly");
                return;
            }
        }
        return;
    }
    const int32_t g = L.group, bits = L.kivi ? (L.bits) : L.bits;
    const int32_t groups = is_v ? L.v_groups : L.k_groups;
    /* q4 keys (not MLA's, which its values read as rows) lie in tiles of 16 tokens: dword j of slot t's row at
     * tile t/16, column j, lane t%16 (gokv_layout.h). Gathered into a plain row here, by that rule. */
    const bool tiled = !is_v && L.format == GOKV_FORMAT_Q4 && !L.v_is_k_prefix;
    EXPECT_EQ(L.k_tiled != 0, L.format == GOKV_FORMAT_Q4 && !L.v_is_k_prefix) << what;
    const uint64_t rb = L.k_row_bytes;
    std::vector<uint8_t> row(tiled ? (size_t)rb : 0);
    const uint64_t tile0 = L.k_codes + (uint64_t)h * L.k_codes_head + (uint64_t)(slot / 16) * 16 * rb;
    for (uint64_t b = 0; b < row.size(); b++) row[b] = page[tile0 + (b / 4) * 64 + (uint64_t)(slot % 16) * 4 + b % 4];
    const uint8_t *codes_at = tiled ? row.data() : page + codes;
    const uint64_t sb = (uint64_t)h * (is_v ? L.v_sb_head : L.k_sb_head) + (uint64_t)slot * (uint64_t)groups * 2;
    for (int32_t j = 0; j < groups; j++) {
        std::vector<float> x((size_t)g), dq((size_t)g);
        std::vector<uint32_t> q((size_t)g);
        for (int32_t i = 0; i < g; i++) {
            x[(size_t)i] = round_in ? gokv_round_half(x_in[j * g + i]) : x_in[j * g + i];
            dq[(size_t)i] = dq_in[j * g + i];
            q[(size_t)i] = code_at(codes_at, bits, j * g + i);
        }
        const uint16_t sbits = half_bits_at(page, (is_v ? L.v_scale : L.k_scale) + sb + 2 * (uint64_t)j);
        const uint16_t bbits = half_bits_at(page, (is_v ? L.v_bias : L.k_bias) + sb + 2 * (uint64_t)j);
        check_group(fb, what + " group " + std::to_string(j), x, q, sbits, bbits, dq, bits);
    }
}

void check_stored_sequence(FailBudget &fb, gokv_pool *pool, const PoolCfg &c, const Seq &s,
                           const std::vector<float> &kdq, const std::vector<float> &vdq) {
    const gokv_layout *Lp = gokv_pool_layout(pool);
    ASSERT_NE(Lp, nullptr);
    const gokv_layout &L = *Lp;
    const int32_t H = c.n_kv_heads, dk = c.d_k, dv = c.d_v, P = c.page_size;
    const int32_t nq = c.kivi() ? gokv_kivi_quantized_len(s.len, c.group, c.residual) : s.len;
    const bool has_v = !c.v_is_k_prefix;
    /* the raw bytes of each page, read once through gokv_pool_page_bytes */
    std::map<int32_t, std::vector<uint8_t>> pages;
    auto page_of = [&](int32_t id) -> const uint8_t * {
        auto it = pages.find(id);
        if (it == pages.end()) it = pages.emplace(id, page_bytes(pool, id)).first;
        return it->second.empty() ? nullptr : it->second.data();
    };
    for (int32_t t = 0; t < nq; t++) {
        const uint8_t *page = page_of(s.pages[(size_t)(t / P)]);
        ASSERT_NE(page, nullptr);
        for (int32_t h = 0; h < H; h++) {
            const size_t ko = ((size_t)t * (size_t)H + (size_t)h) * (size_t)dk;
            const size_t vo = ((size_t)t * (size_t)H + (size_t)h) * (size_t)dv;
            const std::string at = c.name() + " token " + std::to_string(t) + " head " + std::to_string(h);
            if (!c.kivi())
                check_token_row(fb, at + " K", page, L, false, h, t % P, &s.k[ko], &kdq[ko], false);
            if (has_v) check_token_row(fb, at + " V", page, L, true, h, t % P, &s.v[vo], &vdq[vo], c.kivi());
        }
    }
    if (c.kivi()) {
        const int32_t g = c.group, bits = L.bits;
        for (int32_t t0 = 0; t0 < nq; t0 += g) {
            const uint8_t *page = page_of(s.pages[(size_t)(t0 / P)]);
            ASSERT_NE(page, nullptr);
            const int32_t tg = (t0 % P) / g;
            for (int32_t h = 0; h < H; h++)
                for (int32_t ch = 0; ch < dk; ch++) {
                    std::vector<float> x((size_t)g), dq((size_t)g);
                    std::vector<uint32_t> q((size_t)g);
                    const uint64_t codes = L.k_codes + (uint64_t)h * L.k_codes_head + (uint64_t)tg * L.k_row_bytes +
                                           (uint64_t)ch * (uint64_t)(g * bits / 8);
                    for (int32_t u = 0; u < g; u++) {
                        const size_t ko = ((size_t)(t0 + u) * (size_t)H + (size_t)h) * (size_t)dk + (size_t)ch;
                        x[(size_t)u] = gokv_round_half(s.k[ko]);
                        dq[(size_t)u] = kdq[ko];
                        q[(size_t)u] = code_at(page + codes, bits, u);
                    }
                    const uint64_t sb = (uint64_t)h * L.k_sb_head + ((uint64_t)tg * (uint64_t)dk + (uint64_t)ch) * 2;
                    check_group(fb,
                                c.name() + " K tokens " + std::to_string(t0) + ".." + std::to_string(t0 + g - 1) +
                                    " head " + std::to_string(h) + " channel " + std::to_string(ch),
                                x, q, half_bits_at(page, L.k_scale + sb), half_bits_at(page, L.k_bias + sb), dq, bits);
                }
        }
        /* Ring: the newest tokens, fp16, at row t % (R + g). */
        const std::vector<uint8_t> ring_bytes = slot_bytes(pool, s.slot);
        ASSERT_FALSE(ring_bytes.empty());
        const uint8_t *ring = ring_bytes.data();
        for (int32_t t = nq; t < s.len; t++) {
            const uint64_t row = (uint64_t)(t % L.ring_rows);
            for (int32_t i = 0; i < H * dk; i++) {
                const size_t ko = (size_t)t * (size_t)H * (size_t)dk + (size_t)i;
                const uint16_t want = gokv_float_to_half(s.k[ko]);
                if (half_bits_at(ring, L.ring_k + (row * (uint64_t)H * (uint64_t)dk + (uint64_t)i) * 2) != want ||
                    kdq[ko] != gokv_half_to_float(want)) {
                    fb.fail(c.name() + " ring K token " + std::to_string(t) + " element " + std::to_string(i) +
                            " is not the fp16 input (in ring row t % (R+g), and read back)");
                    break;
                }
            }
            for (int32_t i = 0; has_v && i < H * dv; i++) {
                const size_t vo = (size_t)t * (size_t)H * (size_t)dv + (size_t)i;
                const uint16_t want = gokv_float_to_half(s.v[vo]);
                if (half_bits_at(ring, L.ring_v + (row * (uint64_t)H * (uint64_t)dv + (uint64_t)i) * 2) != want ||
                    vdq[vo] != gokv_half_to_float(want)) {
                    fb.fail(c.name() + " ring V token " + std::to_string(t) + " element " + std::to_string(i) +
                            " is not the fp16 input");
                    break;
                }
            }
        }
    }
}

} // namespace gokvtest
