// sycl_internal.hpp: what the SYCL module's host files share (native/sycl/README.md, docs/architecture.md §7):
// sycl_device.cpp (device open, caps, info, USM buffers, the measurement), sycl_call.cpp (the plan's
// gpu_ops over one in-order sycl::queue), sycl_backend.cpp (the backend table, pools, fault injection).
//
// The same files build the real module (icpx -fsycl) and the emulated backend (a plain C++17 compiler
// against the shim of native/sycl/emu); the build defines GOKV_SYCL_EMULATED for these host files only.
// Every function the C side calls (the backend slots, gpu_ops) catches every exception: nothing throws
// into C.
#ifndef GOKV_SYCL_INTERNAL_HPP
#define GOKV_SYCL_INTERNAL_HPP

#include <sycl/sycl.hpp>

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gokv_backend.h"
#include "gpu_plan.h"
#include "sycl_instances.hpp"

namespace gokv_sycl {

constexpr const char *kBackend = "sycl";

// One USM allocation: device memory (pools, scratch) or host memory the device reads and writes directly
// (the call's up and down buffers).
struct usm_buffer {
    uint8_t *data = nullptr;
    uint64_t size = 0;
    bool host = false; // sycl::malloc_host, else sycl::malloc_device
};

// A pipeline: the kernel instance a (name, spec) request runs, its spec words and local memory.
struct pipeline {
    std::string name; // the instance, "<kernel>_<arg>_..."
    const instance *inst = nullptr;
    uint32_t spec[GPU_SPEC_COUNT] = {};
    uint32_t local_words = 0;
};

// One recorded operation of a call; enqueued at submit.
struct command {
    enum kind_t { dispatch, copy, fill } kind;
    const pipeline *pl;
    uint32_t push[kPushWords];
    uint32_t grid[3]; // x, y, z workgroups
    int32_t src, dst;
    uint64_t src_off, dst_off, bytes;
    uint32_t word;
};

// Everything a device holds besides the plan's view (C++ members, so apart from the standard-layout
// struct the plan casts).
struct device_state {
    sycl::device dev;
    sycl::queue q;        // in order: each operation starts after the previous one finished
    std::mutex mu;        // one call at a time (begin .. end), the call buffers, pools' allocations
    std::mutex pipe_mu;   // the pipeline cache (pipelines are made outside calls)
    bool lost = false;    // a failed submit: every later call is GOKV_EDEVICE
    std::string name;     // the device's name as reported
    std::vector<uint32_t> subgroup_sizes; // info::device::sub_group_sizes, ascending
    usm_buffer up, scratch, down, dummy;
    std::unordered_map<std::string, std::unique_ptr<pipeline>> pipelines;
    std::vector<command> commands; // the call being recorded
    std::string record_error;      // what went wrong while recording (reported by submit)
};

} // namespace gokv_sycl

// The plan's views first (gpu_plan.h): the plan passes &base back and the module casts it, so both structs
// are standard layout, with the C++ state behind a pointer.
struct sycl_device {
    gpu_device base;
    gokv_sycl::device_state *s;
};

struct sycl_pool {
    gpu_pool base;
    gokv_sycl::usm_buffer pages, rings; // rings: empty without residual slots (the device's dummy is bound)
};

namespace gokv_sycl {

// sycl_device.cpp
gokv_status device_open(const gokv_device_desc *desc, void **impl);
void device_close(void *dev);
gokv_status device_info(void *dev, gokv_device_info *out);
gokv_status measure(void *dev, uint64_t bytes, gokv_device_ceilings *out);
// Makes b hold at least bytes of USM (contents not kept when it grows); op and what name the failure.
// Throws nothing.
gokv_status reserve(sycl::queue &q, usm_buffer &b, uint64_t bytes, bool host, const char *op, const char *what);
void release(sycl::queue &q, usm_buffer &b);
// The status and message of an exception caught at a C entry point (what() included).
gokv_status exception_status(const std::exception_ptr &e, const char *op, const char *what);

// sycl_call.cpp
extern const gpu_ops ops;

// sycl_backend.cpp: the armed fault code of site GOKV_FAULT_* (taken: disarmed), or 0.
int32_t take_fault(int32_t site);

} // namespace gokv_sycl

#endif
