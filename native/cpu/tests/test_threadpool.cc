/*
 * test_threadpool.cc: the CPU module's worker pool (threadpool.h). Waiters spin for a while and then sleep,
 * so loops are run back to back (workers still spinning), after pauses longer than the spin (workers asleep
 * on the condition variable), and mixed; every index must run exactly once per loop, on a valid worker.
 */
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <chrono>
#include <thread>
#include <vector>

#include "threadpool.h"

namespace {

struct Counts {
    std::vector<std::atomic<int>> hits;
    std::atomic<int> bad_worker{0};
    int32_t n_threads;
    explicit Counts(size_t n, int32_t threads) : hits(n), n_threads(threads) {}
};

void count(void *ctx, int64_t index, int32_t worker) {
    auto *c = static_cast<Counts *>(ctx);
    c->hits[(size_t)index].fetch_add(1);
    if (worker < 0 || worker >= c->n_threads) c->bad_worker.fetch_add(1);
}

void run_and_check(cpu_threadpool *tp, int64_t n, int32_t threads) {
    Counts c((size_t)n, threads);
    cpu_threadpool_run(tp, n, count, &c);
    for (int64_t i = 0; i < n; i++) ASSERT_EQ(c.hits[(size_t)i].load(), 1) << "index " << i << " of " << n;
    ASSERT_EQ(c.bad_worker.load(), 0);
}

TEST(ThreadPool, EveryIndexOnceBackToBackAndAfterSleeping) {
    for (int32_t threads : {1, 2, 3, 8}) {
        cpu_threadpool *tp = cpu_threadpool_create(threads);
        ASSERT_NE(tp, nullptr);
        ASSERT_EQ(cpu_threadpool_size(tp), threads);
        for (int rep = 0; rep < 200; rep++) run_and_check(tp, 1 + rep % 37, threads); /* workers spinning */
        for (int rep = 0; rep < 5; rep++) {
            std::this_thread::sleep_for(std::chrono::milliseconds(2)); /* past the spin: workers asleep */
            run_and_check(tp, 64, threads);
        }
        cpu_threadpool_destroy(tp); /* while workers may still spin */
    }
}

TEST(ThreadPool, NoSpinningAndBadSettings) {
    /* GOKV_CPU_SPIN_US=0: waiters sleep at once; a value that is not a number falls back to the default */
    for (const char *v : {"0", "1", "not-a-number", "-5"}) {
        setenv("GOKV_CPU_SPIN_US", v, 1);
        cpu_threadpool *tp = cpu_threadpool_create(3);
        unsetenv("GOKV_CPU_SPIN_US");
        ASSERT_NE(tp, nullptr) << v;
        for (int rep = 0; rep < 50; rep++) run_and_check(tp, 1 + rep % 9, 3);
        cpu_threadpool_destroy(tp);
    }
}

/* More threads than cores, workers that sleep at once: most wake after their loop is over (the caller does
 * not wait for them) and must take nothing of the loops after it. Each loop's context is freed as soon as
 * the loop returns, so a late worker running an index with a stale context is a use after free (ASan). */
TEST(ThreadPool, LateWorkersTakeNothingOfLaterLoops) {
    setenv("GOKV_CPU_SPIN_US", "0", 1);
    cpu_threadpool *tp = cpu_threadpool_create(16);
    unsetenv("GOKV_CPU_SPIN_US");
    ASSERT_NE(tp, nullptr);
    for (int rep = 0; rep < 3000; rep++) {
        const int64_t n = 2 + rep % 5;
        auto c = std::make_unique<Counts>((size_t)n, 16);
        cpu_threadpool_run(tp, n, count, c.get());
        for (int64_t i = 0; i < n; i++) ASSERT_EQ(c->hits[(size_t)i].load(), 1) << "loop " << rep << " index " << i;
        ASSERT_EQ(c->bad_worker.load(), 0);
    }
    cpu_threadpool_destroy(tp);
}

TEST(ThreadPool, DestroyWhileWorkersSleep) {
    cpu_threadpool *tp = cpu_threadpool_create(4);
    ASSERT_NE(tp, nullptr);
    run_and_check(tp, 10, 4);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    cpu_threadpool_destroy(tp);
}

} // namespace
