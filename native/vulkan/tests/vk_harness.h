/*
 * vk_harness.h: what the Vulkan suite adds to the CPU suite's helpers (native/cpu/tests/reference.h): the
 * shared Vulkan device, the validation-layer watch every test runs under, and the cross-backend comparisons
 * (docs/architecture.md §8: the same inputs on the Vulkan and the CPU backend, each checked against the
 * float64 reference over its own gokv_pool_read output, then against each other).
 *
 * Validation: the global environment installs a log callback, registers the backend and opens the shared
 * device; every fixture (VkTest, VkParamTest) fails its test if gokv_vulkan_validation_messages() grew
 * during it and prints the messages the log captured. With GOKV_VULKAN_VALIDATION=1 (ctest sets it) the
 * suite also turns on the layer's synchronization validation (VK_LAYER_ENABLES, unless already set).
 *
 * Tolerances (rel_err of reference.h: worst absolute deviation over the largest reference magnitude):
 *   - Vulkan vs float64 reference over Vulkan's own read-back: the CPU suite's, f32/f16 1e-5 and quantized
 *     1e-4 (the shaders compute in f32; no f16 arithmetic, so nothing is relaxed).
 *   - Vulkan vs CPU on identical inputs: 2·tol + rel_err(reference over Vulkan's read-back, reference over
 *     the CPU's read-back). Each output is within tol of its reference (checked), so by the triangle
 *     inequality this bound is what a correct pair can reach; the last term is 0 when the two backends
 *     store bit-identical pages and is only the effect of a stored code that differs by one step.
 *   - Stored data (pool_read): bit for bit, except (a) a quantized element whose code differs by one step
 *     (the GPU's division (x - b) / s may round a near-tie the other way), allowed for at most 1 in 1000
 *     elements; (b) a quantized element that differs by float rounding of q·s + b (a fused multiply-add
 *     on one side), at most 2.5e-7 of the group's magnitude, the slack the CPU suite's format checks give
 *     its own paths. f32, f16 and KIVI ring rows must match exactly. Counts are printed ("[ PARITY   ]").
 */
#ifndef GOKV_VK_TESTS_HARNESS_H
#define GOKV_VK_TESTS_HARNESS_H

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gokv_vulkan.h"
#include "reference.h"

/* The backend under test. A scratch build may define it as "cpu" to check the harness itself against
 * the CPU backend (the Vulkan-only tests then fail, the comparisons must pass). */
#ifndef GOKV_VK_TEST_BACKEND
#define GOKV_VK_TEST_BACKEND "vulkan"
#endif

namespace gokvtest {

/* The Vulkan device shared by the suite (opened by the global environment; null if that failed) and the
 * CPU device it is compared with (reference.h's shared_device: 2 threads). */
gokv_device *vk_device();
gokv_device *cpu_device();
/* Why the shared Vulkan device is null ("" when it is open). */
const std::string &vk_open_error();

/* Log messages captured since the process started (all levels), formatted "LEVEL backend op: msg". */
size_t log_mark();
std::string log_since(size_t mark);

/* Fails the current test if gokv_vulkan_validation_messages() grew since begin(), printing the log
 * messages captured meanwhile. Every fixture of the suite runs its test between begin() and check(). */
struct ValidationWatch {
    uint64_t start = 0;
    size_t mark = 0;
    void begin();
    void check(const std::string &where);
};

class VkTest : public testing::Test {
protected:
    void SetUp() override;
    void TearDown() override;
    ValidationWatch watch_;
};

template <class P>
class VkParamTest : public testing::TestWithParam<P> {
protected:
    void SetUp() override {
        watch_.begin();
        ASSERT_NE(vk_device(), nullptr) << "the shared " GOKV_VK_TEST_BACKEND " device did not open: " << vk_open_error();
    }
    void TearDown() override { watch_.check("after the test"); }
    ValidationWatch watch_;
};

/* The pool formats of the suite. */
struct Fmt {
    int32_t format, group, residual;
};
std::string fmt_name(const Fmt &f);
inline void PrintTo(const Fmt &f, std::ostream *os) { *os << fmt_name(f); } /* gtest's parameter printer */
double tol_for(int32_t format); /* f32/f16 1e-5, quantized 1e-4 (as the CPU suite) */

/* Attention geometries of the case table (as the CPU suite's test_attend_decode.cc): MHA 4q/4kv d128,
 * GQA 8q/2kv d128, MQA 4q/1kv d128, MLA absorbed form 8q over one latent (d_k 96, d_v 64 for g <= 32,
 * else 3g and g). */
enum Attn { MHA, GQA, MQA, MLA };
extern const char *const kAttnNames[4];
PoolCfg attn_cfg(const Fmt &f, Attn a, int32_t *n_heads_q);

/* The same pool built on both backends from the same seed: same page tables, slots and input rows. */
struct Pair {
    Cache vk, cpu;
};
bool build_pair(const PoolCfg &cfg, const std::vector<int32_t> &lens, uint32_t seed, Pair &out,
                int32_t extra_capacity = 0);
/* Appends the same new rows to sequences idx[i] of both caches (one write call per backend), then
 * rereads both. */
bool append_pair(Pair &p, const std::vector<size_t> &idx, const std::vector<std::vector<float>> &k,
                 const std::vector<std::vector<float>> &v);
/* a, built against one cache, pointed at sequence i of another (same pages and slot). */
AttnSeq rebind(AttnSeq a, const Cache &c, size_t i);

/* Runs seqs (built against p.vk; src[i] is the cache sequence of seqs[i]) on both backends and checks:
 * each against the float64 reference over its own read-back (tol; every output written, rows that see
 * nothing exactly zero), and Vulkan against the CPU (the bound above). Returns rel_err(vulkan, cpu). */
struct CrossOut {
    std::vector<float> vk, cpu;
};
double cross_attend(const Pair &p, const std::vector<AttnSeq> &seqs, const std::vector<size_t> &src,
                    const std::vector<float> &q, const AttnOpts &o, double tol, const std::string &what,
                    CrossOut *out = nullptr);

/* Compares the Vulkan read-back of every sequence of p with the CPU's (the rule above). */
void expect_read_parity(const Pair &p, const std::string &what);
/* The same for one sequence s (positions start .. s.len - 1): kv/vv read from a Vulkan pool, kc/vc from
 * cpu_pool, a CPU pool holding the same tokens in the same pages and slot (its stored scales give the
 * size of one quantization step). */
void expect_seq_parity(gokv_pool *cpu_pool, const PoolCfg &c, const Seq &s, int32_t start, const std::vector<float> &kv,
                       const std::vector<float> &vv, const std::vector<float> &kc, const std::vector<float> &vc,
                       const std::string &what);

/* A gokv_device_info of dev (test failure if the call fails). */
gokv_device_info device_info(gokv_device *dev);

} // namespace gokvtest

#endif
