/* vk_harness.cc: see vk_harness.h. */
#include "vk_harness.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>

namespace gokvtest {

namespace {

std::mutex g_log_mu;
std::vector<std::string> g_log;

void capture_log(void *, int32_t level, const char *backend, const char *op, const char *msg) {
    static const char *const names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    std::ostringstream s;
    s << (level >= 0 && level <= 3 ? names[level] : "?") << " " << (backend ? backend : "-") << " "
      << (op ? op : "-") << ": " << (msg ? msg : "");
    std::lock_guard<std::mutex> lock(g_log_mu);
    g_log.push_back(s.str());
}

DevicePtr g_vk;
std::string g_vk_error;

/* Registers the backend and opens the shared device before any test, and closes it after the last one
 * under a validation watch of its own (messages at teardown fail the run). */
class VkEnvironment : public testing::Environment {
public:
    void SetUp() override {
        /* ctest's subgroup runs (tests/CMakeLists.txt) set only GOKV_TEST_LAVAPIPE_SUBGROUP=N (CMake 3.25's
         * gtest_discover_tests passes one environment variable per test): llvmpipe's vector width follows
         * from it (32 N bits), and validation is on as in every ctest run. */
        if (const char *sg = std::getenv("GOKV_TEST_LAVAPIPE_SUBGROUP")) {
            /* llvmpipe's vectors are at most 512 bits (gallivm's LP_MAX_VECTOR_WIDTH): 1024 bits "work" but
             * break llvmpipe itself (most attention tests fail there), which says nothing of the shaders */
            const int n = std::atoi(sg);
            ASSERT_TRUE(n == 4 || n == 8 || n == 16)
                << "GOKV_TEST_LAVAPIPE_SUBGROUP=" << sg << ": lavapipe runs subgroups of 4, 8 or 16 (128 to 512 bits)";
            setenv("LP_NATIVE_VECTOR_WIDTH", std::to_string(32 * n).c_str(), 1);
            setenv("GOKV_VULKAN_VALIDATION", "1", 0);
        }
        ASSERT_EQ(gokv_set_log_callback(capture_log, nullptr, GOKV_LOG_INFO), GOKV_OK) << gokv_last_error();
        ASSERT_EQ(gokv_vulkan_register(), GOKV_OK) << gokv_last_error();
        const char *val = std::getenv("GOKV_VULKAN_VALIDATION");
        const bool validation = val && val[0] && std::strcmp(val, "0") != 0;
        if (!validation)
            std::printf("[ WARNING  ] GOKV_VULKAN_VALIDATION is not set: the Khronos validation layer is off "
                        "(ctest sets it to 1)\n");
        ValidationWatch w;
        w.begin();
        gokv_device_desc d;
        std::memset(&d, 0, sizeof d);
        d.struct_size = sizeof d;
        d.backend = "vulkan";
        d.device_index = -1;
        d.n_threads = 2;
        gokv_device *dev = nullptr;
        const gokv_status st = gokv_device_open(&d, &dev);
        if (st != GOKV_OK || dev == nullptr) {
            g_vk_error = std::string(gokv_status_name(st)) + ": " + gokv_last_error() + "\nlog:\n" + log_since(0);
            return; /* every test then fails in its SetUp with this message */
        }
        g_vk.reset(dev);
        w.check("opening the shared " "vulkan" " device");
        gokv_device_info info = device_info(dev);
        std::printf("[ DEVICE   ] %s: %s, subgroup %d, %" PRIu64 " MiB, caps 0x%x, formats 0x%x, validation %s\n",
                    info.backend, info.name, info.subgroup_size, info.memory_bytes >> 20, info.caps, info.formats,
                    validation ? "on (with synchronization validation)" : "off");
    }
    void TearDown() override {
        ValidationWatch w;
        w.begin();
        g_vk.reset();
        w.check("closing the shared " "vulkan" " device");
    }
};

testing::Environment *const kEnvironment = testing::AddGlobalTestEnvironment(new VkEnvironment);

} // namespace

gokv_device *vk_device() { return g_vk.get(); }
const std::string &vk_open_error() { return g_vk_error; }

size_t log_mark() {
    std::lock_guard<std::mutex> lock(g_log_mu);
    return g_log.size();
}

std::string log_since(size_t mark) {
    std::lock_guard<std::mutex> lock(g_log_mu);
    std::string s;
    for (size_t i = mark; i < g_log.size(); i++) s += "  " + g_log[i] + "\n";
    return s;
}

void ValidationWatch::begin() {
    start = gokv_vulkan_validation_messages();
    mark = log_mark();
}

void ValidationWatch::check(const std::string &where) {
    const uint64_t now = gokv_vulkan_validation_messages();
    if (now == start) return;
    const std::string logged = log_since(mark);
    ADD_FAILURE() << where << ": " << (now - start)
                  << " Vulkan validation message(s) (any validation error or warning fails the suite); gokv log "
                     "since the test began:\n"
                  << logged;
    EXPECT_NE(logged.find("vulkan validation: "), std::string::npos)
        << "the validation messages did not reach the gokv log callback";
}

void VkTest::SetUp() {
    watch_.begin();
    ASSERT_NE(vk_device(), nullptr) << "the shared " "vulkan" " device did not open: " << vk_open_error();
}

void VkTest::TearDown() { watch_.check("after the test"); }

gokv_device_info device_info(gokv_device *dev) {
    gokv_device_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    const gokv_status st = gokv_device_info_get(dev, &info);
    EXPECT_EQ(st, GOKV_OK) << "gokv_device_info_get: " << gokv_last_error();
    return info;
}

} // namespace gokvtest
