// mtl_emu_kernel.h: how the emulated Metal backend calls a kernel compiled from native/metal/kernels/*.metal
// as C++ (native/metal/emu/README.md). Each kernel file becomes one generated translation unit
// (mtl_emu_kernels.cc.in) holding a table of its instances, { "<host_name>", run }, where run calls the
// instance with MTL_KERNEL_PARAMS' arguments taken from the call's buffers and from simt::thread_info(); the
// executor (mtl_emu_exec.cc) runs it once per GPU thread under simt::launch.
//
// Included by those generated units before the kernel's source, so it may use no name that the MSL shim
// turns into a macro (device, constant, thread, threadgroup, kernel) or poisons (double).
#ifndef GOKV_MTL_EMU_KERNEL_H
#define GOKV_MTL_EMU_KERNEL_H

#include <cstddef>
#include <cstdint>

#include "simt.h"

namespace gokv_mtl_emu {

// One dispatch's arguments, the same for every thread: buffers 0-4 (GPU_PAGES .. GPU_DOWN), the push words
// (buffer 5) and the pipeline's specialization words (buffer 6).
struct Args {
    uint32_t *buffers[5];
    const uint32_t *push;
    const uint32_t *spec;
};

// Runs the calling GPU thread's share of one kernel instance (inside simt::launch).
typedef void (*RunFn)(const Args &args);

struct Entry {
    const char *name;  // the instance's host name, "<kernel>_<targ>_<targ>..."
    RunFn run;
};

// The instances of one kernel file.
struct Table {
    const char *file;  // "attend.metal"
    const Entry *entries;
    size_t count;
};

// The tables of every kernel file of the module, ending with nullptr (generated: mtl_emu_tables.cc.in).
extern const Table *const kernel_tables[];

// The instance named `name` in tables (ending with nullptr), or nullptr.
const Entry *find_instance(const Table *const *tables, const char *name);

// Runs one instance over a grid: every thread of d calls entry.run(args). simt's status: an error names
// the group, the threads and the kernel's source lines involved.
simt::Status launch(const Entry &entry, const Args &args, const simt::Dispatch &d);

}  // namespace gokv_mtl_emu

#endif
