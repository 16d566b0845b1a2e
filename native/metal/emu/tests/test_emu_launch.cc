// test_emu_launch.cc: kernels written as the module's are (tests/kernels/emu_test.metal) run through the
// emulator's launcher and through the backend's gpu_ops, in every run order and on several OS threads; and
// the mistakes the emulator exists to catch come back as errors naming the kernel's source line (launch) and
// as GOKV_EDEVICE naming the instance (submit), never as an abort.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gokv_metal.h"
#include "mtl_emu_internal.h"
#include "mtl_emu_kernel.h"

namespace gokv_mtl_emu {
extern const Table *const test_kernel_tables[];
}

namespace {

using gokv_mtl_emu::Args;
using gokv_mtl_emu::Entry;

const Entry &instance(const char *name) {
    const Entry *e = gokv_mtl_emu::find_instance(gokv_mtl_emu::test_kernel_tables, name);
    if (!e) {
        ADD_FAILURE() << "no kernel instance " << name;
        static const Entry none = {"none", [](const Args &) {}};
        return none;
    }
    return *e;
}

simt::Dispatch dispatch(uint32_t groups, simt::RunOrder order, uint32_t os_threads, size_t tg_bytes) {
    simt::Dispatch d;
    d.grid = {groups, 1, 1};
    d.threads = {128, 1, 1};
    d.simd_width = 32;
    d.threadgroup_memory_bytes = tg_bytes;
    d.order = order;
    d.seed = 99;
    d.os_threads = os_threads;
    d.stack_bytes = 64 * 1024;
    return d;
}

struct Buffers {
    std::vector<uint32_t> b[5];
    uint32_t push[32] = {};
    uint32_t spec[GPU_SPEC_COUNT] = {};
    Args args() {
        Args a;
        for (int i = 0; i < 5; i++) a.buffers[i] = b[i].data();
        a.push = push;
        a.spec = spec;
        return a;
    }
};

TEST(MetalEmuLaunch, InstancesAreListed) {
    EXPECT_NE(gokv_mtl_emu::find_instance(gokv_mtl_emu::test_kernel_tables, "group_sum_4"), nullptr);
    EXPECT_NE(gokv_mtl_emu::find_instance(gokv_mtl_emu::test_kernel_tables, "broken_simd"), nullptr);
    EXPECT_EQ(gokv_mtl_emu::find_instance(gokv_mtl_emu::test_kernel_tables, "group_sum_8"), nullptr);
}

TEST(MetalEmuLaunch, GroupSumInEveryOrder) {
    const uint32_t n = 1000, groups = (n + 127) / 128;
    for (simt::RunOrder order : {simt::RunOrder::forward, simt::RunOrder::reverse, simt::RunOrder::shuffled}) {
        for (uint32_t os_threads : {1u, 3u}) {
            Buffers m;
            for (auto &v : m.b) v.assign(64, 0u);
            m.b[2].resize(n);
            for (uint32_t i = 0; i < n; i++) {
                const float x = float(i % 7) - 2.0f;
                std::memcpy(&m.b[2][i], &x, 4);
            }
            m.b[4].assign(groups, 0u);
            m.push[0] = n;
            const Args a = m.args();
            simt::Status st = gokv_mtl_emu::launch(instance("group_sum_4"), a, dispatch(groups, order, os_threads, 16));
            ASSERT_TRUE(st.ok) << st.message;
            for (uint32_t g = 0; g < groups; g++) {
                float want = 0.0f;
                for (uint32_t i = g * 128; i < n && i < g * 128 + 128; i++) want += float(i % 7) - 2.0f;
                float got;
                std::memcpy(&got, &m.b[4][g], 4);
                EXPECT_EQ(got, want) << "group " << g;
            }
        }
    }
}

// The errors name the kernel's own file and line (the build's copy carries #line directives).
TEST(MetalEmuLaunch, MissingBarrierIsAnErrorNamingTheKernelLine) {
    Buffers m;
    for (auto &v : m.b) v.assign(256, 0u);
    m.push[0] = 5;
    const Args a = m.args();
    simt::Status st = gokv_mtl_emu::launch(instance("broken_barrier"), a, dispatch(2, simt::RunOrder::shuffled, 1, 0));
    ASSERT_FALSE(st.ok);
    EXPECT_NE(st.message.find("emu_test.metal:"), std::string::npos) << st.message;
    EXPECT_NE(st.message.find("exited"), std::string::npos) << st.message;
}

TEST(MetalEmuLaunch, DivergentSimdFunctionIsAnError) {
    Buffers m;
    for (auto &v : m.b) v.assign(256, 0u);
    m.push[0] = 40;
    const Args a = m.args();
    simt::Status st = gokv_mtl_emu::launch(instance("broken_simd"), a, dispatch(1, simt::RunOrder::forward, 1, 0));
    ASSERT_FALSE(st.ok);
    EXPECT_NE(st.message.find("emu_test.metal:"), std::string::npos) << st.message;
}

TEST(MetalEmuLaunch, DivergentBarrierIsAnError) {
    Buffers m;
    for (auto &v : m.b) v.assign(256, 0u);
    m.push[0] = 64;
    const Args a = m.args();
    simt::Status st = gokv_mtl_emu::launch(instance("broken_divergent"), a, dispatch(1, simt::RunOrder::reverse, 1, 0));
    ASSERT_FALSE(st.ok);
    EXPECT_NE(st.message.find("emu_test.metal:"), std::string::npos) << st.message;
}

// The backend's device: the plan's call sequence on gpu_ops, with a test kernel as the pipeline.
struct Device {
    mtl_emu_device *d = nullptr;
    Device() {
        gokv_device_desc desc;
        std::memset(&desc, 0, sizeof desc);
        desc.struct_size = sizeof desc;
        desc.backend = "metal";
        desc.device_index = -1;
        void *impl = nullptr;
        EXPECT_EQ(mtl_emu_device_open(&desc, &impl), GOKV_OK) << gokv_last_error();
        d = static_cast<mtl_emu_device *>(impl);
    }
    ~Device() { mtl_emu_device_close(d); }
    gpu_pipeline pipeline(const char *name, uint32_t tg_words) {
        uint32_t spec[GPU_SPEC_COUNT] = {};
        gpu_pipeline p = nullptr;
        EXPECT_EQ(gokv_mtl_emu::pipeline_for_entry(&d->base, &instance(name), tg_words, spec, &p), GOKV_OK);
        return p;
    }
};

TEST(MetalEmuDevice, CapsAreAnAppleGpus) {
    Device dev;
    ASSERT_NE(dev.d, nullptr);
    EXPECT_EQ(dev.d->base.caps.subgroup_size, 32u);
    EXPECT_EQ(dev.d->base.caps.wg_size, 128u);
    EXPECT_EQ(dev.d->base.caps.max_shared_bytes, 32768u);
    EXPECT_EQ(dev.d->base.caps.stage_inputs, 0);
    gokv_device_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    ASSERT_EQ(mtl_emu_device_info(dev.d, &info), GOKV_OK);
    EXPECT_NE(std::string(info.name).find("emulated"), std::string::npos) << info.name;
}

TEST(MetalEmuDevice, MeasuresTheHostMemory) {
    Device dev;
    ASSERT_NE(dev.d, nullptr);
    gokv_device_ceilings c;
    std::memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    ASSERT_EQ(mtl_emu_measure(dev.d, 4u << 20, &c), GOKV_OK) << gokv_last_error();
    EXPECT_GT(c.read_gbps, 0.0);
    EXPECT_NE(std::string(c.method).find("host memory"), std::string::npos) << c.method;
}

TEST(MetalEmuDevice, CallRunsCopiesFillsAndDispatchesInOrder) {
    Device dev;
    ASSERT_NE(dev.d, nullptr);
    gpu_pipeline sum = dev.pipeline("group_sum_4", 4);
    const uint32_t n = 256;
    gpu_call c;
    ASSERT_EQ(gpu_call_begin(&dev.d->base, nullptr, n * 4, n * 4, 64, &c), GOKV_OK) << gokv_last_error();
    float *up = reinterpret_cast<float *>(c.up);
    for (uint32_t i = 0; i < n; i++) up[i] = 1.0f;
    // scratch = up, then up's first half = 2.0: the kernel reads up, so the fill must come before it
    c.d->ops->copy(&c, GPU_UP, 0, GPU_SCRATCH, 0, n * 4);
    const float two = 2.0f;
    uint32_t two_bits;
    std::memcpy(&two_bits, &two, 4);
    c.d->ops->fill(&c, GPU_UP, 0, n * 2, two_bits);
    gpu_barrier(&c);
    const uint32_t push[1] = {n};
    gpu_dispatch(&c, sum, push, sizeof push, 2, 1, 1);
    ASSERT_EQ(gpu_call_submit(&c, "test"), GOKV_OK) << gokv_last_error();
    const float *down = reinterpret_cast<const float *>(c.down);
    EXPECT_EQ(down[0], 256.0f);  // 128 x 2.0
    EXPECT_EQ(down[1], 128.0f);  // 128 x 1.0
    gpu_call_end(&c);
}

// gpu_copy / gpu_fill check their ranges against the call's bindings for every module: one outside fails the
// call at submit, naming it, and nothing of the call runs (the earlier, valid copy included).
TEST(MetalEmuDevice, CopyOrFillOutsideItsBindingFailsTheCallAndRunsNothing) {
    Device dev;
    ASSERT_NE(dev.d, nullptr);
    for (int fill = 0; fill < 2; fill++) {
        gpu_call c;
        ASSERT_EQ(gpu_call_begin(&dev.d->base, nullptr, 64, 0, 64, &c), GOKV_OK) << gokv_last_error();
        std::memset(c.up, 0x11, 64);
        std::memset(c.down, 0, 64);
        gpu_copy(&c, GPU_UP, 0, GPU_DOWN, 0, 64);
        if (fill) gpu_fill(&c, GPU_DOWN, 32, 64, 0);
        else gpu_copy(&c, GPU_UP, 8, GPU_DOWN, 0, 64);
        EXPECT_EQ(gpu_call_submit(&c, "test"), GOKV_EDEVICE);
        const std::string msg = gokv_last_error();
        EXPECT_NE(msg.find(fill ? "test: fill of 64 bytes of binding" : "test: copy of 64 bytes from binding"),
                  std::string::npos) << msg;
        EXPECT_EQ(c.down[0], 0u) << "the call's valid copy ran";
        gpu_call_end(&c);
    }
}

TEST(MetalEmuDevice, KernelErrorIsEDEVICENamingTheInstance) {
    Device dev;
    ASSERT_NE(dev.d, nullptr);
    gpu_pipeline broken = dev.pipeline("broken_barrier", 0);
    gpu_call c;
    ASSERT_EQ(gpu_call_begin(&dev.d->base, nullptr, 64, 64, 128 * 4, &c), GOKV_OK);
    const uint32_t push[1] = {7};
    gpu_dispatch(&c, broken, push, sizeof push, 1, 1, 1);
    EXPECT_EQ(gpu_call_submit(&c, "gokv_attend"), GOKV_EDEVICE);
    const std::string msg = gokv_last_error();
    gpu_call_end(&c);
    EXPECT_NE(msg.find("gokv_attend: metal: kernel broken_barrier"), std::string::npos) << msg;
    EXPECT_NE(msg.find("emu_test.metal:"), std::string::npos) << msg;
    // the device goes on working
    gpu_pipeline sum = dev.pipeline("group_sum_4", 4);
    ASSERT_EQ(gpu_call_begin(&dev.d->base, nullptr, 128 * 4, 0, 64, &c), GOKV_OK);
    std::memset(c.up, 0, 128 * 4);
    const uint32_t push2[1] = {128};
    gpu_dispatch(&c, sum, push2, sizeof push2, 1, 1, 1);
    EXPECT_EQ(gpu_call_submit(&c, "test"), GOKV_OK) << gokv_last_error();
    gpu_call_end(&c);
}

TEST(MetalEmuDevice, UnknownKernelIsENOTSUP) {
    Device dev;
    ASSERT_NE(dev.d, nullptr);
    uint32_t spec[GPU_SPEC_COUNT] = {};
    gpu_pipeline p = nullptr;
    EXPECT_EQ(gpu_get_pipeline(&dev.d->base, "no_such_kernel", spec, &p), GOKV_ENOTSUP);
    EXPECT_NE(std::string(gokv_last_error()).find("no_such_kernel"), std::string::npos) << gokv_last_error();
}

TEST(MetalEmuDevice, EnvironmentIsChecked) {
    setenv("GOKV_METAL_EMU_ORDER", "sideways", 1);
    gokv_device_desc desc;
    std::memset(&desc, 0, sizeof desc);
    desc.struct_size = sizeof desc;
    desc.device_index = -1;
    void *impl = nullptr;
    EXPECT_EQ(mtl_emu_device_open(&desc, &impl), GOKV_EINVAL);
    EXPECT_NE(std::string(gokv_last_error()).find("GOKV_METAL_EMU_ORDER"), std::string::npos);
    unsetenv("GOKV_METAL_EMU_ORDER");
}

TEST(MetalEmuDevice, RegistersAsMetal) {
    ASSERT_EQ(gokv_metal_register(), GOKV_OK);
    bool found = false;
    for (int32_t i = 0; i < gokv_backend_count(); i++) found = found || std::strcmp(gokv_backend_name(i), "metal") == 0;
    EXPECT_TRUE(found);
}

}  // namespace
