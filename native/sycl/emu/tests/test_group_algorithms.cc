// Every group algorithm, over sub_group and group<D>, at sub-group sizes 8, 16 and 32 and work-group sizes
// that leave a partial last sub-group, against the same computation done plainly on the host.
#include <algorithm>
#include <cstring>
#include <vector>

#include "sycl_emu_test.h"

namespace {

using sycl_emu_test::Settings;

enum Result : int {
    kSgSum, kSgMax, kSgMin, kSgOr, kSgInclusive, kSgExclusive, kSgExclusiveMax, kSgInclusiveInit, kSgExclusiveInit,
    kSgReduceInit, kSgBroadcast, kSgAny, kSgAll, kSgNone, kSgLeft, kSgRight, kSgSelect, kSgXor, kSgFloatSum,
    kSgHalfMax, kSgShape, kWgSum, kWgMax, kWgMin, kWgInclusive, kWgExclusive, kWgExclusiveInit, kWgBroadcast,
    kWgAny, kWgAll, kWgNone, kWgAnd, kResults
};
const char *const kNames[kResults] = {
    "sg sum", "sg max", "sg min", "sg or", "sg inclusive", "sg exclusive", "sg exclusive max", "sg inclusive init",
    "sg exclusive init", "sg reduce init", "sg broadcast", "sg any", "sg all", "sg none", "sg left", "sg right",
    "sg select", "sg xor", "sg float sum", "sg half max", "sg shape", "wg sum", "wg max", "wg min", "wg inclusive",
    "wg exclusive", "wg exclusive init", "wg broadcast", "wg any", "wg all", "wg none", "wg and"};
constexpr uint32_t kPoison = 0xFFFFFFFFu;

uint32_t input(size_t i) { return uint32_t((i * 7 + 3) % 13); }

// The host's version of every result for work-item `lid` of a work-group `wg` of the sub-group size `sg`.
std::vector<uint32_t> expected(const std::vector<uint32_t> &x, uint32_t sg, uint32_t wg, size_t group, uint32_t lid) {
    std::vector<uint32_t> r(kResults);
    const size_t g0 = group * wg;
    const uint32_t base = lid / sg * sg, lanes = std::min(sg, wg - base), lane = lid - base;
    auto v = [&](uint32_t l) { return x[g0 + base + l]; };
    uint32_t sum = 0, mx = 0, mn = ~0u, any = 0, all = 1, none = 1, inc = 0, exc = 0, exc_max = 0;
    uint32_t bits = 0;
    float fsum = 0;
    for (uint32_t l = 0; l < lanes; l++) {
        sum += v(l), mx = std::max(mx, v(l)), mn = std::min(mn, v(l)), bits |= v(l);
        any |= v(l) == 5, all &= v(l) < 13, none &= !(v(l) == 12);
        fsum += float(v(l)) * 0.5f;
        if (l < lane) exc += v(l), exc_max = std::max(exc_max, v(l));
        if (l <= lane) inc += v(l);
    }
    r[kSgSum] = sum, r[kSgMax] = mx, r[kSgMin] = mn, r[kSgOr] = bits, r[kSgInclusive] = inc, r[kSgExclusive] = exc;
    r[kSgExclusiveMax] = exc_max, r[kSgInclusiveInit] = 100 + inc, r[kSgExclusiveInit] = 100 + exc;
    r[kSgReduceInit] = 1000 + sum, r[kSgBroadcast] = v(lanes - 1);
    r[kSgAny] = any, r[kSgAll] = all, r[kSgNone] = none;
    r[kSgLeft] = lane + 1 < lanes ? v(lane + 1) : kPoison;
    r[kSgRight] = lane >= 2 ? v(lane - 2) : kPoison;
    r[kSgSelect] = (lane + 3) % sg < lanes ? v((lane + 3) % sg) : kPoison;
    r[kSgXor] = (lane ^ 1u) < lanes ? v(lane ^ 1u) : kPoison;
    r[kSgFloatSum] = uint32_t(fsum * 2);
    r[kSgHalfMax] = mx;
    r[kSgShape] = lane | lanes << 8 | sg << 16 | (lid / sg) << 24;
    uint32_t wsum = 0, wmax = 0, wmin = ~0u, winc = 0, wexc = 0, wany = 0, wall = 1, wnone = 1, wand = ~0u;
    for (uint32_t l = 0; l < wg; l++) {
        uint32_t u = x[g0 + l];
        wsum += u, wmax = std::max(wmax, u), wmin = std::min(wmin, u), wand &= u | 0x10u;
        wany |= u == 5, wall &= u < 13, wnone &= !(u == 12);
        if (l < lid) wexc += u;
        if (l <= lid) winc += u;
    }
    r[kWgSum] = wsum, r[kWgMax] = wmax, r[kWgMin] = wmin, r[kWgInclusive] = winc, r[kWgExclusive] = wexc;
    r[kWgExclusiveInit] = 7 + wexc, r[kWgBroadcast] = x[g0 + wg / 2];
    r[kWgAny] = wany, r[kWgAll] = wall, r[kWgNone] = wnone, r[kWgAnd] = wand;
    return r;
}

struct Shape {
    uint32_t sub_group;
    uint32_t work_group;
};
void PrintTo(const Shape &s, std::ostream *os) { *os << "sub-group " << s.sub_group << ", work-group " << s.work_group; }

class GroupAlgorithms : public ::testing::TestWithParam<Shape> {};

TEST_P(GroupAlgorithms, MatchThePlainComputation) {
    const Shape shape = GetParam();
    Settings settings(shape.sub_group);
    const uint32_t wg = shape.work_group, groups = 3, n = wg * groups;
    sycl::queue q{sycl::property::queue::in_order{}};
    uint32_t *in = sycl::malloc_shared<uint32_t>(n, q);
    uint32_t *out = sycl::malloc_shared<uint32_t>(size_t(n) * kResults, q);
    std::vector<uint32_t> x(n);
    for (uint32_t i = 0; i < n; i++) x[i] = in[i] = input(i);

    q.submit([&](sycl::handler &h) {
        h.parallel_for(sycl::nd_range<1>(n, wg), [=](sycl::nd_item<1> it) {
            const sycl::sub_group sg = it.get_sub_group();
            const sycl::group<1> g = it.get_group();
            const size_t i = it.get_global_id(0);
            const uint32_t v = in[i];
            auto put = [&](int result, uint32_t value) { out[size_t(result) * n + i] = value; };
            put(kSgSum, sycl::reduce_over_group(sg, v, sycl::plus<>()));
            put(kSgMax, sycl::reduce_over_group(sg, v, sycl::maximum<uint32_t>()));
            put(kSgMin, sycl::reduce_over_group(sg, v, sycl::minimum<>()));
            put(kSgOr, sycl::reduce_over_group(sg, v, sycl::bit_or<uint32_t>()));
            put(kSgInclusive, sycl::inclusive_scan_over_group(sg, v, sycl::plus<>()));
            put(kSgExclusive, sycl::exclusive_scan_over_group(sg, v, sycl::plus<uint32_t>()));
            put(kSgExclusiveMax, sycl::exclusive_scan_over_group(sg, v, sycl::maximum<uint32_t>()));
            put(kSgInclusiveInit, sycl::inclusive_scan_over_group(sg, v, sycl::plus<>(), 100u));
            put(kSgExclusiveInit, sycl::exclusive_scan_over_group(sg, v, 100u, sycl::plus<>()));
            put(kSgReduceInit, sycl::reduce_over_group(sg, v, 1000u, sycl::plus<>()));
            put(kSgBroadcast, sycl::group_broadcast(sg, v, sg.get_local_linear_range() - 1));
            put(kSgAny, sycl::any_of_group(sg, v == 5));
            put(kSgAll, sycl::all_of_group(sg, v, [](uint32_t u) { return u < 13; }));
            put(kSgNone, sycl::none_of_group(sg, v == 12));
            put(kSgLeft, sycl::shift_group_left(sg, v));
            put(kSgRight, sycl::shift_group_right(sg, v, 2));
            put(kSgSelect, sycl::select_from_group(sg, v, (sg.get_local_linear_id() + 3) % sg.get_max_local_range()[0]));
            put(kSgXor, sycl::permute_group_by_xor(sg, v, 1));
            put(kSgFloatSum, uint32_t(sycl::reduce_over_group(sg, float(v) * 0.5f, sycl::plus<float>()) * 2));
            put(kSgHalfMax, uint32_t(float(sycl::reduce_over_group(sg, sycl::half(float(v)), sycl::maximum<>()))));
            put(kSgShape, uint32_t(sg.get_local_id()[0]) | uint32_t(sg.get_local_range()[0]) << 8 |
                              uint32_t(sg.get_max_local_range()[0]) << 16 | uint32_t(sg.get_group_id()[0]) << 24);
            put(kWgSum, sycl::reduce_over_group(g, v, sycl::plus<>()));
            put(kWgMax, sycl::reduce_over_group(g, v, sycl::maximum<>()));
            put(kWgMin, sycl::reduce_over_group(g, v, sycl::minimum<uint32_t>()));
            put(kWgInclusive, sycl::inclusive_scan_over_group(g, v, sycl::plus<>()));
            put(kWgExclusive, sycl::exclusive_scan_over_group(g, v, sycl::plus<uint32_t>()));
            put(kWgExclusiveInit, sycl::exclusive_scan_over_group(g, v, 7u, sycl::plus<>()));
            put(kWgBroadcast, sycl::group_broadcast(g, v, g.get_local_linear_range() / 2));
            put(kWgAny, sycl::any_of_group(g, v == 5));
            put(kWgAll, sycl::all_of_group(g, v < 13));
            put(kWgNone, sycl::none_of_group(g, v, [](uint32_t u) { return u == 12; }));
            put(kWgAnd, sycl::reduce_over_group(g, v | 0x10u, sycl::bit_and<>()));
        });
    });
    q.wait_and_throw();

    EXPECT_EQ(size_t((wg + shape.sub_group - 1) / shape.sub_group), size_t(out[size_t(kSgShape) * n + n - 1] >> 24) + 1);
    for (uint32_t group = 0; group < groups; group++) {
        for (uint32_t lid = 0; lid < wg; lid++) {
            const std::vector<uint32_t> want = expected(x, shape.sub_group, wg, group, lid);
            for (int r = 0; r < kResults; r++) {
                EXPECT_EQ(out[size_t(r) * n + group * wg + lid], want[r])
                    << kNames[r] << ", work-group " << group << ", work-item " << lid;
            }
        }
    }
    sycl::free(in, q);
    sycl::free(out, q);
}

INSTANTIATE_TEST_SUITE_P(SubGroupSizes, GroupAlgorithms,
                         ::testing::Values(Shape{8, 64}, Shape{8, 7}, Shape{8, 44}, Shape{16, 64}, Shape{16, 40},
                                           Shape{16, 5}, Shape{32, 128}, Shape{32, 100}, Shape{32, 33},
                                           Shape{32, 256}),
                         [](const ::testing::TestParamInfo<Shape> &info) {
                             return "sg" + std::to_string(info.param.sub_group) + "_wg" +
                                    std::to_string(info.param.work_group);
                         });

// Multi-dimensional work-groups: the work-group algorithms see the linear order (last dimension fastest),
// and group_broadcast takes an id<D>.
class GroupAlgorithms3D : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GroupAlgorithms3D, LinearOrderAndIdBroadcast) {
    Settings settings(GetParam());
    const sycl::range<3> local(2, 3, 5), global(2, 6, 10);
    const size_t n = global.size();
    sycl::queue q;
    uint32_t *out = sycl::malloc_shared<uint32_t>(3 * n, q);
    q.parallel_for(sycl::nd_range<3>(global, local), [=](sycl::nd_item<3> it) {
         const sycl::group<3> g = it.get_group();
         const uint32_t lid = uint32_t(it.get_local_linear_id());
         const size_t i = it.get_global_linear_id();
         out[i] = sycl::inclusive_scan_over_group(g, lid, sycl::plus<>());
         out[n + i] = sycl::group_broadcast(g, lid * 10, sycl::id<3>(1, 2, 3));
         out[2 * n + i] = sycl::reduce_over_group(g, uint32_t(g.get_group_linear_id()), sycl::maximum<>());
     }).wait();
    for (size_t i = 0; i < n; i++) {
        const size_t d0 = i / 60, d1 = i / 10 % 6, d2 = i % 10;
        const uint32_t lid = uint32_t((d0 % 2) * 15 + (d1 % 3) * 5 + d2 % 5);
        const uint32_t group = uint32_t((d0 / 2) * 4 + (d1 / 3) * 2 + d2 / 5);
        EXPECT_EQ(out[i], lid * (lid + 1) / 2) << i;
        EXPECT_EQ(out[n + i], (1 * 15 + 2 * 5 + 3) * 10u) << i;
        EXPECT_EQ(out[2 * n + i], group) << i;
    }
    sycl::free(out, q);
}

INSTANTIATE_TEST_SUITE_P(SubGroupSizes, GroupAlgorithms3D, ::testing::Values(8u, 16u, 32u),
                         [](const ::testing::TestParamInfo<uint32_t> &info) { return "sg" + std::to_string(info.param); });

// A sub-group barrier synchronizes only its sub-group; a work-group barrier, every work-item.
TEST(GroupBarrier, SubGroupAndWorkGroup) {
    Settings settings(8);
    sycl::queue q;
    const size_t n = 64;
    uint32_t *out = sycl::malloc_shared<uint32_t>(n, q);
    q.submit([&](sycl::handler &h) {
        sycl::local_accessor<uint32_t, 1> tg(sycl::range<1>(n), h);
        h.parallel_for(sycl::nd_range<1>(n, n), [=](sycl::nd_item<1> it) {
            const size_t l = it.get_local_id(0);
            const sycl::sub_group sg = it.get_sub_group();
            tg[l] = uint32_t(l);
            sycl::group_barrier(sg);
            const size_t partner = sg.get_group_linear_id() * 8 + (sg.get_local_linear_id() + 1) % 8;
            uint32_t within = tg[partner];
            sycl::group_barrier(it.get_group(), sycl::memory_scope::work_group);
            tg[l] = within;
            it.barrier(sycl::access::fence_space::local_space);
            out[l] = tg[(l + 8) % n];
        });
    });
    q.wait();
    for (size_t l = 0; l < n; l++) EXPECT_EQ(out[l], uint32_t((l + 8) % n / 8 * 8 + ((l + 8) % n + 1) % 8)) << l;
    sycl::free(out, q);
}

}  // namespace
