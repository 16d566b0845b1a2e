/*
 * gokv_cpu.h: the CPU module's entry points beyond the backend table: the SIMD-path selection and the
 * roofline measurements. Not part of the public ABI. (Raw storage: gokv_pool_page_bytes and
 * gokv_pool_slot_bytes, gokv.h.)
 */
#ifndef GOKV_CPU_H
#define GOKV_CPU_H

#include "gokv.h"
#include "gokv_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* SIMD paths of the CPU kernels, best first. gokv_cpu_simd_level() is what the CPU supports;
 * gokv_cpu_set_simd_limit caps it process-wide (tests use it to compare each path with the scalar one);
 * returns the level now in force. The environment's GOKV_CPU_SIMD (scalar, avx2, avx512) sets the first cap. */
enum {
    GOKV_CPU_SCALAR = 0,
    GOKV_CPU_AVX2 = 1,   /* AVX2 + FMA + F16C (+AVX-VNNI where present) */
    GOKV_CPU_AVX512 = 2, /* AVX-512 F/BW/VL (+VNNI where it pays) */
    GOKV_CPU_NEON = 3,   /* arm64 baseline */
};
int32_t gokv_cpu_simd_level(void);
int32_t gokv_cpu_set_simd_limit(int32_t level);
const char *gokv_cpu_simd_name(int32_t level);

/* At the AVX-512 level, which attention kernels run (dispatch.c): MEASURED (the default) times each against
 * its AVX2 twin once per process and keeps the faster; WIDEST keeps every AVX-512 kernel (also the environment's
 * GOKV_CPU_DISPATCH=widest); NARROW, a test hook, takes every AVX2 kernel into the AVX-512 table.
 * gokv_cpu_set_dispatch returns the mode before; gokv_cpu_dispatch_note says what the mode in force chose. */
enum { GOKV_CPU_DISPATCH_MEASURED = 0, GOKV_CPU_DISPATCH_WIDEST = 1, GOKV_CPU_DISPATCH_NARROW = 2 };
int32_t gokv_cpu_set_dispatch(int32_t mode);
const char *gokv_cpu_dispatch_note(void);

/* The two ceilings of docs/architecture.md §9 on this machine (roofline.c), with the best SIMD path the CPU has.
 * Each takes a fraction of a second and spawns its own n_threads (0 = all online CPUs); 0.0 on failure.
 * gokv_cpu_measure_read_gbps: streaming read bandwidth in GB/s (1e9 bytes/s), the best pass of walks with and
 * without software prefetch in three rounds, over a buffer of `bytes` (0 = 1 GiB; it should be many times the
 * last-level cache).
 * gokv_cpu_measure_peak_gflops: float32 FMA peak in GFLOP/s (an FMA counts 2), best of 5 runs of
 * independent register-resident FMA chains on every thread. */
double gokv_cpu_measure_read_gbps(int32_t n_threads, uint64_t bytes);
double gokv_cpu_measure_peak_gflops(int32_t n_threads);

#ifdef __cplusplus
}
#endif
#endif
