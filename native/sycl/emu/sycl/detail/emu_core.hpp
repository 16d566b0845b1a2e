// The SYCL emulator's core types (see ../sycl.hpp): errc and exception, the access and memory enums,
// range, id, nd_range, nd_item, group, sub_group, half, the function objects, bit_cast and the math.
//
// Index mapping: SYCL's last dimension is the fastest, simt's x is: dimension D-1 is x, D-2 is y, D-3 is z,
// so linear ids (work-item in group, group in range) agree, and sub-groups are consecutive runs of the
// local linear id, as on Intel GPUs.
#ifndef GOKV_SYCL_EMU_CORE_HPP
#define GOKV_SYCL_EMU_CORE_HPP

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

#include "simt.h"

namespace sycl {
inline namespace _V1 {

// ---- errors ----------------------------------------------------------------------------------------------
enum class errc : int {
    success = 0,
    runtime,
    kernel,
    accessor,
    nd_range,
    event,
    kernel_argument,
    build,
    invalid,
    memory_allocation,
    platform,
    profiling,
    feature_not_supported,
    kernel_not_supported,
    backend_mismatch,
};

namespace detail {
class sycl_error_category : public std::error_category {
  public:
    const char *name() const noexcept override { return "sycl"; }
    std::string message(int ev) const override {
        static const char *const names[] = {"success", "runtime", "kernel", "accessor", "nd_range",
                                            "event", "kernel_argument", "build", "invalid",
                                            "memory_allocation", "platform", "profiling",
                                            "feature_not_supported", "kernel_not_supported", "backend_mismatch"};
        return ev >= 0 && ev < int(sizeof(names) / sizeof(names[0])) ? names[ev] : "unknown";
    }
};
}  // namespace detail

inline const std::error_category &sycl_category() noexcept {
    static const detail::sycl_error_category category;
    return category;
}
inline std::error_code make_error_code(errc e) noexcept { return std::error_code(int(e), sycl_category()); }

class context;

class exception : public std::exception {
  public:
    exception(std::error_code ec, const std::string &what_arg) : ec_(ec), what_(what_arg) {}
    exception(std::error_code ec, const char *what_arg) : ec_(ec), what_(what_arg) {}
    exception(std::error_code ec) : ec_(ec), what_(ec.message()) {}
    exception(int ev, const std::error_category &cat, const std::string &what_arg) : ec_(ev, cat), what_(what_arg) {}
    exception(int ev, const std::error_category &cat) : ec_(ev, cat), what_(ec_.message()) {}
    const std::error_code &code() const noexcept { return ec_; }
    const std::error_category &category() const noexcept { return ec_.category(); }
    const char *what() const noexcept override { return what_.c_str(); }
    bool has_context() const noexcept { return false; }

  private:
    std::error_code ec_;
    std::string what_;
};

// ---- access, memory order and scope ---------------------------------------------------------------------
namespace access {
enum class address_space : int { global_space, local_space, constant_space, private_space, generic_space };
enum class decorated : int { no, yes, legacy };
enum class fence_space : int { local_space, global_space, global_and_local };
enum class mode : int { read, write, read_write, discard_write, discard_read_write, atomic };
enum class target : int { device, host_task, constant_buffer, local, host_buffer };
}  // namespace access
using access_mode = access::mode;
using target = access::target;

enum class memory_order : int { relaxed, acquire, release, acq_rel, seq_cst };
inline constexpr memory_order memory_order_relaxed = memory_order::relaxed;
inline constexpr memory_order memory_order_acquire = memory_order::acquire;
inline constexpr memory_order memory_order_release = memory_order::release;
inline constexpr memory_order memory_order_acq_rel = memory_order::acq_rel;
inline constexpr memory_order memory_order_seq_cst = memory_order::seq_cst;

enum class memory_scope : int { work_item, sub_group, work_group, device, system };
inline constexpr memory_scope memory_scope_work_item = memory_scope::work_item;
inline constexpr memory_scope memory_scope_sub_group = memory_scope::sub_group;
inline constexpr memory_scope memory_scope_work_group = memory_scope::work_group;
inline constexpr memory_scope memory_scope_device = memory_scope::device;
inline constexpr memory_scope memory_scope_system = memory_scope::system;

// ---- range, id, nd_range ----------------------------------------------------------------------------------
namespace detail {
struct no_conversion {};
// What range and id share: D size_t values, element-wise arithmetic and comparison.
template <int D, class Self> class index_array {
    static_assert(D >= 1 && D <= 3, "SYCL ranges and ids have 1, 2 or 3 dimensions");

  public:
    static constexpr int dimensions = D;
    size_t get(int dimension) const { return v_[dimension]; }
    size_t &operator[](int dimension) { return v_[dimension]; }
    size_t operator[](int dimension) const { return v_[dimension]; }

#define GOKV_SYCL_INDEX_OP(op)                                                                                  \
    friend Self operator op(const Self &a, const Self &b) {                                                     \
        Self r = a;                                                                                             \
        for (int i = 0; i < D; i++) r.v_[i] = a.v_[i] op b.v_[i];                                               \
        return r;                                                                                               \
    }                                                                                                           \
    friend Self operator op(const Self &a, size_t b) {                                                          \
        Self r = a;                                                                                             \
        for (int i = 0; i < D; i++) r.v_[i] = a.v_[i] op b;                                                     \
        return r;                                                                                               \
    }                                                                                                           \
    friend Self operator op(size_t a, const Self &b) {                                                          \
        Self r = b;                                                                                             \
        for (int i = 0; i < D; i++) r.v_[i] = a op b.v_[i];                                                     \
        return r;                                                                                               \
    }                                                                                                           \
    friend Self &operator op##=(Self &a, const Self &b) {                                                       \
        for (int i = 0; i < D; i++) a.v_[i] = a.v_[i] op b.v_[i];                                               \
        return a;                                                                                               \
    }                                                                                                           \
    friend Self &operator op##=(Self &a, size_t b) {                                                            \
        for (int i = 0; i < D; i++) a.v_[i] = a.v_[i] op b;                                                     \
        return a;                                                                                               \
    }
    GOKV_SYCL_INDEX_OP(+)
    GOKV_SYCL_INDEX_OP(-)
    GOKV_SYCL_INDEX_OP(*)
    GOKV_SYCL_INDEX_OP(/)
    GOKV_SYCL_INDEX_OP(%)
    GOKV_SYCL_INDEX_OP(<<)
    GOKV_SYCL_INDEX_OP(>>)
    GOKV_SYCL_INDEX_OP(&)
    GOKV_SYCL_INDEX_OP(|)
    GOKV_SYCL_INDEX_OP(^)
#undef GOKV_SYCL_INDEX_OP
    friend bool operator==(const Self &a, const Self &b) {
        for (int i = 0; i < D; i++)
            if (a.v_[i] != b.v_[i]) return false;
        return true;
    }
    friend bool operator!=(const Self &a, const Self &b) { return !(a == b); }

  protected:
    size_t v_[D] = {};
};
}  // namespace detail

template <int D = 1> class range : public detail::index_array<D, range<D>> {
  public:
    template <int M = D, std::enable_if_t<M == 1, int> = 0> range(size_t d0) { this->v_[0] = d0; }
    template <int M = D, std::enable_if_t<M == 2, int> = 0> range(size_t d0, size_t d1) {
        this->v_[0] = d0;
        this->v_[1] = d1;
    }
    template <int M = D, std::enable_if_t<M == 3, int> = 0> range(size_t d0, size_t d1, size_t d2) {
        this->v_[0] = d0;
        this->v_[1] = d1;
        this->v_[2] = d2;
    }
    size_t size() const {
        size_t n = 1;
        for (int i = 0; i < D; i++) n *= this->v_[i];
        return n;
    }
};
range(size_t)->range<1>;
range(size_t, size_t)->range<2>;
range(size_t, size_t, size_t)->range<3>;

template <int D = 1> class id : public detail::index_array<D, id<D>> {
  public:
    id() = default;
    template <int M = D, std::enable_if_t<M == 1, int> = 0> id(size_t d0) { this->v_[0] = d0; }
    template <int M = D, std::enable_if_t<M == 2, int> = 0> id(size_t d0, size_t d1) {
        this->v_[0] = d0;
        this->v_[1] = d1;
    }
    template <int M = D, std::enable_if_t<M == 3, int> = 0> id(size_t d0, size_t d1, size_t d2) {
        this->v_[0] = d0;
        this->v_[1] = d1;
        this->v_[2] = d2;
    }
    id(const range<D> &r) {
        for (int i = 0; i < D; i++) this->v_[i] = r[i];
    }
    // id<1> converts to size_t (an index into a pointer); other ids convert to nothing usable.
    operator std::conditional_t<D == 1, size_t, detail::no_conversion>() const {
        if constexpr (D == 1) return this->v_[0];
        else return {};
    }
};
id(size_t)->id<1>;
id(size_t, size_t)->id<2>;
id(size_t, size_t, size_t)->id<3>;

template <int D = 1> class nd_range {
  public:
    static constexpr int dimensions = D;
    nd_range(range<D> global_size, range<D> local_size, id<D> offset = id<D>())
        : global_(global_size), local_(local_size), offset_(offset) {}
    range<D> get_global_range() const { return global_; }
    range<D> get_local_range() const { return local_; }
    range<D> get_group_range() const {
        range<D> r = global_;
        for (int i = 0; i < D; i++) r[i] = local_[i] ? global_[i] / local_[i] : 0;
        return r;
    }
    id<D> get_offset() const { return offset_; }
    friend bool operator==(const nd_range &a, const nd_range &b) {
        return a.global_ == b.global_ && a.local_ == b.local_ && a.offset_ == b.offset_;
    }
    friend bool operator!=(const nd_range &a, const nd_range &b) { return !(a == b); }

  private:
    range<D> global_, local_;
    id<D> offset_;
};

// ---- the work-item's view: nd_item, group, sub_group ----------------------------------------------------------
namespace detail {
inline size_t axis(const simt::uint3 &u, int a) { return a == 0 ? u.x : a == 1 ? u.y : u.z; }
// SYCL dimension `dim` of D is simt axis D-1-dim.
template <int D> size_t pick(const simt::uint3 &u, int dim) { return axis(u, D - 1 - dim); }
template <class R, int D> R make_index(const simt::uint3 &u) {
    if constexpr (D == 1) return R(u.x);
    else if constexpr (D == 2) return R(u.y, u.x);
    else return R(u.z, u.y, u.x);
}
template <int D> size_t linearize(const simt::uint3 &pos, const simt::uint3 &extent) {
    size_t n = 0;
    for (int d = 0; d < D; d++) n = n * pick<D>(extent, d) + pick<D>(pos, d);
    return n;
}
inline simt::uint3 global_extent(const simt::ThreadInfo &t) {
    return simt::uint3{t.threadgroups_per_grid.x * t.threads_per_threadgroup.x,
                       t.threadgroups_per_grid.y * t.threads_per_threadgroup.y,
                       t.threadgroups_per_grid.z * t.threads_per_threadgroup.z};
}
struct construct_tag {};  // nd_item, group and sub_group are made by the emulator only
}  // namespace detail

class sub_group {
  public:
    using id_type = id<1>;
    using range_type = range<1>;
    using linear_id_type = uint32_t;
    static constexpr int dimensions = 1;
    static constexpr memory_scope fence_scope = memory_scope::sub_group;

    explicit sub_group(detail::construct_tag) {}
    id<1> get_group_id() const { return id<1>(simt::thread_info().simdgroup_index_in_threadgroup); }
    id<1> get_local_id() const { return id<1>(simt::thread_info().thread_index_in_simdgroup); }
    range<1> get_local_range() const { return range<1>(simt::thread_info().lanes_in_simdgroup); }
    range<1> get_group_range() const { return range<1>(simt::thread_info().simdgroups_per_threadgroup); }
    range<1> get_max_local_range() const { return range<1>(simt::thread_info().threads_per_simdgroup); }
    uint32_t get_group_linear_id() const { return simt::thread_info().simdgroup_index_in_threadgroup; }
    uint32_t get_local_linear_id() const { return simt::thread_info().thread_index_in_simdgroup; }
    uint32_t get_group_linear_range() const { return simt::thread_info().simdgroups_per_threadgroup; }
    uint32_t get_local_linear_range() const { return simt::thread_info().lanes_in_simdgroup; }
    bool leader() const { return get_local_linear_id() == 0; }
};

template <int D = 1> class group {
  public:
    using id_type = id<D>;
    using range_type = range<D>;
    using linear_id_type = size_t;
    static constexpr int dimensions = D;
    static constexpr memory_scope fence_scope = memory_scope::work_group;

    explicit group(detail::construct_tag) {}
    id<D> get_group_id() const { return detail::make_index<id<D>, D>(simt::thread_info().threadgroup_position_in_grid); }
    size_t get_group_id(int dim) const { return detail::pick<D>(simt::thread_info().threadgroup_position_in_grid, dim); }
    id<D> get_local_id() const { return detail::make_index<id<D>, D>(simt::thread_info().thread_position_in_threadgroup); }
    size_t get_local_id(int dim) const { return detail::pick<D>(simt::thread_info().thread_position_in_threadgroup, dim); }
    range<D> get_local_range() const { return detail::make_index<range<D>, D>(simt::thread_info().threads_per_threadgroup); }
    size_t get_local_range(int dim) const { return detail::pick<D>(simt::thread_info().threads_per_threadgroup, dim); }
    range<D> get_max_local_range() const { return get_local_range(); }
    range<D> get_group_range() const { return detail::make_index<range<D>, D>(simt::thread_info().threadgroups_per_grid); }
    size_t get_group_range(int dim) const { return detail::pick<D>(simt::thread_info().threadgroups_per_grid, dim); }
    size_t operator[](int dim) const { return get_group_id(dim); }
    size_t get_group_linear_id() const {
        const simt::ThreadInfo &t = simt::thread_info();
        return detail::linearize<D>(t.threadgroup_position_in_grid, t.threadgroups_per_grid);
    }
    size_t get_local_linear_id() const { return simt::thread_info().thread_index_in_threadgroup; }
    size_t get_group_linear_range() const { return get_group_range().size(); }
    size_t get_local_linear_range() const { return get_local_range().size(); }
    bool leader() const { return get_local_linear_id() == 0; }
};

template <int D = 1> class nd_item {
  public:
    static constexpr int dimensions = D;

    explicit nd_item(detail::construct_tag) {}
    id<D> get_global_id() const { return detail::make_index<id<D>, D>(simt::thread_info().thread_position_in_grid); }
    size_t get_global_id(int dim) const { return detail::pick<D>(simt::thread_info().thread_position_in_grid, dim); }
    size_t get_global_linear_id() const {
        const simt::ThreadInfo &t = simt::thread_info();
        return detail::linearize<D>(t.thread_position_in_grid, detail::global_extent(t));
    }
    id<D> get_local_id() const { return detail::make_index<id<D>, D>(simt::thread_info().thread_position_in_threadgroup); }
    size_t get_local_id(int dim) const { return detail::pick<D>(simt::thread_info().thread_position_in_threadgroup, dim); }
    size_t get_local_linear_id() const { return simt::thread_info().thread_index_in_threadgroup; }
    group<D> get_group() const { return group<D>(detail::construct_tag{}); }
    size_t get_group(int dim) const { return detail::pick<D>(simt::thread_info().threadgroup_position_in_grid, dim); }
    size_t get_group_linear_id() const { return get_group().get_group_linear_id(); }
    sub_group get_sub_group() const { return sub_group(detail::construct_tag{}); }
    range<D> get_group_range() const { return detail::make_index<range<D>, D>(simt::thread_info().threadgroups_per_grid); }
    size_t get_group_range(int dim) const { return detail::pick<D>(simt::thread_info().threadgroups_per_grid, dim); }
    range<D> get_global_range() const { return detail::make_index<range<D>, D>(detail::global_extent(simt::thread_info())); }
    size_t get_global_range(int dim) const { return detail::pick<D>(detail::global_extent(simt::thread_info()), dim); }
    range<D> get_local_range() const { return detail::make_index<range<D>, D>(simt::thread_info().threads_per_threadgroup); }
    size_t get_local_range(int dim) const { return detail::pick<D>(simt::thread_info().threads_per_threadgroup, dim); }
    nd_range<D> get_nd_range() const { return nd_range<D>(get_global_range(), get_local_range()); }
    id<D> get_offset() const { return id<D>(); }
    // Deprecated in SYCL 2020 (group_barrier(get_group())), kept because it is still valid code.
    void barrier(access::fence_space = access::fence_space::global_and_local,
                 simt::Site site = simt::Site::here()) const {
        simt::barrier(site);
    }
};

// The basic parallel_for's work-item (handler::parallel_for(range<D>, ...)).
template <int D = 1, bool WithOffset = false> class item {
  public:
    static constexpr int dimensions = D;
    explicit item(detail::construct_tag) {}
    id<D> get_id() const { return detail::make_index<id<D>, D>(simt::thread_info().thread_position_in_grid); }
    size_t get_id(int dim) const { return detail::pick<D>(simt::thread_info().thread_position_in_grid, dim); }
    size_t operator[](int dim) const { return get_id(dim); }
    range<D> get_range() const { return detail::make_index<range<D>, D>(detail::global_extent(simt::thread_info())); }
    size_t get_range(int dim) const { return detail::pick<D>(detail::global_extent(simt::thread_info()), dim); }
    size_t get_linear_id() const {
        const simt::ThreadInfo &t = simt::thread_info();
        return detail::linearize<D>(t.thread_position_in_grid, detail::global_extent(t));
    }
    operator id<D>() const { return get_id(); }
    operator std::conditional_t<D == 1, size_t, detail::no_conversion>() const {
        if constexpr (D == 1) return get_id(0);
        else return {};
    }
};

template <class T> struct is_group : std::false_type {};
template <int D> struct is_group<group<D>> : std::true_type {};
template <> struct is_group<sub_group> : std::true_type {};
template <class T> inline constexpr bool is_group_v = is_group<T>::value;

// ---- device copyability (kernel functors) ----------------------------------------------------------------
template <class T> struct is_device_copyable : std::is_trivially_copyable<T> {};
template <class T> struct is_device_copyable<const T> : is_device_copyable<T> {};
template <class T> inline constexpr bool is_device_copyable_v = is_device_copyable<T>::value;

// ---- half, bit_cast ----------------------------------------------------------------------------------------
using half = _Float16;

template <class To, class From> constexpr To bit_cast(const From &from) noexcept {
    static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
    static_assert(std::is_trivially_copyable<To>::value && std::is_trivially_copyable<From>::value,
                  "bit_cast needs trivially copyable types");
    return __builtin_bit_cast(To, from);
}

namespace detail {
template <class T> inline constexpr bool is_floating_v = std::is_floating_point<T>::value || std::is_same<T, half>::value;
template <class T> inline constexpr bool is_arith_v = std::is_arithmetic<T>::value || std::is_same<T, half>::value;
}  // namespace detail

// ---- function objects -----------------------------------------------------------------------------------
#define GOKV_SYCL_FUNCTOR(name, expr)                                                                           \
    template <class T = void> struct name {                                                                     \
        T operator()(const T &x, const T &y) const { return T(expr); }                                          \
    };                                                                                                          \
    template <> struct name<void> {                                                                             \
        template <class T, class U> auto operator()(T &&x, U &&y) const { return (expr); }                      \
    };
GOKV_SYCL_FUNCTOR(plus, x + y)
GOKV_SYCL_FUNCTOR(multiplies, x * y)
GOKV_SYCL_FUNCTOR(bit_and, x & y)
GOKV_SYCL_FUNCTOR(bit_or, x | y)
GOKV_SYCL_FUNCTOR(bit_xor, x ^ y)
GOKV_SYCL_FUNCTOR(logical_and, x && y)
GOKV_SYCL_FUNCTOR(logical_or, x || y)
GOKV_SYCL_FUNCTOR(minimum, (x < y) ? x : y)
GOKV_SYCL_FUNCTOR(maximum, (x > y) ? x : y)
#undef GOKV_SYCL_FUNCTOR

// The identities of the function objects (exclusive scans without an initial value need one).
namespace detail {
template <class Op, class T> struct identity_of {
    static constexpr bool known = false;
};
template <class T> constexpr T infinity_of() {
    if constexpr (std::is_same<T, half>::value) return T(std::numeric_limits<float>::infinity());
    else return std::numeric_limits<T>::infinity();
}
#define GOKV_SYCL_IDENTITY(name, cond, value)                                                                   \
    template <class U, class T> struct identity_of<name<U>, T> {                                                \
        static constexpr bool known = (cond);                                                                   \
        static constexpr T get() { return (value); }                                                                      \
    };
GOKV_SYCL_IDENTITY(plus, is_arith_v<T>, T(0))
GOKV_SYCL_IDENTITY(multiplies, is_arith_v<T>, T(1))
GOKV_SYCL_IDENTITY(bit_and, std::is_integral<T>::value, T(~T(0)))
GOKV_SYCL_IDENTITY(bit_or, std::is_integral<T>::value, T(0))
GOKV_SYCL_IDENTITY(bit_xor, std::is_integral<T>::value, T(0))
GOKV_SYCL_IDENTITY(logical_and, (std::is_same<T, bool>::value), T(true))
GOKV_SYCL_IDENTITY(logical_or, (std::is_same<T, bool>::value), T(false))
GOKV_SYCL_IDENTITY(minimum, is_arith_v<T>,
                   is_floating_v<T> ? infinity_of<T>()
                                    : T(std::numeric_limits<std::conditional_t<is_floating_v<T>, int, T>>::max()))
GOKV_SYCL_IDENTITY(maximum, is_arith_v<T>,
                   is_floating_v<T> ? T(-infinity_of<T>())
                                    : T(std::numeric_limits<std::conditional_t<is_floating_v<T>, int, T>>::lowest()))
#undef GOKV_SYCL_IDENTITY
}  // namespace detail

template <class BinaryOperation, class AccumulatorT>
struct has_known_identity : std::integral_constant<bool, detail::identity_of<BinaryOperation, AccumulatorT>::known> {};
template <class BinaryOperation, class AccumulatorT>
inline constexpr bool has_known_identity_v = has_known_identity<BinaryOperation, AccumulatorT>::value;
template <class BinaryOperation, class AccumulatorT> struct known_identity {
    static_assert(has_known_identity_v<BinaryOperation, AccumulatorT>, "this operation has no known identity");
    static constexpr AccumulatorT value = detail::identity_of<BinaryOperation, AccumulatorT>::get();
};
template <class BinaryOperation, class AccumulatorT>
inline constexpr AccumulatorT known_identity_v = known_identity<BinaryOperation, AccumulatorT>::value;

// ---- math (no fast math: the C library's functions; half computes in float and rounds once) ----------------
#define GOKV_SYCL_MATH1(name, expr)                                                                             \
    inline float name(float x) { return (expr); }                                                               \
    inline double name(double x) { return (expr); }                                                             \
    inline half name(half h) { return half(name(float(h))); }
GOKV_SYCL_MATH1(exp, std::exp(x))
GOKV_SYCL_MATH1(exp2, std::exp2(x))
GOKV_SYCL_MATH1(exp10, std::pow(decltype(x)(10), x))
GOKV_SYCL_MATH1(expm1, std::expm1(x))
GOKV_SYCL_MATH1(log, std::log(x))
GOKV_SYCL_MATH1(log2, std::log2(x))
GOKV_SYCL_MATH1(log10, std::log10(x))
GOKV_SYCL_MATH1(log1p, std::log1p(x))
GOKV_SYCL_MATH1(sqrt, std::sqrt(x))
GOKV_SYCL_MATH1(rsqrt, decltype(x)(1) / std::sqrt(x))
GOKV_SYCL_MATH1(cbrt, std::cbrt(x))
GOKV_SYCL_MATH1(fabs, std::fabs(x))
GOKV_SYCL_MATH1(floor, std::floor(x))
GOKV_SYCL_MATH1(ceil, std::ceil(x))
GOKV_SYCL_MATH1(rint, std::rint(x))
GOKV_SYCL_MATH1(round, std::round(x))
GOKV_SYCL_MATH1(trunc, std::trunc(x))
GOKV_SYCL_MATH1(sin, std::sin(x))
GOKV_SYCL_MATH1(cos, std::cos(x))
GOKV_SYCL_MATH1(tan, std::tan(x))
GOKV_SYCL_MATH1(asin, std::asin(x))
GOKV_SYCL_MATH1(acos, std::acos(x))
GOKV_SYCL_MATH1(atan, std::atan(x))
GOKV_SYCL_MATH1(sinh, std::sinh(x))
GOKV_SYCL_MATH1(cosh, std::cosh(x))
GOKV_SYCL_MATH1(tanh, std::tanh(x))
GOKV_SYCL_MATH1(erf, std::erf(x))
#undef GOKV_SYCL_MATH1

#define GOKV_SYCL_MATH2(name, expr)                                                                             \
    inline float name(float x, float y) { return (expr); }                                                      \
    inline double name(double x, double y) { return (expr); }                                                  \
    inline half name(half a, half b) { return half(name(float(a), float(b))); }
GOKV_SYCL_MATH2(fmin, std::fmin(x, y))
GOKV_SYCL_MATH2(fmax, std::fmax(x, y))
GOKV_SYCL_MATH2(fmod, std::fmod(x, y))
GOKV_SYCL_MATH2(pow, std::pow(x, y))
GOKV_SYCL_MATH2(atan2, std::atan2(x, y))
GOKV_SYCL_MATH2(copysign, std::copysign(x, y))
GOKV_SYCL_MATH2(hypot, std::hypot(x, y))
GOKV_SYCL_MATH2(fdim, std::fdim(x, y))
#undef GOKV_SYCL_MATH2

inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
inline double fma(double a, double b, double c) { return std::fma(a, b, c); }
inline half fma(half a, half b, half c) { return half(std::fma(float(a), float(b), float(c))); }
inline float mad(float a, float b, float c) { return a * b + c; }
inline float ldexp(float x, int k) { return std::ldexp(x, k); }
inline double ldexp(double x, int k) { return std::ldexp(x, k); }

#define GOKV_SYCL_RELATIONAL(name, expr)                                                                        \
    inline bool name(float x) { return (expr); }                                                                \
    inline bool name(double x) { return (expr); }                                                               \
    inline bool name(half h) { return name(float(h)); }
GOKV_SYCL_RELATIONAL(isnan, std::isnan(x))
GOKV_SYCL_RELATIONAL(isinf, std::isinf(x))
GOKV_SYCL_RELATIONAL(isfinite, std::isfinite(x))
GOKV_SYCL_RELATIONAL(isnormal, std::isnormal(x))
GOKV_SYCL_RELATIONAL(signbit, std::signbit(x))
#undef GOKV_SYCL_RELATIONAL

// min, max, clamp: the common functions for floating types (fmin/fmax for clamp), the integer functions
// for integers; both with one type for all arguments, as the specification's scalar overloads.
template <class T, std::enable_if_t<detail::is_arith_v<T>, int> = 0> T min(T x, T y) { return y < x ? y : x; }
template <class T, std::enable_if_t<detail::is_arith_v<T>, int> = 0> T max(T x, T y) { return x < y ? y : x; }
template <class T, std::enable_if_t<detail::is_arith_v<T>, int> = 0> T clamp(T x, T minval, T maxval) {
    if constexpr (detail::is_floating_v<T>) return fmin(fmax(x, minval), maxval);
    else return min(max(x, minval), maxval);
}
template <class T, std::enable_if_t<detail::is_floating_v<T>, int> = 0> T sign(T x) {
    if (isnan(x)) return T(0);
    return x > T(0) ? T(1) : x < T(0) ? T(-1) : x;
}

template <class T, std::enable_if_t<std::is_integral<T>::value, int> = 0> std::make_unsigned_t<T> abs(T x) {
    using U = std::make_unsigned_t<T>;
    return x < 0 ? U(U(0) - U(x)) : U(x);
}
template <class T, std::enable_if_t<std::is_integral<T>::value, int> = 0> T popcount(T x) {
    return T(__builtin_popcountll(static_cast<unsigned long long>(std::make_unsigned_t<T>(x))));
}
template <class T, std::enable_if_t<std::is_integral<T>::value, int> = 0> T clz(T x) {
    constexpr int bits = int(sizeof(T) * 8);
    auto u = static_cast<unsigned long long>(std::make_unsigned_t<T>(x));
    return T(u == 0 ? bits : __builtin_clzll(u) - (64 - bits));
}
template <class T, std::enable_if_t<std::is_integral<T>::value, int> = 0> T ctz(T x) {
    constexpr int bits = int(sizeof(T) * 8);
    auto u = static_cast<unsigned long long>(std::make_unsigned_t<T>(x));
    return T(u == 0 ? bits : __builtin_ctzll(u));
}

}  // namespace _V1
}  // namespace sycl

template <> struct std::is_error_code_enum<sycl::errc> : std::true_type {};

#endif
