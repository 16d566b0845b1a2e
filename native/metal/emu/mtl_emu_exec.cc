// mtl_emu_exec.cc: the emulated Metal backend's gpu_ops (native/gpu/gpu_plan.h): pipelines are kernel
// instances from the generated tables (mtl_emu_kernel.h), a call records its dispatches, copies and fills,
// and submit runs them in order, every dispatch through simt::launch (native/simt), every copy and fill as
// a memcpy / word fill. native/metal/emu/README.md has the mapping and what it checks.
//
// Recording and running at submit (rather than at each dispatch) keeps the GPU's contract: nothing of a
// call happens before its submit, and an injected submit failure leaves memory as it was. Dispatches run
// one after the other, so barriers need no work. The ops are called from C: nothing throws out of them.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "mtl_emu_internal.h"
#include "mtl_emu_kernel.h"

namespace gokv_mtl_emu {

const Entry *find_instance(const Table *const *tables, const char *name) {
    for (; *tables; tables++)
        for (size_t i = 0; i < (*tables)->count; i++)
            if (std::strcmp((*tables)->entries[i].name, name) == 0) return &(*tables)->entries[i];
    return nullptr;
}

simt::Status launch(const Entry &entry, const Args &args, const simt::Dispatch &d) {
    const RunFn run = entry.run;
    return simt::launch(d, [run, &args] { run(args); });
}

}  // namespace gokv_mtl_emu

namespace {

using gokv_mtl_emu::Args;
using gokv_mtl_emu::Entry;

// One compiled pipeline: a kernel instance, its specialization words (buffer 6) and threadgroup memory.
struct Pipeline {
    std::string instance;
    const Entry *entry = nullptr;
    uint32_t spec[GPU_SPEC_COUNT] = {};
    uint32_t tg_words = 0;
};

struct Command {
    enum Kind { dispatch, copy, fill } kind;
    const Pipeline *pipeline;
    uint32_t push[GPU_PUSH_BYTES / 4];
    uint32_t grid[3];
    int32_t src, dst;
    uint64_t src_off, dst_off, bytes;
    uint32_t word;
};

}  // namespace

struct mtl_emu_exec {
    pthread_mutex_t pipe_mu = PTHREAD_MUTEX_INITIALIZER;  // the pipeline cache (pipelines are made outside calls)
    std::unordered_map<std::string, std::unique_ptr<Pipeline>> pipelines;
    std::vector<Command> commands;  // the call being recorded
    std::string record_error;       // what went wrong while recording (reported by submit)
    uint64_t dispatches = 0;        // dispatches run on this device: the shuffled order's seed offset
};

namespace {

mtl_emu_device *device_of(gpu_call *c) { return reinterpret_cast<mtl_emu_device *>(c->d); }

gokv_status make_pipeline(mtl_emu_device *d, const char *name, const uint32_t spec[GPU_SPEC_COUNT],
                          std::unique_ptr<Pipeline> &out) {
    char instance[GPU_MAX_NAME];
    uint32_t tg_words = 0;
    gokv_status st = gpu_kernel_instance(&d->base, name, spec, instance, &tg_words);
    if (st != GOKV_OK) return st;
    const Entry *e = gokv_mtl_emu::find_instance(gokv_mtl_emu::kernel_tables, instance);
    if (!e)
        return gokv_set_error(GOKV_ENOTSUP,
                              "metal: kernel instance %s is not compiled (no entry in the MTL_INSTANCES list of "
                              "native/metal/kernels/%s.metal)",
                              instance, name);
    out.reset(new Pipeline);
    out->instance = instance;
    out->entry = e;
    std::memcpy(out->spec, spec, sizeof out->spec);
    out->tg_words = tg_words;
    return GOKV_OK;
}

gokv_status op_pipeline(gpu_device *dev, const char *name, const uint32_t spec[GPU_SPEC_COUNT], gpu_pipeline *out) {
    mtl_emu_device *d = reinterpret_cast<mtl_emu_device *>(dev);
    mtl_emu_exec *x = d->exec;
    try {
        std::string key(name);
        key.push_back('\0');
        key.append(reinterpret_cast<const char *>(spec), sizeof(uint32_t) * GPU_SPEC_COUNT);
        pthread_mutex_lock(&x->pipe_mu);
        auto it = x->pipelines.find(key);
        gokv_status st = GOKV_OK;
        if (it == x->pipelines.end()) {
            std::unique_ptr<Pipeline> p;
            st = make_pipeline(d, name, spec, p);
            if (st == GOKV_OK) it = x->pipelines.emplace(key, std::move(p)).first;
        }
        if (st == GOKV_OK) *out = it->second.get();
        pthread_mutex_unlock(&x->pipe_mu);
        return st;
    } catch (const std::bad_alloc &) {
        pthread_mutex_unlock(&x->pipe_mu);
        return gokv_set_error(GOKV_ENOMEM, "metal: out of memory creating the pipeline of %s", name);
    }
}

mtl_emu_buffer *binding(gpu_call *c, int32_t b) {
    mtl_emu_device *d = device_of(c);
    mtl_emu_pool *p = reinterpret_cast<mtl_emu_pool *>(c->p);
    switch (b) {
    case GPU_PAGES: return p && p->pages.data ? &p->pages : &d->dummy;
    case GPU_RINGS: return p && p->rings.data ? &p->rings : &d->dummy;
    case GPU_UP: return &d->up;
    case GPU_SCRATCH: return &d->scratch;
    default: return &d->down;
    }
}

gokv_status op_begin(gpu_device *dev, gpu_pool *pool, uint64_t up_bytes, uint64_t scratch_bytes, uint64_t down_bytes,
                     gpu_call *c) {
    mtl_emu_device *d = reinterpret_cast<mtl_emu_device *>(dev);
    std::memset(c, 0, sizeof *c);
    pthread_mutex_lock(&d->mu);
    gokv_status st = GOKV_OK;
    if (d->lost)
        st = gokv_set_error(GOKV_EDEVICE, "metal: the device was lost earlier; close it and open a new one");
    if (st == GOKV_OK) st = mtl_emu_buffer_reserve(&d->up, up_bytes, "metal call", "the upload buffer");
    if (st == GOKV_OK) st = mtl_emu_buffer_reserve(&d->scratch, scratch_bytes, "metal call", "the scratch buffer");
    if (st == GOKV_OK) st = mtl_emu_buffer_reserve(&d->down, down_bytes, "metal call", "the download buffer");
    if (st != GOKV_OK) {
        pthread_mutex_unlock(&d->mu);
        return st;
    }
    d->exec->commands.clear();
    d->exec->record_error.clear();
    c->d = dev;
    c->p = pool;
    c->up = d->up.data;
    c->down = d->down.data;
    c->up_bytes = up_bytes;
    c->scratch_bytes = scratch_bytes;
    c->down_bytes = down_bytes;
    c->impl = d->exec;
    return GOKV_OK;
}

void record(gpu_call *c, const Command &cmd) {
    mtl_emu_exec *x = device_of(c)->exec;
    if (!x->record_error.empty()) return;
    try {
        x->commands.push_back(cmd);
    } catch (const std::bad_alloc &) {
        x->record_error = "out of memory recording the call";
    }
}

void fail_record(gpu_call *c, const std::string &what) {
    mtl_emu_exec *x = device_of(c)->exec;
    if (x->record_error.empty()) x->record_error = what;
}

void op_dispatch(gpu_call *c, gpu_pipeline pl, const void *push, uint32_t push_bytes, uint32_t gx, uint32_t gy,
                 uint32_t gz) {
    if (gx == 0 || gy == 0 || gz == 0) return;
    const Pipeline *p = static_cast<const Pipeline *>(pl);
    const gpu_caps &caps = c->d->caps;
    char why[256];
    if (push_bytes > GPU_PUSH_BYTES || gx > caps.max_groups[0] || gy > caps.max_groups[1] || gz > caps.max_groups[2]) {
        std::snprintf(why, sizeof why, "dispatch of %s out of the device's limits: %u push bytes, grid %u x %u x %u",
                      p->instance.c_str(), push_bytes, gx, gy, gz);
        return fail_record(c, why);
    }
    Command cmd{};
    cmd.kind = Command::dispatch;
    cmd.pipeline = p;
    if (push && push_bytes) std::memcpy(cmd.push, push, push_bytes);
    cmd.grid[0] = gx, cmd.grid[1] = gy, cmd.grid[2] = gz;
    record(c, cmd);
}

void op_copy(gpu_call *c, int32_t src, uint64_t src_off, int32_t dst, uint64_t dst_off, uint64_t bytes) {
    if (bytes == 0) return;
    Command cmd{};
    cmd.kind = Command::copy;
    cmd.src = src, cmd.src_off = src_off, cmd.dst = dst, cmd.dst_off = dst_off, cmd.bytes = bytes;
    record(c, cmd);
}

void op_fill(gpu_call *c, int32_t dst, uint64_t off, uint64_t bytes, uint32_t word) {
    if (bytes == 0) return;
    Command cmd{};
    cmd.kind = Command::fill;
    cmd.dst = dst, cmd.dst_off = off, cmd.bytes = bytes, cmd.word = word;
    record(c, cmd);
}

void op_barrier(gpu_call *) {}  // commands run one after the other

// Runs one dispatch; "" or what failed.
std::string run_dispatch(gpu_call *c, const Command &cmd) {
    mtl_emu_device *d = device_of(c);
    const Pipeline *p = cmd.pipeline;
    Args args;
    for (int i = 0; i < GPU_N_BINDINGS; i++) args.buffers[i] = reinterpret_cast<uint32_t *>(binding(c, i)->data);
    args.push = cmd.push;
    args.spec = p->spec;
    simt::Dispatch sd;
    sd.grid = {cmd.grid[0], cmd.grid[1], cmd.grid[2]};
    sd.threads = {d->base.caps.wg_size, 1, 1};
    sd.simd_width = d->base.caps.subgroup_size;
    sd.threadgroup_memory_bytes = (size_t)p->tg_words * 4u;
    sd.order = static_cast<simt::RunOrder>(d->order);
    sd.seed = d->seed + d->exec->dispatches++;
    sd.stack_bytes = d->stack_bytes;
    sd.os_threads = d->os_threads;
    simt::Status st = gokv_mtl_emu::launch(*p->entry, args, sd);
    if (st.ok) return std::string();
    char head[256];
    std::snprintf(head, sizeof head, "kernel %s (grid %u x %u x %u of %u threads, %s order, seed %llu): ",
                  p->instance.c_str(), cmd.grid[0], cmd.grid[1], cmd.grid[2], d->base.caps.wg_size,
                  d->order == 0 ? "forward" : d->order == 1 ? "reverse" : "shuffled", (unsigned long long)sd.seed);
    return head + st.message;
}

void run_copy(gpu_call *c, const Command &cmd) {
    std::memmove(binding(c, cmd.dst)->data + cmd.dst_off, binding(c, cmd.src)->data + cmd.src_off, cmd.bytes);
}

void run_fill(gpu_call *c, const Command &cmd) {
    uint8_t *p = binding(c, cmd.dst)->data + cmd.dst_off;
    const uint64_t words = cmd.bytes / 4u;
    uint32_t *w = reinterpret_cast<uint32_t *>(p);
    if (cmd.word == 0)
        std::memset(p, 0, words * 4u);
    else
        std::fill(w, w + words, cmd.word);
    // a tail of 1..3 bytes takes the word's first bytes, as vkCmdFillBuffer's whole-size fill would
    std::memcpy(p + words * 4u, &cmd.word, cmd.bytes % 4u);
}

gokv_status op_submit(gpu_call *c, const char *op) {
    mtl_emu_device *d = device_of(c);
    mtl_emu_exec *x = d->exec;
    if (!x->record_error.empty())
        return gokv_set_error(GOKV_EDEVICE, "%s: metal: %s", op, x->record_error.c_str());
    const int32_t fault = mtl_emu_take_fault(GOKV_FAULT_SUBMIT);
    if (fault != 0) {
        d->lost = 1;
        gokv_log(GOKV_LOG_ERROR, "metal", op, "injected command buffer failure (code %d)", (int)fault);
        return gokv_set_error(GOKV_EDEVICE,
                              "%s: metal: the command buffer failed (injected, code %d); the device is lost: close "
                              "it and open a new one",
                              op, (int)fault);
    }
    try {
        for (const Command &cmd : x->commands) {
            switch (cmd.kind) {
            case Command::dispatch: {
                std::string err = run_dispatch(c, cmd);
                if (!err.empty()) {
                    x->commands.clear();
                    gokv_log(GOKV_LOG_ERROR, "metal", op, "%s", err.c_str());
                    return gokv_set_error(GOKV_EDEVICE, "%s: metal: %s", op, err.c_str());
                }
                break;
            }
            case Command::copy: run_copy(c, cmd); break;
            case Command::fill: run_fill(c, cmd); break;
            }
        }
    } catch (const std::bad_alloc &) {
        x->commands.clear();
        return gokv_set_error(GOKV_ENOMEM, "%s: metal: out of memory running the call", op);
    }
    x->commands.clear();
    return GOKV_OK;
}

void op_end(gpu_call *c) {
    if (c->d) {
        mtl_emu_device *d = device_of(c);
        d->exec->commands.clear();
        pthread_mutex_unlock(&d->mu);
    }
    std::memset(c, 0, sizeof *c);
}

}  // namespace

gokv_status gokv_mtl_emu::pipeline_for_entry(gpu_device *dev, const Entry *entry, uint32_t tg_words,
                                             const uint32_t spec[GPU_SPEC_COUNT], gpu_pipeline *out) {
    mtl_emu_exec *x = reinterpret_cast<mtl_emu_device *>(dev)->exec;
    try {
        std::string key = std::string("entry:") + entry->name + ":" + std::to_string(tg_words);
        key.push_back('\0');
        key.append(reinterpret_cast<const char *>(spec), sizeof(uint32_t) * GPU_SPEC_COUNT);
        std::unique_ptr<Pipeline> p(new Pipeline);
        p->instance = entry->name;
        p->entry = entry;
        std::memcpy(p->spec, spec, sizeof p->spec);
        p->tg_words = tg_words;
        pthread_mutex_lock(&x->pipe_mu);
        auto it = x->pipelines.find(key);
        if (it == x->pipelines.end()) it = x->pipelines.emplace(key, std::move(p)).first;
        *out = it->second.get();
        pthread_mutex_unlock(&x->pipe_mu);
        return GOKV_OK;
    } catch (const std::bad_alloc &) {
        return gokv_set_error(GOKV_ENOMEM, "metal: out of memory creating the pipeline of %s", entry->name);
    }
}

extern "C" {

const gpu_ops mtl_emu_ops = {op_pipeline, op_begin, op_dispatch, op_copy, op_fill, op_barrier, op_submit, op_end};

gokv_status mtl_emu_exec_create(mtl_emu_exec **out) {
    *out = new (std::nothrow) mtl_emu_exec;
    return *out ? GOKV_OK : gokv_set_error(GOKV_ENOMEM, "gokv_device_open: metal: out of memory");
}

void mtl_emu_exec_destroy(mtl_emu_exec *e) { delete e; }

}  // extern "C"
