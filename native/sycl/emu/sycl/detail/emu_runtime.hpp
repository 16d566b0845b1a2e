// The SYCL emulator's runtime (see ../sycl.hpp): properties, device info, the emulated device, queue,
// handler, local_accessor, event, USM.
//
// Execution: a queue runs each command as it is submitted, on the calling thread (a kernel through
// simt::launch, whose work-groups may run on several OS threads), so every queue behaves as an in-order
// queue whose commands are complete when submit returns. The emulation settings come from the environment
// at each launch: GOKV_SYCL_EMU_SUBGROUP (8|16|32, default 16), GOKV_SYCL_EMU_ORDER
// (forward|reverse|shuffled, default shuffled), GOKV_SYCL_EMU_SEED (default 1; each launch adds its
// ordinal), GOKV_SYCL_EMU_THREADS (OS threads running work-groups, default 2), GOKV_SYCL_EMU_STACK_KIB.
//
// Errors: what a real implementation rejects at submission (an nd_range whose global range is not a
// multiple of its local range, a work-group too large, too much local memory, a bad setting) throws from
// submit. A kernel that breaks the execution model (a divergent barrier, a group algorithm some work-items
// never reach, ...) is, as on a device, an asynchronous error: sycl::exception with errc::runtime, whose
// what() carries the emulator's message naming the kernel's lines. It is reported, once, by whichever comes
// first: event::wait or wait_and_throw on its event, queue::wait, wait_and_throw or throw_asynchronous, or
// the queue's next submission. With an async_handler the queue hands it the exception_list instead of
// throwing. (A real queue::wait would not throw; here no kernel failure may pass unseen.)
#ifndef GOKV_SYCL_EMU_RUNTIME_HPP
#define GOKV_SYCL_EMU_RUNTIME_HPP

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "emu_core.hpp"
#include "emu_groups.hpp"

namespace sycl {
inline namespace _V1 {

// ---- properties ------------------------------------------------------------------------------------------
namespace property {
namespace queue {
struct in_order {};
struct enable_profiling {};
}  // namespace queue
}  // namespace property
template <class T> struct is_property : std::false_type {};
template <> struct is_property<property::queue::in_order> : std::true_type {};
template <> struct is_property<property::queue::enable_profiling> : std::true_type {};
template <class T> inline constexpr bool is_property_v = is_property<T>::value;

class property_list {
  public:
    template <class... Props, std::enable_if_t<(is_property_v<Props> && ...), int> = 0>
    property_list(Props... props) {
        (add(props), ...);
    }
    template <class P> bool has_property() const noexcept {
        if constexpr (std::is_same<P, property::queue::in_order>::value) return in_order_;
        else if constexpr (std::is_same<P, property::queue::enable_profiling>::value) return profiling_;
        else return false;
    }

  private:
    void add(property::queue::in_order) { in_order_ = true; }
    void add(property::queue::enable_profiling) { profiling_ = true; }
    bool in_order_ = false, profiling_ = false;
};

// ---- multi_ptr --------------------------------------------------------------------------------------------
template <class T, access::address_space Space, access::decorated Decorated = access::decorated::legacy>
class multi_ptr {
  public:
    using value_type = T;
    using pointer = T *;
    using reference = T &;
    using difference_type = std::ptrdiff_t;
    static constexpr access::address_space address_space = Space;

    multi_ptr() = default;
    explicit multi_ptr(T *p) : p_(p) {}
    T *get() const noexcept { return p_; }
    T *get_raw() const noexcept { return p_; }
    T *get_decorated() const noexcept { return p_; }
    T &operator*() const { return *p_; }
    T *operator->() const { return p_; }
    T &operator[](difference_type i) const { return p_[i]; }
    multi_ptr operator+(difference_type n) const { return multi_ptr(p_ + n); }
    multi_ptr operator-(difference_type n) const { return multi_ptr(p_ - n); }
    explicit operator bool() const noexcept { return p_ != nullptr; }

  private:
    T *p_ = nullptr;
};
template <class T, access::decorated D = access::decorated::legacy>
using local_ptr = multi_ptr<T, access::address_space::local_space, D>;
template <class T, access::decorated D = access::decorated::legacy>
using global_ptr = multi_ptr<T, access::address_space::global_space, D>;
template <class T, access::decorated D = access::decorated::legacy>
using private_ptr = multi_ptr<T, access::address_space::private_space, D>;

// ---- device information ------------------------------------------------------------------------------------
enum class aspect : int {
    cpu, gpu, accelerator, custom, emulated, host_debuggable, fp16, fp64, atomic64, image, online_compiler,
    online_linker, queue_profiling, usm_device_allocations, usm_host_allocations, usm_atomic_host_allocations,
    usm_shared_allocations, usm_atomic_shared_allocations, usm_system_allocations,
};

namespace info {
enum class device_type : int { cpu, gpu, accelerator, custom, automatic, host, all };
enum class event_command_status : int { submitted, running, complete };
namespace device {
#define GOKV_SYCL_INFO(name, type)                                                                              \
    struct name {                                                                                               \
        using return_type = type;                                                                               \
    };
GOKV_SYCL_INFO(device_type, info::device_type)
GOKV_SYCL_INFO(name, std::string)
GOKV_SYCL_INFO(vendor, std::string)
GOKV_SYCL_INFO(driver_version, std::string)
GOKV_SYCL_INFO(version, std::string)
GOKV_SYCL_INFO(max_compute_units, uint32_t)
GOKV_SYCL_INFO(max_work_group_size, size_t)
GOKV_SYCL_INFO(max_num_sub_groups, uint32_t)
GOKV_SYCL_INFO(sub_group_sizes, std::vector<size_t>)
GOKV_SYCL_INFO(local_mem_size, uint64_t)
GOKV_SYCL_INFO(global_mem_size, uint64_t)
GOKV_SYCL_INFO(max_mem_alloc_size, uint64_t)
GOKV_SYCL_INFO(max_clock_frequency, uint32_t)
GOKV_SYCL_INFO(mem_base_addr_align, uint32_t)
}  // namespace device
namespace platform {
GOKV_SYCL_INFO(name, std::string)
GOKV_SYCL_INFO(vendor, std::string)
GOKV_SYCL_INFO(version, std::string)
}  // namespace platform
namespace event {
GOKV_SYCL_INFO(command_execution_status, info::event_command_status)
}  // namespace event
namespace event_profiling {
GOKV_SYCL_INFO(command_submit, uint64_t)
GOKV_SYCL_INFO(command_start, uint64_t)
GOKV_SYCL_INFO(command_end, uint64_t)
}  // namespace event_profiling
#undef GOKV_SYCL_INFO
}  // namespace info

namespace detail {
// The emulated device: an Intel-like GPU whose sub-group sizes are the ones the CI runs the kernels at.
constexpr size_t kMaxWorkGroupSize = 1024;
constexpr uint64_t kLocalMemSize = 64 * 1024;
inline uint64_t physical_memory() {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : uint64_t(4) << 30;
}
}  // namespace detail

class platform;
class device {
  public:
    device() = default;
    template <class Selector, std::enable_if_t<std::is_invocable_r<int, const Selector &, const device &>::value, int> = 0>
    explicit device(const Selector &selector);

    bool is_gpu() const { return true; }
    bool is_cpu() const { return false; }
    bool is_accelerator() const { return false; }
    // fp64: no (Intel's client GPUs lack it, and kernels must not use double); fp16 and USM: yes.
    bool has(aspect a) const {
        return a == aspect::gpu || a == aspect::emulated || a == aspect::fp16 || a == aspect::queue_profiling ||
               a == aspect::usm_device_allocations || a == aspect::usm_host_allocations ||
               a == aspect::usm_shared_allocations || a == aspect::atomic64;
    }
    platform get_platform() const;
    template <class Param> typename Param::return_type get_info() const {
        namespace d = info::device;
        if constexpr (std::is_same<Param, d::device_type>::value) return info::device_type::gpu;
        else if constexpr (std::is_same<Param, d::name>::value) return "gokv SYCL emulator (simt)";
        else if constexpr (std::is_same<Param, d::vendor>::value) return "gokv";
        else if constexpr (std::is_same<Param, d::driver_version>::value) return "simt";
        else if constexpr (std::is_same<Param, d::version>::value) return "2020";
        else if constexpr (std::is_same<Param, d::max_compute_units>::value) return 1u;
        else if constexpr (std::is_same<Param, d::max_work_group_size>::value) return detail::kMaxWorkGroupSize;
        else if constexpr (std::is_same<Param, d::max_num_sub_groups>::value) return uint32_t(detail::kMaxWorkGroupSize / 8);
        else if constexpr (std::is_same<Param, d::sub_group_sizes>::value) return std::vector<size_t>{8, 16, 32};
        else if constexpr (std::is_same<Param, d::local_mem_size>::value) return detail::kLocalMemSize;
        else if constexpr (std::is_same<Param, d::global_mem_size>::value) return detail::physical_memory();
        else if constexpr (std::is_same<Param, d::max_mem_alloc_size>::value) return detail::physical_memory() / 2;
        else if constexpr (std::is_same<Param, d::max_clock_frequency>::value) return 1000u;
        else if constexpr (std::is_same<Param, d::mem_base_addr_align>::value) return 1024u;  // bits
        else static_assert(sizeof(Param) == 0, "this device information is not emulated");
    }
    static std::vector<device> get_devices(info::device_type type = info::device_type::all) {
        if (type == info::device_type::all || type == info::device_type::gpu || type == info::device_type::automatic)
            return {device()};
        return {};
    }
    friend bool operator==(const device &, const device &) { return true; }
    friend bool operator!=(const device &, const device &) { return false; }
};

class platform {
  public:
    platform() = default;
    std::vector<device> get_devices(info::device_type type = info::device_type::all) const {
        return device::get_devices(type);
    }
    template <class Param> typename Param::return_type get_info() const {
        namespace p = info::platform;
        if constexpr (std::is_same<Param, p::name>::value) return "gokv SYCL emulator";
        else if constexpr (std::is_same<Param, p::vendor>::value) return "gokv";
        else if constexpr (std::is_same<Param, p::version>::value) return "2020";
        else static_assert(sizeof(Param) == 0, "this platform information is not emulated");
    }
    static std::vector<platform> get_platforms() { return {platform()}; }
};
inline platform device::get_platform() const { return platform(); }

class context {
  public:
    context() = default;
    explicit context(const device &) {}
    std::vector<device> get_devices() const { return {device()}; }
    platform get_platform() const { return platform(); }
};

// Device selectors: scores; a negative score rejects a device.
inline constexpr struct default_selector_t {
    int operator()(const device &) const { return 1; }
} default_selector_v{};
inline constexpr struct gpu_selector_t {
    int operator()(const device &d) const { return d.is_gpu() ? 1 : -1; }
} gpu_selector_v{};
inline constexpr struct cpu_selector_t {
    int operator()(const device &d) const { return d.is_cpu() ? 1 : -1; }
} cpu_selector_v{};
inline constexpr struct accelerator_selector_t {
    int operator()(const device &d) const { return d.is_accelerator() ? 1 : -1; }
} accelerator_selector_v{};
template <class Selector, std::enable_if_t<std::is_invocable_r<int, const Selector &, const device &>::value, int>>
device::device(const Selector &selector) {
    if (selector(device()) < 0)
        throw exception(make_error_code(errc::runtime), "no device of the requested type (the emulator has one GPU)");
}

// ---- exceptions in lists, events ----------------------------------------------------------------------------
namespace detail {
struct exception_list_access;
}
class exception_list {
  public:
    using value_type = std::exception_ptr;
    using reference = value_type &;
    using const_reference = const value_type &;
    using size_type = size_t;
    using iterator = std::vector<std::exception_ptr>::const_iterator;
    using const_iterator = iterator;
    size_type size() const { return list_.size(); }
    iterator begin() const { return list_.begin(); }
    iterator end() const { return list_.end(); }

  private:
    friend struct detail::exception_list_access;
    std::vector<std::exception_ptr> list_;
};
using async_handler = std::function<void(exception_list)>;

namespace detail {
struct exception_list_access {
    static exception_list make(std::vector<std::exception_ptr> errors) {
        exception_list l;
        l.list_ = std::move(errors);
        return l;
    }
};
struct event_state {
    std::exception_ptr error;        // the kernel's failure, if it failed
    std::atomic<bool> reported{false};
    uint64_t submit_ns = 0, start_ns = 0, end_ns = 0;
};
struct queue_state {
    async_handler handler;
    bool in_order = false, profiling = false;
    std::mutex mutex;                                   // one command at a time
    std::vector<std::shared_ptr<event_state>> failed;   // failures not yet reported
};
inline uint64_t now_ns() {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
}
// Hands the failures not yet reported to the handler, or throws the first (with the mutex held or not).
inline void report(const async_handler &handler, std::vector<std::shared_ptr<event_state>> &failed) {
    std::vector<std::exception_ptr> errors;
    for (auto &f : failed)
        if (!f->reported.exchange(true)) errors.push_back(f->error);
    failed.clear();
    if (errors.empty()) return;
    if (handler) {
        handler(exception_list_access::make(std::move(errors)));
        return;
    }
    std::rethrow_exception(errors.front());
}
}  // namespace detail

class event {
  public:
    event() : state_(std::make_shared<detail::event_state>()) {}
    void wait() { throw_if_failed(); }
    void wait_and_throw() {
        if (state_->error && queue_ && queue_->handler) {
            std::vector<std::shared_ptr<detail::event_state>> one{state_};
            detail::report(queue_->handler, one);
            return;
        }
        throw_if_failed();
    }
    static void wait(const std::vector<event> &events) {
        for (event e : events) e.wait();
    }
    static void wait_and_throw(const std::vector<event> &events) {
        for (event e : events) e.wait_and_throw();
    }
    template <class Param> typename Param::return_type get_info() const {
        static_assert(std::is_same<Param, info::event::command_execution_status>::value,
                      "this event information is not emulated");
        return info::event_command_status::complete;
    }
    template <class Param> typename Param::return_type get_profiling_info() const {
        if constexpr (std::is_same<Param, info::event_profiling::command_submit>::value) return state_->submit_ns;
        else if constexpr (std::is_same<Param, info::event_profiling::command_start>::value) return state_->start_ns;
        else if constexpr (std::is_same<Param, info::event_profiling::command_end>::value) return state_->end_ns;
        else static_assert(sizeof(Param) == 0, "this profiling information is not emulated");
    }
    friend bool operator==(const event &a, const event &b) { return a.state_ == b.state_; }
    friend bool operator!=(const event &a, const event &b) { return a.state_ != b.state_; }

  private:
    friend class queue;
    event(std::shared_ptr<detail::event_state> s, std::shared_ptr<detail::queue_state> q)
        : state_(std::move(s)), queue_(std::move(q)) {}
    void throw_if_failed() {
        if (state_->error && !state_->reported.exchange(true)) std::rethrow_exception(state_->error);
    }
    std::shared_ptr<detail::event_state> state_;
    std::shared_ptr<detail::queue_state> queue_;
};

// ---- emulation settings -------------------------------------------------------------------------------------
namespace detail {
struct emu_settings {
    uint32_t sub_group = 16;
    simt::RunOrder order = simt::RunOrder::shuffled;
    uint64_t seed = 1;
    uint32_t os_threads = 2;
    size_t stack_bytes = 256 * 1024;
};
inline uint64_t env_number(const char *name, uint64_t fallback, uint64_t lo, uint64_t hi) {
    const char *v = std::getenv(name);
    if (v == nullptr || *v == '\0') return fallback;
    char *end = nullptr;
    unsigned long long n = std::strtoull(v, &end, 10);
    if (*end != '\0' || n < lo || n > hi)
        throw exception(make_error_code(errc::invalid), std::string(name) + "=" + v + ": not a number in [" +
                                                            std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return n;
}
// The settings of the next launch; each launch's shuffle seed is the base seed plus its ordinal.
inline emu_settings read_settings() {
    static std::atomic<uint64_t> launches{0};
    emu_settings s;
    s.sub_group = uint32_t(env_number("GOKV_SYCL_EMU_SUBGROUP", 16, 8, 32));
    if (s.sub_group != 8 && s.sub_group != 16 && s.sub_group != 32)
        throw exception(make_error_code(errc::invalid), "GOKV_SYCL_EMU_SUBGROUP must be 8, 16 or 32");
    const char *order = std::getenv("GOKV_SYCL_EMU_ORDER");
    std::string o = order != nullptr && *order != '\0' ? order : "shuffled";
    if (o == "forward") s.order = simt::RunOrder::forward;
    else if (o == "reverse") s.order = simt::RunOrder::reverse;
    else if (o == "shuffled") s.order = simt::RunOrder::shuffled;
    else throw exception(make_error_code(errc::invalid), "GOKV_SYCL_EMU_ORDER must be forward, reverse or shuffled");
    s.seed = env_number("GOKV_SYCL_EMU_SEED", 1, 0, UINT64_MAX) + launches.fetch_add(1);
    s.os_threads = uint32_t(env_number("GOKV_SYCL_EMU_THREADS", 2, 1, 256));
    s.stack_bytes = size_t(env_number("GOKV_SYCL_EMU_STACK_KIB", 256, 16, 1 << 20)) * 1024;
    return s;
}
using command = std::function<simt::Status(const emu_settings &)>;
inline size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace detail

// ---- handler and local_accessor ---------------------------------------------------------------------------------
class handler {
  public:
    handler(const handler &) = delete;
    handler &operator=(const handler &) = delete;

    template <class KernelName = void, int D, class KernelType>
    void parallel_for(nd_range<D> r, const KernelType &kernel) {
        check_kernel<KernelType>();
        static_assert(std::is_invocable<const KernelType &, nd_item<D>>::value,
                      "an nd_range kernel's operator() must be const and take sycl::nd_item<D>");
        simt::Dispatch d = dispatch_of(r);
        set_command(d, [kernel] { kernel(nd_item<D>(detail::construct_tag{})); });
    }
    // The basic data-parallel form: work-groups of the emulator's choosing (up to 64 items along the last
    // dimension); no barrier or group algorithm is allowed in such a kernel.
    template <class KernelName = void, int D, class KernelType>
    void parallel_for(range<D> r, const KernelType &kernel) {
        check_kernel<KernelType>();
        range<D> local = r;
        for (int i = 0; i < D; i++) local[i] = 1;
        local[D - 1] = r[D - 1] ? std::gcd(r[D - 1], size_t(64)) : 1;
        simt::Dispatch d = dispatch_of(nd_range<D>(r, local));
        if constexpr (std::is_invocable<const KernelType &, item<D>>::value)
            set_command(d, [kernel] { kernel(item<D>(detail::construct_tag{})); });
        else set_command(d, [kernel] { kernel(item<D>(detail::construct_tag{}).get_id()); });
    }
    template <class KernelName = void, class KernelType> void single_task(const KernelType &kernel) {
        check_kernel<KernelType>();
        simt::Dispatch d = dispatch_of(nd_range<1>(range<1>(1), range<1>(1)));
        set_command(d, [kernel] { kernel(); });
    }
    void memcpy(void *dest, const void *src, size_t bytes) {
        set_copy([=] {
            if (bytes != 0) std::memmove(dest, src, bytes);
        });
    }
    void memset(void *ptr, int value, size_t bytes) {
        set_copy([=] {
            if (bytes != 0) std::memset(ptr, value, bytes);
        });
    }
    template <class T> void fill(void *ptr, const T &pattern, size_t count) {
        static_assert(std::is_trivially_copyable<T>::value, "fill takes a trivially copyable pattern");
        set_copy([=] {
            for (size_t i = 0; i < count; i++) std::memcpy(static_cast<unsigned char *>(ptr) + i * sizeof(T), &pattern, sizeof(T));
        });
    }
    template <class T> void copy(const T *src, T *dest, size_t count) { memcpy(dest, src, count * sizeof(T)); }
    void depends_on(event) {}  // commands complete in submission order
    void depends_on(const std::vector<event> &) {}

  private:
    friend class queue;
    template <class, int> friend class local_accessor;
    handler() = default;

    template <class KernelType> static void check_kernel() {
        static_assert(is_device_copyable_v<KernelType>,
                      "a SYCL kernel must be device copyable: every capture or member trivially copyable, "
                      "or sycl::is_device_copyable specialized for it");
    }
    void set_command(const simt::Dispatch &d, std::function<void()> body) {
        if (command_) throw exception(make_error_code(errc::invalid), "a command group holds one command");
        const size_t user_bytes = detail::align_up(local_bytes_, detail::kScratchSlot);
        command_ = [d, user_bytes, body = std::move(body)](const detail::emu_settings &s) {
            simt::Dispatch run = d;
            const size_t items = size_t(d.threads.x) * d.threads.y * d.threads.z;
            run.simd_width = s.sub_group;
            run.threadgroup_memory_bytes = user_bytes + detail::group_scratch_bytes((items + s.sub_group - 1) / s.sub_group);
            run.order = s.order;
            run.seed = s.seed;
            run.os_threads = s.os_threads;
            run.stack_bytes = s.stack_bytes;
            if (size_t(d.grid.x) * d.grid.y * d.grid.z == 0) return simt::Status{};
            return simt::launch(run, body);
        };
    }
    void set_copy(std::function<void()> f) {
        if (command_) throw exception(make_error_code(errc::invalid), "a command group holds one command");
        command_ = [f = std::move(f)](const detail::emu_settings &) {
            f();
            return simt::Status{};
        };
    }
    template <int D> simt::Dispatch dispatch_of(const nd_range<D> &r) {
        const range<D> g = r.get_global_range(), l = r.get_local_range();
        for (int i = 0; i < D; i++) {
            if (l[i] == 0 || g[i] % l[i] != 0) {
                throw exception(make_error_code(errc::nd_range),
                                "global range " + std::to_string(g[i]) + " of dimension " + std::to_string(i) +
                                    " is not a multiple of the local range " + std::to_string(l[i]));
            }
            if (g[i] / (l[i] ? l[i] : 1) > UINT32_MAX)
                throw exception(make_error_code(errc::nd_range), "too many work-groups in dimension " + std::to_string(i));
        }
        if (r.get_offset() != id<D>())
            throw exception(make_error_code(errc::feature_not_supported), "nd_range offsets are not emulated");
        if (l.size() > detail::kMaxWorkGroupSize) {
            throw exception(make_error_code(errc::nd_range), "work-group size " + std::to_string(l.size()) +
                                                                 " exceeds the device's maximum " +
                                                                 std::to_string(detail::kMaxWorkGroupSize));
        }
        if (local_bytes_ > detail::kLocalMemSize) {
            throw exception(make_error_code(errc::memory_allocation),
                            "local memory " + std::to_string(local_bytes_) + " bytes exceeds the device's " +
                                std::to_string(detail::kLocalMemSize));
        }
        simt::Dispatch d;
        simt::uint3 groups, items;
        if constexpr (D >= 1) groups.x = uint32_t(g[D - 1] / l[D - 1]), items.x = uint32_t(l[D - 1]);
        if constexpr (D >= 2) groups.y = uint32_t(g[D - 2] / l[D - 2]), items.y = uint32_t(l[D - 2]);
        if constexpr (D >= 3) groups.z = uint32_t(g[D - 3] / l[D - 3]), items.z = uint32_t(l[D - 3]);
        d.grid = groups;
        d.threads = items;
        return d;
    }
    size_t reserve_local(size_t bytes, size_t align) {
        size_t offset = detail::align_up(local_bytes_, align);
        local_bytes_ = offset + bytes;
        return offset;
    }

    size_t local_bytes_ = 0;
    detail::command command_;
};

// A work-group's local memory: each work-group gets its own, poisoned (every byte 0xFF) before it starts.
// Trivially copyable (an offset and a count), so kernels holding it stay device copyable.
template <class T, int D = 1> class local_accessor {
    static_assert(D == 1, "the emulator has one-dimensional local_accessors only");

  public:
    using value_type = T;
    using reference = T &;
    using const_reference = const T &;
    using size_type = size_t;
    using iterator = T *;

    local_accessor() = default;
    local_accessor(range<1> allocation_size, handler &h, const property_list & = {})
        : offset_(h.reserve_local(allocation_size[0] * sizeof(T), alignof(T))), count_(allocation_size[0]) {}

    T &operator[](size_t index) const {
        if (index >= count_) {
            throw std::out_of_range("local_accessor index " + std::to_string(index) + " is outside its " +
                                    std::to_string(count_) + " elements");
        }
        return base()[index];
    }
    T &operator[](id<1> index) const { return (*this)[size_t(index[0])]; }
    size_t size() const noexcept { return count_; }
    size_t byte_size() const noexcept { return count_ * sizeof(T); }
    size_t max_size() const noexcept { return count_; }
    bool empty() const noexcept { return count_ == 0; }
    range<1> get_range() const { return range<1>(count_); }
    template <access::decorated Decorated>
    multi_ptr<T, access::address_space::local_space, Decorated> get_multi_ptr() const noexcept {
        return multi_ptr<T, access::address_space::local_space, Decorated>(base());
    }
    local_ptr<T> get_pointer() const noexcept { return local_ptr<T>(base()); }
    iterator begin() const { return base(); }
    iterator end() const { return base() + count_; }

  private:
    T *base() const {
        const simt::ThreadInfo &t = simt::thread_info();
        if (t.threadgroup_memory == nullptr) throw std::logic_error("a local_accessor is used outside a kernel");
        return reinterpret_cast<T *>(static_cast<unsigned char *>(t.threadgroup_memory) + offset_);
    }
    size_t offset_ = 0;
    size_t count_ = 0;
};

// ---- queue -----------------------------------------------------------------------------------------------------
class queue {
    template <class S>
    using if_selector = std::enable_if_t<std::is_invocable_r<int, const S &, const device &>::value, int>;

  public:
    explicit queue(const property_list &props = {}) : queue(device(), async_handler(), props) {}
    explicit queue(const async_handler &h, const property_list &props = {}) : queue(device(), h, props) {}
    template <class Selector, if_selector<Selector> = 0>
    explicit queue(const Selector &s, const property_list &props = {}) : queue(device(s), async_handler(), props) {}
    template <class Selector, if_selector<Selector> = 0>
    queue(const Selector &s, const async_handler &h, const property_list &props = {}) : queue(device(s), h, props) {}
    explicit queue(const device &, const property_list &props = {}) : queue(device(), async_handler(), props) {}
    queue(const device &, const async_handler &h, const property_list &props = {})
        : state_(std::make_shared<detail::queue_state>()) {
        state_->handler = h;
        state_->in_order = props.has_property<property::queue::in_order>();
        state_->profiling = props.has_property<property::queue::enable_profiling>();
    }
    queue(const context &, const device &d, const property_list &props = {}) : queue(d, async_handler(), props) {}

    device get_device() const { return device(); }
    context get_context() const { return context(); }
    bool is_in_order() const { return state_->in_order; }
    template <class P> bool has_property() const noexcept {
        if constexpr (std::is_same<P, property::queue::in_order>::value) return state_->in_order;
        else if constexpr (std::is_same<P, property::queue::enable_profiling>::value) return state_->profiling;
        else return false;
    }

    template <class CommandGroup> event submit(CommandGroup cgf) {
        std::lock_guard<std::mutex> lock(state_->mutex);
        detail::report(state_->handler, state_->failed);
        handler h;
        cgf(h);
        return run(h);
    }
    void wait() { wait_and_throw(); }
    void wait_and_throw() {
        std::lock_guard<std::mutex> lock(state_->mutex);
        detail::report(state_->handler, state_->failed);
    }
    void throw_asynchronous() { wait_and_throw(); }

    event memcpy(void *dest, const void *src, size_t bytes) {
        return submit([&](handler &h) { h.memcpy(dest, src, bytes); });
    }
    event memcpy(void *dest, const void *src, size_t bytes, event) { return memcpy(dest, src, bytes); }
    event memcpy(void *dest, const void *src, size_t bytes, const std::vector<event> &) { return memcpy(dest, src, bytes); }
    event memset(void *ptr, int value, size_t bytes) {
        return submit([&](handler &h) { h.memset(ptr, value, bytes); });
    }
    event memset(void *ptr, int value, size_t bytes, event) { return memset(ptr, value, bytes); }
    event memset(void *ptr, int value, size_t bytes, const std::vector<event> &) { return memset(ptr, value, bytes); }
    template <class T> event fill(void *ptr, const T &pattern, size_t count) {
        return submit([&](handler &h) { h.fill(ptr, pattern, count); });
    }
    template <class T> event fill(void *ptr, const T &pattern, size_t count, event) { return fill(ptr, pattern, count); }
    template <class T> event fill(void *ptr, const T &pattern, size_t count, const std::vector<event> &) {
        return fill(ptr, pattern, count);
    }
    template <class T> event copy(const T *src, T *dest, size_t count) {
        return submit([&](handler &h) { h.copy(src, dest, count); });
    }
    template <class T> event copy(const T *src, T *dest, size_t count, event) { return copy(src, dest, count); }
    template <class T> event copy(const T *src, T *dest, size_t count, const std::vector<event> &) {
        return copy(src, dest, count);
    }
    template <class KernelName = void, int D, class KernelType> event parallel_for(nd_range<D> r, const KernelType &k) {
        return submit([&](handler &h) { h.parallel_for<KernelName>(r, k); });
    }
    template <class KernelName = void, int D, class KernelType> event parallel_for(range<D> r, const KernelType &k) {
        return submit([&](handler &h) { h.parallel_for<KernelName>(r, k); });
    }
    template <class KernelName = void, class KernelType> event single_task(const KernelType &k) {
        return submit([&](handler &h) { h.single_task<KernelName>(k); });
    }

    friend bool operator==(const queue &a, const queue &b) { return a.state_ == b.state_; }
    friend bool operator!=(const queue &a, const queue &b) { return a.state_ != b.state_; }

  private:
    event run(handler &h) {
        auto e = std::make_shared<detail::event_state>();
        e->submit_ns = detail::now_ns();
        e->start_ns = e->submit_ns;
        if (h.command_) {
            detail::emu_settings settings = detail::read_settings();
            e->start_ns = detail::now_ns();
            simt::Status st = h.command_(settings);
            if (!st.ok) {
                e->error = std::make_exception_ptr(
                    exception(make_error_code(errc::runtime),
                              "SYCL kernel failed on the emulator (in simt's words: a threadgroup (x,y,z) is the "
                              "work-group of group ids (2,1,0), a thread its local linear id, a simdgroup a "
                              "sub-group): " + st.message));
                state_->failed.push_back(e);
            }
        }
        e->end_ns = detail::now_ns();
        return event(e, state_);
    }
    std::shared_ptr<detail::queue_state> state_;
};

// ---- USM --------------------------------------------------------------------------------------------------------
namespace usm {
enum class alloc : int { host, device, shared, unknown };
}

namespace detail {
// Device memory starts poisoned (every byte 0xFF), as uninitialized device memory is not zero; host and
// shared memory are plain.
inline void *usm_alloc(size_t alignment, size_t bytes, usm::alloc kind) {
    if (alignment < 64) alignment = 64;
    if ((alignment & (alignment - 1)) != 0) return nullptr;
    size_t size = align_up(bytes ? bytes : 1, alignment);
    void *p = std::aligned_alloc(alignment, size);
    if (p != nullptr && kind == usm::alloc::device) std::memset(p, 0xFF, size);
    return p;
}
}  // namespace detail

#define GOKV_SYCL_USM(kind)                                                                                     \
    inline void *malloc_##kind(size_t bytes, const queue &, const property_list & = {}) {                       \
        return detail::usm_alloc(0, bytes, usm::alloc::kind);                                                   \
    }                                                                                                           \
    inline void *malloc_##kind(size_t bytes, const device &, const context &, const property_list & = {}) {     \
        return detail::usm_alloc(0, bytes, usm::alloc::kind);                                                   \
    }                                                                                                           \
    template <class T> T *malloc_##kind(size_t count, const queue &, const property_list & = {}) {              \
        return static_cast<T *>(detail::usm_alloc(alignof(T), count * sizeof(T), usm::alloc::kind));            \
    }                                                                                                           \
    inline void *aligned_alloc_##kind(size_t alignment, size_t bytes, const queue &, const property_list & = {}) { \
        return detail::usm_alloc(alignment, bytes, usm::alloc::kind);                                           \
    }                                                                                                           \
    template <class T>                                                                                          \
    T *aligned_alloc_##kind(size_t alignment, size_t count, const queue &, const property_list & = {}) {        \
        return static_cast<T *>(detail::usm_alloc(alignment, count * sizeof(T), usm::alloc::kind));             \
    }
GOKV_SYCL_USM(device)
GOKV_SYCL_USM(host)
GOKV_SYCL_USM(shared)
#undef GOKV_SYCL_USM

inline void free(void *ptr, const queue &) { std::free(ptr); }
inline void free(void *ptr, const context &) { std::free(ptr); }

}  // namespace _V1
}  // namespace sycl

#endif
