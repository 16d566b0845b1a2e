/*
 * reference.h: the test suite's float64 reference of docs/architecture.md §5, its data generators, and thin RAII
 * helpers around the C ABI (devices, pools, sequences, writes, reads, attention calls).
 *
 * The reference attends over K/V as returned by gokv_pool_read, which is exactly what the kernels see
 * (dequantized codes, fp16 ring rows), so the comparison isolates the attention math from the format's
 * own quantization error; the formats' quality is measured separately against the original data.
 */
#ifndef GOKV_TESTS_REFERENCE_H
#define GOKV_TESTS_REFERENCE_H

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gokv.h"
#include "gokv_backend.h"
#include "gokv_half.h"
#include "gokv_layout.h"

namespace gokvtest {

struct DeviceCloser {
    void operator()(gokv_device *d) const { gokv_device_close(d); }
};
struct PoolDestroyer {
    void operator()(gokv_pool *p) const { gokv_pool_destroy(p); }
};
using DevicePtr = std::unique_ptr<gokv_device, DeviceCloser>;
using PoolPtr = std::unique_ptr<gokv_pool, PoolDestroyer>;

/* Opens the "cpu" backend with n_threads workers (0 = all CPUs); null (and a test failure) on error. */
DevicePtr open_cpu(int32_t n_threads);
/* Opens device -1 of any registered backend ("cpu", "vulkan", ...); null (and a test failure) on error.
 * Other backends' suites use it with the CPU backend as their reference. */
DevicePtr open_backend(const char *backend, int32_t n_threads);
/* A 2-thread CPU device shared by the tests that do not vary the device (and the conformance suite's
 * reference backend). */
gokv_device *shared_device();

/* Raw storage through the ABI (gokv_pool_page_bytes / gokv_pool_slot_bytes): the bytes of page `page`
 * (layout page_bytes) or residual slot `slot` (layout ring_bytes) as stored; empty, after a test failure,
 * if the call fails. */
std::vector<uint8_t> page_bytes(gokv_pool *pool, int32_t page);
std::vector<uint8_t> slot_bytes(gokv_pool *pool, int32_t slot);

/* A pool's geometry, in the test's words; pool_desc() turns it into the ABI descriptor. */
struct PoolCfg {
    int32_t format = GOKV_FORMAT_F32;
    int32_t group = 0;
    int32_t residual = 0;
    int32_t n_kv_heads = 1;
    int32_t d_k = 64, d_v = 64;
    int32_t v_is_k_prefix = 0;
    int32_t page_size = 64;
    int32_t n_pages = 64;
    int32_t n_slots = 0;
    int32_t key_bounds = 0; /* gokv_pool_desc.key_bounds (Quest) */
    bool kivi() const { return gokv_format_is_kivi(format) != 0; }
    bool quantized() const { return gokv_format_quantized(format) != 0; }
    std::string name() const; /* "f16", "q4_g32", "kivi2_g32_r128" */
};
PoolCfg format_cfg(int32_t format, int32_t group, int32_t residual);
gokv_pool_desc pool_desc(const PoolCfg &c);
PoolPtr make_pool(gokv_device *dev, const PoolCfg &c);

/* One sequence of a pool: its page table (covering its capacity), residual slot, and written inputs. */
struct Seq {
    std::vector<int32_t> pages;
    int32_t slot = -1;
    int32_t len = 0;
    std::vector<float> k, v; /* the original inputs, [len][Hkv][d] */
    std::vector<int32_t> table(int32_t n_tokens, int32_t page_size) const; /* the first pages covering n_tokens */
};

/* Hands out distinct pages (shuffled, so page tables are not contiguous) and residual slots. */
class Allocator {
public:
    Allocator(const PoolCfg &c, uint32_t seed);
    Seq new_seq(int32_t capacity_tokens); /* test failure if the pool is too small */

private:
    PoolCfg cfg_;
    std::vector<int32_t> pages_, slots_;
};

/* The arrays of one gokv_pool_write call, gathered sequence by sequence. desc() points into them: keep the
 * object alive and unchanged while the descriptor is in use. */
struct WriteArrays {
    std::vector<int32_t> tok{0}, pind{0}, pids, start, slots;
    std::vector<float> k, v;
    /* Adds rows k_new, v_new ([n][Hkv][d]; v_new ignored for MLA pools) after s's current length, with
     * the pages that cover them. */
    void add(const PoolCfg &c, const Seq &s, const std::vector<float> &k_new, const std::vector<float> &v_new);
    gokv_write_desc desc(const PoolCfg &c);
};

/* Appends rows to several sequences in one gokv_pool_write call (k[i], v[i]: new rows of seqs[i]; v
 * ignored for MLA pools). On success the sequences' lengths and input copies are updated. */
gokv_status append(gokv_pool *pool, const PoolCfg &c, const std::vector<Seq *> &seqs,
                   const std::vector<std::vector<float>> &k, const std::vector<std::vector<float>> &v);
gokv_status append1(gokv_pool *pool, const PoolCfg &c, Seq &s, const std::vector<float> &k,
                    const std::vector<float> &v);
/* Reads tokens [start, s.len) of s as the kernels see them; for MLA pools v is the d_v prefix of k. */
/* A read descriptor of one sequence: rows tok[0]..tok[1], its page table pids (pind = {0, size}), slot NULL
 * for formats without a ring. The pointed-to values must outlive the call it is used in. */
gokv_read_desc one_seq_read(const int32_t *tok, const int32_t *pind, const int32_t *pids, const int32_t *kv_len,
                            const int32_t *start, const int32_t *slot, float *k, float *v);
gokv_status read_seq(gokv_pool *pool, const PoolCfg &c, const Seq &s, std::vector<float> &k, std::vector<float> &v,
                     int32_t start = 0);

/* Data: N(0,1), with the key channels c % 16 == 5 (8 of 128) scaled by 4 as real keys have outliers. */
bool is_outlier_channel(int32_t c);
std::vector<float> gen_normal(std::mt19937 &rng, size_t n, float sigma = 1.0f);
std::vector<float> gen_keys(std::mt19937 &rng, int32_t n, int32_t heads, int32_t d);
std::vector<float> gen_values(std::mt19937 &rng, int32_t n, int32_t heads, int32_t d);

/* A pool with sequences written from random data and read back dequantized. */
struct Cache {
    PoolCfg cfg;
    PoolPtr pool;
    std::vector<Seq> seqs;
    std::vector<std::vector<float>> kdq, vdq; /* read back, [len][Hkv][d] */
};
/* Creates the pool and writes sequences of the given lengths in one call (capacity extra tokens each);
 * returns false (after a test failure) on any error. */
bool build_cache(gokv_device *dev, PoolCfg cfg, const std::vector<int32_t> &lens, uint32_t seed, Cache &out,
                 int32_t extra_capacity = 0);
bool reread(Cache &c); /* refreshes kdq/vdq */

/* One sequence's part of an attention call. */
struct AttnSeq {
    int32_t kv_len = 0;
    int32_t n_rows = 1;
    int32_t q_pos = 0;
    int32_t slot = -1;
    std::vector<int32_t> pages;  /* as passed to gokv_attend (-1 = released) */
    std::vector<uint32_t> mask;  /* validity words; empty = all valid. With GOKV_ATTEND_MASK_PER_KV_HEAD in the
                                  * call's flags: n_kv_heads masks of ceil(kv_len / 32) words, kv head h's at
                                  * h * ceil(kv_len / 32) */
    const std::vector<float> *k = nullptr, *v = nullptr; /* dequantized K/V for the reference */
};
/* Decode (n_rows == 1) or prefill (n_rows rows ending at the last token) of sequence i of a cache. */
AttnSeq attn_seq(const Cache &c, size_t i, int32_t n_rows = 1);

struct AttnOpts {
    int32_t n_heads_q = 1;
    float scale = 0.0f;        /* 0: 1/sqrt(d_k) */
    std::vector<float> sinks;  /* learned sink logits, empty = none */
    int32_t n_sink_tokens = 0;
    int32_t window = 0;
    int32_t chunk = 0;
    uint32_t flags = 0;
    bool mass = false;         /* ask for the attention mass (gokv_attend_desc.mass) */
    int32_t mass_rows = 0;     /* gokv_attend_desc.mass_rows */
};
/* Elements of a call's mass output: Σ_i n_kv_heads · kv_len[i]. */
size_t mass_size(const PoolCfg &c, const std::vector<AttnSeq> &seqs);
int32_t total_rows(const std::vector<AttnSeq> &seqs);
float eff_scale(const PoolCfg &c, const AttnOpts &o);

/* Calls gokv_attend; out is resized and poisoned with NaN first. With o.mass, mass (required then) is
 * resized to mass_size and poisoned too, and the call computes it. */
gokv_status attend(gokv_device *dev, gokv_pool *pool, const PoolCfg &c, const std::vector<AttnSeq> &seqs,
                   const std::vector<float> &q, const AttnOpts &o, std::vector<float> &out,
                   std::vector<float> *mass = nullptr);
/* The same, with edit(desc) called on the filled descriptor just before gokv_attend: for the fields a test
 * sets beyond AttnOpts (Quest's). */
gokv_status attend_edited(gokv_device *dev, gokv_pool *pool, const PoolCfg &c, const std::vector<AttnSeq> &seqs,
                          const std::vector<float> &q, const AttnOpts &o, std::vector<float> &out,
                          std::vector<float> *mass, const std::function<void(gokv_attend_desc &)> &edit);

/* The float64 reference of docs/architecture.md §5 over the AttnSeqs' K/V; n_visible[row*Hq+h] counts visible
 * tokens. ref_visible: whether a query at position p of kv head kvh sees token t (kvh matters with per-kv-head
 * masks only). mass: the attention mass as gokv.h defines it (per sequence, kv head and token: the softmax
 * probabilities, learned sink in each denominator, summed over the kv head's query heads and the counted rows:
 * all with o.mass_rows = 0, else each sequence's last min(mass_rows, rows)); sink_share[row*Hq+h]: the
 * learned sink's probability, e^σ / (Σ e^s + e^σ) (0 without sinks, 1 for a query that sees nothing: its
 * tokens' probabilities sum to 1 - its share). */
bool ref_visible(const AttnSeq &s, int32_t page_size, int32_t t, int32_t p, const AttnOpts &o, int32_t kvh = 0);
void ref_attend(const PoolCfg &c, const std::vector<AttnSeq> &seqs, const std::vector<float> &q,
                const AttnOpts &o, std::vector<double> &out, std::vector<int32_t> *n_visible = nullptr,
                std::vector<double> *mass = nullptr, std::vector<double> *sink_share = nullptr);
/* Whether row r (of rows) of a sequence is counted in the mass under mass_rows. */
inline bool mass_counts_row(int32_t r, int32_t rows, int32_t mass_rows) {
    return mass_rows == 0 || r >= rows - mass_rows;
}

/* Relative error = max_i |a_i - b_i| / max(max_i |b_i|, 1e-30): the worst absolute deviation measured
 * against the largest reference magnitude (outputs are convex combinations of values, so O(1) scale). */
double rel_err(const std::vector<float> &a, const std::vector<double> &b);
double rel_err(const std::vector<float> &a, const std::vector<float> &b);
double cosine(const std::vector<double> &a, const std::vector<double> &b);
bool all_finite(const std::vector<float> &a);

/* Runs attend and checks it against the reference: status ok, every output written and finite, rows
 * that see nothing exactly zero, rel_err <= tol. With o.mass, the mass too: every element written, each within
 * tol · max(1, reference) of the reference (tokens no counted query sees exactly 0), and each kv head's sum
 * over its tokens equal to Σ over its counted queries of (1 - sink share), within tol per query. Returns the
 * rel_err of the outputs (or +inf on failure); mass_ret receives the mass. */
double check_attend(gokv_device *dev, const Cache &c, const std::vector<AttnSeq> &seqs, const std::vector<float> &q,
                    const AttnOpts &o, double tol, const std::string &what, std::vector<float> *out_ret = nullptr,
                    std::vector<float> *mass_ret = nullptr);
/* max_i |a_i - b_i| / max(1, |b_i|): the mass's error (absolute for elements up to 1, one probability). */
double mass_err(const std::vector<float> &a, const std::vector<double> &b);

/* Raw storage access: fp16 at byte offset, and codes. */
float half_at(const uint8_t *p, uint64_t off);
uint32_t code_at(const uint8_t *base, int32_t bits, int32_t i); /* i-th packed code of a byte run */

} // namespace gokvtest

#endif
