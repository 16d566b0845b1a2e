// Ranges, ids and nd_ranges; what nd_item, group and sub_group report in 1, 2 and 3 dimensions; the
// emulated device's information; the math and bit functions.
#include <cmath>
#include <vector>

#include "sycl_emu_test.h"

namespace {

using sycl_emu_test::Settings;

TEST(Range, Arithmetic) {
    sycl::range<3> r(2, 3, 4);
    EXPECT_EQ(r.size(), 24u);
    EXPECT_EQ(r[2], 4u);
    EXPECT_EQ(r.get(1), 3u);
    EXPECT_EQ(r * 2, sycl::range<3>(4, 6, 8));
    EXPECT_EQ(r + sycl::range<3>(1, 1, 1), sycl::range<3>(3, 4, 5));
    EXPECT_EQ(sycl::range<3>(8, 9, 10) / r, sycl::range<3>(4, 3, 2));
    EXPECT_EQ(sycl::range<3>(8, 9, 10) % r, sycl::range<3>(0, 0, 2));
    r *= 3;
    EXPECT_EQ(r, sycl::range<3>(6, 9, 12));
    EXPECT_NE(r, sycl::range<3>(6, 9, 13));
    sycl::id<2> i(1, 2);
    i += sycl::id<2>(3, 4);
    EXPECT_EQ(i, sycl::id<2>(4, 6));
    EXPECT_EQ(sycl::id<2>(), sycl::id<2>(0, 0));
    sycl::id<1> one(7);
    size_t as_size = one;
    EXPECT_EQ(as_size, 7u);
    EXPECT_EQ(sycl::id<2>(sycl::range<2>(5, 6)), sycl::id<2>(5, 6));
}

TEST(NdRange, Ranges) {
    sycl::nd_range<2> r(sycl::range<2>(8, 96), sycl::range<2>(2, 32));
    EXPECT_EQ(r.get_group_range(), sycl::range<2>(4, 3));
    EXPECT_EQ(r.get_local_range(), sycl::range<2>(2, 32));
    EXPECT_EQ(r.get_global_range(), sycl::range<2>(8, 96));
    EXPECT_EQ(r.get_offset(), sycl::id<2>());
}

struct Ids {
    uint32_t global[3], local[3], group[3], group_range[3], local_range[3], global_range[3];
    uint32_t global_linear, local_linear, group_linear, sub_group, sub_group_lane, sub_groups, group_local_linear;
};

// Every work-item writes what it is told about itself at its global linear id; the host computes the same.
template <int D> void check_ids(sycl::range<D> global, sycl::range<D> local, uint32_t sub_group_size) {
    Settings settings(sub_group_size);
    sycl::queue q;
    const size_t n = global.size();
    Ids *out = sycl::malloc_shared<Ids>(n, q);
    q.parallel_for(sycl::nd_range<D>(global, local), [=](sycl::nd_item<D> it) {
         Ids r{};
         for (int d = 0; d < D; d++) {
             r.global[d] = uint32_t(it.get_global_id(d));
             r.local[d] = uint32_t(it.get_local_id(d));
             r.group[d] = uint32_t(it.get_group(d));
             r.group_range[d] = uint32_t(it.get_group_range(d));
             r.local_range[d] = uint32_t(it.get_local_range(d));
             r.global_range[d] = uint32_t(it.get_global_range()[d]);
         }
         r.global_linear = uint32_t(it.get_global_linear_id());
         r.local_linear = uint32_t(it.get_local_linear_id());
         r.group_linear = uint32_t(it.get_group_linear_id());
         r.sub_group = it.get_sub_group().get_group_linear_id();
         r.sub_group_lane = it.get_sub_group().get_local_linear_id();
         r.sub_groups = it.get_sub_group().get_group_linear_range();
         r.group_local_linear = uint32_t(it.get_group().get_local_linear_id());
         if (it.get_global_id() != sycl::id<D>(it.get_group().get_group_id() * sycl::id<D>(it.get_local_range()) + it.get_local_id()))
             r.global_linear = ~0u;
         out[it.get_global_linear_id()] = r;
     }).wait();
    const sycl::range<D> groups = global / local;
    const size_t local_size = local.size();
    for (size_t i = 0; i < n; i++) {
        size_t rest = i, gl = 0, ll = 0;
        size_t coord[3] = {};
        for (int d = D - 1; d >= 0; d--) coord[d] = rest % global[d], rest /= global[d];
        for (int d = 0; d < D; d++) {
            gl = gl * groups[d] + coord[d] / local[d];
            ll = ll * local[d] + coord[d] % local[d];
            EXPECT_EQ(out[i].global[d], coord[d]) << i;
            EXPECT_EQ(out[i].local[d], coord[d] % local[d]) << i;
            EXPECT_EQ(out[i].group[d], coord[d] / local[d]) << i;
            EXPECT_EQ(out[i].group_range[d], groups[d]) << i;
            EXPECT_EQ(out[i].local_range[d], local[d]) << i;
            EXPECT_EQ(out[i].global_range[d], global[d]) << i;
        }
        EXPECT_EQ(out[i].global_linear, i);
        EXPECT_EQ(out[i].local_linear, ll) << i;
        EXPECT_EQ(out[i].group_local_linear, ll) << i;
        EXPECT_EQ(out[i].group_linear, gl) << i;
        EXPECT_EQ(out[i].sub_group, ll / sub_group_size) << i;
        EXPECT_EQ(out[i].sub_group_lane, ll % sub_group_size) << i;
        EXPECT_EQ(out[i].sub_groups, (local_size + sub_group_size - 1) / sub_group_size) << i;
    }
    sycl::free(out, q);
}

TEST(NdItem, OneDimension) { check_ids<1>(sycl::range<1>(96), sycl::range<1>(24), 16); }
TEST(NdItem, TwoDimensions) { check_ids<2>(sycl::range<2>(6, 20), sycl::range<2>(3, 10), 8); }
TEST(NdItem, ThreeDimensions) { check_ids<3>(sycl::range<3>(4, 6, 64), sycl::range<3>(1, 2, 32), 32); }
TEST(NdItem, ThePlansLayout) { check_ids<3>(sycl::range<3>(2, 3, 5 * 48), sycl::range<3>(1, 1, 48), 16); }

TEST(BasicParallelFor, ItemsAndIds) {
    Settings settings(16);
    sycl::queue q;
    const size_t n = 100;
    uint32_t *a = sycl::malloc_shared<uint32_t>(n, q), *b = sycl::malloc_shared<uint32_t>(n, q);
    q.parallel_for(sycl::range<1>(n), [=](sycl::item<1> it) { a[it.get_linear_id()] = uint32_t(it.get_id(0) * 2); });
    q.parallel_for(sycl::range<1>(n), [=](sycl::id<1> i) { b[i] = uint32_t(i[0] + 1); });
    uint32_t *c = sycl::malloc_shared<uint32_t>(1, q);
    q.single_task([=] { c[0] = 42; }).wait();
    for (size_t i = 0; i < n; i++) {
        EXPECT_EQ(a[i], 2 * i);
        EXPECT_EQ(b[i], i + 1);
    }
    EXPECT_EQ(c[0], 42u);
    for (void *p : {static_cast<void *>(a), static_cast<void *>(b), static_cast<void *>(c)}) sycl::free(p, q);
}

TEST(Device, EmulatedGpu) {
    sycl::queue q{sycl::gpu_selector_v, sycl::property_list{sycl::property::queue::in_order{}}};
    EXPECT_TRUE(q.is_in_order());
    const sycl::device d = q.get_device();
    EXPECT_TRUE(d.is_gpu());
    EXPECT_EQ(d.get_info<sycl::info::device::sub_group_sizes>(), (std::vector<size_t>{8, 16, 32}));
    EXPECT_EQ(d.get_info<sycl::info::device::max_work_group_size>(), 1024u);
    EXPECT_EQ(d.get_info<sycl::info::device::local_mem_size>(), 65536u);
    EXPECT_GT(d.get_info<sycl::info::device::global_mem_size>(), 0u);
    EXPECT_GT(d.get_info<sycl::info::device::max_mem_alloc_size>(), 0u);
    EXPECT_FALSE(d.get_info<sycl::info::device::name>().empty());
    EXPECT_FALSE(d.get_info<sycl::info::device::vendor>().empty());
    EXPECT_FALSE(d.get_info<sycl::info::device::driver_version>().empty());
    EXPECT_FALSE(d.has(sycl::aspect::fp64));
    EXPECT_TRUE(d.has(sycl::aspect::usm_device_allocations));
    EXPECT_EQ(sycl::device::get_devices().size(), 1u);
    EXPECT_FALSE(sycl::queue().is_in_order());
    std::string message = sycl_emu_test::exception_message([] { sycl::queue cpu{sycl::cpu_selector_v}; },
                                                           sycl::errc::runtime);
    EXPECT_HAS(message, "no device");
}

TEST(Math, FunctionsAndBits) {
    EXPECT_EQ(sycl::exp(0.0f), 1.0f);
    EXPECT_EQ(sycl::exp2(3.0f), 8.0f);
    EXPECT_EQ(sycl::log(1.0f), 0.0f);
    EXPECT_EQ(sycl::sqrt(16.0f), 4.0f);
    EXPECT_EQ(sycl::rsqrt(4.0f), 0.5f);
    EXPECT_EQ(sycl::fabs(-2.5f), 2.5f);
    EXPECT_EQ(sycl::fmin(1.0f, NAN), 1.0f);
    EXPECT_EQ(sycl::fmax(NAN, 2.0f), 2.0f);
    EXPECT_EQ(sycl::fma(2.0f, 3.0f, 1.0f), 7.0f);
    EXPECT_EQ(sycl::floor(-1.5f), -2.0f);
    EXPECT_EQ(sycl::ceil(-1.5f), -1.0f);
    EXPECT_EQ(sycl::rint(2.5f), 2.0f);
    EXPECT_EQ(sycl::round(2.5f), 3.0f);
    EXPECT_EQ(sycl::trunc(-2.7f), -2.0f);
    EXPECT_TRUE(sycl::isinf(INFINITY));
    EXPECT_TRUE(sycl::isnan(sycl::half(NAN)));
    EXPECT_FALSE(sycl::isfinite(-INFINITY));
    EXPECT_EQ(sycl::min(3u, 5u), 3u);
    EXPECT_EQ(sycl::max(-3, -5), -3);
    EXPECT_EQ(sycl::clamp(7, 0, 5), 5);
    EXPECT_EQ(sycl::clamp(-1.0f, 0.0f, 1.0f), 0.0f);
    EXPECT_EQ(sycl::popcount(0xF0F0u), 8u);
    EXPECT_EQ(sycl::clz(uint32_t(1)), 31u);
    EXPECT_EQ(sycl::clz(uint32_t(0)), 32u);
    EXPECT_EQ(sycl::clz(uint16_t(1)), 15u);
    EXPECT_EQ(sycl::ctz(uint32_t(8)), 3u);
    EXPECT_EQ(sycl::ctz(uint64_t(0)), 64u);
    EXPECT_EQ(sycl::bit_cast<uint32_t>(1.0f), 0x3F800000u);
    EXPECT_EQ(sycl::bit_cast<float>(0x40000000u), 2.0f);
    const sycl::half h = sycl::half(1.5f);
    EXPECT_EQ(float(h), 1.5f);
    EXPECT_EQ(float(sycl::exp(sycl::half(0.0f))), 1.0f);
    EXPECT_EQ(sizeof(sycl::half), 2u);
}

}  // namespace

namespace {
static_assert(sycl::known_identity_v<sycl::plus<>, float> == 0.0f);
static_assert(sycl::known_identity_v<sycl::maximum<>, int> == INT32_MIN);
static_assert(sycl::known_identity_v<sycl::minimum<uint32_t>, uint32_t> == UINT32_MAX);
static_assert(sycl::known_identity_v<sycl::bit_and<>, uint16_t> == 0xFFFF);
static_assert(sycl::known_identity_v<sycl::minimum<>, sycl::half> > sycl::half(65504.0f));
static_assert(!sycl::has_known_identity_v<sycl::bit_or<>, float>);
}  // namespace
