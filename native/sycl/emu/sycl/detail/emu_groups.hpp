// group_barrier and the SYCL 2020 group algorithms (see ../sycl.hpp), for sub_group and group<D>.
//
// A sub-group algorithm is one simt simdgroup exchange: every lane of the sub-group must reach the same
// call site, and the result is computed from all lanes' values in lane order (deterministic rounding).
// A work-group algorithm is the sub-group one, then a combination across sub-groups through the
// work-group's scratch: 16 bytes per sub-group plus one slot, at the end of the work-group's local memory
// (the handler reserves it beyond the local_accessors), between two simt barriers at the caller's site.
// The first barrier keeps a sub-group from overwriting a slot that another still reads for the previous
// algorithm; a single-sub-group work-group needs no scratch and no barrier.
//
// Results the specification leaves unspecified are poison here (every byte 0xFF: a NaN, or -1): a
// shift_group_left/right or permute_group_by_xor reading beyond the sub-group, a select_from_group of a lane
// the sub-group lacks. Arguments the specification requires to be uniform (shift deltas, xor masks,
// broadcast ids) are checked across the sub-group; an out-of-range work-group broadcast id is an error.
#ifndef GOKV_SYCL_EMU_GROUPS_HPP
#define GOKV_SYCL_EMU_GROUPS_HPP

#include <stdexcept>

#include "emu_core.hpp"

namespace sycl {
inline namespace _V1 {
namespace detail {

using lanes_t = simt::detail::SimdLanes;
constexpr size_t kScratchSlot = simt::detail::kSimdValueBytes;

// The scratch the handler reserves at the end of a work-group's local memory (one slot per sub-group and
// one for broadcasts).
constexpr size_t group_scratch_bytes(size_t sub_groups) { return kScratchSlot * (sub_groups + 1); }
inline unsigned char *group_scratch() {
    const simt::ThreadInfo &t = simt::thread_info();
    return static_cast<unsigned char *>(t.threadgroup_memory) + t.threadgroup_memory_bytes -
           group_scratch_bytes(t.simdgroups_per_threadgroup);
}
template <class T> T load_slot(const unsigned char *scratch, size_t slot) {
    T v;
    std::memcpy(static_cast<void *>(&v), scratch + slot * kScratchSlot, sizeof(T));
    return v;
}
template <class T> void store_slot(unsigned char *scratch, size_t slot, const T &v) {
    std::memcpy(scratch + slot * kScratchSlot, static_cast<const void *>(&v), sizeof(T));
}

template <class T> void check_value() {
    static_assert(std::is_trivially_copyable<T>::value, "group algorithm values must be trivially copyable");
    static_assert(sizeof(T) <= kScratchSlot, "the emulator's group algorithms take values of at most 16 bytes");
}
template <class Op> void check_op() {
    static_assert(std::is_default_constructible<Op>::value,
                  "group algorithms take a SYCL function object (sycl::plus<>, sycl::maximum<>, ...)");
}
template <class T> T poison() {
    T v;
    std::memset(static_cast<void *>(&v), 0xFF, sizeof(T));
    return v;
}

// ---- simt resolvers: all lanes' values in, every lane's result out --------------------------------------
template <class T, class Op> const char *resolve_reduce(const lanes_t &l) {
    return simt::detail::resolve_fold<T>(l, [](const T &a, const T &b) { return T(Op()(a, b)); });
}
template <class T, class Op> const char *resolve_inclusive(const lanes_t &l) {
    T acc = simt::detail::lane_value<T>(l, 0);
    simt::detail::set_lane(l, 0, acc);
    for (uint32_t i = 1; i < l.count; i++) {
        acc = T(Op()(acc, simt::detail::lane_value<T>(l, i)));
        simt::detail::set_lane(l, i, acc);
    }
    return nullptr;
}
template <class T, class Op> const char *resolve_exclusive(const lanes_t &l) {
    T acc = identity_of<Op, T>::get();
    for (uint32_t i = 0; i < l.count; i++) {
        T v = simt::detail::lane_value<T>(l, i);
        simt::detail::set_lane(l, i, acc);
        acc = T(Op()(acc, v));
    }
    return nullptr;
}
inline bool uniform_arg(const lanes_t &l) {
    for (uint32_t i = 1; i < l.count; i++)
        if (l.arg[i] != l.arg[0]) return false;
    return true;
}
template <class T> const char *resolve_broadcast(const lanes_t &l) {
    if (!uniform_arg(l)) return "group_broadcast: the id differs between work-items (it must be uniform)";
    if (l.arg[0] >= l.count) return "group_broadcast: the id is outside the sub-group";
    for (uint32_t i = 0; i < l.count; i++) simt::detail::set_lane(l, i, simt::detail::lane_value<T>(l, l.arg[0]));
    return nullptr;
}
enum class permute { left, right, select, xor_mask };
template <class T, permute P> const char *resolve_permute(const lanes_t &l) {
    if (P != permute::select && !uniform_arg(l)) {
        return P == permute::xor_mask ? "permute_group_by_xor: the mask differs between work-items (it must be uniform)"
                                      : "shift_group_left/right: the delta differs between work-items (it must be uniform)";
    }
    for (uint32_t i = 0; i < l.count; i++) {
        uint64_t from = P == permute::left    ? uint64_t(i) + l.arg[i]
                        : P == permute::right ? (l.arg[i] <= i ? uint64_t(i - l.arg[i]) : UINT64_MAX)
                        : P == permute::select ? uint64_t(l.arg[i])
                                               : uint64_t(i ^ l.arg[i]);
        simt::detail::set_lane(l, i, from < l.count ? simt::detail::lane_value<T>(l, uint32_t(from)) : poison<T>());
    }
    return nullptr;
}

// ---- sub-group and work-group layers ----------------------------------------------------------------------
template <class T> T sub_group_call(const char *op, const T &x, uint32_t arg, simt::detail::SimdResolver resolve,
                                    const simt::Site &site) {
    check_value<T>();
    return simt::detail::simd_call(op, x, arg, resolve, site);
}

template <class T, class Op> T group_reduce(const char *name, T x, const simt::Site &site) {
    T r = sub_group_call(name, x, 0, resolve_reduce<T, Op>, site);
    const simt::ThreadInfo &t = simt::thread_info();
    const uint32_t n = t.simdgroups_per_threadgroup;
    if (n == 1) return r;
    unsigned char *scratch = group_scratch();
    simt::barrier(site);
    if (t.thread_index_in_simdgroup == 0) store_slot(scratch, t.simdgroup_index_in_threadgroup, r);
    simt::barrier(site);
    T acc = load_slot<T>(scratch, 0);
    for (uint32_t i = 1; i < n; i++) acc = T(Op()(acc, load_slot<T>(scratch, i)));
    return acc;
}

// The scan of the sub-group totals before this work-item's sub-group, combined with its sub-group scan.
// `inclusive_in_sub_group` is this work-item's inclusive scan within its sub-group; `mine` its result so far.
template <class T, class Op> T group_scan_combine(T mine, T inclusive_in_sub_group, const simt::Site &site) {
    const simt::ThreadInfo &t = simt::thread_info();
    const uint32_t n = t.simdgroups_per_threadgroup;
    if (n == 1) return mine;
    unsigned char *scratch = group_scratch();
    simt::barrier(site);
    if (t.thread_index_in_simdgroup + 1 == t.lanes_in_simdgroup)
        store_slot(scratch, t.simdgroup_index_in_threadgroup, inclusive_in_sub_group);
    simt::barrier(site);
    const uint32_t sg = t.simdgroup_index_in_threadgroup;
    if (sg == 0) return mine;
    T before = load_slot<T>(scratch, 0);
    for (uint32_t i = 1; i < sg; i++) before = T(Op()(before, load_slot<T>(scratch, i)));
    return T(Op()(before, mine));
}

template <class Group, class T, class Op> T reduce(T x, const simt::Site &site) {
    check_op<Op>();
    if constexpr (std::is_same<Group, sub_group>::value)
        return sub_group_call("reduce_over_group", x, 0, resolve_reduce<T, Op>, site);
    else return group_reduce<T, Op>("reduce_over_group", x, site);
}
template <class Group, class T, class Op> T inclusive_scan(T x, const simt::Site &site) {
    check_op<Op>();
    T r = sub_group_call("inclusive_scan_over_group", x, 0, resolve_inclusive<T, Op>, site);
    if constexpr (std::is_same<Group, sub_group>::value) return r;
    else return group_scan_combine<T, Op>(r, r, site);
}
template <class Group, class T, class Op> T exclusive_scan(T x, const simt::Site &site) {
    check_op<Op>();
    static_assert(has_known_identity_v<Op, T>,
                  "exclusive_scan_over_group without an init needs an operation with a known identity");
    T r = sub_group_call("exclusive_scan_over_group", x, 0, resolve_exclusive<T, Op>, site);
    if constexpr (std::is_same<Group, sub_group>::value) return r;
    else return group_scan_combine<T, Op>(r, T(Op()(r, x)), site);
}

template <class T> T group_broadcast_linear(T x, size_t source, const simt::Site &site) {
    check_value<T>();
    const simt::ThreadInfo &t = simt::thread_info();
    const size_t size = size_t(t.threads_per_threadgroup.x) * t.threads_per_threadgroup.y * t.threads_per_threadgroup.z;
    if (source >= size) {
        throw std::out_of_range("group_broadcast at " + simt::describe(site) + ": id " + std::to_string(source) +
                                " is outside the work-group of " + std::to_string(size));
    }
    unsigned char *scratch = group_scratch();
    simt::barrier(site);
    if (t.thread_index_in_threadgroup == source) store_slot(scratch, t.simdgroups_per_threadgroup, x);
    simt::barrier(site);
    return load_slot<T>(scratch, t.simdgroups_per_threadgroup);
}

template <class Group> void check_group() {
    static_assert(is_group_v<Group>, "a group algorithm takes a sycl::group or a sycl::sub_group");
}

}  // namespace detail

// ---- barriers --------------------------------------------------------------------------------------------
template <class Group>
void group_barrier(Group, memory_scope = Group::fence_scope, simt::Site site = simt::Site::here()) {
    detail::check_group<Group>();
    if constexpr (std::is_same<Group, sub_group>::value)
        (void)simt::detail::simd_call("group_barrier(sub_group)", uint32_t(1), 0, simt::detail::resolve_any, site);
    else simt::barrier(site);
}

// ---- reductions and scans ----------------------------------------------------------------------------------
template <class Group, class T, class BinaryOperation>
T reduce_over_group(Group, T x, BinaryOperation, simt::Site site = simt::Site::here()) {
    detail::check_group<Group>();
    return detail::reduce<Group, T, BinaryOperation>(x, site);
}
template <class Group, class V, class T, class BinaryOperation>
T reduce_over_group(Group, V x, T init, BinaryOperation op, simt::Site site = simt::Site::here()) {
    detail::check_group<Group>();
    return T(op(init, detail::reduce<Group, T, BinaryOperation>(T(x), site)));
}
template <class Group, class T, class BinaryOperation>
T inclusive_scan_over_group(Group, T x, BinaryOperation, simt::Site site = simt::Site::here()) {
    detail::check_group<Group>();
    return detail::inclusive_scan<Group, T, BinaryOperation>(x, site);
}
template <class Group, class V, class BinaryOperation, class T>
T inclusive_scan_over_group(Group, V x, BinaryOperation op, T init, simt::Site site = simt::Site::here()) {
    detail::check_group<Group>();
    return T(op(init, detail::inclusive_scan<Group, T, BinaryOperation>(T(x), site)));
}
template <class Group, class T, class BinaryOperation>
T exclusive_scan_over_group(Group, T x, BinaryOperation, simt::Site site = simt::Site::here()) {
    detail::check_group<Group>();
    return detail::exclusive_scan<Group, T, BinaryOperation>(x, site);
}
template <class Group, class V, class T, class BinaryOperation>
T exclusive_scan_over_group(Group, V x, T init, BinaryOperation op, simt::Site site = simt::Site::here()) {
    detail::check_group<Group>();
    return T(op(init, detail::exclusive_scan<Group, T, BinaryOperation>(T(x), site)));
}

// ---- votes ------------------------------------------------------------------------------------------------
template <class Group> bool any_of_group(Group, bool pred, simt::Site site = simt::Site::here()) {
    detail::check_group<Group>();
    return detail::reduce<Group, bool, logical_or<bool>>(pred, site);
}
template <class Group, class T, class Predicate>
bool any_of_group(Group g, T x, Predicate pred, simt::Site site = simt::Site::here()) {
    return any_of_group(g, bool(pred(x)), site);
}
template <class Group> bool all_of_group(Group, bool pred, simt::Site site = simt::Site::here()) {
    detail::check_group<Group>();
    return detail::reduce<Group, bool, logical_and<bool>>(pred, site);
}
template <class Group, class T, class Predicate>
bool all_of_group(Group g, T x, Predicate pred, simt::Site site = simt::Site::here()) {
    return all_of_group(g, bool(pred(x)), site);
}
template <class Group> bool none_of_group(Group g, bool pred, simt::Site site = simt::Site::here()) {
    return !any_of_group(g, pred, site);
}
template <class Group, class T, class Predicate>
bool none_of_group(Group g, T x, Predicate pred, simt::Site site = simt::Site::here()) {
    return !any_of_group(g, bool(pred(x)), site);
}

// ---- broadcasts -------------------------------------------------------------------------------------------
template <class T> T group_broadcast(sub_group, T x, simt::Site site = simt::Site::here()) {
    return detail::sub_group_call("group_broadcast", x, 0, detail::resolve_broadcast<T>, site);
}
template <class T>
T group_broadcast(sub_group, T x, sub_group::linear_id_type local_linear_id, simt::Site site = simt::Site::here()) {
    return detail::sub_group_call("group_broadcast", x, local_linear_id, detail::resolve_broadcast<T>, site);
}
template <class T> T group_broadcast(sub_group, T x, sub_group::id_type local_id, simt::Site site = simt::Site::here()) {
    return detail::sub_group_call("group_broadcast", x, uint32_t(local_id[0]), detail::resolve_broadcast<T>, site);
}
template <int D, class T> T group_broadcast(group<D>, T x, simt::Site site = simt::Site::here()) {
    return detail::group_broadcast_linear(x, 0, site);
}
template <int D, class T>
T group_broadcast(group<D>, T x, typename group<D>::linear_id_type local_linear_id,
                  simt::Site site = simt::Site::here()) {
    return detail::group_broadcast_linear(x, local_linear_id, site);
}
template <int D, class T>
T group_broadcast(group<D> g, T x, typename group<D>::id_type local_id, simt::Site site = simt::Site::here()) {
    size_t linear = 0;
    for (int d = 0; d < D; d++) linear = linear * g.get_local_range(d) + local_id[d];
    return detail::group_broadcast_linear(x, linear, site);
}

// ---- sub-group permutations -----------------------------------------------------------------------------
template <class T>
T shift_group_left(sub_group, T x, sub_group::linear_id_type delta = 1, simt::Site site = simt::Site::here()) {
    return detail::sub_group_call("shift_group_left", x, delta, detail::resolve_permute<T, detail::permute::left>, site);
}
template <class T>
T shift_group_right(sub_group, T x, sub_group::linear_id_type delta = 1, simt::Site site = simt::Site::here()) {
    return detail::sub_group_call("shift_group_right", x, delta, detail::resolve_permute<T, detail::permute::right>,
                                  site);
}
template <class T>
T select_from_group(sub_group, T x, sub_group::id_type remote_local_id, simt::Site site = simt::Site::here()) {
    return detail::sub_group_call("select_from_group", x, uint32_t(remote_local_id[0]),
                                  detail::resolve_permute<T, detail::permute::select>, site);
}
template <class T>
T permute_group_by_xor(sub_group, T x, sub_group::linear_id_type mask, simt::Site site = simt::Site::here()) {
    return detail::sub_group_call("permute_group_by_xor", x, mask,
                                  detail::resolve_permute<T, detail::permute::xor_mask>, site);
}

}  // namespace _V1
}  // namespace sycl

#endif
