// sycl_device.cpp: the SYCL module's devices (docs/architecture.md §7): which device a gokv device opens (the
// GPUs of every platform; the emulated build: the shim's one device), what it reports to the plan
// (gpu_caps) and to the caller (gokv_device_info), its USM buffers, and the measurement (a device copy).
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "sycl_internal.hpp"

namespace gokv_sycl {

namespace {

const char *const kOpen = "gokv_device_open";

// The devices a gokv device may open, in the runtime's order: gokv_device_desc.device_index counts these.
std::vector<sycl::device> candidates() {
#ifdef GOKV_SYCL_EMULATED
    return {sycl::device()}; // the shim's device: the CPU under native/simt
#else
    return sycl::device::get_devices(sycl::info::device_type::gpu);
#endif
}

// Host memory is as close to the device as its own (an integrated GPU, the emulator): the inputs are read
// where the host wrote them. SYCL 2020 has no non-deprecated query for it besides vendor extensions, so
// the deprecated host_unified_memory answers (true on Intel's integrated GPUs).
bool host_memory_is_local(const sycl::device &dev) {
#ifdef GOKV_SYCL_EMULATED
    (void)dev;
    return true;
#else
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
#endif
    return dev.get_info<sycl::info::device::host_unified_memory>();
#if defined(__clang__)
#pragma clang diagnostic pop
#endif
#endif
}

// What the module needs of a device: USM device and host allocations, work-groups of 128.
bool usable(const sycl::device &dev, std::string *why) {
    if (!dev.has(sycl::aspect::usm_device_allocations) || !dev.has(sycl::aspect::usm_host_allocations)) {
        if (why) *why = "no USM device and host allocations";
        return false;
    }
    if (dev.get_info<sycl::info::device::max_work_group_size>() < 128) {
        if (why) *why = "work-groups of fewer than 128 work-items";
        return false;
    }
    return true;
}

// The name gokv reports and device_name filters match: the runtime's; the emulated device says what it is.
std::string display_name(const sycl::device &dev) {
#ifdef GOKV_SYCL_EMULATED
    (void)dev;
    return "SYCL GPU (emulated on the CPU by native/simt)";
#else
    return dev.get_info<sycl::info::device::name>();
#endif
}

std::string device_names(const std::vector<sycl::device> &list) {
    std::string s;
    for (size_t i = 0; i < list.size(); i++) {
        if (i) s += ", ";
        s += std::to_string(i) + ": " + display_name(list[i]);
    }
    return s;
}

// The device desc asks for: a name filter first, then an index, else the first discrete GPU (host memory
// across a bus is the case the plan's staging is for, and a discrete GPU is the faster one), else the first.
gokv_status pick(const gokv_device_desc *desc, sycl::device *out) {
    const std::vector<sycl::device> list = candidates();
    if (list.empty())
        return gokv_set_error(GOKV_ENODEV,
                              "%s: sycl: no GPU device found (sycl-ls lists what the runtime sees; is the Level Zero "
                              "or OpenCL GPU driver installed, and is ONEAPI_DEVICE_SELECTOR set to hide it?)",
                              kOpen);
    const std::string names = device_names(list);
    std::string why;
    if (desc->device_name && desc->device_name[0]) {
        for (const sycl::device &d : list)
            if (display_name(d).find(desc->device_name) != std::string::npos && usable(d, nullptr)) {
                *out = d;
                return GOKV_OK;
            }
        return gokv_set_error(GOKV_ENODEV, "%s: sycl: no usable device named like \"%s\" (devices: %s)", kOpen,
                              desc->device_name, names.c_str());
    }
    if (desc->device_index >= 0) {
        if ((size_t)desc->device_index >= list.size())
            return gokv_set_error(GOKV_ENODEV, "%s: sycl: device_index %d out of range: %zu device(s) (%s)", kOpen,
                                  desc->device_index, list.size(), names.c_str());
        if (!usable(list[desc->device_index], &why))
            return gokv_set_error(GOKV_ENODEV, "%s: sycl: device %d has %s (%s)", kOpen, desc->device_index, why.c_str(),
                                  names.c_str());
        *out = list[desc->device_index];
        return GOKV_OK;
    }
    const sycl::device *first = nullptr;
    for (const sycl::device &d : list) {
        if (!usable(d, &why)) continue;
        if (!host_memory_is_local(d)) {
            *out = d;
            return GOKV_OK;
        }
        if (!first) first = &d;
    }
    if (!first)
        return gokv_set_error(GOKV_ENODEV, "%s: sycl: no device with USM allocations and work-groups of 128 (%s)", kOpen,
                              names.c_str());
    *out = *first;
    return GOKV_OK;
}

uint64_t host_ram_bytes() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : (uint64_t)8 << 30;
}

// The sub-group size kernels get, as far as the host can know: the emulator runs them at
// GOKV_SYCL_EMU_SUBGROUP (default 16, native/sycl/emu); a real device's compiler picks one of the listed
// sizes per kernel (Intel's usually 16 or 32), so the largest listed is reported, or 16 when none is.
uint32_t subgroup_size_of(const std::vector<uint32_t> &sg) {
#ifdef GOKV_SYCL_EMULATED
    const char *env = std::getenv("GOKV_SYCL_EMU_SUBGROUP");
    const unsigned long v = env && *env ? std::strtoul(env, nullptr, 10) : 16ul;
    if (std::find(sg.begin(), sg.end(), (uint32_t)v) != sg.end()) return (uint32_t)v;
#endif
    return sg.empty() ? 16u : sg.back();
}

// The plan's view of the device. Sub-group sizes: kernels never assume one (kernels/sycl_kernel.hpp); the
// plan sizes per-sub-group arrays from the smallest the device may give a kernel (subgroup_min), and
// subgroup_size (spec word SUBGROUP_SIZE, information only) is subgroup_size_of's.
void set_caps(const sycl::device &dev, const std::vector<uint32_t> &sg, gpu_caps *c) {
    c->wg_size = 128;
    c->subgroup_size = subgroup_size_of(sg);
    c->subgroup_min = sg.empty() ? c->subgroup_size : sg.front();
    c->chunk_size = 512;
    const uint64_t local = dev.get_info<sycl::info::device::local_mem_size>();
    c->max_shared_bytes = (uint32_t)std::min<uint64_t>(local, 0xffffffffu);
    c->shared_budget = std::min<uint32_t>(c->max_shared_bytes / 2u, 16384u);
    c->max_groups[0] = c->max_groups[1] = c->max_groups[2] = 65535;
#ifdef GOKV_SYCL_EMULATED
    // The emulated device's memory is the host's: pools may take half of it, as the Metal emulator's.
    c->memory_bytes = host_ram_bytes() / 2;
#else
    c->memory_bytes = dev.get_info<sycl::info::device::global_mem_size>();
#endif
    // Kernels address a binding in 32-bit words; one allocation is one binding.
    uint64_t bind = std::min<uint64_t>(dev.get_info<sycl::info::device::max_mem_alloc_size>(), 0xfffffffcull);
    bind = std::min<uint64_t>(bind, c->memory_bytes);
    c->max_binding_bytes = bind & ~(uint64_t)3;
    // up is host memory (malloc_host): across PCIe on a discrete GPU the plan first copies the inputs it
    // reads many times into scratch (device memory).
    c->stage_inputs = host_memory_is_local(dev) ? 0 : 1;
}

std::string subgroup_list(const std::vector<uint32_t> &sg) {
    std::string s;
    for (uint32_t v : sg) s += (s.empty() ? "" : "/") + std::to_string(v);
    return s.empty() ? "?" : s;
}

} // namespace

gokv_status exception_status(const std::exception_ptr &e, const char *op, const char *what) {
    try {
        std::rethrow_exception(e);
    } catch (const sycl::exception &x) {
        const bool oom = x.code() == sycl::make_error_code(sycl::errc::memory_allocation);
        gokv_log(GOKV_LOG_ERROR, kBackend, op, "%s: %s", what, x.what());
        return gokv_set_error(oom ? GOKV_ENOMEM : GOKV_EDEVICE, "%s: sycl: %s: %s", op, what, x.what());
    } catch (const std::bad_alloc &) {
        return gokv_set_error(GOKV_ENOMEM, "%s: sycl: %s: out of host memory", op, what);
    } catch (const std::exception &x) {
        gokv_log(GOKV_LOG_ERROR, kBackend, op, "%s: %s", what, x.what());
        return gokv_set_error(GOKV_EDEVICE, "%s: sycl: %s: %s", op, what, x.what());
    } catch (...) {
        return gokv_set_error(GOKV_EDEVICE, "%s: sycl: %s: an unknown exception", op, what);
    }
}

gokv_status reserve(sycl::queue &q, usm_buffer &b, uint64_t bytes, bool host, const char *op, const char *what) {
    if (bytes == 0) bytes = 64; // a binding is never empty (a kernel may be handed it unread)
    if (b.data && b.size >= bytes && b.host == host) return GOKV_OK;
    if (take_fault(GOKV_FAULT_ALLOC))
        return gokv_set_error(GOKV_ENOMEM, "%s: sycl: cannot allocate %llu bytes for %s (injected)", op,
                              (unsigned long long)bytes, what);
    const uint64_t size = (bytes + 63u) & ~(uint64_t)63u;
    try {
        release(q, b);
        void *p = host ? sycl::malloc_host(size, q) : sycl::malloc_device(size, q);
        if (!p)
            return gokv_set_error(GOKV_ENOMEM, "%s: sycl: cannot allocate %llu bytes of %s memory for %s", op,
                                  (unsigned long long)size, host ? "host" : "device", what);
        b.data = static_cast<uint8_t *>(p);
        b.size = size;
        b.host = host;
        return GOKV_OK;
    } catch (...) {
        return exception_status(std::current_exception(), op, what);
    }
}

void release(sycl::queue &q, usm_buffer &b) {
    if (b.data) {
        try {
            sycl::free(b.data, q);
        } catch (...) {
            // freeing cannot be reported (close, regrowth); the memory goes with the context
        }
    }
    b = usm_buffer{};
}

void device_close(void *dev) {
    sycl_device *d = static_cast<sycl_device *>(dev);
    if (!d) return;
    if (device_state *s = d->s) {
        try {
            s->q.wait(); // nothing of ours may still run on the buffers freed below
        } catch (...) {
        }
        release(s->q, s->up);
        release(s->q, s->scratch);
        release(s->q, s->down);
        release(s->q, s->dummy);
        delete s;
    }
    delete d;
}

gokv_status device_open(const gokv_device_desc *desc, void **impl) {
    sycl_device *d = nullptr;
    try {
        sycl::device dev;
        gokv_status st = pick(desc, &dev);
        if (st) return st;
        d = new sycl_device{};
        d->s = new device_state;
        device_state &s = *d->s;
        s.dev = dev;
        // Errors of running work arrive at wait_and_throw (submit): the handler rethrows the first, which the
        // submit turns into a status (without a handler the runtime's default one would end the process).
        s.q = sycl::queue(dev, [](sycl::exception_list errors) {
            for (const std::exception_ptr &e : errors) std::rethrow_exception(e);
        }, sycl::property_list{sycl::property::queue::in_order()});
        s.name = display_name(dev);
        for (size_t v : dev.get_info<sycl::info::device::sub_group_sizes>()) s.subgroup_sizes.push_back((uint32_t)v);
        std::sort(s.subgroup_sizes.begin(), s.subgroup_sizes.end());
        d->base.ops = &ops;
        d->base.backend = kBackend;
        set_caps(dev, s.subgroup_sizes, &d->base.caps);
        st = reserve(s.q, s.dummy, 256, false, kOpen, "the placeholder binding");
        if (st) {
            device_close(d);
            return st;
        }
        const gpu_caps &c = d->base.caps;
        gokv_log(GOKV_LOG_INFO, kBackend, "device_open",
                 "%s: sub-groups %s (plan: %u, smallest %u), work-group %u, chunk %d, local memory %u bytes, "
                 "%llu MiB for pools, binding %llu MiB, %s inputs",
                 s.name.c_str(), subgroup_list(s.subgroup_sizes).c_str(), c.subgroup_size, c.subgroup_min, c.wg_size,
                 c.chunk_size, c.max_shared_bytes, (unsigned long long)(c.memory_bytes >> 20),
                 (unsigned long long)(c.max_binding_bytes >> 20), c.stage_inputs ? "staged" : "direct");
        *impl = d;
        return GOKV_OK;
    } catch (...) {
        const gokv_status st = exception_status(std::current_exception(), kOpen, "opening the device");
        device_close(d);
        return st;
    }
}

gokv_status device_info(void *dev, gokv_device_info *out) {
    sycl_device *d = static_cast<sycl_device *>(dev);
    const device_state &s = *d->s;
    const gpu_caps &c = d->base.caps;
    std::snprintf(out->name, sizeof out->name, "%s", s.name.c_str());
#ifdef GOKV_SYCL_EMULATED
    const char *kind = "sycl emulated";
#else
    const char *kind = "sycl";
#endif
    std::snprintf(out->features, sizeof out->features, "%s: sub-groups %s, wg %u, chunk %d, local %u, usm, %s inputs",
                  kind, subgroup_list(s.subgroup_sizes).c_str(), c.wg_size, c.chunk_size, c.max_shared_bytes,
                  c.stage_inputs ? "staged" : "direct");
    out->memory_bytes = c.memory_bytes;
    out->subgroup_size = (int32_t)c.subgroup_size;
    out->n_threads = 1; // the calling thread records and waits; the device runs the work
    out->caps = GOKV_CAP_DECODE | GOKV_CAP_PREFILL | GOKV_CAP_LEARNED_SINKS | GOKV_CAP_WINDOW | GOKV_CAP_MLA |
                GOKV_CAP_HOLES | GOKV_CAP_BASELINE | GOKV_CAP_MASS | GOKV_CAP_KV_HEAD_MASKS | GOKV_CAP_QUEST;
    out->formats = (1u << GOKV_FORMAT_COUNT_) - 1u;
    return GOKV_OK;
}

// The device's copy bandwidth: device memory to device memory with q.memcpy, bytes read plus bytes written
// per second, best of a few after one warm-up (the floor attention's speed is reported against,
// docs/architecture.md §9). The emulated device copies host memory.
gokv_status measure(void *dev, uint64_t bytes, gokv_device_ceilings *out) {
    const char *op = "gokv_device_measure";
    sycl_device *d = static_cast<sycl_device *>(dev);
    device_state &s = *d->s;
    uint64_t n = bytes ? bytes : (uint64_t)256 << 20;
    n = std::min<uint64_t>(n, d->base.caps.max_binding_bytes) & ~(uint64_t)63;
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.lost) return gokv_set_error(GOKV_EDEVICE, "%s: sycl: the device was lost; close it and open a new one", op);
    usm_buffer src, dst;
    gokv_status st = reserve(s.q, src, n, false, op, "the measurement's source");
    if (st == GOKV_OK) st = reserve(s.q, dst, n, false, op, "the measurement's destination");
    double best = 0;
    if (st == GOKV_OK) {
        try {
            s.q.memset(src.data, 1, n).wait_and_throw();
            for (int i = 0; i < 4; i++) {
                const auto t0 = std::chrono::steady_clock::now();
                s.q.memcpy(dst.data, src.data, n).wait_and_throw();
                const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                if (i > 0 && sec > 0) best = std::max(best, 2.0 * (double)n / sec / 1e9);
            }
        } catch (...) {
            st = exception_status(std::current_exception(), op, "the copy");
        }
    }
    release(s.q, src);
    release(s.q, dst);
    if (st) return st;
    out->read_gbps = best;
    out->peak_gflops = 0;
#ifdef GOKV_SYCL_EMULATED
    std::snprintf(out->method, sizeof out->method, "buffer copy, read + write (host memory: emulated device)");
#else
    std::snprintf(out->method, sizeof out->method, "buffer copy (queue memcpy), read + write");
#endif
    return GOKV_OK;
}

} // namespace gokv_sycl
