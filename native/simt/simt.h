// simt: a SIMT emulator for testing GPU kernels on the CPU (native/simt/README.md).
//
// A kernel is a C++ callable run once per GPU thread; every thread is a fiber, and the threads of one
// threadgroup (work-group) run on one OS thread, switching only where a kernel synchronizes: at a
// threadgroup barrier or a simdgroup (sub-group) operation. A barrier releases only when every thread of
// the group waits at the same call site, a simdgroup operation only when every lane of its simdgroup
// does; anything else is reported as an error by launch(), naming the group, the threads and the sites.
//
// The Metal and SYCL shims compile the kernels' sources unchanged against this header: their builtins
// (threadgroup_barrier, simd_sum, sub_group reductions, ...) forward here and pass on the call site they
// received as a defaulted Site argument, so errors name the kernel's file:line, not the shim's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

#if defined(__has_builtin)
#if __has_builtin(__builtin_COLUMN)
#define GOKV_SIMT_COLUMN() __builtin_COLUMN()
#endif
#endif
#if !defined(GOKV_SIMT_COLUMN)
#define GOKV_SIMT_COLUMN() 0u  // GCC before 13: sites differ by file and line only
#endif

namespace simt {

struct uint3 {
  uint32_t x = 1, y = 1, z = 1;
};

// The order in which the scheduler runs the runnable threads of a group (re-drawn after every release
// for shuffled) and the groups of a grid. A kernel whose result depends on it is missing a barrier.
enum class RunOrder : int32_t { forward = 0, reverse = 1, shuffled = 2 };

struct Dispatch {
  uint3 grid;                           // threadgroups per grid
  uint3 threads;                        // threads per threadgroup
  uint32_t simd_width = 32;             // lanes per simdgroup: a power of two, 1..64
  size_t threadgroup_memory_bytes = 0;  // poisoned with 0xFF (a NaN in every float type) before each group
  RunOrder order = RunOrder::forward;
  uint64_t seed = 0;                    // for RunOrder::shuffled
  size_t stack_bytes = 256 * 1024;      // per thread; a guard page lies below each stack
  // OS threads running groups at once (each group on one). 1: every group on the calling thread, in the
  // run order; more: groups are taken in the run order but finish in any, and a kernel must not write
  // host memory that another group writes.
  uint32_t os_threads = 1;
};

// A synchronization call site. The defaulted arguments of here() are evaluated at the caller, so a
// function taking `Site site = Site::here()` learns where it was called from. `id` lets a caller that
// has no source position (generated code) tell sites apart; two sites are the same when file, line,
// column and id all are.
struct Site {
  const char *file = "";
  uint32_t line = 0;
  uint32_t column = 0;
  uintptr_t id = 0;

  static constexpr Site here(const char *file = __builtin_FILE(), uint32_t line = __builtin_LINE(),
                             uint32_t column = GOKV_SIMT_COLUMN()) {
    return Site{file, line, column, 0};
  }
};

bool same_site(const Site &a, const Site &b);
std::string describe(const Site &site);  // "file:line[:column][#id]"

struct Status {
  bool ok = true;
  std::string message;  // names the threadgroup, the threads and the sites involved
  explicit operator bool() const { return ok; }
};

// Runs kernel once per thread of the grid and returns when every group has finished or one has failed
// (later groups are then not run). Never throws: an exception leaving a kernel is an error of that thread.
// A failed group's threads are abandoned where they wait, without unwinding their stacks.
Status launch(const Dispatch &dispatch, const std::function<void()> &kernel);

// What a thread can ask about itself; valid inside a kernel (outside one: a single thread, group and lane).
// Linear indices run x fastest, then y, then z; simdgroups are consecutive runs of linear indices.
struct ThreadInfo {
  uint3 thread_position_in_grid;
  uint3 thread_position_in_threadgroup;
  uint3 threadgroup_position_in_grid;
  uint3 threads_per_threadgroup;
  uint3 threadgroups_per_grid;
  uint32_t thread_index_in_threadgroup = 0;
  uint32_t simdgroup_index_in_threadgroup = 0;
  uint32_t simdgroups_per_threadgroup = 1;
  uint32_t thread_index_in_simdgroup = 0;  // the lane
  uint32_t threads_per_simdgroup = 1;      // the simd width (the last simdgroup may have fewer lanes)
  uint32_t lanes_in_simdgroup = 1;         // this simdgroup's lanes: simd width, or fewer in the last one
  void *threadgroup_memory = nullptr;
  size_t threadgroup_memory_bytes = 0;
};
const ThreadInfo &thread_info();

// threadgroup_barrier / work-group barrier. Memory is shared plainly (one OS thread), so every barrier
// is also a full memory fence.
void barrier(Site site = Site::here());

// ---- simdgroup operations ----------------------------------------------------------------------------
// Values: any trivially copyable type of at most 16 bytes (float, int, uint32_t, _Float16, small vectors);
// reductions need operator+ or operator<. Reductions and prefix sums add in lane order. A shuffle from a
// lane the simdgroup does not have (the last, partial simdgroup) returns the caller's own value; a lane
// index >= the simd width is an error, and so is a broadcast whose lane differs between lanes.

namespace detail {
constexpr size_t kSimdValueBytes = 16;

struct SimdLanes {
  const unsigned char *in;  // lane i's value at in + i * kSimdValueBytes
  unsigned char *out;       // lane i's result at out + i * kSimdValueBytes
  const uint32_t *arg;      // lane i's argument (lane, mask, delta)
  uint32_t count;           // lanes in this simdgroup
  uint32_t width;           // the simd width
};
// Computes every lane's result; returns nullptr, or what is wrong (a static string).
using SimdResolver = const char *(*)(const SimdLanes &lanes);

void simd_exchange(const char *op, const Site &site, const void *value, size_t size, uint32_t arg,
                   SimdResolver resolve, void *result);

template <class T> T lane_value(const SimdLanes &l, uint32_t lane) {
  T v;
  std::memcpy(static_cast<void *>(&v), l.in + lane * kSimdValueBytes, sizeof(T));
  return v;
}
template <class T> void set_lane(const SimdLanes &l, uint32_t lane, const T &v) {
  std::memcpy(l.out + lane * kSimdValueBytes, static_cast<const void *>(&v), sizeof(T));
}

// Every lane gets the fold of all lanes' values in lane order (sum: the order fixes the rounding).
template <class T, class F> const char *resolve_fold(const SimdLanes &l, F f) {
  T acc = lane_value<T>(l, 0);
  for (uint32_t i = 1; i < l.count; i++) acc = f(acc, lane_value<T>(l, i));
  for (uint32_t i = 0; i < l.count; i++) set_lane(l, i, acc);
  return nullptr;
}
template <class T> const char *resolve_sum(const SimdLanes &l) {
  return resolve_fold<T>(l, [](const T &a, const T &b) { return a + b; });
}
template <class T> const char *resolve_min(const SimdLanes &l) {
  return resolve_fold<T>(l, [](const T &a, const T &b) { return b < a ? b : a; });
}
template <class T> const char *resolve_max(const SimdLanes &l) {
  return resolve_fold<T>(l, [](const T &a, const T &b) { return a < b ? b : a; });
}
template <class T> const char *resolve_inclusive_sum(const SimdLanes &l) {
  T acc = lane_value<T>(l, 0);
  set_lane(l, 0, acc);
  for (uint32_t i = 1; i < l.count; i++) {
    acc = acc + lane_value<T>(l, i);
    set_lane(l, i, acc);
  }
  return nullptr;
}
template <class T> const char *resolve_exclusive_sum(const SimdLanes &l) {
  // Lane 0 gets T{} (zero), as Metal's simd_prefix_exclusive_sum and SYCL's exclusive_scan with plus.
  T acc{};
  for (uint32_t i = 0; i < l.count; i++) {
    T v = lane_value<T>(l, i);
    set_lane(l, i, acc);
    acc = acc + v;
  }
  return nullptr;
}
// source(lane, arg, width) -> the lane read from, or >= count for "keep my own value".
template <class T, uint32_t (*source)(uint32_t, uint32_t, uint32_t), bool uniform>
const char *resolve_permute(const SimdLanes &l) {
  for (uint32_t i = 0; i < l.count; i++) {
    if (uniform && l.arg[i] != l.arg[0]) return "the lane argument differs between lanes (it must be uniform)";
  }
  for (uint32_t i = 0; i < l.count; i++) {
    uint32_t from = source(i, l.arg[i], l.width);
    if (from == UINT32_MAX) return "lane index out of range of the simd width";
    set_lane(l, i, lane_value<T>(l, from < l.count ? from : i));
  }
  return nullptr;
}
uint32_t source_index(uint32_t lane, uint32_t arg, uint32_t width);
uint32_t source_xor(uint32_t lane, uint32_t arg, uint32_t width);
uint32_t source_up(uint32_t lane, uint32_t arg, uint32_t width);
uint32_t source_down(uint32_t lane, uint32_t arg, uint32_t width);
const char *resolve_ballot(const SimdLanes &l);  // in: uint64_t 0/1; out: uint64_t mask
const char *resolve_any(const SimdLanes &l);     // in: uint32_t 0/1; out: uint32_t
const char *resolve_all(const SimdLanes &l);

template <class T> T simd_call(const char *op, const T &value, uint32_t arg, SimdResolver resolve, const Site &site) {
  static_assert(std::is_trivially_copyable<T>::value, "simdgroup values must be trivially copyable");
  static_assert(sizeof(T) <= kSimdValueBytes, "simdgroup values are at most 16 bytes");
  alignas(16) unsigned char result[kSimdValueBytes];
  simd_exchange(op, site, &value, sizeof(T), arg, resolve, result);
  T r;
  std::memcpy(static_cast<void *>(&r), result, sizeof(T));
  return r;
}
}  // namespace detail

template <class T> T simd_sum(T v, Site site = Site::here()) {
  return detail::simd_call("simd_sum", v, 0, detail::resolve_sum<T>, site);
}
template <class T> T simd_min(T v, Site site = Site::here()) {
  return detail::simd_call("simd_min", v, 0, detail::resolve_min<T>, site);
}
template <class T> T simd_max(T v, Site site = Site::here()) {
  return detail::simd_call("simd_max", v, 0, detail::resolve_max<T>, site);
}
template <class T> T simd_prefix_inclusive_sum(T v, Site site = Site::here()) {
  return detail::simd_call("simd_prefix_inclusive_sum", v, 0, detail::resolve_inclusive_sum<T>, site);
}
template <class T> T simd_prefix_exclusive_sum(T v, Site site = Site::here()) {
  return detail::simd_call("simd_prefix_exclusive_sum", v, 0, detail::resolve_exclusive_sum<T>, site);
}
template <class T> T simd_shuffle(T v, uint32_t lane, Site site = Site::here()) {
  return detail::simd_call("simd_shuffle", v, lane,
                           detail::resolve_permute<T, detail::source_index, false>, site);
}
template <class T> T simd_shuffle_xor(T v, uint32_t mask, Site site = Site::here()) {
  return detail::simd_call("simd_shuffle_xor", v, mask, detail::resolve_permute<T, detail::source_xor, false>,
                           site);
}
template <class T> T simd_shuffle_up(T v, uint32_t delta, Site site = Site::here()) {
  return detail::simd_call("simd_shuffle_up", v, delta, detail::resolve_permute<T, detail::source_up, false>,
                           site);
}
template <class T> T simd_shuffle_down(T v, uint32_t delta, Site site = Site::here()) {
  return detail::simd_call("simd_shuffle_down", v, delta,
                           detail::resolve_permute<T, detail::source_down, false>, site);
}
template <class T> T simd_broadcast(T v, uint32_t lane, Site site = Site::here()) {
  return detail::simd_call("simd_broadcast", v, lane, detail::resolve_permute<T, detail::source_index, true>,
                           site);
}
uint64_t simd_ballot(bool predicate, Site site = Site::here());  // bit i: lane i's predicate
bool simd_any(bool predicate, Site site = Site::here());
bool simd_all(bool predicate, Site site = Site::here());

}  // namespace simt
