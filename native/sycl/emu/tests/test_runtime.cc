// The runtime side of the shim: local memory (poisoned, one per work-group), atomic_ref across OS threads,
// USM round trips, what submit rejects, and how a kernel that breaks the execution model is reported.
#include <cstring>
#include <string>
#include <vector>

#include "sycl_emu_test.h"

namespace {

using sycl_emu_test::exception_message;
using sycl_emu_test::Settings;

TEST(LocalAccessor, PoisonedAndPerWorkGroup) {
    Settings settings(16, "shuffled", 2);
    sycl::queue q;
    const size_t wg = 32, groups = 64, n = wg * groups;
    uint32_t *before = sycl::malloc_shared<uint32_t>(n, q), *after = sycl::malloc_shared<uint32_t>(n, q);
    float *fpoison = sycl::malloc_shared<float>(n, q);
    q.submit([&](sycl::handler &h) {
        sycl::local_accessor<uint32_t, 1> words(sycl::range<1>(wg), h);
        sycl::local_accessor<float, 1> floats(sycl::range<1>(3), h);
        sycl::local_accessor<uint16_t, 1> shorts(sycl::range<1>(5), h);
        h.parallel_for(sycl::nd_range<1>(n, wg), [=](sycl::nd_item<1> it) {
            const size_t l = it.get_local_id(0), i = it.get_global_id(0);
            before[i] = words[l];
            fpoison[i] = floats[l % 3];
            sycl::group_barrier(it.get_group());
            words[l] = uint32_t(it.get_group(0) * 1000 + l);
            if (l < 5) shorts[l] = uint16_t(l);
            sycl::group_barrier(it.get_group());
            uint32_t *raw = words.get_multi_ptr<sycl::access::decorated::no>().get();
            after[i] = raw[(l + 1) % wg] + (l < 5 ? shorts[l] : 0u) * 0u + uint32_t(words.size() - wg);
        });
    });
    q.wait_and_throw();
    for (size_t i = 0; i < n; i++) {
        const size_t g = i / wg, l = i % wg;
        EXPECT_EQ(before[i], 0xFFFFFFFFu) << i;
        EXPECT_TRUE(std::isnan(fpoison[i])) << i;
        EXPECT_EQ(after[i], g * 1000 + (l + 1) % wg) << i;
    }
    for (void *p : {static_cast<void *>(before), static_cast<void *>(after), static_cast<void *>(fpoison)}) sycl::free(p, q);
}

TEST(LocalAccessor, IndexOutOfRangeIsAnError) {
    Settings settings(16);
    sycl::queue q;
    q.submit([&](sycl::handler &h) {
        sycl::local_accessor<uint32_t, 1> words(sycl::range<1>(8), h);
        h.parallel_for(sycl::nd_range<1>(16, 16), [=](sycl::nd_item<1> it) { words[it.get_local_id(0)] = 1; });
    });
    std::string message = exception_message([&] { q.wait_and_throw(); }, sycl::errc::runtime);
    EXPECT_HAS(message, "local_accessor index 8 is outside its 8 elements");
}

TEST(AtomicRef, AcrossWorkGroupsOnSeveralThreads) {
    Settings settings(16, "shuffled", 4);
    sycl::queue q;
    const size_t n = 64 * 256;
    struct Counters {
        uint32_t count, bits, min, max;
        int64_t sum64;
        float fsum;
        uint32_t cas_winner, exchanged;
    };
    Counters *c = sycl::malloc_shared<Counters>(1, q);
    *c = Counters{0, 0, ~0u, 0, 0, 0.0f, ~0u, 0};
    q.parallel_for(sycl::nd_range<1>(n, 64), [=](sycl::nd_item<1> it) {
         using relaxed_ref = sycl::atomic_ref<uint32_t, sycl::memory_order::relaxed, sycl::memory_scope::device,
                                              sycl::access::address_space::global_space>;
         const uint32_t i = uint32_t(it.get_global_id(0));
         relaxed_ref(c->count).fetch_add(1);
         relaxed_ref(c->bits).fetch_or(1u << (i % 32));
         relaxed_ref(c->min).fetch_min(i + 5);
         relaxed_ref(c->max).fetch_max(i);
         sycl::atomic_ref<int64_t, sycl::memory_order::relaxed, sycl::memory_scope::device>(c->sum64) += int64_t(i);
         sycl::atomic_ref<float, sycl::memory_order::relaxed, sycl::memory_scope::device>(c->fsum).fetch_add(1.0f);
         uint32_t expected = ~0u;
         relaxed_ref(c->cas_winner).compare_exchange_strong(expected, i);
         relaxed_ref(c->exchanged).exchange(7);
     }).wait();
    EXPECT_EQ(c->count, n);
    EXPECT_EQ(c->bits, 0xFFFFFFFFu);
    EXPECT_EQ(c->min, 5u);
    EXPECT_EQ(c->max, n - 1);
    EXPECT_EQ(c->sum64, int64_t(n) * int64_t(n - 1) / 2);
    EXPECT_EQ(c->fsum, float(n));
    EXPECT_LT(c->cas_winner, n);
    EXPECT_EQ(c->exchanged, 7u);
    uint32_t v = 3;
    sycl::atomic_ref<uint32_t, sycl::memory_order::acq_rel, sycl::memory_scope::work_group> r(v);
    EXPECT_EQ(r.load(), 3u);
    r.store(9);
    EXPECT_EQ(r.fetch_and(8), 9u);
    EXPECT_EQ(++r, 9u);
    uint32_t wrong = 1;
    EXPECT_FALSE(r.compare_exchange_strong(wrong, 0));
    EXPECT_EQ(wrong, 9u);
    sycl::free(c, q);
}

TEST(Usm, RoundTrips) {
    sycl::queue q{sycl::property::queue::in_order{}};
    const size_t n = 1000;
    uint32_t *dev = sycl::malloc_device<uint32_t>(n, q);
    uint32_t *host = sycl::malloc_host<uint32_t>(n, q);
    ASSERT_NE(dev, nullptr);
    ASSERT_NE(host, nullptr);
    std::vector<uint32_t> src(n), back(n);
    q.memcpy(back.data(), dev, n * 4).wait();
    EXPECT_EQ(back[0], 0xFFFFFFFFu);  // device memory starts poisoned
    for (size_t i = 0; i < n; i++) src[i] = uint32_t(i * 3);
    q.memcpy(dev, src.data(), n * 4);
    q.copy(dev, host, n).wait();
    EXPECT_EQ(std::memcmp(host, src.data(), n * 4), 0);
    q.fill(dev, uint32_t(0xABCD), n / 2);
    q.memset(dev + n / 2, 0, (n - n / 2) * 4);
    q.submit([&](sycl::handler &h) { h.memcpy(back.data(), dev, n * 4); }).wait_and_throw();
    for (size_t i = 0; i < n; i++) EXPECT_EQ(back[i], i < n / 2 ? 0xABCDu : 0u) << i;
    void *aligned = sycl::aligned_alloc_device(4096, 100, q);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(aligned) % 4096, 0u);
    void *shared = sycl::malloc_shared(64, q);
    EXPECT_NE(shared, nullptr);
    sycl::free(aligned, q);
    sycl::free(shared, q);
    sycl::free(dev, q);
    sycl::free(host, q.get_context());
    sycl::free(nullptr, q);
    const sycl::event e = q.memset(back.data(), 0, 4);
    EXPECT_EQ(e.get_info<sycl::info::event::command_execution_status>(), sycl::info::event_command_status::complete);
    EXPECT_LE(e.get_profiling_info<sycl::info::event_profiling::command_start>(),
              e.get_profiling_info<sycl::info::event_profiling::command_end>());
}

TEST(Submit, GlobalRangeNotAMultipleOfTheLocalRange) {
    sycl::queue q;
    std::string message = exception_message(
        [&] {
            q.submit([&](sycl::handler &h) {
                h.parallel_for(sycl::nd_range<2>(sycl::range<2>(4, 100), sycl::range<2>(2, 32)), [=](sycl::nd_item<2>) {});
            });
        },
        sycl::errc::nd_range);
    EXPECT_HAS(message, "not a multiple");
    exception_message([&] { q.parallel_for(sycl::nd_range<1>(2048, 2048), [=](sycl::nd_item<1>) {}); },
                      sycl::errc::nd_range);
    exception_message(
        [&] {
            q.submit([&](sycl::handler &h) {
                sycl::local_accessor<uint32_t, 1> big(sycl::range<1>(20000), h);
                h.parallel_for(sycl::nd_range<1>(32, 32), [=](sycl::nd_item<1>) { big[0] = 0; });
            });
        },
        sycl::errc::memory_allocation);
    q.wait_and_throw();  // nothing ran, nothing to report
}

TEST(Submit, BadSettingsAreRejected) {
    setenv("GOKV_SYCL_EMU_SUBGROUP", "12", 1);
    sycl::queue q;
    std::string message = exception_message(
        [&] { q.parallel_for(sycl::nd_range<1>(32, 32), [=](sycl::nd_item<1>) {}); }, sycl::errc::invalid);
    EXPECT_HAS(message, "GOKV_SYCL_EMU_SUBGROUP");
    unsetenv("GOKV_SYCL_EMU_SUBGROUP");
}

// A kernel that reads a neighbour's local memory without a barrier: its result depends on the order in
// which the emulator runs the work-items, which is how a test run in several orders catches it.
std::vector<uint32_t> neighbour_sums(const char *order, bool with_barrier) {
    Settings settings(16, order, 1);
    sycl::queue q;
    const size_t n = 64;
    uint32_t *out = sycl::malloc_shared<uint32_t>(n, q);
    q.submit([&](sycl::handler &h) {
        sycl::local_accessor<uint32_t, 1> tg(sycl::range<1>(n), h);
        h.parallel_for(sycl::nd_range<1>(n, n), [=](sycl::nd_item<1> it) {
            const size_t l = it.get_local_id(0);
            tg[l] = uint32_t(l);
            if (with_barrier) sycl::group_barrier(it.get_group());
            out[l] = tg[(l + 1) % n];
            sycl::group_barrier(it.get_group());
        });
    });
    q.wait_and_throw();
    std::vector<uint32_t> r(out, out + n);
    sycl::free(out, q);
    return r;
}

TEST(Errors, MissingBarrierShowsAsOrderDependence) {
    EXPECT_NE(neighbour_sums("forward", false), neighbour_sums("reverse", false));
    const std::vector<uint32_t> forward = neighbour_sums("forward", true);
    EXPECT_EQ(forward, neighbour_sums("reverse", true));
    EXPECT_EQ(forward, neighbour_sums("shuffled", true));
    EXPECT_EQ(forward[63], 0u);
}

TEST(Errors, DivergentBarrierNamesTheKernelsLines) {
    Settings settings(16);
    sycl::queue q;
    const int line_a = __LINE__ + 4, line_b = __LINE__ + 6;
    sycl::event e = q.submit([&](sycl::handler &h) {
        h.parallel_for(sycl::nd_range<1>(32, 32), [=](sycl::nd_item<1> it) {
            if (it.get_local_id(0) < 4)
                sycl::group_barrier(it.get_group());
            else
                sycl::group_barrier(it.get_group());
        });
    });
    std::string message = exception_message([&] { e.wait(); }, sycl::errc::runtime);
    EXPECT_HAS(message, "divergent barrier");
    EXPECT_HAS(message, "test_runtime.cc:" + std::to_string(line_a));
    EXPECT_HAS(message, "test_runtime.cc:" + std::to_string(line_b));
    q.wait_and_throw();  // reported once
}

TEST(Errors, SubGroupAlgorithmAfterSomeWorkItemsExited) {
    Settings settings(8);
    sycl::queue q;
    uint32_t *out = sycl::malloc_shared<uint32_t>(16, q);
    const int line = __LINE__ + 4;
    q.parallel_for(sycl::nd_range<1>(16, 16), [=](sycl::nd_item<1> it) {
        if (it.get_local_id(0) == 5) return;
        out[it.get_local_id(0)] =
            sycl::reduce_over_group(it.get_sub_group(), 1u, sycl::plus<>());
    });
    std::string message = exception_message([&] { q.wait_and_throw(); }, sycl::errc::runtime);
    EXPECT_HAS(message, "thread 5 exited");
    EXPECT_HAS(message, "reduce_over_group");
    EXPECT_HAS(message, "test_runtime.cc:" + std::to_string(line));
    sycl::free(out, q);
}

TEST(Errors, WorkGroupAlgorithmInDivergentControlFlow) {
    Settings settings(16);
    sycl::queue q;
    const int line = __LINE__ + 3;
    q.parallel_for(sycl::nd_range<1>(64, 64), [=](sycl::nd_item<1> it) {
        if (it.get_sub_group().get_group_linear_id() != 2)
            (void)sycl::reduce_over_group(it.get_group(), 1u, sycl::plus<>());
    });
    std::string message = exception_message([&] { q.wait(); }, sycl::errc::runtime);
    EXPECT_HAS(message, "test_runtime.cc:" + std::to_string(line));
}

TEST(Errors, UniformArgumentsAreChecked) {
    Settings settings(16);
    sycl::queue q;
    q.parallel_for(sycl::nd_range<1>(16, 16), [=](sycl::nd_item<1> it) {
        const sycl::sub_group sg = it.get_sub_group();
        (void)sycl::shift_group_left(sg, 1u, sg.get_local_linear_id() % 2);
    });
    EXPECT_HAS(exception_message([&] { q.wait_and_throw(); }, sycl::errc::runtime), "must be uniform");
    q.parallel_for(sycl::nd_range<1>(16, 16), [=](sycl::nd_item<1> it) {
        (void)sycl::group_broadcast(it.get_group(), 1u, 16);
    });
    EXPECT_HAS(exception_message([&] { q.wait_and_throw(); }, sycl::errc::runtime), "outside the work-group");
}

TEST(Errors, TheNextSubmitReportsAnUnreportedFailure) {
    Settings settings(16);
    sycl::queue q;
    q.parallel_for(sycl::nd_range<1>(16, 16), [=](sycl::nd_item<1> it) {
        if (it.get_local_id(0) != 0) sycl::group_barrier(it.get_group());
    });
    exception_message([&] { q.memset(nullptr, 0, 0); }, sycl::errc::runtime);
    q.memset(nullptr, 0, 0).wait();  // reported once
}

TEST(Errors, AnAsyncHandlerReceivesTheFailures) {
    Settings settings(16);
    std::vector<std::string> seen;
    sycl::queue q{[&](sycl::exception_list list) {
        for (const std::exception_ptr &e : list) {
            try {
                std::rethrow_exception(e);
            } catch (const sycl::exception &x) {
                seen.push_back(x.what());
            }
        }
    }};
    for (int i = 0; i < 2; i++) {
        q.parallel_for(sycl::nd_range<1>(16, 16), [=](sycl::nd_item<1> it) {
            if (it.get_local_id(0) != 0) sycl::group_barrier(it.get_group());
        });
    }
    q.wait_and_throw();
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_HAS(seen[0], "exited while others wait at a barrier");
    q.throw_asynchronous();
    EXPECT_EQ(seen.size(), 2u);
}

// A functor whose member is not trivially copyable is accepted once sycl::is_device_copyable says so
// (native/sycl/emu/tests/compile_fail checks that without it the kernel does not compile).
struct Wrapped {
    uint32_t *p;
    Wrapped(uint32_t *q) : p(q) {}
    Wrapped(const Wrapped &o) : p(o.p) {}
};
struct WrappedKernel {
    Wrapped w;
    void operator()(sycl::nd_item<1> it) const { w.p[it.get_global_id(0)] = 1; }
};
}  // namespace

template <> struct sycl::is_device_copyable<WrappedKernel> : std::true_type {};

namespace {
TEST(DeviceCopyable, SpecializationAccepted) {
    sycl::queue q;
    uint32_t *out = sycl::malloc_shared<uint32_t>(8, q);
    q.parallel_for(sycl::nd_range<1>(8, 8), WrappedKernel{Wrapped(out)}).wait();
    EXPECT_EQ(out[7], 1u);
    sycl::free(out, q);
}
}  // namespace
