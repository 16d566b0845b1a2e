// Barriers, run orders, thread positions and threadgroup memory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "simt.h"

namespace {

simt::Dispatch group_of(uint32_t threads, simt::RunOrder order, size_t memory_bytes = 0) {
  simt::Dispatch d;
  d.threads = {threads, 1, 1};
  d.simd_width = 32;
  d.order = order;
  d.seed = 7;
  d.threadgroup_memory_bytes = memory_bytes;
  return d;
}

const simt::RunOrder kOrders[] = {simt::RunOrder::forward, simt::RunOrder::reverse, simt::RunOrder::shuffled};

TEST(Barrier, PositionsCoverTheGrid3D) {
  simt::Dispatch d;
  d.grid = {3, 2, 2};
  d.threads = {4, 3, 2};
  d.simd_width = 8;
  for (simt::RunOrder order : kOrders) {
    d.order = order;
    std::vector<int> seen(3 * 2 * 2 * 4 * 3 * 2, 0);
    bool consistent = true;
    simt::Status st = simt::launch(d, [&] {
      const simt::ThreadInfo &t = simt::thread_info();
      const simt::uint3 &p = t.thread_position_in_grid;
      uint32_t index = p.x + 12 * (p.y + 6 * p.z);
      seen[index]++;
      const simt::uint3 &l = t.thread_position_in_threadgroup;
      uint32_t linear = l.x + 4 * (l.y + 3 * l.z);
      consistent = consistent && linear == t.thread_index_in_threadgroup &&
                   p.x == t.threadgroup_position_in_grid.x * 4 + l.x &&
                   p.z == t.threadgroup_position_in_grid.z * 2 + l.z &&
                   t.simdgroup_index_in_threadgroup == linear / 8 && t.thread_index_in_simdgroup == linear % 8 &&
                   t.simdgroups_per_threadgroup == 3 && t.threads_per_threadgroup.y == 3 &&
                   t.threadgroups_per_grid.x == 3;
      simt::barrier();
    });
    ASSERT_TRUE(st.ok) << st.message;
    EXPECT_TRUE(consistent);
    for (int s : seen) EXPECT_EQ(s, 1);
  }
}

// A threadgroup tree reduction with a barrier per level: the same result in every order.
TEST(Barrier, TreeReductionIsOrderIndependent) {
  const uint32_t n = 256;
  for (simt::RunOrder order : kOrders) {
    float result = 0;
    simt::Status st = simt::launch(group_of(n, order, n * sizeof(float)), [&] {
      const simt::ThreadInfo &t = simt::thread_info();
      float *shared = static_cast<float *>(t.threadgroup_memory);
      uint32_t tid = t.thread_index_in_threadgroup;
      shared[tid] = float(tid);
      simt::barrier();
      for (uint32_t stride = n / 2; stride > 0; stride /= 2) {
        if (tid < stride) shared[tid] += shared[tid + stride];
        simt::barrier();
      }
      if (tid == 0) result = shared[0];
    });
    ASSERT_TRUE(st.ok) << st.message;
    EXPECT_EQ(result, float(n * (n - 1) / 2));
  }
}

// Each thread reads its neighbour's slot after writing its own; without the barrier the result depends on
// the run order, and the emulator makes that visible.
std::vector<float> neighbour_exchange(simt::RunOrder order, bool with_barrier) {
  const uint32_t n = 64;
  std::vector<float> out(n);
  simt::Status st = simt::launch(group_of(n, order, n * sizeof(float)), [&] {
    const simt::ThreadInfo &t = simt::thread_info();
    float *shared = static_cast<float *>(t.threadgroup_memory);
    uint32_t tid = t.thread_index_in_threadgroup;
    shared[tid] = float(tid) * 2.0f;
    if (with_barrier) simt::barrier();
    out[tid] = shared[(tid + 1) % n];
  });
  EXPECT_TRUE(st.ok) << st.message;
  return out;
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Barrier, MissingBarrierChangesTheResultAcrossOrders) {
  std::vector<float> good[3], bad[3];
  for (int i = 0; i < 3; i++) {
    good[i] = neighbour_exchange(kOrders[i], true);
    bad[i] = neighbour_exchange(kOrders[i], false);
  }
  EXPECT_TRUE(same_bits(good[0], good[1]));
  EXPECT_TRUE(same_bits(good[0], good[2]));
  EXPECT_FALSE(same_bits(bad[0], bad[1]));
  EXPECT_FALSE(same_bits(bad[0], bad[2]));
  // Forward order: every thread but the last reads a slot not yet written: poison.
  EXPECT_TRUE(std::isnan(bad[0][0]));
  EXPECT_EQ(bad[1][0], 2.0f);
}

TEST(Barrier, ThreadgroupMemoryIsPoisonedBeforeEachGroup) {
  simt::Dispatch d = group_of(32, simt::RunOrder::forward, 32 * sizeof(float));
  d.grid = {3, 1, 1};
  std::vector<float> f(96);
  std::vector<uint32_t> bits(96);
  std::vector<_Float16> h(96);
  simt::Status st = simt::launch(d, [&] {
    const simt::ThreadInfo &t = simt::thread_info();
    float *shared = static_cast<float *>(t.threadgroup_memory);
    uint32_t tid = t.thread_index_in_threadgroup;
    uint32_t g = t.thread_position_in_grid.x;
    f[g] = shared[tid];  // read before any write
    std::memcpy(&bits[g], &shared[tid], 4);
    std::memcpy(&h[g], reinterpret_cast<const unsigned char *>(shared) + 2 * tid, 2);
    simt::barrier();
    shared[tid] = 1.0f;  // the next group must not see this
  });
  ASSERT_TRUE(st.ok) << st.message;
  for (uint32_t i = 0; i < 96; i++) {
    EXPECT_TRUE(std::isnan(f[i])) << i;
    EXPECT_EQ(bits[i], 0xFFFFFFFFu) << i;
    EXPECT_TRUE(std::isnan(float(h[i]))) << i;
  }
}

// 1024 threads, a thousand barriers each, and a simdgroup reduction per round: the fast context switch
// keeps this well under a second in a release build.
TEST(Barrier, ThousandsOfBarriersIn1024ThreadGroup) {
  const uint32_t n = 1024, rounds = 1000;
  for (simt::RunOrder order : {simt::RunOrder::forward, simt::RunOrder::shuffled}) {
    std::vector<float> out(n);
    simt::Status st = simt::launch(group_of(n, order, n * sizeof(float)), [&] {
      const simt::ThreadInfo &t = simt::thread_info();
      float *shared = static_cast<float *>(t.threadgroup_memory);
      uint32_t tid = t.thread_index_in_threadgroup;
      float acc = 0;
      shared[tid] = float(tid % 7);
      for (uint32_t r = 0; r < rounds; r++) {
        simt::barrier();
        acc += shared[(tid + r) % n];
        simt::barrier();
        if (r % 100 == 0) acc += simt::simd_sum(1.0f);
      }
      out[tid] = acc;
    });
    ASSERT_TRUE(st.ok) << st.message;
    for (uint32_t tid = 0; tid < n; tid++) {
      float expect = 0;
      for (uint32_t r = 0; r < rounds; r++) {
        expect += float((tid + r) % n % 7);
        if (r % 100 == 0) expect += 32.0f;
      }
      ASSERT_EQ(out[tid], expect) << tid;
    }
  }
}

TEST(Barrier, GroupOrderFollowsRunOrder) {
  for (simt::RunOrder order : kOrders) {
    simt::Dispatch d = group_of(1, order);
    d.grid = {8, 1, 1};
    std::vector<uint32_t> seen;
    simt::Status st = simt::launch(d, [&] { seen.push_back(simt::thread_info().threadgroup_position_in_grid.x); });
    ASSERT_TRUE(st.ok) << st.message;
    ASSERT_EQ(seen.size(), 8u);
    EXPECT_EQ(std::set<uint32_t>(seen.begin(), seen.end()).size(), 8u);
    if (order == simt::RunOrder::forward) {
      EXPECT_EQ(seen.front(), 0u);
    }
    if (order == simt::RunOrder::reverse) {
      EXPECT_EQ(seen.front(), 7u);
    }
  }
}

TEST(Barrier, OutsideAKernelActsAsOneThread) {
  simt::barrier();
  EXPECT_EQ(simt::simd_sum(3), 3);
  EXPECT_EQ(simt::thread_info().threads_per_threadgroup.x, 1u);
}

}  // namespace

namespace {

// Groups on several OS threads: each writes only its own output, so the result is the sequential one.
TEST(Barrier, GroupsOnSeveralOsThreads) {
  const uint32_t groups = 64, n = 128;
  std::vector<float> sequential, parallel;
  for (uint32_t os_threads : {1u, 4u}) {
    simt::Dispatch d = group_of(n, simt::RunOrder::shuffled, n * sizeof(float));
    d.grid = {groups / 4, 4, 1};
    d.os_threads = os_threads;
    std::vector<float> out(groups);
    simt::Status st = simt::launch(d, [&] {
      const simt::ThreadInfo &t = simt::thread_info();
      float *shared = static_cast<float *>(t.threadgroup_memory);
      uint32_t tid = t.thread_index_in_threadgroup;
      uint32_t group = t.threadgroup_position_in_grid.x + t.threadgroup_position_in_grid.y * (groups / 4);
      shared[tid] = float(tid * (group + 1));
      simt::barrier();
      for (uint32_t stride = n / 2; stride > 0; stride /= 2) {
        if (tid < stride) shared[tid] += shared[tid + stride];
        simt::barrier();
      }
      float lanes = simt::simd_sum(1.0f);
      if (tid == 0) out[group] = shared[0] + lanes;
    });
    ASSERT_TRUE(st.ok) << st.message;
    (os_threads == 1 ? sequential : parallel) = out;
  }
  EXPECT_EQ(sequential, parallel);
  EXPECT_EQ(sequential[3], float(4 * n * (n - 1) / 2 + 32));
}

TEST(Barrier, ErrorOnOneOfSeveralOsThreads) {
  simt::Dispatch d = group_of(32, simt::RunOrder::forward);
  d.grid = {16, 1, 1};
  d.os_threads = 3;
  simt::Status st = simt::launch(d, [&] {
    const simt::ThreadInfo &t = simt::thread_info();
    if (t.threadgroup_position_in_grid.x == 9 && t.thread_index_in_threadgroup == 31) return;
    simt::barrier();
  });
  ASSERT_FALSE(st.ok);
  EXPECT_NE(st.message.find("threadgroup (9,0,0): a thread exited"), std::string::npos) << st.message;
}

}  // namespace
