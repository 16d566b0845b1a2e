/*
 * gokv_unity.c: lets cgo compile the CPU module, whose sources live in native/cpu (cgo only builds the
 * files of the package's own folder). CMake builds the same files one by one; see native/cpu/CMakeLists.txt.
 * Static names in those files are unique across the module so that this single translation unit works.
 */
#define _GNU_SOURCE
#include "../native/cpu/threadpool.c"
#include "../native/cpu/cpu_backend.c"
#include "../native/cpu/dispatch.c"
#include "../native/cpu/store.c"
#include "../native/cpu/attend.c"
#include "../native/cpu/quest.c"
#include "../native/cpu/baseline.c"
#include "../native/cpu/roofline.c"
#include "../native/cpu/kernels/scalar.c"
#include "../native/cpu/kernels/avx2.c"
#include "../native/cpu/kernels/avx2_scores.c"
#include "../native/cpu/kernels/avx2_values.c"
#include "../native/cpu/kernels/avx2_q4.c"
#include "../native/cpu/kernels/avx2_kivi.c"
#include "../native/cpu/kernels/avx512.c"
#include "../native/cpu/kernels/avx512_scores.c"
#include "../native/cpu/kernels/avx512_values.c"
#include "../native/cpu/kernels/avx512_q4.c"
#include "../native/cpu/kernels/avx512_kivi.c"
#include "../native/cpu/kernels/neon.c"
