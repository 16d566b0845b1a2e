// mtl_emu_device.cc: the emulated Metal device: what it reports to the plan (gpu_caps, those of an Apple
// GPU: simdgroups of 32, threadgroups of 128, 32 KiB of threadgroup memory, unified memory), how it runs
// kernels (the environment, README "Running"), and its buffers (host memory with a guard page after each).
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "gokv_cpu.h"
#include "mtl_emu_internal.h"
#include "simt.h"

namespace {

const char *const kOp = "gokv_device_open";

// GOKV_METAL_EMU_<name> as an unsigned number; 0 when unset, 1 when set and valid, -1 when malformed.
int env_u64(const char *name, uint64_t *out) {
    const char *s = std::getenv(name);
    if (!s || !*s) return 0;
    char *end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(s, &end, 0);
    if (errno || *end || *s == '-') return -1;
    *out = v;
    return 1;
}

gokv_status configure(mtl_emu_device *d) {
    d->order = static_cast<int32_t>(simt::RunOrder::shuffled);
    if (const char *o = std::getenv("GOKV_METAL_EMU_ORDER"); o && *o) {
        if (std::strcmp(o, "forward") == 0)
            d->order = static_cast<int32_t>(simt::RunOrder::forward);
        else if (std::strcmp(o, "reverse") == 0)
            d->order = static_cast<int32_t>(simt::RunOrder::reverse);
        else if (std::strcmp(o, "shuffled") != 0)
            return gokv_set_error(GOKV_EINVAL, "%s: metal: GOKV_METAL_EMU_ORDER=%s is not forward, reverse or shuffled",
                                  kOp, o);
    }
    uint64_t v = 0;
    d->seed = 1;
    if (int r = env_u64("GOKV_METAL_EMU_SEED", &v); r < 0)
        return gokv_set_error(GOKV_EINVAL, "%s: metal: GOKV_METAL_EMU_SEED is not a number", kOp);
    else if (r > 0)
        d->seed = v;
    d->os_threads = 2;
    if (int r = env_u64("GOKV_METAL_EMU_THREADS", &v); r < 0 || (r > 0 && (v < 1 || v > 256)))
        return gokv_set_error(GOKV_EINVAL, "%s: metal: GOKV_METAL_EMU_THREADS must be 1..256", kOp);
    else if (r > 0)
        d->os_threads = static_cast<uint32_t>(v);
    // The kernels' per-thread arrays (accumulators, scores) live on the fibers' stacks: README "Running".
    d->stack_bytes = 64 * 1024;
    if (int r = env_u64("GOKV_METAL_EMU_STACK_KIB", &v); r < 0 || (r > 0 && (v < 16 || v > 16384)))
        return gokv_set_error(GOKV_EINVAL, "%s: metal: GOKV_METAL_EMU_STACK_KIB must be 16..16384", kOp);
    else if (r > 0)
        d->stack_bytes = v * 1024;
    return GOKV_OK;
}

// An Apple GPU as the kernels' authors target it (Apple7+: M1 and later).
void set_caps(gpu_caps *c) {
    c->wg_size = 128;
    c->subgroup_size = 32;
    c->subgroup_min = 32;
    c->chunk_size = 512;
    c->max_shared_bytes = 32768;
    c->shared_budget = 16384;
    c->max_groups[0] = c->max_groups[1] = c->max_groups[2] = 65535;
    // Unified memory: pools may take half of the machine's, as a Mac's GPU may take a share of its RAM.
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : (uint64_t)8 << 30;
    c->memory_bytes = ram / 2;
    // Kernels address a binding in 32-bit words; 4 GiB, as Vulkan's usual maxStorageBufferRange.
    c->max_binding_bytes = c->memory_bytes < 0xfffffffcull ? c->memory_bytes & ~(uint64_t)3 : 0xfffffffcull;
    c->stage_inputs = 0;
}

const char *order_name(int32_t order) {
    return order == 0 ? "forward" : order == 1 ? "reverse" : "shuffled";
}

}  // namespace

extern "C" {

gokv_status mtl_emu_buffer_reserve(mtl_emu_buffer *b, uint64_t bytes, const char *op, const char *what) {
    if (bytes == 0) bytes = 64;  // a binding is never empty (a kernel may be handed it unread)
    if (b->data && b->size >= bytes) return GOKV_OK;
    if (mtl_emu_take_fault(GOKV_FAULT_ALLOC))
        return gokv_set_error(GOKV_ENOMEM, "%s: metal: cannot allocate %llu bytes for %s (injected)", op,
                              (unsigned long long)bytes, what);
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    const uint64_t size = (bytes + 63u) & ~(uint64_t)63u;
    const uint64_t map_bytes = (size + page - 1) / page * page + page;
    void *m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return gokv_set_error(GOKV_ENOMEM, "%s: metal: cannot allocate %llu bytes for %s", op,
                              (unsigned long long)bytes, what);
    uint8_t *guard = static_cast<uint8_t *>(m) + map_bytes - page;
    if (mprotect(guard, page, PROT_NONE) != 0) {
        munmap(m, map_bytes);
        return gokv_set_error(GOKV_ENOMEM, "%s: metal: cannot protect the guard page of %s", op, what);
    }
    mtl_emu_buffer_free(b);
    b->map = m;
    b->map_bytes = map_bytes;
    b->data = guard - size;  // the binding ends where the guard page starts
    b->size = size;
    return GOKV_OK;
}

void mtl_emu_buffer_free(mtl_emu_buffer *b) {
    if (b->map) munmap(b->map, b->map_bytes);
    std::memset(b, 0, sizeof *b);
}

void mtl_emu_device_close(void *dev) {
    mtl_emu_device *d = static_cast<mtl_emu_device *>(dev);
    if (!d) return;
    mtl_emu_buffer_free(&d->up);
    mtl_emu_buffer_free(&d->scratch);
    mtl_emu_buffer_free(&d->down);
    mtl_emu_buffer_free(&d->dummy);
    mtl_emu_exec_destroy(d->exec);
    pthread_mutex_destroy(&d->mu);
    std::free(d);
}

gokv_status mtl_emu_device_open(const gokv_device_desc *desc, void **impl) {
    if (desc->device_index > 0)
        return gokv_set_error(GOKV_ENODEV, "%s: metal: device %d does not exist (the emulator has one)", kOp,
                              desc->device_index);
    static const char kName[] = "Apple GPU (emulated on the CPU by native/simt)";
    if (desc->device_name && !std::strstr(kName, desc->device_name))
        return gokv_set_error(GOKV_ENODEV, "%s: metal: no device name contains \"%s\" (the emulator's is \"%s\")", kOp,
                              desc->device_name, kName);
    mtl_emu_device *d = static_cast<mtl_emu_device *>(std::calloc(1, sizeof *d));
    if (!d) return gokv_set_error(GOKV_ENOMEM, "%s: metal: out of memory", kOp);
    d->base.ops = &mtl_emu_ops;
    d->base.backend = "metal";
    pthread_mutex_init(&d->mu, nullptr);
    set_caps(&d->base.caps);
    gokv_status st = configure(d);
    if (st == GOKV_OK) st = mtl_emu_exec_create(&d->exec);
    if (st == GOKV_OK) st = mtl_emu_buffer_reserve(&d->dummy, 256, kOp, "the placeholder binding");
    if (st != GOKV_OK) {
        mtl_emu_device_close(d);
        return st;
    }
    gokv_log(GOKV_LOG_INFO, "metal", "device_open",
             "%s: simdgroup %u, threadgroup %u, chunk %d, %s order (seed %llu), %u OS threads, %llu KiB stacks", kName,
             d->base.caps.subgroup_size, d->base.caps.wg_size, d->base.caps.chunk_size, order_name(d->order),
             (unsigned long long)d->seed, d->os_threads, (unsigned long long)(d->stack_bytes / 1024));
    *impl = d;
    return GOKV_OK;
}

gokv_status mtl_emu_device_info(void *dev, gokv_device_info *out) {
    mtl_emu_device *d = static_cast<mtl_emu_device *>(dev);
    std::snprintf(out->name, sizeof out->name, "Apple GPU (emulated on the CPU by native/simt)");
    std::snprintf(out->features, sizeof out->features, "metal emulated: simdgroup %u wg %u chunk %d, %s order seed %llu",
                  d->base.caps.subgroup_size, d->base.caps.wg_size, d->base.caps.chunk_size, order_name(d->order),
                  (unsigned long long)d->seed);
    out->memory_bytes = d->base.caps.memory_bytes;
    out->subgroup_size = (int32_t)d->base.caps.subgroup_size;
    out->n_threads = (int32_t)d->os_threads;
    out->caps = GOKV_CAP_DECODE | GOKV_CAP_PREFILL | GOKV_CAP_LEARNED_SINKS | GOKV_CAP_WINDOW | GOKV_CAP_MLA |
                GOKV_CAP_HOLES | GOKV_CAP_BASELINE | GOKV_CAP_MASS | GOKV_CAP_KV_HEAD_MASKS | GOKV_CAP_QUEST;
    out->formats = (1u << GOKV_FORMAT_COUNT_) - 1u;
    return GOKV_OK;
}

// The emulated device's memory is the host's: its streaming read is the CPU module's measurement, with the
// emulator's OS threads. No FMA peak: the kernels' arithmetic runs through fibers, nowhere near the CPU's.
gokv_status mtl_emu_measure(void *dev, uint64_t bytes, gokv_device_ceilings *out) {
    mtl_emu_device *d = static_cast<mtl_emu_device *>(dev);
    const double gbps = gokv_cpu_measure_read_gbps((int32_t)d->os_threads, bytes ? bytes : (uint64_t)256 << 20);
    if (gbps <= 0)
        return gokv_set_error(GOKV_ENOMEM, "gokv_device_measure: metal: cannot allocate the buffer or start %u threads",
                              d->os_threads);
    out->read_gbps = gbps;
    out->peak_gflops = 0;
    std::snprintf(out->method, sizeof out->method, "host memory (emulated device): streaming read, %u threads",
                  d->os_threads);
    return GOKV_OK;
}

}  // extern "C"
