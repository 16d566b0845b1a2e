// launch(), the barrier and the simdgroup exchange (simt.h): a group's threads are fibers that the
// scheduler, on the calling OS thread, runs in the dispatch's order until each blocks or exits; when none
// can run, it releases what may be released (a simdgroup whose lanes all wait at one operation, then a
// group whose threads all wait at one barrier) or reports why nothing can.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "fiber.h"
#include "simt.h"

#if defined(__SANITIZE_ADDRESS__)
#define GOKV_SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GOKV_SIMT_ASAN 1
#endif
#endif
#if defined(GOKV_SIMT_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace simt {

bool same_site(const Site &a, const Site &b) {
  if (a.line != b.line || a.column != b.column || a.id != b.id) return false;
  if (a.file == b.file) return true;
  return a.file != nullptr && b.file != nullptr && std::strcmp(a.file, b.file) == 0;
}

std::string describe(const Site &site) {
  std::string s = site.file != nullptr && site.file[0] != '\0' ? site.file : "<unknown>";
  s += ":" + std::to_string(site.line);
  if (site.column != 0) s += ":" + std::to_string(site.column);
  if (site.id != 0) s += "#" + std::to_string(site.id);
  return s;
}

namespace detail {

uint32_t source_index(uint32_t, uint32_t arg, uint32_t width) { return arg < width ? arg : UINT32_MAX; }
uint32_t source_xor(uint32_t lane, uint32_t arg, uint32_t width) {
  return (lane ^ arg) < width ? (lane ^ arg) : UINT32_MAX;
}
uint32_t source_up(uint32_t lane, uint32_t arg, uint32_t) { return arg <= lane ? lane - arg : lane; }
uint32_t source_down(uint32_t lane, uint32_t arg, uint32_t width) {
  return uint64_t{lane} + arg < width ? lane + arg : lane;
}

const char *resolve_ballot(const SimdLanes &l) {
  uint64_t mask = 0;
  for (uint32_t i = 0; i < l.count; i++) {
    if (lane_value<uint64_t>(l, i) != 0) mask |= uint64_t{1} << i;
  }
  for (uint32_t i = 0; i < l.count; i++) set_lane(l, i, mask);
  return nullptr;
}
const char *resolve_any(const SimdLanes &l) {
  uint32_t any = 0;
  for (uint32_t i = 0; i < l.count; i++) any |= lane_value<uint32_t>(l, i) != 0 ? 1u : 0u;
  for (uint32_t i = 0; i < l.count; i++) set_lane(l, i, any);
  return nullptr;
}
const char *resolve_all(const SimdLanes &l) {
  uint32_t all = 1;
  for (uint32_t i = 0; i < l.count; i++) all &= lane_value<uint32_t>(l, i) != 0 ? 1u : 0u;
  for (uint32_t i = 0; i < l.count; i++) set_lane(l, i, all);
  return nullptr;
}

namespace {

enum class State : uint8_t { runnable, barrier, simd, exited };

struct Thread {
  FiberContext context;
  void *stack_lo = nullptr;
  size_t stack_size = 0;
  void *fake_stack = nullptr;  // ASan's fake stack while switched away
  State state = State::runnable;
  Site site;
  const char *op = nullptr;
  // A pending simdgroup operation.
  alignas(16) unsigned char value[kSimdValueBytes];
  size_t value_size = 0;
  uint32_t arg = 0;
  SimdResolver resolve = nullptr;
  void *result = nullptr;
  ThreadInfo info;
};

struct Group {
  const std::function<void()> *kernel = nullptr;
  std::vector<Thread> threads;
  FiberContext scheduler;
  const void *scheduler_stack = nullptr;  // the scheduler's stack, learnt at a fiber's first entry (ASan)
  size_t scheduler_stack_size = 0;
  void *scheduler_fake_stack = nullptr;
  std::string thread_error;  // an exception that left a kernel
  uint32_t simd_width = 32;
};

thread_local Group *current_group = nullptr;
thread_local Thread *current_thread = nullptr;
thread_local StackPool stack_pool;

// Scheduler -> fiber.
void resume(Group &g, Thread &t) {
  current_thread = &t;
#if defined(GOKV_SIMT_ASAN)
  __sanitizer_start_switch_fiber(&g.scheduler_fake_stack, t.stack_lo, t.stack_size);
#endif
  switch_fiber(&g.scheduler, &t.context);
#if defined(GOKV_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(g.scheduler_fake_stack, nullptr, nullptr);
#endif
  current_thread = nullptr;
}

// Fiber -> scheduler; returns when the scheduler resumes this thread (never if it exited).
void yield_to_scheduler(Group &g, Thread &t) {
#if defined(GOKV_SIMT_ASAN)
  __sanitizer_start_switch_fiber(t.state == State::exited ? nullptr : &t.fake_stack, g.scheduler_stack,
                                 g.scheduler_stack_size);
#endif
  switch_fiber(&t.context, &g.scheduler);
#if defined(GOKV_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(t.fake_stack, nullptr, nullptr);
#endif
}

void fiber_main(void *arg) {
  Thread &t = *static_cast<Thread *>(arg);
  Group &g = *current_group;
#if defined(GOKV_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &g.scheduler_stack, &g.scheduler_stack_size);
#endif
  try {
    (*g.kernel)();
  } catch (const std::exception &e) {
    if (g.thread_error.empty())
      g.thread_error = "thread " + std::to_string(t.info.thread_index_in_threadgroup) + " threw: " + e.what();
  } catch (...) {
    if (g.thread_error.empty())
      g.thread_error = "thread " + std::to_string(t.info.thread_index_in_threadgroup) + " threw an exception";
  }
  t.state = State::exited;
  yield_to_scheduler(g, t);
  __builtin_trap();  // an exited fiber is never resumed
}

uint64_t splitmix64(uint64_t &state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void order_indices(std::vector<uint32_t> &order, RunOrder run_order, uint64_t &rng) {
  for (uint32_t i = 0; i < order.size(); i++) order[i] = i;
  if (run_order == RunOrder::reverse) {
    std::reverse(order.begin(), order.end());
  } else if (run_order == RunOrder::shuffled) {
    for (size_t i = order.size(); i > 1; i--) std::swap(order[i - 1], order[splitmix64(rng) % i]);
  }
}

const char *state_verb(State s) {
  switch (s) {
    case State::runnable: return "running";
    case State::barrier: return "wait at";
    case State::simd: return "wait at";
    case State::exited: return "exited";
  }
  return "?";
}

// "threads 0-3,8 wait at barrier k.cc:12:5; threads 4-7 exited" for threads [first, last).
std::string describe_threads(const Group &g, uint32_t first, uint32_t last) {
  std::vector<bool> done(last - first, false);
  std::string out;
  for (uint32_t i = first; i < last; i++) {
    if (done[i - first]) continue;
    const Thread &a = g.threads[i];
    std::string ranges;
    uint32_t n = 0;
    for (uint32_t j = i; j < last; j++) {
      const Thread &b = g.threads[j];
      bool same = !done[j - first] && b.state == a.state &&
                  (a.state == State::exited || a.state == State::runnable ||
                   (same_site(a.site, b.site) && a.op == b.op));
      if (!same) continue;
      uint32_t k = j;
      while (k + 1 < last && !done[k + 1 - first]) {
        const Thread &c = g.threads[k + 1];
        bool next_same = c.state == a.state && (a.state == State::exited || a.state == State::runnable ||
                                                (same_site(a.site, c.site) && a.op == c.op));
        if (!next_same) break;
        k++;
      }
      for (uint32_t m = j; m <= k; m++) done[m - first] = true;
      if (!ranges.empty()) ranges += ",";
      ranges += std::to_string(j);
      if (k > j) ranges += "-" + std::to_string(k);
      n += k - j + 1;
      j = k;
    }
    if (!out.empty()) out += "; ";
    out += (n == 1 ? "thread " : "threads ") + ranges + " " + state_verb(a.state);
    if (a.state == State::barrier || a.state == State::simd) out += std::string(" ") + a.op + " " + describe(a.site);
  }
  return out;
}

std::string group_name(const ThreadInfo &info) {
  const uint3 &p = info.threadgroup_position_in_grid;
  return "threadgroup (" + std::to_string(p.x) + "," + std::to_string(p.y) + "," + std::to_string(p.z) + ")";
}

// Releases every simdgroup whose lanes all wait at one operation. Returns false with `error` set when a
// simdgroup's operation fails. `released` counts the simdgroups released.
bool release_simdgroups(Group &g, uint32_t &released, std::string &error) {
  uint32_t n = static_cast<uint32_t>(g.threads.size());
  uint32_t w = g.simd_width;
  alignas(16) unsigned char in[64 * kSimdValueBytes];
  alignas(16) unsigned char out[64 * kSimdValueBytes];
  uint32_t args[64];
  for (uint32_t first = 0; first < n; first += w) {
    uint32_t last = std::min(n, first + w);
    const Thread &lead = g.threads[first];
    if (lead.state != State::simd) continue;
    bool ready = true;
    for (uint32_t i = first; i < last && ready; i++) {
      const Thread &t = g.threads[i];
      ready = t.state == State::simd && same_site(t.site, lead.site) && t.resolve == lead.resolve &&
              t.value_size == lead.value_size;
    }
    if (!ready) continue;
    std::memset(in, 0, sizeof in);
    for (uint32_t i = first; i < last; i++) {
      std::memcpy(in + (i - first) * kSimdValueBytes, g.threads[i].value, kSimdValueBytes);
      args[i - first] = g.threads[i].arg;
    }
    SimdLanes lanes{in, out, args, last - first, w};
    if (const char *why = lead.resolve(lanes)) {
      error = std::string(lead.op) + " at " + describe(lead.site) + " in simdgroup " + std::to_string(first / w) +
              " (threads " + std::to_string(first) + "-" + std::to_string(last - 1) + "): " + why;
      return false;
    }
    for (uint32_t i = first; i < last; i++) {
      Thread &t = g.threads[i];
      std::memcpy(t.result, out + (i - first) * kSimdValueBytes, t.value_size);
      t.state = State::runnable;
    }
    released++;
  }
  return true;
}

// Nothing can run and no simdgroup could be released: release the barrier or say why not.
bool release_barrier(Group &g, std::string &error) {
  uint32_t n = static_cast<uint32_t>(g.threads.size());
  const Thread *lead = nullptr;
  bool exited = false, divergent = false, simd_waiting = false;
  for (const Thread &t : g.threads) {
    if (t.state == State::exited) exited = true;
    if (t.state == State::simd) simd_waiting = true;
    if (t.state != State::barrier) continue;
    if (lead == nullptr) lead = &t;
    else if (!same_site(t.site, lead->site)) divergent = true;
  }
  if (lead != nullptr && !exited && !divergent && !simd_waiting) {
    for (Thread &t : g.threads) t.state = State::runnable;
    return true;
  }
  if (simd_waiting) {
    // Name the first simdgroup that cannot complete its operation.
    uint32_t w = g.simd_width;
    for (uint32_t first = 0; first < n; first += w) {
      uint32_t last = std::min(n, first + w);
      bool waits = false;
      for (uint32_t i = first; i < last; i++) waits = waits || g.threads[i].state == State::simd;
      if (!waits) continue;
      error = "divergent simdgroup operation in simdgroup " + std::to_string(first / w) +
              " (every lane must reach the same operation): " + describe_threads(g, first, last);
      return false;
    }
  }
  if (divergent) {
    error = "divergent barrier (every thread must wait at the same barrier): " + describe_threads(g, 0, n);
  } else if (exited) {
    error = "a thread exited while others wait at a barrier: " + describe_threads(g, 0, n);
  } else {
    error = "deadlock: " + describe_threads(g, 0, n);
  }
  return false;
}

const char *validate(const Dispatch &d) {
  const uint3 *dims[2] = {&d.grid, &d.threads};
  for (const uint3 *u : dims) {
    if (u->x == 0 || u->y == 0 || u->z == 0) return "grid and threadgroup sizes must be at least 1 in every dimension";
  }
  uint64_t threads = uint64_t{d.threads.x} * d.threads.y * d.threads.z;
  if (threads > 65536) return "at most 65536 threads per threadgroup";
  if (uint64_t{d.grid.x} * d.grid.y * d.grid.z > UINT32_MAX) return "at most 2^32-1 threadgroups per grid";
  if (d.simd_width == 0 || d.simd_width > 64 || (d.simd_width & (d.simd_width - 1)) != 0)
    return "simd_width must be a power of two from 1 to 64";
  if (d.order != RunOrder::forward && d.order != RunOrder::reverse && d.order != RunOrder::shuffled)
    return "unknown run order";
  if (d.stack_bytes < 16 * 1024) return "stack_bytes must be at least 16 KiB";
  if (d.os_threads > 256) return "at most 256 OS threads";
  return nullptr;
}

struct AlignedFree {
  void operator()(unsigned char *p) const { ::operator delete[](p, std::align_val_t(64)); }
};

// One worker: runs the groups group_order[next++] on the calling OS thread until none are left or a group
// of any worker has failed. Returns the failed group's message, or "".
std::string run_worker(const Dispatch &d, const std::function<void()> &kernel, const std::vector<uint32_t> &group_order,
                       std::atomic<size_t> &next, std::atomic<bool> &failed) {
  uint32_t n = d.threads.x * d.threads.y * d.threads.z;
  if (!stack_pool.reserve(n, d.stack_bytes)) return "cannot map " + std::to_string(n) + " fiber stacks";
  std::unique_ptr<unsigned char[], AlignedFree> memory;
  if (d.threadgroup_memory_bytes > 0)
    memory.reset(new (std::align_val_t(64)) unsigned char[d.threadgroup_memory_bytes]);

  Group g;
  g.kernel = &kernel;
  g.simd_width = d.simd_width;
  g.threads.resize(n);
  uint32_t simdgroups = (n + d.simd_width - 1) / d.simd_width;
  std::vector<uint32_t> order(n);

  struct CurrentGroup {
    explicit CurrentGroup(Group *g) { current_group = g; }
    ~CurrentGroup() { current_group = nullptr; }
  } scope(&g);
  for (size_t k; !failed.load(std::memory_order_relaxed) && (k = next.fetch_add(1)) < group_order.size();) {
    uint32_t gi = group_order[k];
    // Each group's thread orders depend on the seed and the group only, not on which worker runs it.
    uint64_t rng = d.seed ^ (uint64_t{gi} * 0xD1B54A32D192ED03ull);
    uint3 gp{gi % d.grid.x, (gi / d.grid.x) % d.grid.y, gi / (d.grid.x * d.grid.y)};
    if (memory) std::memset(memory.get(), 0xFF, d.threadgroup_memory_bytes);
    for (uint32_t i = 0; i < n; i++) {
      Thread &t = g.threads[i];
      ThreadInfo &info = t.info;
      info.threads_per_threadgroup = d.threads;
      info.threadgroups_per_grid = d.grid;
      info.threadgroup_position_in_grid = gp;
      info.thread_position_in_threadgroup = uint3{i % d.threads.x, (i / d.threads.x) % d.threads.y,
                                                  i / (d.threads.x * d.threads.y)};
      info.thread_position_in_grid =
          uint3{gp.x * d.threads.x + info.thread_position_in_threadgroup.x,
                gp.y * d.threads.y + info.thread_position_in_threadgroup.y,
                gp.z * d.threads.z + info.thread_position_in_threadgroup.z};
      info.thread_index_in_threadgroup = i;
      info.simdgroup_index_in_threadgroup = i / d.simd_width;
      info.simdgroups_per_threadgroup = simdgroups;
      info.thread_index_in_simdgroup = i % d.simd_width;
      info.threads_per_simdgroup = d.simd_width;
      info.lanes_in_simdgroup = std::min(d.simd_width, n - i / d.simd_width * d.simd_width);
      info.threadgroup_memory = memory.get();
      info.threadgroup_memory_bytes = d.threadgroup_memory_bytes;
      t.state = State::runnable;
      t.fake_stack = nullptr;
      t.stack_lo = stack_pool.stack(i);
      t.stack_size = stack_pool.stack_size();
#if defined(GOKV_SIMT_ASAN)
      // A fiber abandoned by a failed group may have left its frames' redzones poisoned.
      __asan_unpoison_memory_region(t.stack_lo, t.stack_size);
#endif
      make_fiber(&t.context, t.stack_lo, t.stack_size, fiber_main, &t);
    }
    std::string error;
    uint32_t live = n;
    while (live > 0) {
      order_indices(order, d.order, rng);
      for (uint32_t i : order) {
        Thread &t = g.threads[i];
        if (t.state != State::runnable) continue;
        resume(g, t);
        if (t.state == State::exited) live--;
        if (!g.thread_error.empty()) break;
      }
      if (!g.thread_error.empty()) {
        error = g.thread_error;
        break;
      }
      if (live == 0) break;
      uint32_t released = 0;
      if (!release_simdgroups(g, released, error)) break;
      if (released > 0) continue;
      if (!release_barrier(g, error)) break;
    }
    if (!error.empty()) {
      failed.store(true);
      return group_name(g.threads[0].info) + ": " + error;
    }
  }
  return std::string();
}

Status run_groups(const Dispatch &d, const std::function<void()> &kernel) {
  if (const char *why = validate(d)) return Status{false, std::string("invalid dispatch: ") + why};
  if (current_group != nullptr) return Status{false, "launch called from inside a kernel"};

  uint64_t groups = uint64_t{d.grid.x} * d.grid.y * d.grid.z;
  std::vector<uint32_t> group_order(groups);
  uint64_t rng = d.seed;
  order_indices(group_order, d.order, rng);

  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  uint64_t workers = std::min<uint64_t>(std::max<uint32_t>(d.os_threads, 1), groups);
  if (workers == 1) {
    std::string error = run_worker(d, kernel, group_order, next, failed);
    return error.empty() ? Status{} : Status{false, error};
  }
  // Several workers: the first failure (in time) is reported; later groups are not started.
  std::mutex mutex;
  std::string first_error;
  auto work = [&] {
    std::string error;
    try {
      error = run_worker(d, kernel, group_order, next, failed);
    } catch (const std::bad_alloc &) {
      error = "out of memory";
      failed.store(true);
    }
    if (!error.empty()) {
      std::lock_guard<std::mutex> lock(mutex);
      if (first_error.empty()) first_error = error;
    }
  };
  std::vector<std::thread> pool;
  for (uint64_t i = 1; i < workers; i++) pool.emplace_back(work);
  work();
  for (std::thread &t : pool) t.join();
  return first_error.empty() ? Status{} : Status{false, first_error};
}

Thread *require_thread() { return current_thread; }

}  // namespace

void simd_exchange(const char *op, const Site &site, const void *value, size_t size, uint32_t arg,
                   SimdResolver resolve, void *result) {
  Thread *t = require_thread();
  if (t == nullptr) {
    // Outside a kernel: a simdgroup of one lane.
    alignas(16) unsigned char in[kSimdValueBytes] = {};
    alignas(16) unsigned char out[kSimdValueBytes] = {};
    std::memcpy(in, value, size);
    uint32_t args[1] = {arg};
    SimdLanes lanes{in, out, args, 1, 1};
    if (resolve(lanes) != nullptr) std::memcpy(out, in, kSimdValueBytes);
    std::memcpy(result, out, size);
    return;
  }
  std::memset(t->value, 0, kSimdValueBytes);
  std::memcpy(t->value, value, size);
  t->value_size = size;
  t->arg = arg;
  t->resolve = resolve;
  t->result = result;
  t->op = op;
  t->site = site;
  t->state = State::simd;
  yield_to_scheduler(*current_group, *t);
}

}  // namespace detail

const ThreadInfo &thread_info() {
  static const ThreadInfo outside{};
  const detail::Thread *t = detail::current_thread;
  return t != nullptr ? t->info : outside;
}

void barrier(Site site) {
  detail::Thread *t = detail::current_thread;
  if (t == nullptr) return;  // outside a kernel: a group of one thread
  t->op = "barrier";
  t->site = site;
  t->state = detail::State::barrier;
  detail::yield_to_scheduler(*detail::current_group, *t);
}

uint64_t simd_ballot(bool predicate, Site site) {
  return detail::simd_call<uint64_t>("simd_ballot", predicate ? 1ull : 0ull, 0, detail::resolve_ballot, site);
}
bool simd_any(bool predicate, Site site) {
  return detail::simd_call<uint32_t>("simd_any", predicate ? 1u : 0u, 0, detail::resolve_any, site) != 0;
}
bool simd_all(bool predicate, Site site) {
  return detail::simd_call<uint32_t>("simd_all", predicate ? 1u : 0u, 0, detail::resolve_all, site) != 0;
}

Status launch(const Dispatch &dispatch, const std::function<void()> &kernel) {
  try {
    return detail::run_groups(dispatch, kernel);
  } catch (const std::bad_alloc &) {
    detail::current_group = nullptr;
    return Status{false, "out of memory"};
  } catch (const std::exception &e) {
    detail::current_group = nullptr;
    return Status{false, std::string("internal error: ") + e.what()};
  }
}

}  // namespace simt
