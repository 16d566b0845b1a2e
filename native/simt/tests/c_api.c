/* The C entry point, compiled as C: a launch that runs, and one that fails with its message. */
#include "simt_c.h"

#include <string.h>

static void count_thread(void *user) { ++*(int *)user; }

int simt_c_api_runs(void) {
  gokv_simt_dispatch d;
  memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.grid[0] = 3, d.grid[1] = 1, d.grid[2] = 1;
  d.threads[0] = 8, d.threads[1] = 2, d.threads[2] = 1;
  d.simd_width = 4;
  d.order = GOKV_SIMT_ORDER_SHUFFLED;
  int count = 0;
  char message[256];
  if (gokv_simt_launch(&d, count_thread, &count, message, sizeof message) != GOKV_SIMT_OK) return -1;
  return count;
}

int simt_c_api_rejects(char *message, size_t size) {
  gokv_simt_dispatch d;
  memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.grid[0] = d.grid[1] = d.grid[2] = 1;
  d.threads[0] = d.threads[1] = d.threads[2] = 1;
  d.simd_width = 3;
  int count = 0;
  return gokv_simt_launch(&d, count_thread, &count, message, size);
}
