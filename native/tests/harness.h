/*
 * harness.h: the conformance suite's backend parameterization and cross-backend comparisons
 * (docs/architecture.md §8). Every test is parameterized by backend: its parameter is a backend name, or a
 * backend name and a case (On<P>), and its name starts with the backend's ("vulkan_f16_gqa"), which is
 * what ctest filters each backend's run on (CMakeLists.txt). The backends are those registered when the
 * tests are listed: the CPU and every vendor module of the build (backends.c, generated).
 *
 * The backend under test ("dut") gets one shared device per process, opened at its first test; the CPU
 * backend's shared device (reference.h: shared_device, 2 threads) is the reference backend. Each case runs on
 * both with the same inputs and is checked against the float64 reference over each one's own
 * gokv_pool_read output, then against each other; when the backend under test is the CPU itself, the
 * reference run uses its plain scalar path (GOKV_ATTEND_FORCE_SCALAR).
 *
 * Log watch: the suite installs a gokv log callback; every test fails if the backend under test logged a
 * warning or an error during it (validation layers report through the log at those levels). A test that
 * calls expect_backend_errors() (fault injection) fails only on its validation layer's messages (op
 * "validation").
 *
 * Tolerances (rel_err of reference.h: worst absolute deviation over the largest reference magnitude):
 *   - each backend vs the float64 reference over its own read-back: f32/f16 1e-5, quantized 1e-4.
 *   - backend vs CPU on identical inputs: 2·tol + rel_err(reference over the one's read-back, reference
 *     over the other's). Each output is within tol of its reference (checked), so by the triangle
 *     inequality this bound is what a correct pair can reach; the last term is 0 when the two backends
 *     store bit-identical pages and is only the effect of a stored code that differs by one step. The
 *     CPU's default (SIMD) path against its scalar path: at most 1e-5 as well.
 *   - stored data (pool_read): bit for bit, except (a) a quantized element whose code differs by one step
 *     (a GPU's division (x - b) / s may round a near-tie the other way), allowed for at most 1 in 1000
 *     elements; (b) a quantized element that differs by float rounding of q·s + b (a fused multiply-add
 *     on one side), at most 2.5e-7 of the group's magnitude. f32, f16 and KIVI ring rows match exactly.
 */
#ifndef GOKV_TESTS_HARNESS_H
#define GOKV_TESTS_HARNESS_H

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "reference.h"

namespace gokvtest {

/* The registered backends ("cpu" first), known once main has registered the vendor modules. */
const std::vector<std::string> &backends();

/* The backend under test in the running test, its shared device, and the CPU reference device. */
const std::string &dut_name();
gokv_device *dut();
gokv_device *cpu_device();
bool dut_is_cpu();
/* This test expects the backend under test to log warnings or errors (an injected fault): the log watch
 * fails it only on validation messages. */
void expect_backend_errors();

/* Reinstalls the suite's log callback (after a test that replaced it). */
void restore_log_capture();

/* Log messages captured since the process started (all levels), formatted "LEVEL backend op: msg". */
size_t log_mark();
std::string log_since(size_t mark);

/* What every fixture does around its test: selects the backend, opens its shared device, watches the log. */
void begin_backend_test(const std::string &backend);
void end_backend_test();

/* Tests parameterized by the backend alone. */
class BackendTest : public testing::TestWithParam<std::string> {
protected:
    void SetUp() override { begin_backend_test(GetParam()); }
    void TearDown() override { end_backend_test(); }
};

/* Tests parameterized by backend and case. */
template <class P>
struct On {
    std::string backend;
    P p;
};
template <class P>
class BackendParamTest : public testing::TestWithParam<On<P>> {
protected:
    void SetUp() override { begin_backend_test(this->GetParam().backend); }
    void TearDown() override { end_backend_test(); }
    const P &param() const { return this->GetParam().p; }
};

/* How a case splits into finer tests: by default it does not; a case type that loops over lengths or
 * shapes inside its test declares split_case next to it (found by argument-dependent lookup). */
template <class P>
std::vector<P> split_case(const P &c) {
    return {c};
}

/* The CPU starts in milliseconds, so its runs are split as fine as a case type allows: a failure names its
 * length or shape in the test's name. A GPU backend's run compiles its pipelines once per process, so its
 * tests stay grouped per (format, attention type). */
template <class P>
std::vector<On<P>> on_every_backend(const std::vector<P> &cases) {
    std::vector<On<P>> v;
    for (const std::string &b : backends())
        for (const P &c : cases) {
            if (b != "cpu") {
                v.push_back({b, c});
                continue;
            }
            for (const P &part : split_case(c)) v.push_back({b, part});
        }
    return v;
}
template <class P, size_t N>
std::vector<On<P>> on_every_backend(const P (&cases)[N]) {
    return on_every_backend(std::vector<P>(cases, cases + N));
}

/* Test names: "<backend>" and "<backend>_<case_name(case)>" (case_name found by argument-dependent lookup
 * next to each case type). */
struct BackendName {
    std::string operator()(const testing::TestParamInfo<std::string> &i) const { return i.param; }
};
struct CaseName {
    template <class P>
    std::string operator()(const testing::TestParamInfo<On<P>> &i) const {
        return i.param.backend + "_" + case_name(i.param.p);
    }
};
template <class P>
void PrintTo(const On<P> &o, std::ostream *os) {
    *os << o.backend << " " << case_name(o.p);
}

#define GOKV_INSTANTIATE_ON_BACKENDS(suite) \
    INSTANTIATE_TEST_SUITE_P(All, suite, testing::ValuesIn(gokvtest::backends()), gokvtest::BackendName())
#define GOKV_INSTANTIATE_CASES(prefix, suite, cases) \
    INSTANTIATE_TEST_SUITE_P(prefix, suite, testing::ValuesIn(gokvtest::on_every_backend(cases)), gokvtest::CaseName())

/* The pool formats of the case tables. */
struct Fmt {
    int32_t format, group, residual;
};
std::string fmt_name(const Fmt &f);
inline std::string case_name(const Fmt &f) { return fmt_name(f); }
double tol_for(int32_t format); /* f32/f16 1e-5, quantized 1e-4 */

/* Attention geometries of the case table: MHA 4q/4kv d128, GQA 8q/2kv d128, MQA 4q/1kv d128, MLA absorbed
 * form 8q over one latent (d_k 96, d_v 64 for g <= 32, else 3g and g). */
enum Attn { MHA, GQA, MQA, MLA };
extern const char *const kAttnNames[4];
PoolCfg attn_cfg(const Fmt &f, Attn a, int32_t *n_heads_q);

/* The same pool built on the backend under test and on the CPU from the same seed: same page tables,
 * slots and input rows. */
struct Pair {
    Cache dut, cpu;
};
bool build_pair(const PoolCfg &cfg, const std::vector<int32_t> &lens, uint32_t seed, Pair &out,
                int32_t extra_capacity = 0);
/* Appends the same new rows to sequences idx[i] of both caches (one write call per backend), then
 * rereads both. */
bool append_pair(Pair &p, const std::vector<size_t> &idx, const std::vector<std::vector<float>> &k,
                 const std::vector<std::vector<float>> &v);
/* a, built against one cache, pointed at sequence i of another (same pages and slot). */
AttnSeq rebind(AttnSeq a, const Cache &c, size_t i);

/* Runs seqs (built against p.dut; src[i] is the cache sequence of seqs[i]) on both backends and checks:
 * each against the float64 reference over its own read-back (tol; every output written, rows that see
 * nothing exactly zero), and the backend under test against the CPU (the bound above). With o.mass, the
 * attention mass too (check_attend's checks on each; between the two, per element, 2·tol·max(1, |cpu|) + the
 * two references' gap; the CPU against its scalar path 1e-5·max(1, |cpu|)). Returns rel_err(dut, cpu). */
struct CrossOut {
    std::vector<float> dut, cpu;
    std::vector<float> dut_mass, cpu_mass; /* with o.mass */
};
/* Whether the backend under test has the capability bit(s) caps (GOKV_CAP_*) in its device info. */
bool dut_has_caps(uint32_t caps);
double cross_attend(const Pair &p, const std::vector<AttnSeq> &seqs, const std::vector<size_t> &src,
                    const std::vector<float> &q, const AttnOpts &o, double tol, const std::string &what,
                    CrossOut *out = nullptr);

/* Compares the read-back of every sequence of p with the CPU's (the rule above). */
void expect_read_parity(const Pair &p, const std::string &what);
/* The same for one sequence s (positions start .. s.len - 1): kv/vv read from the pool under test, kc/vc
 * from cpu_pool, a CPU pool holding the same tokens in the same pages and slot (its stored scales give the
 * size of one quantization step). */
void expect_seq_parity(gokv_pool *cpu_pool, const PoolCfg &c, const Seq &s, int32_t start, const std::vector<float> &kv,
                       const std::vector<float> &vv, const std::vector<float> &kc, const std::vector<float> &vc,
                       const std::string &what);

/* Whether the backend under test writes pages as stored (its optional set_page_bytes slot; probed on a small
 * pool of its own): gokv_pool_set_page_bytes, and the core's gokv_pool_gather_rows built on it. */
bool dut_sets_page_bytes();

/* A gokv_device_info of dev (test failure if the call fails). */
gokv_device_info device_info(gokv_device *dev);

} // namespace gokvtest

#endif
