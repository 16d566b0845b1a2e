// gokv_simt_launch (simt_c.h) over simt::launch.
#include "simt_c.h"

#include <cstring>
#include <string>

#include "simt.h"

namespace {
int32_t fail(const std::string &why, char *message, size_t message_size) {
  if (message != nullptr && message_size > 0) {
    size_t n = why.size() < message_size - 1 ? why.size() : message_size - 1;
    std::memcpy(message, why.data(), n);
    message[n] = '\0';
  }
  return GOKV_SIMT_ERROR;
}
}  // namespace

extern "C" int32_t gokv_simt_launch(const gokv_simt_dispatch *dispatch, gokv_simt_kernel kernel, void *user,
                                    char *message, size_t message_size) {
  try {
    if (dispatch == nullptr || kernel == nullptr) return fail("dispatch and kernel must not be NULL", message, message_size);
    if (dispatch->struct_size < sizeof(gokv_simt_dispatch))
      return fail("gokv_simt_dispatch.struct_size is too small", message, message_size);
    simt::Dispatch d;
    d.grid = {dispatch->grid[0], dispatch->grid[1], dispatch->grid[2]};
    d.threads = {dispatch->threads[0], dispatch->threads[1], dispatch->threads[2]};
    d.simd_width = dispatch->simd_width;
    d.order = static_cast<simt::RunOrder>(dispatch->order);
    d.seed = dispatch->seed;
    d.os_threads = dispatch->os_threads;
    d.threadgroup_memory_bytes = static_cast<size_t>(dispatch->threadgroup_memory_bytes);
    if (dispatch->stack_bytes != 0) d.stack_bytes = static_cast<size_t>(dispatch->stack_bytes);
    simt::Status st = simt::launch(d, [kernel, user] { kernel(user); });
    if (!st.ok) return fail(st.message, message, message_size);
    if (message != nullptr && message_size > 0) message[0] = '\0';
    return GOKV_SIMT_OK;
  } catch (...) {
    return fail("out of memory", message, message_size);
  }
}
