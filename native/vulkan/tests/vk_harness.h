/*
 * vk_harness.h: the Vulkan module's own tests (what only Vulkan has: the device it reports, its subgroup
 * sizes, its memory limits); every case every backend must pass runs in the conformance suite
 * (native/tests), on Vulkan too. The shared Vulkan device and the validation-layer watch every test runs
 * under.
 *
 * Validation: the global environment installs a log callback, registers the backend and opens the shared
 * device; every fixture (VkTest) fails its test if gokv_vulkan_validation_messages() grew during it and
 * prints the messages the log captured. GOKV_TEST_LAVAPIPE_SUBGROUP=N (ctest's subgroup runs) sets
 * llvmpipe's vector width to 32 N bits and validation on.
 */
#ifndef GOKV_VK_TESTS_HARNESS_H
#define GOKV_VK_TESTS_HARNESS_H

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gokv_vulkan.h"
#include "reference.h"

namespace gokvtest {

/* The Vulkan device shared by the suite (opened by the global environment; null if that failed). */
gokv_device *vk_device();
/* Why the shared Vulkan device is null ("" when it is open). */
const std::string &vk_open_error();

/* Log messages captured since the process started (all levels), formatted "LEVEL backend op: msg". */
size_t log_mark();
std::string log_since(size_t mark);

/* Fails the current test if gokv_vulkan_validation_messages() grew since begin(), printing the log
 * messages captured meanwhile. Every fixture of the suite runs its test between begin() and check(). */
struct ValidationWatch {
    uint64_t start = 0;
    size_t mark = 0;
    void begin();
    void check(const std::string &where);
};

class VkTest : public testing::Test {
protected:
    void SetUp() override;
    void TearDown() override;
    ValidationWatch watch_;
};

/* A gokv_device_info of dev (test failure if the call fails). */
gokv_device_info device_info(gokv_device *dev);

} // namespace gokvtest

#endif
