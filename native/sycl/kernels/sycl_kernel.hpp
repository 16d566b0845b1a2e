// sycl_kernel.hpp: what every gokv SYCL kernel shares with the host code that launches it (SYCL 2020, no
// vendor extensions). The same file compiles with icpx -fsycl for Intel GPUs and with g++ against the
// header-only shim of native/sycl/emu (the emulated backend): nothing here or in a kernel may be
// emulator-only.
//
// A kernel is a functor struct template holding exactly an `args` (trivially copyable, so device
// copyable) and a `local_words` accessor; its operator()(sycl::nd_item<3>) const is the kernel. Every
// dispatch of the GPU plan (native/gpu/gpu_plan.h) is an nd_range<3> with global range
// (gz, gy, gx * wg) and local range (1, 1, wg): dimension 2 is the threadgroup's threads, and the plan's
// workgroup (x, y) is (it.get_group(2), it.get_group(1)) of (it.get_group_range(2), it.get_group_range(1)).
// Kernels read:
//   a.pages, a.rings, a.up, a.scratch, a.down   the plan's five bindings (GPU_PAGES ...) as 32-bit words (USM)
//   a.push                                      the kernel's push constant block (gpu_push.h) as words
//   a.spec                                      the GPU_SPEC_* words (gpu_spec.h)
//   tg                                          the work-group's local memory, as words
// The sub-group size is never assumed: kernels ask the sub-group (get_max_local_range, get_group_linear_range)
// and size per-sub-group arrays by spec[GPU_SPEC_OP2] (the plan's bound from the smallest size the device
// supports). Sub-group and group algorithms only in control flow uniform over their group.
//
// A kernel file lists its instances once, GOKV_SYCL_INSTANCES_<FILE>(X) with X(name, functor type), name
// "<kernel>_<arg>_<arg>..." as native/gpu/gpu_variants.h returns them, and ends with
// GOKV_SYCL_INSTANCES_<FILE>(GOKV_SYCL_DECLARE_INSTANCE) (declares nothing; the host's instance table
// expands the same lists with its own X).
#ifndef GOKV_SYCL_KERNEL_HPP
#define GOKV_SYCL_KERNEL_HPP

#include <sycl/sycl.hpp>

#include <cstdint>

#include "gpu_push.h"
#include "gpu_spec.h"

namespace gokv_sycl {

constexpr uint32_t kPushWords = 32; // GPU_PUSH_BYTES / 4

struct args {
    uint32_t *pages, *rings, *up, *scratch, *down;
    uint32_t push[kPushWords];
    uint32_t spec[GPU_SPEC_COUNT];
};

using local_words = sycl::local_accessor<uint32_t, 1>;

// Runs kernel K over r with n_local words of local memory (at least one).
template <class K>
void launch(sycl::handler &h, const sycl::nd_range<3> &r, const args &a, uint32_t n_local) {
    local_words tg(sycl::range<1>(n_local ? n_local : 1u), h);
    h.parallel_for(r, K{a, tg});
}

using launcher = void (*)(sycl::handler &h, const sycl::nd_range<3> &r, const args &a, uint32_t n_local);

struct instance {
    const char *name;
    launcher launch;
};

} // namespace gokv_sycl

#define GOKV_SYCL_DECLARE_INSTANCE(name, ...)

#endif
