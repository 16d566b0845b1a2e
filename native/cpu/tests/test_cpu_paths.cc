/*
 * test_cpu_paths.cc: what only the CPU module has (docs/architecture.md §8): results must not depend on the
 * thread count or the SIMD path (gokv_cpu_set_simd_limit), and writes store the same bytes on every path.
 * Outputs are poisoned with NaN before every call (reference.h: attend) and checked written. The other
 * invariances run on every backend in the conformance suite (native/tests).
 */
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gokv_cpu.h"
#include "reference.h"

using namespace gokvtest;

namespace {

/* Restores the process-wide SIMD limit and kernel dispatch when it goes out of scope. */
struct SimdLimitGuard {
    int32_t saved, dispatch;
    SimdLimitGuard() : saved(gokv_cpu_simd_level()), dispatch(gokv_cpu_set_dispatch(GOKV_CPU_DISPATCH_MEASURED)) {
        gokv_cpu_set_dispatch(dispatch);
    }
    ~SimdLimitGuard() {
        gokv_cpu_set_simd_limit(saved);
        gokv_cpu_set_dispatch(dispatch);
    }
};

struct F {
    int32_t format, group, residual;
};
const F kInvFormats[] = {{GOKV_FORMAT_F32, 0, 0},     {GOKV_FORMAT_F16, 0, 0},     {GOKV_FORMAT_Q8, 32, 0},
                         {GOKV_FORMAT_Q4, 32, 0},     {GOKV_FORMAT_KIVI2, 32, 0},  {GOKV_FORMAT_KIVI2, 32, 128},
                         {GOKV_FORMAT_KIVI4, 32, 32}};
std::string f_name(const testing::TestParamInfo<F> &i) { return format_cfg(i.param.format, i.param.group, i.param.residual).name(); }
double tol_of(const PoolCfg &c) { return c.quantized() ? 1e-4 : 1e-5; }

class CpuPaths : public testing::TestWithParam<F> {
protected:
    /* GQA 8:2, a batch of decode sequences of several lengths plus one prefill, window + sinks. */
    PoolCfg cfg() const {
        PoolCfg c = format_cfg(GetParam().format, GetParam().group, GetParam().residual);
        c.n_kv_heads = 2;
        return c;
    }
    std::vector<int32_t> lens() const { return {1, 37, 300, 1000, 90}; }
    std::vector<AttnSeq> seqs(const Cache &c) const {
        std::vector<AttnSeq> s;
        for (size_t i = 0; i + 1 < c.seqs.size(); i++) s.push_back(attn_seq(c, i));
        s.push_back(attn_seq(c, c.seqs.size() - 1, 30)); /* prefill of 30 rows */
        return s;
    }
    AttnOpts opts(bool window) const {
        AttnOpts o;
        o.n_heads_q = 8;
        if (window) {
            o.n_sink_tokens = 4;
            o.window = 100;
            o.sinks = {0.0f, 1.0f, -1.0f, 3.0f, 0.5f, -2.0f, 1.5f, 0.25f};
        }
        return o;
    }
};

/* Thread count: devices with 1, 2 and 3 workers (and all CPUs) give the same result. */
TEST_P(CpuPaths, ThreadCount) {
    std::vector<float> first;
    for (int32_t threads : {1, 2, 3, 0}) {
        DevicePtr dev = open_cpu(threads);
        ASSERT_TRUE(dev);
        gokv_device_info info;
        std::memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        ASSERT_EQ(gokv_device_info_get(dev.get(), &info), GOKV_OK) << gokv_last_error();
        if (threads > 0) {
            EXPECT_EQ(info.n_threads, threads);
        }
        EXPECT_GE(info.n_threads, 1);
        Cache cache;
        ASSERT_TRUE(build_cache(dev.get(), cfg(), lens(), 10u, cache));
        std::vector<AttnSeq> s = seqs(cache);
        std::mt19937 rng(12);
        std::vector<float> q = gen_normal(rng, (size_t)total_rows(s) * 8 * (size_t)cache.cfg.d_k);
        AttnOpts o = opts(true);
        o.chunk = 64;
        std::vector<float> out;
        check_attend(dev.get(), cache, s, q, o, tol_of(cache.cfg), "threads " + std::to_string(threads), &out);
        if (first.empty())
            first = out;
        else
            EXPECT_LE(rel_err(out, first), 1e-6) << "threads " << threads << " vs 1 thread";
    }
}

/* SIMD paths: every level the CPU has (capped with gokv_cpu_set_simd_limit) against the reference and
 * the scalar path; writes produce the same bytes on every path (fp16 conversion bit for bit). AVX-512 runs
 * under each kernel dispatch: the measured table, the AVX-512 kernels whole, and every AVX2 kernel swapped in
 * (which the measured table may or may not do on this machine). */
TEST_P(CpuPaths, SimdLevels) {
    SimdLimitGuard guard;
    const int32_t best = gokv_cpu_simd_level();
    std::vector<std::pair<int32_t, int32_t>> levels = {{GOKV_CPU_SCALAR, GOKV_CPU_DISPATCH_MEASURED}};
    for (int32_t l : {GOKV_CPU_AVX2, GOKV_CPU_AVX512, GOKV_CPU_NEON})
        if (l <= best && (l != GOKV_CPU_NEON || best == GOKV_CPU_NEON) && (best != GOKV_CPU_NEON || l == GOKV_CPU_NEON))
            for (int32_t dispatch : {GOKV_CPU_DISPATCH_MEASURED, GOKV_CPU_DISPATCH_WIDEST, GOKV_CPU_DISPATCH_NARROW})
                if (l == GOKV_CPU_AVX512 || dispatch == GOKV_CPU_DISPATCH_MEASURED) levels.push_back({l, dispatch});
    std::vector<float> scalar_out;
    std::vector<std::vector<uint8_t>> scalar_pages;
    for (auto [level, dispatch] : levels) {
        const int32_t in_force = gokv_cpu_set_simd_limit(level);
        gokv_cpu_set_dispatch(dispatch);
        EXPECT_EQ(in_force, level) << gokv_cpu_simd_name(level);
        EXPECT_NE(gokv_cpu_simd_name(level), nullptr);
        Cache cache;
        ASSERT_TRUE(build_cache(shared_device(), cfg(), lens(), 16u, cache));
        std::vector<std::vector<uint8_t>> pages;
        for (const Seq &sq : cache.seqs) {
            const int32_t full = cache.cfg.kivi() ? gokv_kivi_quantized_len(sq.len, cache.cfg.group, cache.cfg.residual) / cache.cfg.page_size
                                                  : sq.len / cache.cfg.page_size;
            for (int32_t i = 0; i < full; i++) {
                pages.push_back(page_bytes(cache.pool.get(), sq.pages[(size_t)i]));
            }
        }
        std::vector<AttnSeq> s = seqs(cache);
        std::mt19937 rng(17);
        std::vector<float> q = gen_normal(rng, (size_t)total_rows(s) * 8 * (size_t)cache.cfg.d_k);
        std::vector<float> out;
        const std::string what = std::string("simd ") + gokv_cpu_simd_name(level) + " dispatch " + std::to_string(dispatch);
        check_attend(shared_device(), cache, s, q, opts(true), tol_of(cache.cfg), what, &out);
        if (level == GOKV_CPU_SCALAR) {
            scalar_out = out;
            scalar_pages = pages;
        } else {
            EXPECT_LE(rel_err(out, scalar_out), 1e-5) << what << " vs scalar";
            EXPECT_TRUE(pages == scalar_pages) << what << ": written pages differ from the scalar path's bytes";
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, CpuPaths, testing::ValuesIn(kInvFormats), f_name);

/* The SIMD limit cannot raise the level above what the CPU has, and reports what is in force. */
TEST(Simd, LimitIsCapped) {
    SimdLimitGuard guard;
    const int32_t best = gokv_cpu_simd_level();
    EXPECT_EQ(gokv_cpu_set_simd_limit(GOKV_CPU_SCALAR), GOKV_CPU_SCALAR);
    EXPECT_EQ(gokv_cpu_set_simd_limit(best), best);
    EXPECT_NE(gokv_cpu_simd_name(best), nullptr);
    std::printf("[ INFO     ] CPU SIMD level %d (%s)\n", best, gokv_cpu_simd_name(best));
}

/* A fresh one-thread CPU device's info (what it reports at the level in force). */
static ::testing::AssertionResult cpu_info(gokv_device_info *info) {
    DevicePtr dev = open_cpu(1);
    if (!dev) return ::testing::AssertionFailure() << "no CPU device: " << gokv_last_error();
    std::memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    if (gokv_device_info_get(dev.get(), info) != GOKV_OK) return ::testing::AssertionFailure() << gokv_last_error();
    return ::testing::AssertionSuccess();
}

/* The dispatch modes round-trip, say what they chose, and the device's features carry it at AVX-512. */
TEST(Simd, DispatchModes) {
    SimdLimitGuard guard;
    EXPECT_EQ(gokv_cpu_set_dispatch(GOKV_CPU_DISPATCH_WIDEST), guard.dispatch);
    EXPECT_NE(std::strstr(gokv_cpu_dispatch_note(), "avx512"), nullptr) << gokv_cpu_dispatch_note();
    EXPECT_EQ(gokv_cpu_set_dispatch(GOKV_CPU_DISPATCH_NARROW), GOKV_CPU_DISPATCH_WIDEST);
    EXPECT_NE(std::strstr(gokv_cpu_dispatch_note(), "avx2"), nullptr) << gokv_cpu_dispatch_note();
    EXPECT_EQ(gokv_cpu_set_dispatch(42), GOKV_CPU_DISPATCH_NARROW); /* unknown: measured */
    EXPECT_EQ(gokv_cpu_set_dispatch(GOKV_CPU_DISPATCH_MEASURED), GOKV_CPU_DISPATCH_MEASURED);
    const char *note = gokv_cpu_dispatch_note();
    EXPECT_TRUE(std::strstr(note, "every kernel avx512") || std::strstr(note, "avx2 for ")) << note;
    std::printf("[ INFO     ] kernel dispatch: %s\n", note);
    if (gokv_cpu_simd_level() == GOKV_CPU_AVX512) {
        gokv_cpu_set_simd_limit(GOKV_CPU_AVX512);
        gokv_device_info info;
        ASSERT_TRUE(cpu_info(&info));
        EXPECT_NE(std::strstr(info.features, "measured: "), nullptr) << info.features;
    }
}

/* GOKV_CPU_SIMD caps the level before anything else sets it: run with GOKV_CPU_SIMD=scalar by
 * cpu.simd_environment_cap (CMakeLists.txt); skipped elsewhere. */
TEST(Simd, EnvironmentCap) {
    const char *e = std::getenv("GOKV_CPU_SIMD");
    if (!e || std::strcmp(e, "scalar") != 0) GTEST_SKIP() << "run with GOKV_CPU_SIMD=scalar (ctest cpu.simd_environment_cap)";
    gokv_device_info info;
    ASSERT_TRUE(cpu_info(&info));
    EXPECT_EQ(info.subgroup_size, 1) << info.features;
    EXPECT_EQ(gokv_cpu_set_simd_limit(1 << 20), gokv_cpu_simd_level()); /* the API still lifts it */
}

} // namespace
