// sycl_instances.hpp: the kernel instances as the host looks them up (native/sycl/README.md). Each kernel
// file kernels/<file>.hpp lists its instances once, GOKV_SYCL_INSTANCES_<FILE>(X) (kernels/sycl_kernel.hpp);
// the build gives every kernel file one generated unit (sycl_kernel_unit.cpp.in) that expands the list with
// GOKV_SYCL_HOST_INSTANCE into a table of {name, launch<functor>}, so the files compile in parallel and each
// unit holds its kernels' device code; sycl_instance_tables.cpp.in lists the tables.
#ifndef GOKV_SYCL_INSTANCES_HPP
#define GOKV_SYCL_INSTANCES_HPP

#include <cstddef>

#include "sycl_kernel.hpp"

namespace gokv_sycl {

// The instances of one kernel file.
struct instance_table {
    const char *file; // "store_rows.hpp"
    const instance *entries;
    size_t count;
};

// Every kernel file's table, ending with nullptr (generated: sycl_instance_tables.cpp.in).
extern const instance_table *const kernel_tables[];

// The instance named `name` ("<kernel>_<arg>_...", as gpu_kernel_instance names it), or nullptr.
const instance *find_instance(const char *name);

} // namespace gokv_sycl

// X of an instance list: the name as a string (a list may spell it as an identifier or as a string literal;
// find_instance accepts both) and the functor's launcher. The functor type may hold commas (template
// arguments), hence the variadic tail.
#define GOKV_SYCL_HOST_INSTANCE(name, ...) {#name, &::gokv_sycl::launch<__VA_ARGS__>},

#endif
