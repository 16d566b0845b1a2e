// sycl::atomic_ref (see ../sycl.hpp): real atomics (GCC's __atomic builtins), since work-groups may run on
// several OS threads at once. Every operation is sequentially consistent whatever order it names: the
// emulator cannot show a missing acquire or release (x86-64 would hide most of them anyway).
// Floating-point add, min and max are compare-and-swap loops on the bits.
#ifndef GOKV_SYCL_EMU_ATOMIC_HPP
#define GOKV_SYCL_EMU_ATOMIC_HPP

#include "emu_core.hpp"

namespace sycl {
inline namespace _V1 {

template <class T, memory_order DefaultOrder, memory_scope DefaultScope,
          access::address_space AddressSpace = access::address_space::generic_space>
class atomic_ref {
    static_assert(std::is_integral<T>::value || std::is_floating_point<T>::value,
                  "the emulator's atomic_ref takes integer and floating-point types");
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomic_ref takes 32- and 64-bit types");
    using bits_t = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    static constexpr int kOrder = __ATOMIC_SEQ_CST;

  public:
    using value_type = T;
    using difference_type = T;
    static constexpr size_t required_alignment = sizeof(T);
    static constexpr bool is_always_lock_free = true;
    static constexpr memory_order default_read_order =
        DefaultOrder == memory_order::acq_rel ? memory_order::acquire
        : DefaultOrder == memory_order::release ? memory_order::relaxed : DefaultOrder;
    static constexpr memory_order default_write_order =
        DefaultOrder == memory_order::acq_rel ? memory_order::release
        : DefaultOrder == memory_order::acquire ? memory_order::relaxed : DefaultOrder;
    static constexpr memory_order default_read_modify_write_order = DefaultOrder;
    static constexpr memory_scope default_scope = DefaultScope;

    explicit atomic_ref(T &ref) : p_(&ref) {}
    atomic_ref(const atomic_ref &) noexcept = default;
    atomic_ref &operator=(const atomic_ref &) = delete;

    bool is_lock_free() const noexcept { return true; }

    void store(T v, memory_order = default_write_order, memory_scope = default_scope) const noexcept {
        __atomic_store_n(bits(), to_bits(v), kOrder);
    }
    T operator=(T v) const noexcept {
        store(v);
        return v;
    }
    T load(memory_order = default_read_order, memory_scope = default_scope) const noexcept {
        return from_bits(__atomic_load_n(bits(), kOrder));
    }
    operator T() const noexcept { return load(); }
    T exchange(T v, memory_order = default_read_modify_write_order, memory_scope = default_scope) const noexcept {
        return from_bits(__atomic_exchange_n(bits(), to_bits(v), kOrder));
    }
    bool compare_exchange_strong(T &expected, T desired, memory_order, memory_order,
                                 memory_scope = default_scope) const noexcept {
        return cas(expected, desired);
    }
    bool compare_exchange_strong(T &expected, T desired, memory_order = default_read_modify_write_order,
                                 memory_scope = default_scope) const noexcept {
        return cas(expected, desired);
    }
    bool compare_exchange_weak(T &expected, T desired, memory_order, memory_order,
                               memory_scope = default_scope) const noexcept {
        return cas(expected, desired);
    }
    bool compare_exchange_weak(T &expected, T desired, memory_order = default_read_modify_write_order,
                               memory_scope = default_scope) const noexcept {
        return cas(expected, desired);
    }

    T fetch_add(T v, memory_order = default_read_modify_write_order, memory_scope = default_scope) const noexcept {
        if constexpr (std::is_integral<T>::value) return __atomic_fetch_add(p_, v, kOrder);
        else return update([v](T old) { return T(old + v); });
    }
    T fetch_sub(T v, memory_order = default_read_modify_write_order, memory_scope = default_scope) const noexcept {
        if constexpr (std::is_integral<T>::value) return __atomic_fetch_sub(p_, v, kOrder);
        else return update([v](T old) { return T(old - v); });
    }
    T fetch_min(T v, memory_order = default_read_modify_write_order, memory_scope = default_scope) const noexcept {
        return update([v](T old) { return v < old ? v : old; });
    }
    T fetch_max(T v, memory_order = default_read_modify_write_order, memory_scope = default_scope) const noexcept {
        return update([v](T old) { return old < v ? v : old; });
    }
    template <class U = T, std::enable_if_t<std::is_integral<U>::value, int> = 0>
    T fetch_and(T v, memory_order = default_read_modify_write_order, memory_scope = default_scope) const noexcept {
        return __atomic_fetch_and(p_, v, kOrder);
    }
    template <class U = T, std::enable_if_t<std::is_integral<U>::value, int> = 0>
    T fetch_or(T v, memory_order = default_read_modify_write_order, memory_scope = default_scope) const noexcept {
        return __atomic_fetch_or(p_, v, kOrder);
    }
    template <class U = T, std::enable_if_t<std::is_integral<U>::value, int> = 0>
    T fetch_xor(T v, memory_order = default_read_modify_write_order, memory_scope = default_scope) const noexcept {
        return __atomic_fetch_xor(p_, v, kOrder);
    }

    T operator+=(T v) const noexcept { return T(fetch_add(v) + v); }
    T operator-=(T v) const noexcept { return T(fetch_sub(v) - v); }
    template <class U = T, std::enable_if_t<std::is_integral<U>::value, int> = 0> T operator&=(T v) const noexcept {
        return T(fetch_and(v) & v);
    }
    template <class U = T, std::enable_if_t<std::is_integral<U>::value, int> = 0> T operator|=(T v) const noexcept {
        return T(fetch_or(v) | v);
    }
    template <class U = T, std::enable_if_t<std::is_integral<U>::value, int> = 0> T operator^=(T v) const noexcept {
        return T(fetch_xor(v) ^ v);
    }
    template <class U = T, std::enable_if_t<std::is_integral<U>::value, int> = 0> T operator++(int) const noexcept {
        return fetch_add(T(1));
    }
    template <class U = T, std::enable_if_t<std::is_integral<U>::value, int> = 0> T operator++() const noexcept {
        return T(fetch_add(T(1)) + T(1));
    }
    template <class U = T, std::enable_if_t<std::is_integral<U>::value, int> = 0> T operator--(int) const noexcept {
        return fetch_sub(T(1));
    }
    template <class U = T, std::enable_if_t<std::is_integral<U>::value, int> = 0> T operator--() const noexcept {
        return T(fetch_sub(T(1)) - T(1));
    }

  private:
    bits_t *bits() const noexcept { return reinterpret_cast<bits_t *>(p_); }
    static bits_t to_bits(T v) noexcept { return __builtin_bit_cast(bits_t, v); }
    static T from_bits(bits_t b) noexcept { return __builtin_bit_cast(T, b); }
    bool cas(T &expected, T desired) const noexcept {
        bits_t e = to_bits(expected);
        bool ok = __atomic_compare_exchange_n(bits(), &e, to_bits(desired), false, kOrder, kOrder);
        if (!ok) expected = from_bits(e);
        return ok;
    }
    template <class F> T update(F f) const noexcept {
        bits_t old = __atomic_load_n(bits(), kOrder);
        while (!__atomic_compare_exchange_n(bits(), &old, to_bits(f(from_bits(old))), false, kOrder, kOrder)) {
        }
        return from_bits(old);
    }

    T *p_;
};

}  // namespace _V1
}  // namespace sycl

#endif
