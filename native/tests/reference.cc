/* reference.cc: see reference.h. */
#include "reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace gokvtest {

DevicePtr open_cpu(int32_t n_threads) { return open_backend("cpu", n_threads); }

DevicePtr open_backend(const char *backend, int32_t n_threads) {
    gokv_device_desc d;
    std::memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.backend = backend;
    d.device_index = -1;
    d.device_name = nullptr;
    d.n_threads = n_threads;
    gokv_device *dev = nullptr;
    gokv_status st = gokv_device_open(&d, &dev);
    if (st != GOKV_OK || dev == nullptr) {
        ADD_FAILURE() << "gokv_device_open(" << backend << ", n_threads=" << n_threads
                      << "): " << gokv_status_name(st) << ": " << gokv_last_error();
        return DevicePtr();
    }
    return DevicePtr(dev);
}

gokv_device *shared_device() {
    static DevicePtr dev = open_cpu(2);
    return dev.get();
}

std::vector<uint8_t> page_bytes(gokv_pool *pool, int32_t page) {
    const gokv_layout *L = gokv_pool_layout(pool);
    if (!L) {
        ADD_FAILURE() << "page_bytes: no pool";
        return {};
    }
    std::vector<uint8_t> b(L->page_bytes);
    const gokv_status st = gokv_pool_page_bytes(pool, page, b.data(), b.size());
    if (st != GOKV_OK) {
        ADD_FAILURE() << "gokv_pool_page_bytes(page " << page << "): " << gokv_status_name(st) << ": " << gokv_last_error();
        return {};
    }
    return b;
}

std::vector<uint8_t> slot_bytes(gokv_pool *pool, int32_t slot) {
    const gokv_layout *L = gokv_pool_layout(pool);
    if (!L) {
        ADD_FAILURE() << "slot_bytes: no pool";
        return {};
    }
    std::vector<uint8_t> b(L->ring_bytes);
    const gokv_status st = gokv_pool_slot_bytes(pool, slot, b.data(), b.size());
    if (st != GOKV_OK) {
        ADD_FAILURE() << "gokv_pool_slot_bytes(slot " << slot << "): " << gokv_status_name(st) << ": " << gokv_last_error();
        return {};
    }
    return b;
}

std::string PoolCfg::name() const {
    std::string n = gokv_format_name(format) ? gokv_format_name(format) : "unknown";
    if (quantized()) n += "_g" + std::to_string(group);
    if (kivi()) n += "_r" + std::to_string(residual);
    return n;
}

PoolCfg format_cfg(int32_t format, int32_t group, int32_t residual) {
    PoolCfg c;
    c.format = format;
    c.group = group;
    c.residual = residual;
    return c;
}

gokv_pool_desc pool_desc(const PoolCfg &c) {
    gokv_pool_desc d;
    std::memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.format = c.format;
    d.group_size = c.group;
    d.residual = c.residual;
    d.n_kv_heads = c.n_kv_heads;
    d.head_dim_k = c.d_k;
    d.head_dim_v = c.d_v;
    d.v_is_k_prefix = c.v_is_k_prefix;
    d.page_size = c.page_size;
    d.n_pages = c.n_pages;
    d.n_residual_slots = c.n_slots;
    d.key_bounds = c.key_bounds;
    return d;
}

PoolPtr make_pool(gokv_device *dev, const PoolCfg &c) {
    gokv_pool_desc d = pool_desc(c);
    gokv_pool *p = nullptr;
    gokv_status st = gokv_pool_create(dev, &d, &p);
    if (st != GOKV_OK || p == nullptr) {
        ADD_FAILURE() << "gokv_pool_create(" << c.name() << "): " << gokv_status_name(st) << ": " << gokv_last_error();
        return PoolPtr();
    }
    return PoolPtr(p);
}

std::vector<int32_t> Seq::table(int32_t n_tokens, int32_t page_size) const {
    size_t n = (size_t)((n_tokens + page_size - 1) / page_size);
    n = std::min(n, pages.size());
    return std::vector<int32_t>(pages.begin(), pages.begin() + (long)n);
}

Allocator::Allocator(const PoolCfg &c, uint32_t seed) : cfg_(c) {
    for (int32_t i = 0; i < c.n_pages; i++) pages_.push_back(i);
    for (int32_t i = 0; i < c.n_slots; i++) slots_.push_back(i);
    std::mt19937 rng(seed);
    std::shuffle(pages_.begin(), pages_.end(), rng);
    std::shuffle(slots_.begin(), slots_.end(), rng);
}

Seq Allocator::new_seq(int32_t capacity_tokens) {
    Seq s;
    int32_t n = (capacity_tokens + cfg_.page_size - 1) / cfg_.page_size;
    if (n < 1) n = 1;
    if ((size_t)n > pages_.size()) {
        ADD_FAILURE() << "test pool too small: need " << n << " pages, " << pages_.size() << " left";
        return s;
    }
    s.pages.assign(pages_.end() - n, pages_.end());
    pages_.resize(pages_.size() - (size_t)n);
    if (cfg_.kivi()) {
        if (slots_.empty()) {
            ADD_FAILURE() << "test pool has no residual slot left";
            return s;
        }
        s.slot = slots_.back();
        slots_.pop_back();
    }
    return s;
}

void WriteArrays::add(const PoolCfg &c, const Seq &s, const std::vector<float> &k_new,
                      const std::vector<float> &v_new) {
    const int32_t n = (int32_t)(k_new.size() / ((size_t)c.n_kv_heads * (size_t)c.d_k));
    tok.push_back(tok.back() + n);
    const std::vector<int32_t> t = s.table(s.len + n, c.page_size);
    pids.insert(pids.end(), t.begin(), t.end());
    pind.push_back((int32_t)pids.size());
    start.push_back(s.len);
    slots.push_back(s.slot);
    k.insert(k.end(), k_new.begin(), k_new.end());
    if (!c.v_is_k_prefix) v.insert(v.end(), v_new.begin(), v_new.end());
}

gokv_write_desc WriteArrays::desc(const PoolCfg &c) {
    gokv_write_desc w;
    std::memset(&w, 0, sizeof w);
    w.struct_size = sizeof w;
    w.n_seqs = (int32_t)tok.size() - 1;
    w.tok_indptr = tok.data();
    w.page_indptr = pind.data();
    w.page_ids = pids.data();
    w.start_pos = start.data();
    w.residual_slot = c.kivi() ? slots.data() : nullptr;
    w.k = k.data();
    w.v = c.v_is_k_prefix ? nullptr : v.data();
    return w;
}

gokv_status append(gokv_pool *pool, const PoolCfg &c, const std::vector<Seq *> &seqs,
                   const std::vector<std::vector<float>> &k, const std::vector<std::vector<float>> &v) {
    const size_t kr = (size_t)c.n_kv_heads * (size_t)c.d_k;
    WriteArrays arrays;
    for (size_t i = 0; i < seqs.size(); i++) arrays.add(c, *seqs[i], k[i], v[i]);
    const gokv_write_desc w = arrays.desc(c);
    gokv_status st = gokv_pool_write(pool, &w);
    if (st == GOKV_OK) {
        for (size_t i = 0; i < seqs.size(); i++) {
            seqs[i]->len += (int32_t)(k[i].size() / kr);
            seqs[i]->k.insert(seqs[i]->k.end(), k[i].begin(), k[i].end());
            if (!c.v_is_k_prefix) seqs[i]->v.insert(seqs[i]->v.end(), v[i].begin(), v[i].end());
        }
    }
    return st;
}

gokv_status append1(gokv_pool *pool, const PoolCfg &c, Seq &s, const std::vector<float> &k,
                    const std::vector<float> &v) {
    return append(pool, c, {&s}, {k}, {v});
}

gokv_read_desc one_seq_read(const int32_t *tok, const int32_t *pind, const int32_t *pids, const int32_t *kv_len,
                            const int32_t *start, const int32_t *slot, float *k, float *v) {
    gokv_read_desc r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.n_seqs = 1;
    r.tok_indptr = tok;
    r.page_indptr = pind;
    r.page_ids = pids;
    r.kv_len = kv_len;
    r.start_pos = start;
    r.residual_slot = slot;
    r.k_out = k;
    r.v_out = v;
    return r;
}

gokv_status read_seq(gokv_pool *pool, const PoolCfg &c, const Seq &s, std::vector<float> &k, std::vector<float> &v,
                     int32_t start) {
    const int32_t n = s.len - start;
    const size_t kr = (size_t)c.n_kv_heads * (size_t)c.d_k, vr = (size_t)c.n_kv_heads * (size_t)c.d_v;
    k.assign((size_t)n * kr, std::numeric_limits<float>::quiet_NaN());
    v.assign((size_t)n * vr, std::numeric_limits<float>::quiet_NaN());
    std::vector<int32_t> tok{0, n}, pind{0}, pids = s.table(s.len, c.page_size);
    pind.push_back((int32_t)pids.size());
    int32_t kv_len = s.len, slot = s.slot;
    gokv_read_desc r = one_seq_read(tok.data(), pind.data(), pids.data(), &kv_len, &start, c.kivi() ? &slot : nullptr,
                                    k.data(), c.v_is_k_prefix ? nullptr : v.data());
    gokv_status st = gokv_pool_read(pool, &r);
    if (st == GOKV_OK && c.v_is_k_prefix) {
        for (size_t t = 0; t < (size_t)n * (size_t)c.n_kv_heads; t++)
            std::copy(k.begin() + (long)(t * (size_t)c.d_k), k.begin() + (long)(t * (size_t)c.d_k + (size_t)c.d_v),
                      v.begin() + (long)(t * (size_t)c.d_v));
    }
    return st;
}

bool is_outlier_channel(int32_t c) { return c % 16 == 5; }

std::vector<float> gen_normal(std::mt19937 &rng, size_t n, float sigma) {
    std::normal_distribution<float> nd(0.0f, sigma);
    std::vector<float> x(n);
    for (auto &e : x) e = nd(rng);
    return x;
}

std::vector<float> gen_keys(std::mt19937 &rng, int32_t n, int32_t heads, int32_t d) {
    std::vector<float> x = gen_normal(rng, (size_t)n * (size_t)heads * (size_t)d);
    for (size_t i = 0; i < x.size(); i++)
        if (is_outlier_channel((int32_t)(i % (size_t)d))) x[i] *= 4.0f;
    return x;
}

std::vector<float> gen_values(std::mt19937 &rng, int32_t n, int32_t heads, int32_t d) {
    return gen_normal(rng, (size_t)n * (size_t)heads * (size_t)d);
}

bool reread(Cache &c) {
    c.kdq.resize(c.seqs.size());
    c.vdq.resize(c.seqs.size());
    for (size_t i = 0; i < c.seqs.size(); i++) {
        gokv_status st = read_seq(c.pool.get(), c.cfg, c.seqs[i], c.kdq[i], c.vdq[i]);
        if (st != GOKV_OK) {
            ADD_FAILURE() << "gokv_pool_read(" << c.cfg.name() << "): " << gokv_status_name(st) << ": "
                          << gokv_last_error();
            return false;
        }
        if (!all_finite(c.kdq[i]) || !all_finite(c.vdq[i])) {
            ADD_FAILURE() << "gokv_pool_read(" << c.cfg.name() << ") left non-finite or unwritten elements";
            return false;
        }
    }
    return true;
}

bool build_cache(gokv_device *dev, PoolCfg cfg, const std::vector<int32_t> &lens, uint32_t seed, Cache &out,
                 int32_t extra_capacity) {
    int32_t pages = 0;
    for (int32_t L : lens) pages += (L + extra_capacity + cfg.page_size - 1) / cfg.page_size + 1;
    cfg.n_pages = std::max(cfg.n_pages, pages + 2);
    if (cfg.kivi()) cfg.n_slots = std::max(cfg.n_slots, (int32_t)lens.size() + 1);
    out.cfg = cfg;
    out.pool = make_pool(dev, cfg);
    if (!out.pool) return false;
    Allocator alloc(cfg, seed ^ 0x9e3779b9u);
    std::mt19937 rng(seed);
    std::vector<Seq *> ptrs;
    std::vector<std::vector<float>> ks, vs;
    out.seqs.clear();
    out.seqs.reserve(lens.size());
    for (int32_t L : lens) {
        out.seqs.push_back(alloc.new_seq(std::max(1, L + extra_capacity)));
        ks.push_back(gen_keys(rng, L, cfg.n_kv_heads, cfg.d_k));
        vs.push_back(cfg.v_is_k_prefix ? std::vector<float>() : gen_values(rng, L, cfg.n_kv_heads, cfg.d_v));
    }
    for (auto &s : out.seqs) ptrs.push_back(&s);
    gokv_status st = append(out.pool.get(), cfg, ptrs, ks, vs);
    if (st != GOKV_OK) {
        ADD_FAILURE() << "gokv_pool_write(" << cfg.name() << "): " << gokv_status_name(st) << ": " << gokv_last_error();
        return false;
    }
    return reread(out);
}

AttnSeq attn_seq(const Cache &c, size_t i, int32_t n_rows) {
    AttnSeq a;
    const Seq &s = c.seqs[i];
    a.kv_len = s.len;
    a.n_rows = n_rows;
    a.q_pos = s.len - n_rows;
    a.slot = s.slot;
    a.pages = s.table(s.len, c.cfg.page_size);
    a.k = &c.kdq[i];
    a.v = &c.vdq[i];
    return a;
}

int32_t total_rows(const std::vector<AttnSeq> &seqs) {
    int32_t n = 0;
    for (const auto &s : seqs) n += s.n_rows;
    return n;
}

float eff_scale(const PoolCfg &c, const AttnOpts &o) {
    return o.scale != 0.0f ? o.scale : (float)(1.0 / std::sqrt((double)c.d_k));
}

size_t mass_size(const PoolCfg &c, const std::vector<AttnSeq> &seqs) {
    size_t n = 0;
    for (const auto &s : seqs) n += (size_t)c.n_kv_heads * (size_t)s.kv_len;
    return n;
}

gokv_status attend(gokv_device *dev, gokv_pool *pool, const PoolCfg &c, const std::vector<AttnSeq> &seqs,
                   const std::vector<float> &q, const AttnOpts &o, std::vector<float> &out, std::vector<float> *mass) {
    return attend_edited(dev, pool, c, seqs, q, o, out, mass, [](gokv_attend_desc &) {});
}

gokv_status attend_edited(gokv_device *dev, gokv_pool *pool, const PoolCfg &c, const std::vector<AttnSeq> &seqs,
                          const std::vector<float> &q, const AttnOpts &o, std::vector<float> &out,
                          std::vector<float> *mass, const std::function<void(gokv_attend_desc &)> &edit) {
    const bool per_head = (o.flags & GOKV_ATTEND_MASK_PER_KV_HEAD) != 0;
    std::vector<int32_t> qind{0}, pind{0}, pids, kvl, qpos, slots, vind{0};
    std::vector<uint32_t> mask;
    bool any_mask = false;
    for (const auto &s : seqs) any_mask = any_mask || !s.mask.empty();
    for (const auto &s : seqs) {
        qind.push_back(qind.back() + s.n_rows);
        pids.insert(pids.end(), s.pages.begin(), s.pages.end());
        pind.push_back((int32_t)pids.size());
        kvl.push_back(s.kv_len);
        qpos.push_back(s.q_pos);
        slots.push_back(s.slot);
        if (any_mask) {
            if (s.mask.empty())
                mask.insert(mask.end(), (size_t)((s.kv_len + 31) / 32) * (per_head ? (size_t)c.n_kv_heads : 1u), 0xffffffffu);
            else
                mask.insert(mask.end(), s.mask.begin(), s.mask.end());
            vind.push_back((int32_t)mask.size());
        }
    }
    out.assign((size_t)qind.back() * (size_t)o.n_heads_q * (size_t)c.d_v, std::numeric_limits<float>::quiet_NaN());
    gokv_attend_desc a;
    std::memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.pool = pool;
    a.n_seqs = (int32_t)seqs.size();
    a.q_indptr = qind.data();
    a.page_indptr = pind.data();
    a.page_ids = pids.data();
    a.kv_len = kvl.data();
    a.q_pos = qpos.data();
    a.residual_slot = c.kivi() ? slots.data() : nullptr;
    a.valid_mask = any_mask ? mask.data() : nullptr;
    a.valid_indptr = any_mask ? vind.data() : nullptr;
    a.n_heads_q = o.n_heads_q;
    a.q = q.data();
    a.out = out.data();
    a.scale = eff_scale(c, o);
    a.sink_logits = o.sinks.empty() ? nullptr : o.sinks.data();
    a.n_sink_tokens = o.n_sink_tokens;
    a.window = o.window;
    a.chunk_size = o.chunk;
    a.flags = o.flags;
    if (o.mass && mass) {
        mass->assign(mass_size(c, seqs), std::numeric_limits<float>::quiet_NaN());
        a.mass = mass->data();
        a.mass_rows = o.mass_rows;
    }
    edit(a);
    return gokv_attend(dev, &a);
}

bool ref_visible(const AttnSeq &s, int32_t page_size, int32_t t, int32_t p, const AttnOpts &o, int32_t kvh) {
    if (t >= s.kv_len || t > p) return false;
    if (s.pages[(size_t)(t / page_size)] < 0) return false;
    const size_t words = (o.flags & GOKV_ATTEND_MASK_PER_KV_HEAD) ? (size_t)kvh * (size_t)((s.kv_len + 31) / 32) : 0;
    if (!s.mask.empty() && !((s.mask[words + (size_t)(t / 32)] >> (t % 32)) & 1u)) return false;
    if (o.window > 0 && !(t > p - o.window || t < o.n_sink_tokens)) return false;
    return true;
}

void ref_attend(const PoolCfg &c, const std::vector<AttnSeq> &seqs, const std::vector<float> &q,
                const AttnOpts &o, std::vector<double> &out, std::vector<int32_t> *n_visible, std::vector<double> *mass,
                std::vector<double> *sink_share) {
    const int32_t Hq = o.n_heads_q, Hkv = c.n_kv_heads, dk = c.d_k, dv = c.d_v;
    const int32_t group = Hq / Hkv;
    const double alpha = (double)eff_scale(c, o);
    const int32_t rows = total_rows(seqs);
    out.assign((size_t)rows * (size_t)Hq * (size_t)dv, 0.0);
    if (n_visible) n_visible->assign((size_t)rows * (size_t)Hq, 0);
    if (mass) mass->assign(mass_size(c, seqs), 0.0);
    if (sink_share) sink_share->assign((size_t)rows * (size_t)Hq, 1.0);
    int32_t row = 0;
    size_t moff = 0;
    std::vector<double> s, acc((size_t)dv);
    std::vector<int32_t> vis;
    for (const auto &sq : seqs) {
        for (int32_t r = 0; r < sq.n_rows; r++, row++) {
            const int32_t p = sq.q_pos + r;
            const bool counted = mass && mass_counts_row(r, sq.n_rows, o.mass_rows);
            for (int32_t h = 0; h < Hq; h++) {
                const int32_t kvh = h / group;
                if (h % group == 0) {
                    vis.clear();
                    for (int32_t t = 0; t < sq.kv_len; t++)
                        if (ref_visible(sq, c.page_size, t, p, o, kvh)) vis.push_back(t);
                }
                const float *qh = &q[((size_t)row * (size_t)Hq + (size_t)h) * (size_t)dk];
                double *oh = &out[((size_t)row * (size_t)Hq + (size_t)h) * (size_t)dv];
                if (n_visible) (*n_visible)[(size_t)row * (size_t)Hq + (size_t)h] = (int32_t)vis.size();
                if (vis.empty()) continue; /* sees nothing: zeros, with or without a learned sink */
                s.assign(vis.size(), 0.0);
                double m = -std::numeric_limits<double>::infinity();
                for (size_t i = 0; i < vis.size(); i++) {
                    const float *kt = &(*sq.k)[((size_t)vis[i] * (size_t)Hkv + (size_t)kvh) * (size_t)dk];
                    double dot = 0.0;
                    for (int32_t j = 0; j < dk; j++) dot += (double)qh[j] * (double)kt[j];
                    s[i] = alpha * dot;
                    m = std::max(m, s[i]);
                }
                const bool has_sink = !o.sinks.empty();
                if (has_sink) m = std::max(m, (double)o.sinks[(size_t)h]);
                double l = 0.0;
                std::fill(acc.begin(), acc.end(), 0.0);
                for (size_t i = 0; i < vis.size(); i++) {
                    const double e = std::exp(s[i] - m);
                    l += e;
                    const float *vt = &(*sq.v)[((size_t)vis[i] * (size_t)Hkv + (size_t)kvh) * (size_t)dv];
                    for (int32_t j = 0; j < dv; j++) acc[(size_t)j] += e * (double)vt[j];
                }
                const double sink_e = has_sink ? std::exp((double)o.sinks[(size_t)h] - m) : 0.0;
                l += sink_e;
                for (int32_t j = 0; j < dv; j++) oh[j] = acc[(size_t)j] / l;
                if (sink_share) (*sink_share)[(size_t)row * (size_t)Hq + (size_t)h] = sink_e / l;
                if (counted)
                    for (size_t i = 0; i < vis.size(); i++)
                        (*mass)[moff + (size_t)kvh * (size_t)sq.kv_len + (size_t)vis[i]] += std::exp(s[i] - m) / l;
            }
        }
        moff += (size_t)Hkv * (size_t)sq.kv_len;
    }
}

double mass_err(const std::vector<float> &a, const std::vector<double> &b) {
    if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
    double e = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        const double d = std::fabs((double)a[i] - b[i]) / std::max(1.0, std::fabs(b[i]));
        if (!(d <= e)) e = d; /* NaN propagates as failure */
    }
    return e;
}

double rel_err(const std::vector<float> &a, const std::vector<double> &b) {
    if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        const double d = std::fabs((double)a[i] - b[i]);
        if (!(d <= num)) num = d; /* NaN propagates as failure */
        den = std::max(den, std::fabs(b[i]));
    }
    return num / std::max(den, 1e-30);
}

double rel_err(const std::vector<float> &a, const std::vector<float> &b) {
    std::vector<double> bd(b.begin(), b.end());
    return rel_err(a, bd);
}

double cosine(const std::vector<double> &a, const std::vector<double> &b) {
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (size_t i = 0; i < a.size() && i < b.size(); i++) {
        ab += a[i] * b[i];
        aa += a[i] * a[i];
        bb += b[i] * b[i];
    }
    return ab / std::sqrt(std::max(aa * bb, 1e-300));
}

bool all_finite(const std::vector<float> &a) {
    for (float x : a)
        if (!std::isfinite(x)) return false;
    return true;
}

double check_attend(gokv_device *dev, const Cache &c, const std::vector<AttnSeq> &seqs, const std::vector<float> &q,
                    const AttnOpts &o, double tol, const std::string &what, std::vector<float> *out_ret,
                    std::vector<float> *mass_ret) {
    std::vector<float> out, mass;
    gokv_status st = attend(dev, c.pool.get(), c.cfg, seqs, q, o, out, &mass);
    if (out_ret) *out_ret = out;
    if (mass_ret) *mass_ret = mass;
    if (st != GOKV_OK) {
        ADD_FAILURE() << what << ": gokv_attend: " << gokv_status_name(st) << ": " << gokv_last_error();
        return std::numeric_limits<double>::infinity();
    }
    size_t unwritten = 0;
    for (float x : out) unwritten += !std::isfinite(x);
    EXPECT_EQ(unwritten, 0u) << what << ": output elements left unwritten (NaN poison) or non-finite";
    std::vector<double> ref, ref_mass, share;
    std::vector<int32_t> nvis;
    ref_attend(c.cfg, seqs, q, o, ref, &nvis, o.mass ? &ref_mass : nullptr, o.mass ? &share : nullptr);
    size_t nonzero_empty = 0;
    for (size_t rh = 0; rh < nvis.size(); rh++) {
        if (nvis[rh] != 0) continue;
        for (int32_t j = 0; j < c.cfg.d_v; j++) nonzero_empty += out[rh * (size_t)c.cfg.d_v + (size_t)j] != 0.0f;
    }
    EXPECT_EQ(nonzero_empty, 0u) << what << ": a query that sees no token must output exact zeros";
    const double e = rel_err(out, ref);
    EXPECT_LE(e, tol) << what << ": kernel vs float64 reference";
    if (!o.mass) return e;
    size_t mass_unwritten = 0, unseen_nonzero = 0;
    for (size_t i = 0; i < mass.size(); i++) {
        mass_unwritten += !std::isfinite(mass[i]);
        unseen_nonzero += ref_mass[i] == 0.0 && mass[i] != 0.0f;
    }
    EXPECT_EQ(mass_unwritten, 0u) << what << ": mass elements left unwritten (NaN poison) or non-finite";
    EXPECT_EQ(unseen_nonzero, 0u) << what << ": tokens that no counted query sees must have mass exactly 0";
    EXPECT_LE(mass_err(mass, ref_mass), tol) << what << ": mass vs float64 reference (error / max(1, reference))";
    /* Σ_t mass of each kv head = Σ over its counted queries of (1 - sink share) */
    const int32_t Hq = o.n_heads_q, Hkv = c.cfg.n_kv_heads, G = Hq / Hkv;
    size_t moff = 0;
    int32_t row = 0;
    for (size_t si = 0; si < seqs.size() && mass.size() == ref_mass.size(); si++) {
        const AttnSeq &sq = seqs[si];
        for (int32_t h = 0; h < Hkv; h++) {
            double sum = 0.0, want = 0.0;
            int32_t n = 0;
            for (int32_t t = 0; t < sq.kv_len; t++) sum += mass[moff + (size_t)h * (size_t)sq.kv_len + (size_t)t];
            for (int32_t r = 0; r < sq.n_rows; r++)
                if (mass_counts_row(r, sq.n_rows, o.mass_rows))
                    for (int32_t g = 0; g < G; g++, n++)
                        want += 1.0 - share[(size_t)(row + r) * (size_t)Hq + (size_t)(h * G + g)];
            EXPECT_NEAR(sum, want, tol * std::max(1, n))
                << what << ": sequence " << si << " kv head " << h << ": Σ_t mass vs the counted queries' "
                << n << " probabilities less their sink shares";
        }
        moff += (size_t)Hkv * (size_t)sq.kv_len;
        row += sq.n_rows;
    }
    return e;
}

float half_at(const uint8_t *p, uint64_t off) {
    uint16_t h;
    std::memcpy(&h, p + off, 2);
    return gokv_half_to_float(h);
}

uint32_t code_at(const uint8_t *base, int32_t bits, int32_t i) {
    switch (bits) {
    case 8: return base[i];
    case 4: return (base[i / 2] >> (4 * (i % 2))) & 0xfu;
    case 2: return (base[i / 4] >> (2 * (i % 4))) & 0x3u;
    default: return 0;
    }
}

} // namespace gokvtest
