/* vk_harness.cc: see vk_harness.h. */
#include "vk_harness.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>

namespace gokvtest {

namespace {

std::mutex g_log_mu;
std::vector<std::string> g_log;

void capture_log(void *, int32_t level, const char *backend, const char *op, const char *msg) {
    static const char *const names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    std::ostringstream s;
    s << (level >= 0 && level <= 3 ? names[level] : "?") << " " << (backend ? backend : "-") << " "
      << (op ? op : "-") << ": " << (msg ? msg : "");
    std::lock_guard<std::mutex> lock(g_log_mu);
    g_log.push_back(s.str());
}

DevicePtr g_vk;
std::string g_vk_error;

/* Registers the backend and opens the shared device before any test, and closes it after the last one
 * under a validation watch of its own (messages at teardown fail the run). */
class VkEnvironment : public testing::Environment {
public:
    void SetUp() override {
        /* ctest's subgroup runs (tests/CMakeLists.txt) set only GOKV_TEST_LAVAPIPE_SUBGROUP=N (CMake 3.25's
         * gtest_discover_tests passes one environment variable per test): llvmpipe's vector width follows
         * from it (32 N bits), and validation is on as in every ctest run. */
        if (const char *sg = std::getenv("GOKV_TEST_LAVAPIPE_SUBGROUP")) {
            /* llvmpipe's vectors are at most 512 bits (gallivm's LP_MAX_VECTOR_WIDTH): 1024 bits "work" but
             * break llvmpipe itself (most attention tests fail there), which says nothing of the shaders */
            const int n = std::atoi(sg);
            ASSERT_TRUE(n == 4 || n == 8 || n == 16)
                << "GOKV_TEST_LAVAPIPE_SUBGROUP=" << sg << ": lavapipe runs subgroups of 4, 8 or 16 (128 to 512 bits)";
            setenv("LP_NATIVE_VECTOR_WIDTH", std::to_string(32 * n).c_str(), 1);
            setenv("GOKV_VULKAN_VALIDATION", "1", 0);
        }
        ASSERT_EQ(gokv_set_log_callback(capture_log, nullptr, GOKV_LOG_INFO), GOKV_OK) << gokv_last_error();
        ASSERT_EQ(gokv_vulkan_register(), GOKV_OK) << gokv_last_error();
        const char *val = std::getenv("GOKV_VULKAN_VALIDATION");
        const bool validation = val && val[0] && std::strcmp(val, "0") != 0;
        if (!validation)
            std::printf("[ WARNING  ] GOKV_VULKAN_VALIDATION is not set: the Khronos validation layer is off "
                        "(ctest sets it to 1)\n");
        ValidationWatch w;
        w.begin();
        gokv_device_desc d;
        std::memset(&d, 0, sizeof d);
        d.struct_size = sizeof d;
        d.backend = GOKV_VK_TEST_BACKEND;
        d.device_index = -1;
        d.n_threads = 2;
        gokv_device *dev = nullptr;
        const gokv_status st = gokv_device_open(&d, &dev);
        if (st != GOKV_OK || dev == nullptr) {
            g_vk_error = std::string(gokv_status_name(st)) + ": " + gokv_last_error() + "\nlog:\n" + log_since(0);
            return; /* every test then fails in its SetUp with this message */
        }
        g_vk.reset(dev);
        w.check("opening the shared " GOKV_VK_TEST_BACKEND " device");
        gokv_device_info info = device_info(dev);
        std::printf("[ DEVICE   ] %s: %s, subgroup %d, %" PRIu64 " MiB, caps 0x%x, formats 0x%x, validation %s\n",
                    info.backend, info.name, info.subgroup_size, info.memory_bytes >> 20, info.caps, info.formats,
                    validation ? "on (with synchronization validation)" : "off");
        ASSERT_NE(cpu_device(), nullptr);
    }
    void TearDown() override {
        ValidationWatch w;
        w.begin();
        g_vk.reset();
        w.check("closing the shared " GOKV_VK_TEST_BACKEND " device");
    }
};

testing::Environment *const kEnvironment = testing::AddGlobalTestEnvironment(new VkEnvironment);

double rel_err_d(const std::vector<double> &a, const std::vector<double> &b) {
    if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        const double d = std::fabs(a[i] - b[i]);
        if (!(d <= num)) num = d;
        den = std::max(den, std::fabs(b[i]));
    }
    return num / std::max(den, 1e-30);
}

uint16_t half_bits(const uint8_t *p, uint64_t off) {
    uint16_t h;
    std::memcpy(&h, p + off, 2);
    return h;
}

} // namespace

gokv_device *vk_device() { return g_vk.get(); }
gokv_device *cpu_device() { return shared_device(); }
const std::string &vk_open_error() { return g_vk_error; }

size_t log_mark() {
    std::lock_guard<std::mutex> lock(g_log_mu);
    return g_log.size();
}

std::string log_since(size_t mark) {
    std::lock_guard<std::mutex> lock(g_log_mu);
    std::string s;
    for (size_t i = mark; i < g_log.size(); i++) s += "  " + g_log[i] + "\n";
    return s;
}

void ValidationWatch::begin() {
    start = gokv_vulkan_validation_messages();
    mark = log_mark();
}

void ValidationWatch::check(const std::string &where) {
    const uint64_t now = gokv_vulkan_validation_messages();
    if (now == start) return;
    const std::string logged = log_since(mark);
    ADD_FAILURE() << where << ": " << (now - start)
                  << " Vulkan validation message(s) (any validation error or warning fails the suite); gokv log "
                     "since the test began:\n"
                  << logged;
    EXPECT_NE(logged.find("vulkan validation: "), std::string::npos)
        << "the validation messages did not reach the gokv log callback";
}

void VkTest::SetUp() {
    watch_.begin();
    ASSERT_NE(vk_device(), nullptr) << "the shared " GOKV_VK_TEST_BACKEND " device did not open: " << vk_open_error();
}

void VkTest::TearDown() { watch_.check("after the test"); }

std::string fmt_name(const Fmt &f) { return format_cfg(f.format, f.group, f.residual).name(); }

double tol_for(int32_t format) { return gokv_format_quantized(format) ? 1e-4 : 1e-5; }

const char *const kAttnNames[4] = {"mha", "gqa", "mqa", "mla"};

PoolCfg attn_cfg(const Fmt &f, Attn a, int32_t *n_heads_q) {
    PoolCfg c = format_cfg(f.format, f.group, f.residual);
    c.d_k = c.d_v = 128;
    switch (a) {
    case MHA: c.n_kv_heads = 4; *n_heads_q = 4; break;
    case GQA: c.n_kv_heads = 2; *n_heads_q = 8; break;
    case MQA: c.n_kv_heads = 1; *n_heads_q = 4; break;
    case MLA:
        c.n_kv_heads = 1;
        *n_heads_q = 8;
        c.v_is_k_prefix = 1;
        c.d_k = f.group <= 32 ? 96 : 3 * f.group;
        c.d_v = f.group <= 32 ? 64 : f.group;
        break;
    }
    return c;
}

bool build_pair(const PoolCfg &cfg, const std::vector<int32_t> &lens, uint32_t seed, Pair &out,
                int32_t extra_capacity) {
    if (!build_cache(vk_device(), cfg, lens, seed, out.vk, extra_capacity)) return false;
    if (!build_cache(cpu_device(), cfg, lens, seed, out.cpu, extra_capacity)) return false;
    for (size_t i = 0; i < lens.size(); i++) {
        if (out.vk.seqs[i].pages != out.cpu.seqs[i].pages || out.vk.seqs[i].slot != out.cpu.seqs[i].slot) {
            ADD_FAILURE() << "build_pair: the two caches got different page tables (harness bug)";
            return false;
        }
    }
    return true;
}

bool append_pair(Pair &p, const std::vector<size_t> &idx, const std::vector<std::vector<float>> &k,
                 const std::vector<std::vector<float>> &v) {
    for (Cache *c : {&p.vk, &p.cpu}) {
        std::vector<Seq *> seqs;
        for (size_t i : idx) seqs.push_back(&c->seqs[i]);
        const gokv_status st = append(c->pool.get(), c->cfg, seqs, k, v);
        if (st != GOKV_OK) {
            ADD_FAILURE() << "gokv_pool_write(" << c->cfg.name() << ") on " << (c == &p.vk ? GOKV_VK_TEST_BACKEND : "cpu")
                          << ": " << gokv_status_name(st) << ": " << gokv_last_error();
            return false;
        }
        if (!reread(*c)) return false;
    }
    return true;
}

AttnSeq rebind(AttnSeq a, const Cache &c, size_t i) {
    a.k = &c.kdq[i];
    a.v = &c.vdq[i];
    return a;
}

double cross_attend(const Pair &p, const std::vector<AttnSeq> &seqs, const std::vector<size_t> &src,
                    const std::vector<float> &q, const AttnOpts &o, double tol, const std::string &what,
                    CrossOut *out) {
    CrossOut local;
    CrossOut &co = out ? *out : local;
    std::vector<AttnSeq> cs;
    bool same_reads = true;
    for (size_t i = 0; i < seqs.size(); i++) {
        cs.push_back(rebind(seqs[i], p.cpu, src[i]));
        same_reads = same_reads && *seqs[i].k == *cs[i].k && *seqs[i].v == *cs[i].v;
    }
    const double e_vk = check_attend(vk_device(), p.vk, seqs, q, o, tol, what + " [" GOKV_VK_TEST_BACKEND "]", &co.vk);
    const double e_cpu = check_attend(cpu_device(), p.cpu, cs, q, o, tol, what + " [cpu]", &co.cpu);
    if (!std::isfinite(e_vk) || !std::isfinite(e_cpu)) return std::numeric_limits<double>::infinity();
    double ref_gap = 0.0;
    if (!same_reads) {
        std::vector<double> rv, rc;
        ref_attend(p.vk.cfg, seqs, q, o, rv);
        ref_attend(p.cpu.cfg, cs, q, o, rc);
        ref_gap = rel_err_d(rv, rc);
    }
    const double cross = rel_err(co.vk, co.cpu);
    EXPECT_LE(cross, 2 * tol + ref_gap) << what << ": " GOKV_VK_TEST_BACKEND " vs cpu on the same input (tolerance 2 x "
                                        << tol << " + reference gap " << ref_gap << ")";
    return cross;
}

void expect_seq_parity(gokv_pool *cpu_pool, const PoolCfg &c, const Seq &s, int32_t start, const std::vector<float> &kv,
                       const std::vector<float> &vv, const std::vector<float> &kc, const std::vector<float> &vc,
                       const std::string &what) {
    ASSERT_EQ(kv.size(), kc.size()) << what;
    ASSERT_EQ(vv.size(), vc.size()) << what;
    const gokv_layout *Lp = gokv_pool_layout(cpu_pool);
    ASSERT_NE(Lp, nullptr);
    const gokv_layout &L = *Lp;
    const int32_t H = c.n_kv_heads, dk = c.d_k, dv = c.d_v, P = c.page_size, g = c.group;
    const int32_t nq = c.kivi() ? gokv_kivi_quantized_len(s.len, c.group, c.residual) : s.len;
    const double levels = c.quantized() ? (double)((1 << L.bits) - 1) : 0.0;
    /* The stored fp16 scale of the group holding element ch of token t, head h (0: stored exactly). */
    auto step_of = [&](int32_t t, int32_t h, int32_t ch, bool is_v) -> double {
        if (!c.quantized() || t >= nq) return 0.0;
        const uint8_t *page = gokv_cpu_page_bytes(cpu_pool, s.pages[(size_t)(t / P)]);
        if (!page) return 0.0;
        if (is_v && c.v_is_k_prefix) is_v = false;
        uint64_t off;
        if (!is_v && c.kivi())
            off = L.k_scale + (uint64_t)h * L.k_sb_head + ((uint64_t)((t % P) / g) * (uint64_t)dk + (uint64_t)ch) * 2;
        else if (!is_v)
            off = L.k_scale + (uint64_t)h * L.k_sb_head + ((uint64_t)(t % P) * (uint64_t)L.k_groups + (uint64_t)(ch / g)) * 2;
        else
            off = L.v_scale + (uint64_t)h * L.v_sb_head + ((uint64_t)(t % P) * (uint64_t)L.v_groups + (uint64_t)(ch / g)) * 2;
        return (double)gokv_half_to_float(half_bits(page, off));
    };
    size_t n = 0, exact = 0, rounding = 0, one_step = 0, bad = 0;
    std::string first_bad;
    auto compare = [&](const std::vector<float> &a, const std::vector<float> &b, int32_t d, bool is_v) {
        for (size_t i = 0; i < a.size(); i++) {
            n++;
            if (std::memcmp(&a[i], &b[i], 4) == 0) {
                exact++;
                continue;
            }
            const int32_t t = start + (int32_t)(i / ((size_t)H * (size_t)d));
            const int32_t h = (int32_t)((i / (size_t)d) % (size_t)H), ch = (int32_t)(i % (size_t)d);
            const double step = step_of(t, h, ch, is_v);
            const double diff = std::fabs((double)a[i] - (double)b[i]);
            const double round = 2.5e-7 * (2.0 * std::fabs((double)b[i]) + 2.0 * step * levels) + 1e-30;
            if (step > 0.0 && diff <= round) {
                rounding++;
            } else if (step > 0.0 && std::fabs(diff - step) <= round) {
                one_step++;
            } else {
                if (bad++ == 0) {
                    std::ostringstream m;
                    m << (is_v ? "V" : "K") << " token " << t << " head " << h << " channel " << ch << ": "
                      << GOKV_VK_TEST_BACKEND " reads " << a[i] << ", cpu " << b[i] << " (quantization step " << step
                      << (t >= nq && c.kivi() ? ", residual ring row" : "") << ")";
                    first_bad = m.str();
                }
            }
        }
    };
    compare(kv, kc, dk, false);
    compare(vv, vc, dv, true);
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << n << " read-back elements differ from the CPU beyond one "
                       << "quantization step or, for f32/f16/ring data, at all; first: " << first_bad;
    EXPECT_LE(one_step, std::max<size_t>(1, n / 1000))
        << what << ": " << one_step << " of " << n << " quantized elements differ from the CPU by one step (allowed: "
        << "rare near-ties, at most 1 in 1000)";
    if (rounding + one_step > 0)
        std::printf("[ PARITY   ] %s: %zu elements, %zu bit-identical, %zu off by float rounding, %zu off by one step\n",
                    what.c_str(), n, exact, rounding, one_step);
}

void expect_read_parity(const Pair &p, const std::string &what) {
    for (size_t i = 0; i < p.vk.seqs.size(); i++)
        expect_seq_parity(p.cpu.pool.get(), p.cpu.cfg, p.cpu.seqs[i], 0, p.vk.kdq[i], p.vk.vdq[i], p.cpu.kdq[i],
                          p.cpu.vdq[i], what + " sequence " + std::to_string(i));
}

gokv_device_info device_info(gokv_device *dev) {
    gokv_device_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    const gokv_status st = gokv_device_info_get(dev, &info);
    EXPECT_EQ(st, GOKV_OK) << "gokv_device_info_get: " << gokv_last_error();
    return info;
}

} // namespace gokvtest
