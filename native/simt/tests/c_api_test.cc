// The C entry point (simt_c.h), driven from C (c_api.c).
#include <gtest/gtest.h>

#include <string>

#include "simt_c.h"

extern "C" int simt_c_api_runs(void);
extern "C" int simt_c_api_rejects(char *message, size_t size);

namespace {

TEST(CApi, LaunchRunsEveryThread) { EXPECT_EQ(simt_c_api_runs(), 3 * 16); }

TEST(CApi, ErrorsComeBackAsMessages) {
  char message[16];
  EXPECT_EQ(simt_c_api_rejects(message, sizeof message), GOKV_SIMT_ERROR);
  EXPECT_EQ(std::string(message), std::string("invalid dispatc"));  // truncated to the buffer
}

}  // namespace
