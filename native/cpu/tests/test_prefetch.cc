/*
 * test_prefetch.cc: the kernels' spread prefetch (kernels.h, cpu_prefetch_walk). A kernel starts a walk cut
 * into `parts` slices and takes one slice per piece as it goes; together the slices must ask for every line
 * of the hint's regions exactly once, in order, and for nothing else, whatever the regions' alignment,
 * sizes and the slice count, and no slice may hold more than its share.
 */
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/kernels.h"

namespace {

void record(const void *line, void *arg) { static_cast<std::vector<uintptr_t> *>(arg)->push_back(reinterpret_cast<uintptr_t>(line)); }

/* The 64-byte lines that [p, p + n) touches, in order. */
std::vector<uintptr_t> lines_of(const uint8_t *p, size_t n) {
    std::vector<uintptr_t> out;
    if (n == 0) return out;
    for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; a < reinterpret_cast<uintptr_t>(p) + n; a += 64)
        out.push_back(a);
    return out;
}

TEST(Prefetch, SlicesCoverEveryLineOnce) {
    /* CPU_PREFETCH_REGIONS (12) regions 20000 bytes apart, up to 9000 + 63 bytes each */
    std::vector<uint8_t> mem(1 << 18);
    std::mt19937 rng(7);
    for (int trial = 0; trial < 300; trial++) {
        cpu_prefetch pf{};
        std::vector<uintptr_t> want;
        for (int i = 0; i < CPU_PREFETCH_REGIONS; i++) {
            const size_t n = trial % 7 == i || trial % 5 == i ? 0 : rng() % 9000; /* some regions empty */
            const size_t off = (rng() % 3 == 0 ? 0 : rng() % 64) + (size_t)i * 20000; /* aligned or not */
            pf.p[i] = mem.data() + off;
            pf.n[i] = n;
            const std::vector<uintptr_t> l = lines_of(pf.p[i], n);
            want.insert(want.end(), l.begin(), l.end());
        }
        for (int32_t parts : {1, 2, 3, 8, 16, 33, 64, 1000}) { /* the line loop as cpu_prefetch_step walks it */
            std::vector<uintptr_t> got;
            cpu_prefetch_walk w;
            cpu_prefetch_start(&w, &pf, parts);
            const size_t share = (want.size() + parts - 1) / parts;
            for (int32_t part = 0; part < parts; part++) {
                const size_t before = got.size();
                cpu_prefetch_take(&w, record, &got);
                ASSERT_LE(got.size() - before, share) << "trial " << trial << " part " << part;
            }
            ASSERT_EQ(got, want) << "trial " << trial << " parts " << parts;
            cpu_prefetch_take(&w, record, &got); /* a step past the last slice asks for nothing */
            ASSERT_EQ(got.size(), want.size()) << "trial " << trial << " parts " << parts;
        }
    }
}

TEST(Prefetch, NullHintAsksForNothing) {
    std::vector<uintptr_t> got;
    cpu_prefetch_walk w;
    cpu_prefetch_start(&w, nullptr, 4);
    cpu_prefetch_take(&w, record, &got);
    EXPECT_TRUE(got.empty());
    cpu_prefetch pf{};
    cpu_prefetch_start(&w, &pf, 4);
    cpu_prefetch_take(&w, record, &got);
    EXPECT_TRUE(got.empty());
    cpu_prefetch_start(&w, nullptr, 1); /* and the real one does not fault */
    cpu_prefetch_step(&w);
}

} // namespace
