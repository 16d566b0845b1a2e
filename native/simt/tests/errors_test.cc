// The rules the emulator enforces, each broken once: launch() reports it with the group, threads and sites.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "simt.h"

namespace {

simt::Dispatch one_group(uint32_t threads, uint32_t simd_width = 8) {
  simt::Dispatch d;
  d.grid = {2, 1, 1};
  d.threads = {threads, 1, 1};
  d.simd_width = simd_width;
  return d;
}

#define EXPECT_HAS(message, part) EXPECT_NE((message).find(part), std::string::npos) << (message)

TEST(Errors, DivergentBarrier) {
  int line_a = 0, line_b = 0;
  simt::Status st = simt::launch(one_group(16), [&] {
    if (simt::thread_info().thread_index_in_threadgroup < 4) {
      line_a = __LINE__ + 1;
      simt::barrier();
    } else {
      line_b = __LINE__ + 1;
      simt::barrier();
    }
  });
  ASSERT_FALSE(st.ok);
  EXPECT_HAS(st.message, "threadgroup (0,0,0)");
  EXPECT_HAS(st.message, "divergent barrier");
  EXPECT_HAS(st.message, "threads 0-3 wait at barrier");
  EXPECT_HAS(st.message, "threads 4-15 wait at barrier");
  EXPECT_HAS(st.message, "errors_test.cc:" + std::to_string(line_a));
  EXPECT_HAS(st.message, "errors_test.cc:" + std::to_string(line_b));
}

// Sites told apart by id alone (generated code with no source position).
TEST(Errors, DivergentBarrierBySiteId) {
  simt::Status st = simt::launch(one_group(8), [&] {
    uintptr_t id = simt::thread_info().thread_index_in_threadgroup < 4 ? 1 : 2;
    simt::barrier(simt::Site{"kernel", 7, 0, id});
  });
  ASSERT_FALSE(st.ok);
  EXPECT_HAS(st.message, "threads 0-3 wait at barrier kernel:7#1");
  EXPECT_HAS(st.message, "threads 4-7 wait at barrier kernel:7#2");
}

TEST(Errors, ThreadExitsWhileOthersWaitAtBarrier) {
  simt::Status st = simt::launch(one_group(16), [&] {
    if (simt::thread_info().thread_index_in_threadgroup == 5) return;
    simt::barrier();
  });
  ASSERT_FALSE(st.ok);
  EXPECT_HAS(st.message, "exited while others wait at a barrier");
  EXPECT_HAS(st.message, "thread 5 exited");
  EXPECT_HAS(st.message, "threads 0-4,6-15 wait at barrier");
}

TEST(Errors, DivergentSimdgroupOperation) {
  simt::Status st = simt::launch(one_group(16), [&] {
    uint32_t lane = simt::thread_info().thread_index_in_simdgroup;
    uint32_t sg = simt::thread_info().simdgroup_index_in_threadgroup;
    if (sg == 1 && lane == 2) {
      (void)simt::simd_max(1.0f);
    } else {
      (void)simt::simd_sum(1.0f);
    }
  });
  ASSERT_FALSE(st.ok);
  EXPECT_HAS(st.message, "divergent simdgroup operation in simdgroup 1");
  EXPECT_HAS(st.message, "thread 10 wait at simd_max");
  EXPECT_HAS(st.message, "wait at simd_sum");
  EXPECT_HAS(st.message, "errors_test.cc:");
}

TEST(Errors, LaneExitsBeforeSimdgroupOperation) {
  simt::Status st = simt::launch(one_group(8), [&] {
    if (simt::thread_info().thread_index_in_simdgroup == 7) return;
    (void)simt::simd_sum(1);
  });
  ASSERT_FALSE(st.ok);
  EXPECT_HAS(st.message, "divergent simdgroup operation in simdgroup 0");
  EXPECT_HAS(st.message, "thread 7 exited");
}

TEST(Errors, SimdgroupOperationAgainstBarrier) {
  simt::Status st = simt::launch(one_group(8), [&] {
    if (simt::thread_info().thread_index_in_simdgroup == 0) {
      simt::barrier();
    } else {
      (void)simt::simd_sum(1);
    }
  });
  ASSERT_FALSE(st.ok);
  EXPECT_HAS(st.message, "thread 0 wait at barrier");
  EXPECT_HAS(st.message, "threads 1-7 wait at simd_sum");
}

TEST(Errors, NonUniformBroadcastLane) {
  simt::Status st = simt::launch(one_group(8), [&] {
    uint32_t lane = simt::thread_info().thread_index_in_simdgroup;
    (void)simt::simd_broadcast(1.0f, lane);
  });
  ASSERT_FALSE(st.ok);
  EXPECT_HAS(st.message, "simd_broadcast");
  EXPECT_HAS(st.message, "uniform");
}

TEST(Errors, ShuffleLaneOutOfRange) {
  simt::Status st = simt::launch(one_group(8), [&] { (void)simt::simd_shuffle(1, 8); });
  ASSERT_FALSE(st.ok);
  EXPECT_HAS(st.message, "out of range");
}

TEST(Errors, ExceptionInKernel) {
  simt::Status st = simt::launch(one_group(8), [&] {
    if (simt::thread_info().thread_index_in_threadgroup == 3) throw std::runtime_error("bad index");
    simt::barrier();
  });
  ASSERT_FALSE(st.ok);
  EXPECT_HAS(st.message, "thread 3 threw: bad index");
}

TEST(Errors, InvalidDispatch) {
  simt::Dispatch d = one_group(8, 12);
  simt::Status st = simt::launch(d, [] {});
  ASSERT_FALSE(st.ok);
  EXPECT_HAS(st.message, "simd_width");
  d = one_group(8);
  d.grid.y = 0;
  EXPECT_FALSE(simt::launch(d, [] {}).ok);
}

// A failed launch abandons its fibers; the next launch reuses their stacks and runs normally.
TEST(Errors, LaunchAfterFailureWorks) {
  simt::Status bad = simt::launch(one_group(64), [&] {
    if (simt::thread_info().thread_index_in_threadgroup == 0) return;
    simt::barrier();
  });
  ASSERT_FALSE(bad.ok);
  int count = 0;
  simt::Status good = simt::launch(one_group(64), [&] {
    simt::barrier();
    count++;
  });
  EXPECT_TRUE(good.ok) << good.message;
  EXPECT_EQ(count, 128);
}

}  // namespace
