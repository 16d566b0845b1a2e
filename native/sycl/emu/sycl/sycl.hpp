// <sycl/sycl.hpp> for the emulated SYCL backend: the part of SYCL 2020 that gokv's SYCL module uses, as
// header-only C++17 on the SIMT emulator (native/simt/simt.h), so that the module's host code and its
// kernels (native/sycl/kernels) compile unchanged with g++ (-I native/sycl/emu) and run on the CPU.
// native/sycl/emu/README.md says what maps to what, what is checked and what cannot be seen.
//
// Rules kept here:
// - Signatures are the specification's, so that whatever compiles here compiles with icpx -fsycl. The one
//   addition: every synchronizing call (group_barrier, the group algorithms, the sub-group shuffles,
//   nd_item::barrier) takes a trailing `simt::Site site = simt::Site::here()` after the specification's
//   parameters. Code written to the specification never passes it; its default is evaluated at the call,
//   so the emulator's errors name the kernel's file:line, not this header's.
// - No fast math: the math functions are the C library's; half math runs in float and rounds once.
// - Nothing under sycl::ext.
// - `double` is not poisoned (the Metal shim poisons it): the host code includes this header too, and it
//   uses double (timings, statistics); kernels must still not use it (Intel GPUs may lack fp64).
#ifndef GOKV_SYCL_EMU_SYCL_HPP
#define GOKV_SYCL_EMU_SYCL_HPP

#include "detail/emu_core.hpp"     // errc/exception, ranges and ids, nd_item, group, sub_group, half, math
#include "detail/emu_groups.hpp"   // group_barrier and the group algorithms
#include "detail/emu_atomic.hpp"   // atomic_ref
#include "detail/emu_runtime.hpp"  // device, queue, handler, local_accessor, event, USM

#endif
