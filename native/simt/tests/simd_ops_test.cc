// Every simdgroup operation's result at every simd width and run order, for full and partial simdgroups.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "simt.h"

namespace {

struct Float4 {
  float x, y, z, w;
};
Float4 operator+(const Float4 &a, const Float4 &b) { return {a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w}; }

const char *order_name(simt::RunOrder o) {
  switch (o) {
    case simt::RunOrder::forward: return "forward";
    case simt::RunOrder::reverse: return "reverse";
    case simt::RunOrder::shuffled: return "shuffled";
  }
  return "?";
}

class SimdOps : public ::testing::TestWithParam<std::tuple<uint32_t, simt::RunOrder>> {
 protected:
  simt::Dispatch dispatch(uint32_t threads) const {
    simt::Dispatch d;
    d.grid = {2, 1, 1};
    d.threads = {threads, 1, 1};
    d.simd_width = std::get<0>(GetParam());
    d.order = std::get<1>(GetParam());
    d.seed = 42;
    return d;
  }
  uint32_t width() const { return std::get<0>(GetParam()); }
};

// Lane values: distinct, small integers so that float sums are exact.
int value_of(uint32_t tid) { return static_cast<int>((tid * 7 + 3) % 23) - 11; }

TEST_P(SimdOps, ReductionsMatchPlainLoops) {
  for (uint32_t threads : {3 * width(), 3 * width() - (width() > 1 ? width() / 2 : 0)}) {
    const uint32_t n = 2 * threads;
    std::vector<float> sum(n), mn(n), mx(n);
    std::vector<int> isum(n), imin(n);
    std::vector<float> half_sum(n);
    std::vector<Float4> vsum(n);
    simt::Status st = simt::launch(dispatch(threads), [&] {
      const simt::ThreadInfo &ti = simt::thread_info();
      uint32_t tid = ti.thread_index_in_threadgroup;
      uint32_t g = ti.thread_position_in_grid.x;
      int v = value_of(tid);
      sum[g] = simt::simd_sum(float(v));
      mn[g] = simt::simd_min(float(v));
      mx[g] = simt::simd_max(float(v));
      isum[g] = simt::simd_sum(v);
      imin[g] = simt::simd_min(v);
      half_sum[g] = float(simt::simd_sum(static_cast<_Float16>(v)));
      vsum[g] = simt::simd_sum(Float4{float(v), 1.0f, -float(v), 0.5f});
    });
    ASSERT_TRUE(st.ok) << st.message;
    for (uint32_t g = 0; g < n; g++) {
      uint32_t tid = g % threads;
      uint32_t first = tid / width() * width(), last = std::min(threads, first + width());
      int s = 0, lo = 1 << 30, hi = -(1 << 30);
      for (uint32_t i = first; i < last; i++) {
        s += value_of(i);
        lo = std::min(lo, value_of(i));
        hi = std::max(hi, value_of(i));
      }
      ASSERT_EQ(sum[g], float(s)) << "thread " << g;
      ASSERT_EQ(mn[g], float(lo));
      ASSERT_EQ(mx[g], float(hi));
      ASSERT_EQ(isum[g], s);
      ASSERT_EQ(imin[g], lo);
      ASSERT_EQ(half_sum[g], float(s));
      ASSERT_EQ(vsum[g].x, float(s));
      ASSERT_EQ(vsum[g].y, float(last - first));
      ASSERT_EQ(vsum[g].z, -float(s));
      ASSERT_EQ(vsum[g].w, 0.5f * float(last - first));
    }
  }
}

TEST_P(SimdOps, PrefixSums) {
  const uint32_t threads = 2 * width() + (width() > 1 ? width() / 2 : 1);
  std::vector<int> inc(threads), exc(threads);
  std::vector<float> finc(threads);
  simt::Dispatch d = dispatch(threads);
  d.grid = {1, 1, 1};
  simt::Status st = simt::launch(d, [&] {
    uint32_t tid = simt::thread_info().thread_index_in_threadgroup;
    inc[tid] = simt::simd_prefix_inclusive_sum(value_of(tid));
    exc[tid] = simt::simd_prefix_exclusive_sum(value_of(tid));
    finc[tid] = simt::simd_prefix_inclusive_sum(float(value_of(tid)));
  });
  ASSERT_TRUE(st.ok) << st.message;
  for (uint32_t tid = 0; tid < threads; tid++) {
    int s = 0;
    for (uint32_t i = tid / width() * width(); i < tid; i++) s += value_of(i);
    EXPECT_EQ(exc[tid], s) << "thread " << tid;
    EXPECT_EQ(inc[tid], s + value_of(tid)) << "thread " << tid;
    EXPECT_EQ(finc[tid], float(s + value_of(tid))) << "thread " << tid;
  }
}

TEST_P(SimdOps, ShufflesAndBroadcast) {
  const uint32_t w = width();
  const uint32_t threads = 4 * w;
  std::vector<uint32_t> sh(threads), x(threads), up(threads), down(threads), bc(threads);
  simt::Dispatch d = dispatch(threads);
  d.grid = {1, 1, 1};
  simt::Status st = simt::launch(d, [&] {
    const simt::ThreadInfo &ti = simt::thread_info();
    uint32_t tid = ti.thread_index_in_threadgroup;
    uint32_t lane = ti.thread_index_in_simdgroup;
    uint32_t v = tid * 10;
    sh[tid] = simt::simd_shuffle(v, (lane * 3 + 1) % w);
    x[tid] = simt::simd_shuffle_xor(v, (w / 2) | 1u);
    up[tid] = simt::simd_shuffle_up(v, 1);
    down[tid] = simt::simd_shuffle_down(v, 2);
    bc[tid] = simt::simd_broadcast(v, w - 1);
  });
  ASSERT_TRUE(st.ok) << st.message;
  uint32_t mask = (w / 2) | 1u;
  for (uint32_t tid = 0; tid < threads; tid++) {
    uint32_t base = tid / w * w, lane = tid % w;
    EXPECT_EQ(sh[tid], (base + (lane * 3 + 1) % w) * 10) << "thread " << tid;
    EXPECT_EQ(x[tid], (base + (lane ^ mask)) * 10) << "thread " << tid;
    EXPECT_EQ(up[tid], (lane >= 1 ? tid - 1 : tid) * 10) << "thread " << tid;
    EXPECT_EQ(down[tid], (lane + 2 < w ? tid + 2 : tid) * 10) << "thread " << tid;
    EXPECT_EQ(bc[tid], (base + w - 1) * 10) << "thread " << tid;
  }
}

TEST_P(SimdOps, BallotAnyAll) {
  const uint32_t w = width();
  const uint32_t threads = 2 * w;
  std::vector<uint64_t> ballot(threads);
  std::vector<int> any(threads), all(threads), none(threads), every(threads);
  simt::Dispatch d = dispatch(threads);
  d.grid = {1, 1, 1};
  simt::Status st = simt::launch(d, [&] {
    uint32_t tid = simt::thread_info().thread_index_in_threadgroup;
    uint32_t lane = simt::thread_info().thread_index_in_simdgroup;
    bool p = lane % 3 == 0;
    ballot[tid] = simt::simd_ballot(p);
    any[tid] = simt::simd_any(p && tid >= w);  // only the second simdgroup has a true lane
    all[tid] = simt::simd_all(p);
    none[tid] = simt::simd_any(false);
    every[tid] = simt::simd_all(true);
  });
  ASSERT_TRUE(st.ok) << st.message;
  uint64_t expect = 0;
  for (uint32_t l = 0; l < w; l++)
    if (l % 3 == 0) expect |= uint64_t{1} << l;
  for (uint32_t tid = 0; tid < threads; tid++) {
    EXPECT_EQ(ballot[tid], expect);
    EXPECT_EQ(any[tid], tid >= w ? 1 : 0);
    EXPECT_EQ(all[tid], w == 1 ? 1 : 0);
    EXPECT_EQ(none[tid], 0);
    EXPECT_EQ(every[tid], 1);
  }
}

// A tree reduction with shuffle_xor inside a loop: the same site is reached many times.
TEST_P(SimdOps, ButterflyReductionInALoop) {
  const uint32_t w = width();
  const uint32_t threads = 4 * w;
  std::vector<float> out(threads);
  simt::Dispatch d = dispatch(threads);
  d.grid = {1, 1, 1};
  simt::Status st = simt::launch(d, [&] {
    uint32_t tid = simt::thread_info().thread_index_in_threadgroup;
    float v = float(value_of(tid));
    for (uint32_t m = w / 2; m > 0; m /= 2) v += simt::simd_shuffle_xor(v, m);
    out[tid] = v;
  });
  ASSERT_TRUE(st.ok) << st.message;
  for (uint32_t tid = 0; tid < threads; tid++) {
    int s = 0;
    for (uint32_t i = tid / w * w; i < tid / w * w + w; i++) s += value_of(i);
    EXPECT_EQ(out[tid], float(s)) << "thread " << tid;
  }
}

INSTANTIATE_TEST_SUITE_P(
    WidthsAndOrders, SimdOps,
    ::testing::Combine(::testing::Values(4u, 8u, 16u, 32u, 64u),
                       ::testing::Values(simt::RunOrder::forward, simt::RunOrder::reverse, simt::RunOrder::shuffled)),
    [](const ::testing::TestParamInfo<SimdOps::ParamType> &info) {
      return "w" + std::to_string(std::get<0>(info.param)) + "_" + order_name(std::get<1>(info.param));
    });

}  // namespace
