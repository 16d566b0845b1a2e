// mtl_kernel.h: what every gokv Metal kernel shares (Metal Shading Language; also compiled as C++17 against
// the emulator's shim, native/metal/emu, so nothing here or in a kernel may be emulator-only).
//
// One parameter list for every kernel (MTL_KERNEL_PARAMS), so one host path encodes them all and the
// emulator calls them all the same way:
//   buffers 0..4   pages, rings, up, scratch, down as 32-bit words (native/gpu/gpu_plan.h: GPU_PAGES ...)
//   buffer 5       the push constants (the kernel's block of native/gpu/gpu_push.h), as words
//   buffer 6       the pipeline's specialization constants, GPU_SPEC_COUNT words (GPU_SPEC_* ids)
//   threadgroup 0  the kernel's threadgroup memory, as words; its size comes from the kernel family's
//                  instance (gpu_kernel_instance, native/gpu/gpu_variants.c; the host sets it). Threadgroup memory is only ever passed this
//                  way, never declared inside a kernel (the emulator cannot give a function-scope
//                  threadgroup variable one copy per threadgroup).
//   builtins       the threadgroup's position and the grid, the thread's index, its simdgroup and lane.
// Simdgroups are 32 wide on every Apple GPU; kernels still read the width from sg_size.
//
// Variants are template parameters (function constants cannot be emulated). A kernel file lists its
// instances once, as MTL_INSTANCES_<FILE>(X) with X(host_name, function, template arguments...), and ends
// with MTL_INSTANCES_<FILE>(MTL_INSTANTIATE): Metal gets one [[host_name]] per instance, the emulator a
// table of function pointers from the same list. Host names are <kernel>_<arg>_<arg>..., the arguments in
// the order gpu_kernel_instance (native/gpu/gpu_variants.c) gives them.
//
// Rules the emulator enforces or cannot see, so keep them: simdgroup functions (simd_sum, simd_max, ...)
// and threadgroup_barrier only in control flow that is uniform across the simdgroup / threadgroup; no
// double (the emulator poisons it); no half literals such as 0.5h (write half(0.5f)); no function
// constants; fp16 conversions go through the bit-exact helpers of the common header, never through
// hardware rounding, so pages stay byte-identical to the CPU backend's.
#ifndef GOKV_MTL_KERNEL_H
#define GOKV_MTL_KERNEL_H

#include <metal_stdlib>
using namespace metal;

#define MTL_KERNEL_PARAMS                                                                                   \
    device uint *pages [[buffer(0)]], device uint *rings [[buffer(1)]], device uint *up [[buffer(2)]],      \
        device uint *scratch [[buffer(3)]], device uint *down [[buffer(4)]],                                \
        constant uint *push_words [[buffer(5)]], constant uint *spec [[buffer(6)]],                         \
        threadgroup uint *tg [[threadgroup(0)]], uint3 group_id [[threadgroup_position_in_grid]],           \
        uint3 n_groups [[threadgroups_per_grid]], uint lid [[thread_index_in_threadgroup]],                 \
        uint3 wg_dims [[threads_per_threadgroup]], uint sg_id [[simdgroup_index_in_threadgroup]],           \
        uint n_sg [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],                  \
        uint sg_size [[threads_per_simdgroup]]

// The arguments as a kernel passes them on to its helpers (same order and names).
#define MTL_KERNEL_ARGS                                                                                     \
    pages, rings, up, scratch, down, push_words, spec, tg, group_id, n_groups, lid, wg_dims, sg_id, n_sg, lane, sg_size

#define MTL_INSTANTIATE(host, fn, ...) template [[host_name(#host)]] kernel void fn<__VA_ARGS__>(MTL_KERNEL_PARAMS);

#endif
