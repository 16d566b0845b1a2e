// What the emulated SYCL shim's tests share: the emulation settings for one test, set through the
// environment as the conformance suite sets them, and restored after it.
#ifndef GOKV_SYCL_EMU_TEST_H
#define GOKV_SYCL_EMU_TEST_H

#include <gtest/gtest.h>
#include <sycl/sycl.hpp>

#include <cstdlib>
#include <string>

namespace sycl_emu_test {

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// Sets GOKV_SYCL_EMU_* for a scope.
class Settings {
  public:
    Settings(unsigned sub_group, const char *order = "shuffled", unsigned threads = 2) {
        setenv("GOKV_SYCL_EMU_SUBGROUP", std::to_string(sub_group).c_str(), 1);
        setenv("GOKV_SYCL_EMU_ORDER", order, 1);
        setenv("GOKV_SYCL_EMU_SEED", "20261126", 1);
        setenv("GOKV_SYCL_EMU_THREADS", std::to_string(threads).c_str(), 1);
    }
    ~Settings() {
        unsetenv("GOKV_SYCL_EMU_SUBGROUP");
        unsetenv("GOKV_SYCL_EMU_ORDER");
        unsetenv("GOKV_SYCL_EMU_SEED");
        unsetenv("GOKV_SYCL_EMU_THREADS");
    }
    Settings(const Settings &) = delete;
    Settings &operator=(const Settings &) = delete;
};

// The message of the sycl::exception that f throws, with its code checked; empty (and a failure) if none.
template <class F> std::string exception_message(F f, sycl::errc expected) {
    try {
        f();
    } catch (const sycl::exception &e) {
        EXPECT_EQ(e.code(), sycl::make_error_code(expected)) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "no sycl::exception";
    return "";
}

}  // namespace sycl_emu_test

#endif
