// mtl_emu_invoke.h: the bridge from an emulator thread to one kernel instance (mtl_emu_kernel.h), included
// by the generated translation units after the kernel's source: the shim's macros are in force here, so
// nothing below names device, constant, thread, threadgroup, kernel or double.
#ifndef GOKV_MTL_EMU_INVOKE_H
#define GOKV_MTL_EMU_INVOKE_H

namespace gokv_mtl_emu {

// A kernel's type, from the one parameter list every kernel has (native/metal/kernels/mtl_kernel.h).
typedef void KernelFn(MTL_KERNEL_PARAMS);

inline ::uint3 msl_uint3(const simt::uint3 &v) { return ::uint3(v.x, v.y, v.z); }

// Calls Fn with MTL_KERNEL_PARAMS' arguments for the calling GPU thread: buffers 0-6 from the dispatch,
// threadgroup memory and the builtins from simt::thread_info().
template <KernelFn *Fn> void invoke(const Args &a) {
    const simt::ThreadInfo &t = simt::thread_info();
    Fn(a.buffers[0], a.buffers[1], a.buffers[2], a.buffers[3], a.buffers[4], a.push, a.spec,
       static_cast<uint *>(t.threadgroup_memory), msl_uint3(t.threadgroup_position_in_grid),
       msl_uint3(t.threadgroups_per_grid), t.thread_index_in_threadgroup, msl_uint3(t.threads_per_threadgroup),
       t.simdgroup_index_in_threadgroup, t.simdgroups_per_threadgroup, t.thread_index_in_simdgroup,
       t.threads_per_simdgroup);
}

}  // namespace gokv_mtl_emu

// X(host_name, function, template arguments...) of a kernel file's MTL_INSTANCES_<FILE> list, as a table entry.
#define GOKV_MTL_EMU_ENTRY(host, fn, ...) {#host, &gokv_mtl_emu::invoke<&fn<__VA_ARGS__>>},

#endif
