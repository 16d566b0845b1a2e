// sycl_call.cpp: the SYCL module's gpu_ops (native/gpu/gpu_plan.h) over the device's in-order sycl::queue.
// A pipeline is a kernel instance from the generated tables (sycl_instances.hpp); a call records its
// dispatches, copies and fills, and submit enqueues them in order (a dispatch: q.submit of the instance's
// launcher over nd_range<3>({gz, gy, gx * wg}, {1, 1, wg}); a copy: q.memcpy; a fill: q.fill) and waits.
//
// Why record and enqueue at submit rather than at each op: dispatch, copy and fill return nothing to the
// plan, so enqueueing there would leave an exception nowhere to go; at submit every SYCL call sits in one
// try, and an injected submit failure leaves memory as it was, as the other modules' do. Barriers need no
// work: on an in-order queue each operation starts after the previous one has finished and its writes are
// visible to it (SYCL 2020 §4.6.5.2).
#include <cstdio>
#include <cstring>

#include "sycl_internal.hpp"

namespace gokv_sycl {

namespace {

sycl_device *device_of(gpu_call *c) { return reinterpret_cast<sycl_device *>(c->d); }

// "x" and "\"x\"" are the same instance name (a list may spell it either way).
bool same_name(const char *entry, const char *name) {
    if (std::strcmp(entry, name) == 0) return true;
    const size_t n = std::strlen(name);
    return entry[0] == '"' && std::strncmp(entry + 1, name, n) == 0 && entry[n + 1] == '"' && entry[n + 2] == 0;
}

gokv_status make_pipeline(sycl_device *d, const char *name, const uint32_t spec[GPU_SPEC_COUNT],
                          std::unique_ptr<pipeline> &out) {
    char inst_name[GPU_MAX_NAME];
    uint32_t local_words = 0;
    gokv_status st = gpu_kernel_instance(&d->base, name, spec, inst_name, &local_words);
    if (st != GOKV_OK) return st;
    const instance *inst = find_instance(inst_name);
    if (!inst)
        return gokv_set_error(GOKV_ENOTSUP,
                              "sycl: kernel instance %s is not compiled (no entry in the GOKV_SYCL_INSTANCES list of "
                              "native/sycl/kernels/%s.hpp, or no such file)",
                              inst_name, name);
    out.reset(new pipeline);
    out->name = inst_name;
    out->inst = inst;
    std::memcpy(out->spec, spec, sizeof out->spec);
    out->local_words = local_words;
    return GOKV_OK;
}

gokv_status op_pipeline(gpu_device *dev, const char *name, const uint32_t spec[GPU_SPEC_COUNT], gpu_pipeline *out) {
    sycl_device *d = reinterpret_cast<sycl_device *>(dev);
    device_state &s = *d->s;
    try {
        std::string key(name);
        key.push_back('\0');
        key.append(reinterpret_cast<const char *>(spec), sizeof(uint32_t) * GPU_SPEC_COUNT);
        std::lock_guard<std::mutex> lock(s.pipe_mu);
        auto it = s.pipelines.find(key);
        if (it == s.pipelines.end()) {
            std::unique_ptr<pipeline> p;
            const gokv_status st = make_pipeline(d, name, spec, p);
            if (st != GOKV_OK) return st;
            it = s.pipelines.emplace(key, std::move(p)).first;
        }
        *out = it->second.get();
        return GOKV_OK;
    } catch (...) {
        return exception_status(std::current_exception(), "sycl pipeline", name);
    }
}

usm_buffer &binding(gpu_call *c, int32_t b) {
    device_state &s = *device_of(c)->s;
    sycl_pool *p = reinterpret_cast<sycl_pool *>(c->p);
    switch (b) {
    case GPU_PAGES: return p && p->pages.data ? p->pages : s.dummy;
    case GPU_RINGS: return p && p->rings.data ? p->rings : s.dummy;
    case GPU_UP: return s.up;
    case GPU_SCRATCH: return s.scratch;
    default: return s.down;
    }
}

gokv_status op_begin(gpu_device *dev, gpu_pool *pool, uint64_t up_bytes, uint64_t scratch_bytes, uint64_t down_bytes,
                     gpu_call *c) {
    sycl_device *d = reinterpret_cast<sycl_device *>(dev);
    device_state &s = *d->s;
    std::memset(c, 0, sizeof *c);
    s.mu.lock();
    gokv_status st = GOKV_OK;
    if (s.lost) st = gokv_set_error(GOKV_EDEVICE, "sycl: the device was lost earlier; close it and open a new one");
    if (st == GOKV_OK) st = reserve(s.q, s.up, up_bytes, true, "sycl call", "the upload buffer");
    if (st == GOKV_OK) st = reserve(s.q, s.scratch, scratch_bytes, false, "sycl call", "the scratch buffer");
    if (st == GOKV_OK) st = reserve(s.q, s.down, down_bytes, true, "sycl call", "the download buffer");
    if (st != GOKV_OK) {
        s.mu.unlock();
        return st;
    }
    s.commands.clear();
    s.record_error.clear();
    c->d = dev;
    c->p = pool;
    c->up = s.up.data;
    c->down = s.down.data;
    c->up_bytes = up_bytes;
    c->scratch_bytes = scratch_bytes;
    c->down_bytes = down_bytes;
    c->impl = &s;
    return GOKV_OK;
}

void fail_record(gpu_call *c, const char *what) {
    device_state &s = *device_of(c)->s;
    try {
        if (s.record_error.empty()) s.record_error = what;
    } catch (...) {
        // the message could not be kept: submit still fails, with a shorter one
        s.record_error.clear();
        s.commands.clear();
    }
}

void record(gpu_call *c, const command &cmd) {
    device_state &s = *device_of(c)->s;
    if (!s.record_error.empty()) return;
    try {
        s.commands.push_back(cmd);
    } catch (...) {
        fail_record(c, "out of memory recording the call");
    }
}

void op_dispatch(gpu_call *c, gpu_pipeline pl, const void *push, uint32_t push_bytes, uint32_t gx, uint32_t gy,
                 uint32_t gz) {
    if (gx == 0 || gy == 0 || gz == 0) return;
    const pipeline *p = static_cast<const pipeline *>(pl);
    const gpu_caps &caps = c->d->caps;
    if (push_bytes > sizeof(command::push) || gx > caps.max_groups[0] || gy > caps.max_groups[1] ||
        gz > caps.max_groups[2]) {
        char why[256];
        std::snprintf(why, sizeof why, "dispatch of %s out of the device's limits: %u push bytes, grid %u x %u x %u",
                      p->name.c_str(), push_bytes, gx, gy, gz);
        return fail_record(c, why);
    }
    command cmd{};
    cmd.kind = command::dispatch;
    cmd.pl = p;
    if (push && push_bytes) std::memcpy(cmd.push, push, push_bytes);
    cmd.grid[0] = gx, cmd.grid[1] = gy, cmd.grid[2] = gz;
    record(c, cmd);
}

void op_copy(gpu_call *c, int32_t src, uint64_t src_off, int32_t dst, uint64_t dst_off, uint64_t bytes) {
    if (bytes == 0) return;
    command cmd{};
    cmd.kind = command::copy;
    cmd.src = src, cmd.src_off = src_off, cmd.dst = dst, cmd.dst_off = dst_off, cmd.bytes = bytes;
    record(c, cmd);
}

void op_fill(gpu_call *c, int32_t dst, uint64_t off, uint64_t bytes, uint32_t word) {
    if (bytes == 0) return;
    command cmd{};
    cmd.kind = command::fill;
    cmd.dst = dst, cmd.dst_off = off, cmd.bytes = bytes, cmd.word = word;
    record(c, cmd);
}

// Nothing to do: the queue is in order (see the top of the file).
void op_barrier(gpu_call *) {}

// Enqueues one recorded operation (throws what the runtime throws).
void enqueue(gpu_call *c, const command &cmd) {
    device_state &s = *device_of(c)->s;
    switch (cmd.kind) {
    case command::dispatch: {
        const pipeline *p = cmd.pl;
        args a;
        a.pages = reinterpret_cast<uint32_t *>(binding(c, GPU_PAGES).data);
        a.rings = reinterpret_cast<uint32_t *>(binding(c, GPU_RINGS).data);
        a.up = reinterpret_cast<uint32_t *>(s.up.data);
        a.scratch = reinterpret_cast<uint32_t *>(s.scratch.data);
        a.down = reinterpret_cast<uint32_t *>(s.down.data);
        std::memcpy(a.push, cmd.push, sizeof a.push);
        std::memcpy(a.spec, p->spec, sizeof a.spec);
        const size_t wg = c->d->caps.wg_size;
        const sycl::nd_range<3> range(sycl::range<3>(cmd.grid[2], cmd.grid[1], (size_t)cmd.grid[0] * wg),
                                      sycl::range<3>(1, 1, wg));
        const launcher launch = p->inst->launch;
        const uint32_t local_words = p->local_words;
        s.q.submit([&](sycl::handler &h) { launch(h, range, a, local_words); });
        break;
    }
    case command::copy:
        s.q.memcpy(binding(c, cmd.dst).data + cmd.dst_off, binding(c, cmd.src).data + cmd.src_off, cmd.bytes);
        break;
    case command::fill: {
        uint8_t *p = binding(c, cmd.dst).data + cmd.dst_off;
        const uint64_t words = cmd.bytes / 4u;
        if (words) s.q.fill(reinterpret_cast<uint32_t *>(p), cmd.word, words);
        // a tail of 1..3 bytes takes the word's first bytes, as vkCmdFillBuffer's whole-size fill would; the
        // source lives in the recorded command, which outlasts the wait
        if (cmd.bytes % 4u) s.q.memcpy(p + words * 4u, &cmd.word, cmd.bytes % 4u);
        break;
    }
    }
}

const char *kind_name(const command &cmd) {
    return cmd.kind == command::dispatch ? "dispatch" : cmd.kind == command::copy ? "copy" : "fill";
}

gokv_status op_submit(gpu_call *c, const char *op) {
    device_state &s = *device_of(c)->s;
    if (!s.record_error.empty())
        return gokv_set_error(GOKV_EDEVICE, "%s: sycl: %s", op, s.record_error.c_str());
    const int32_t fault = take_fault(GOKV_FAULT_SUBMIT);
    if (fault != 0) {
        s.lost = true;
        gokv_log(GOKV_LOG_ERROR, kBackend, op, "injected submit failure (code %d)", (int)fault);
        return gokv_set_error(GOKV_EDEVICE,
                              "%s: sycl: the queue's work failed (injected, code %d); the device is lost: close it "
                              "and open a new one",
                              op, (int)fault);
    }
    const command *current = nullptr;
    try {
        for (const command &cmd : s.commands) {
            current = &cmd;
            enqueue(c, cmd);
        }
        current = nullptr;
        s.q.wait_and_throw();
    } catch (...) {
        const std::exception_ptr error = std::current_exception();
        // The queue may still hold work that reads or writes the call's buffers: drain it before they are reused
        // or freed. The device stays open: if the runtime lost it, the next call fails the same way.
        try {
            s.q.wait();
        } catch (...) {
        }
        char what[160];
        if (current && current->kind == command::dispatch)
            std::snprintf(what, sizeof what, "enqueueing kernel %s (grid %u x %u x %u of %u)", current->pl->name.c_str(),
                          current->grid[0], current->grid[1], current->grid[2], c->d->caps.wg_size);
        else if (current)
            std::snprintf(what, sizeof what, "enqueueing a %s of %llu bytes", kind_name(*current),
                          (unsigned long long)current->bytes);
        else
            std::snprintf(what, sizeof what, "running the call's %zu operations", s.commands.size());
        s.commands.clear();
        return exception_status(error, op, what);
    }
    s.commands.clear();
    return GOKV_OK;
}

void op_end(gpu_call *c) {
    if (c->d) {
        device_state &s = *device_of(c)->s;
        s.commands.clear();
        s.mu.unlock();
    }
    std::memset(c, 0, sizeof *c);
}

} // namespace

const instance *find_instance(const char *name) {
    for (const instance_table *const *t = kernel_tables; *t; t++)
        for (size_t i = 0; i < (*t)->count; i++)
            if (same_name((*t)->entries[i].name, name)) return &(*t)->entries[i];
    return nullptr;
}

const gpu_ops ops = {op_pipeline, op_begin, op_dispatch, op_copy, op_fill, op_barrier, op_submit, op_end};

} // namespace gokv_sycl
