/*
 * test_prefetch.cc: the kernels' spread prefetch (kernels.h, cpu_prefetch_visit). A kernel asks for slice
 * `part` of `parts` as it goes; together the slices must ask for every line of the hint's regions exactly
 * once, in order, and for nothing else, whatever the regions' alignment, sizes and the slice count.
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
    std::vector<uint8_t> mem(1 << 16);
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
        for (int32_t parts : {1, 2, 3, 8, 16, 33, 1000}) {
            std::vector<uintptr_t> got;
            for (int32_t part = 0; part < parts; part++) {
                const size_t before = got.size();
                cpu_prefetch_visit(&pf, part, parts, record, &got);
                /* slices are even: no slice holds more than its share rounded up */
                ASSERT_LE(got.size() - before, want.size() / parts + 1) << "trial " << trial << " part " << part;
            }
            ASSERT_EQ(got, want) << "trial " << trial << " parts " << parts;
        }
    }
}

TEST(Prefetch, NullHintAsksForNothing) {
    std::vector<uintptr_t> got;
    cpu_prefetch_visit(nullptr, 0, 4, record, &got);
    EXPECT_TRUE(got.empty());
    cpu_prefetch pf{};
    cpu_prefetch_visit(&pf, 1, 4, record, &got);
    EXPECT_TRUE(got.empty());
    cpu_prefetch_slice(nullptr, 0, 1); /* and the real one does not fault */
    cpu_prefetch_slice(&pf, 0, 1);
}

} // namespace
