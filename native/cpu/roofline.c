/*
 * roofline.c: the two ceilings of docs/architecture.md §9, measured on the machine we run on: streaming read
 * bandwidth and float32 FMA peak, both over n threads with the best SIMD path the CPU has (chosen at run
 * time, like the kernels). `gokv bench` and native/cpu/bench/bench_decode.c divide by these to report
 * each result as a fraction of its floor max(bytes / bandwidth, flops / peak).
 *
 * Both use their own pthreads (not a device's pool) so that they need no device and measure the raw
 * machine; each thread works on its own data and the wall time of the slowest decides (barrier to barrier).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gokv_cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

static double roofline_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- read bandwidth ---- */

/* A walk's software prefetch: none (the hardware prefetchers alone), or each 256 bytes asking for those
 * `ahead` bytes on, into L1 or L2. Which one reads fastest differs between machines and from minute to minute
 * on a shared one (this 2-core Xeon: 19-26 GB/s plain, 23-27 with hints), and the kernels prefetch, so the
 * ceiling is the best of them: a walk slower than the kernels would put floors under what they reach. */
typedef struct roofline_hint {
    size_t ahead; /* 0: none */
    int l2;       /* 1: into L2 (prefetcht1), 0: L1 */
} roofline_hint;

static const roofline_hint roofline_hints[] = {{0, 0}, {512, 0}, {2048, 1}};
enum { ROOFLINE_HINTS = sizeof roofline_hints / sizeof roofline_hints[0] };

#if defined(__x86_64__)
#define ROOFLINE_PREFETCH(p, l2) \
    ((l2) ? _mm_prefetch((const char *)(p), _MM_HINT_T1) : _mm_prefetch((const char *)(p), _MM_HINT_T0))
#else
#define ROOFLINE_PREFETCH(p, l2) ((l2) ? __builtin_prefetch((p), 0, 2) : __builtin_prefetch((p), 0, 3))
#endif

/* Asks for the 256 bytes `ahead` bytes past p + i when they lie inside the walk. */
static inline __attribute__((always_inline)) void roofline_ask(const uint8_t *p, size_t i, size_t bytes, roofline_hint h) {
    if (h.ahead && i + h.ahead + 256 <= bytes)
        for (int k = 0; k < 4; k++) ROOFLINE_PREFETCH(p + i + h.ahead + 64 * (size_t)k, h.l2);
}

/* Sums a range of 64-byte lines so the loads cannot be dropped; four accumulators keep the loads independent. */
static uint64_t roofline_read_scalar(const uint8_t *p, size_t bytes, roofline_hint h) {
    (void)h;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 64 <= bytes; i += 64) {
        const uint64_t *w = (const uint64_t *)(p + i);
        a += w[0] ^ w[4];
        b += w[1] ^ w[5];
        c += w[2] ^ w[6];
        d += w[3] ^ w[7];
    }
    return a + b + c + d;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t roofline_read_avx2(const uint8_t *p, size_t bytes, roofline_hint h) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 128 <= bytes; i += 128) {
        if (!(i & 128)) roofline_ask(p, i, bytes, h);
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(p + i + 64)));
        d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}

__attribute__((target("avx512f"))) static uint64_t roofline_read_avx512(const uint8_t *p, size_t bytes, roofline_hint h) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i + 256 <= bytes; i += 256) {
        roofline_ask(p, i, bytes, h);
        a = _mm512_xor_si512(a, _mm512_load_si512((const void *)(p + i)));
        b = _mm512_xor_si512(b, _mm512_load_si512((const void *)(p + i + 64)));
        c = _mm512_xor_si512(c, _mm512_load_si512((const void *)(p + i + 128)));
        d = _mm512_xor_si512(d, _mm512_load_si512((const void *)(p + i + 192)));
    }
    a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
    return (uint64_t)_mm512_reduce_or_epi64(a); /* bitwise: a signed 64-bit sum of the lanes may overflow (UB) */
}
#endif

#if defined(__aarch64__)
static uint64_t roofline_read_neon(const uint8_t *p, size_t bytes, roofline_hint h) {
    uint64x2_t a = vdupq_n_u64(0), b = a, c = a, d = a;
    for (size_t i = 0; i + 64 <= bytes; i += 64) {
        if (!(i & 192)) roofline_ask(p, i, bytes, h);
        a = veorq_u64(a, vld1q_u64((const uint64_t *)(p + i)));
        b = veorq_u64(b, vld1q_u64((const uint64_t *)(p + i + 16)));
        c = veorq_u64(c, vld1q_u64((const uint64_t *)(p + i + 32)));
        d = veorq_u64(d, vld1q_u64((const uint64_t *)(p + i + 48)));
    }
    a = veorq_u64(veorq_u64(a, b), veorq_u64(c, d));
    return vgetq_lane_u64(a, 0) ^ vgetq_lane_u64(a, 1);
}
#endif

typedef uint64_t (*roofline_read_fn)(const uint8_t *, size_t, roofline_hint);

static roofline_read_fn roofline_pick_read(void) {
    switch (gokv_cpu_simd_level()) {
#if defined(__x86_64__)
    case GOKV_CPU_AVX512: return roofline_read_avx512;
    case GOKV_CPU_AVX2: return roofline_read_avx2;
#endif
#if defined(__aarch64__)
    case GOKV_CPU_NEON: return roofline_read_neon;
#endif
    default: return roofline_read_scalar;
    }
}

/* ---- FMA peak: independent chains, enough of them to cover the FMA latency on every FMA pipe ---- */

enum { ROOFLINE_FMA_ITERS = 1 << 20 };

static double roofline_fma_scalar(int64_t iters, float seed) {
    float a[8], x = 1.0f + seed * 1e-9f, y = 1.0f - seed * 1e-9f;
    for (int j = 0; j < 8; j++) a[j] = (float)j;
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 8; j++) a[j] = a[j] * x + y;
    float s = 0.0f;
    for (int j = 0; j < 8; j++) s += a[j];
    return (double)s;
}
static const double roofline_flops_scalar = 8 * 2;

#if defined(__x86_64__)
#define ROOFLINE_CHAINS(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11)
__attribute__((target("avx2,fma"))) static double roofline_fma_avx2(int64_t iters, float seed) {
    const __m256 x = _mm256_set1_ps(1.0f + seed * 1e-9f), y = _mm256_set1_ps(1e-7f);
#define ROOFLINE_DECL8(j) __m256 a##j = _mm256_set1_ps((float)(j));
    ROOFLINE_CHAINS(ROOFLINE_DECL8)
    for (int64_t i = 0; i < iters; i++) {
#define ROOFLINE_FMA8(j) a##j = _mm256_fmadd_ps(a##j, x, y);
        ROOFLINE_CHAINS(ROOFLINE_FMA8)
        __asm__ volatile("" ::: "memory"); /* keeps the loop a loop of 12 FMAs */
    }
    __m256 s = _mm256_setzero_ps();
#define ROOFLINE_SUM8(j) s = _mm256_add_ps(s, a##j);
    ROOFLINE_CHAINS(ROOFLINE_SUM8)
    float out[8];
    _mm256_storeu_ps(out, s);
    return (double)out[0];
}
static const double roofline_flops_avx2 = 12 * 8 * 2;

__attribute__((target("avx512f"))) static double roofline_fma_avx512(int64_t iters, float seed) {
    const __m512 x = _mm512_set1_ps(1.0f + seed * 1e-9f), y = _mm512_set1_ps(1e-7f);
#define ROOFLINE_DECL16(j) __m512 a##j = _mm512_set1_ps((float)(j));
    ROOFLINE_CHAINS(ROOFLINE_DECL16)
    for (int64_t i = 0; i < iters; i++) {
#define ROOFLINE_FMA16(j) a##j = _mm512_fmadd_ps(a##j, x, y);
        ROOFLINE_CHAINS(ROOFLINE_FMA16)
        __asm__ volatile("" ::: "memory");
    }
    __m512 s = _mm512_setzero_ps();
#define ROOFLINE_SUM16(j) s = _mm512_add_ps(s, a##j);
    ROOFLINE_CHAINS(ROOFLINE_SUM16)
    return (double)_mm512_reduce_add_ps(s);
}
static const double roofline_flops_avx512 = 12 * 16 * 2;
#endif

#if defined(__aarch64__)
static double roofline_fma_neon(int64_t iters, float seed) {
    const float32x4_t x = vdupq_n_f32(1.0f + seed * 1e-9f), y = vdupq_n_f32(1e-7f);
    float32x4_t a[12];
    for (int j = 0; j < 12; j++) a[j] = vdupq_n_f32((float)j);
    for (int64_t i = 0; i < iters; i++) {
        for (int j = 0; j < 12; j++) a[j] = vfmaq_f32(y, a[j], x);
        __asm__ volatile("" ::: "memory");
    }
    float32x4_t s = vdupq_n_f32(0.0f);
    for (int j = 0; j < 12; j++) s = vaddq_f32(s, a[j]);
    return (double)vgetq_lane_f32(s, 0);
}
static const double roofline_flops_neon = 12 * 4 * 2;
#endif

/* ---- threads ---- */

typedef struct roofline_job {
    pthread_barrier_t start, end;
    int32_t n_threads, passes;
    /* read */
    const uint8_t *buf;
    size_t bytes;
    roofline_read_fn read;
    roofline_hint hint;
    /* fma */
    double (*fma)(int64_t, float);
    int64_t iters;
    volatile double sink;
} roofline_job;

typedef struct roofline_arg {
    roofline_job *job;
    int32_t id;
} roofline_arg;

static void roofline_pass(roofline_job *j, int32_t id) {
    if (j->read) {
        /* contiguous slices, each a multiple of 256 bytes */
        const size_t slice = (j->bytes / (size_t)j->n_threads) & ~(size_t)255u;
        j->sink += (double)j->read(j->buf + slice * (size_t)id, slice, j->hint);
    } else {
        j->sink += j->fma(j->iters, (float)id);
    }
}

static void *roofline_worker(void *p) {
    roofline_arg *a = p;
    for (int32_t pass = 0; pass < a->job->passes; pass++) {
        pthread_barrier_wait(&a->job->start);
        roofline_pass(a->job, a->id);
        pthread_barrier_wait(&a->job->end);
    }
    return NULL;
}

/* Runs job->passes passes on n threads (the caller is thread 0); returns the best pass in seconds. */
static double roofline_run(roofline_job *j) {
    const int32_t n = j->n_threads;
    pthread_t *th = calloc((size_t)n, sizeof *th);
    roofline_arg *args = calloc((size_t)n, sizeof *args);
    if (!th || !args) {
        free(th), free(args);
        return 0.0;
    }
    pthread_barrier_init(&j->start, NULL, (unsigned)n);
    pthread_barrier_init(&j->end, NULL, (unsigned)n);
    int32_t started = 1;
    for (int32_t i = 1; i < n; i++) {
        args[i] = (roofline_arg){j, i};
        if (pthread_create(&th[i], NULL, roofline_worker, &args[i]) != 0) break;
        started++;
    }
    double best = 0.0;
    if (started == n) {
        for (int32_t pass = 0; pass < j->passes; pass++) {
            pthread_barrier_wait(&j->start);
            const double t0 = roofline_now();
            roofline_pass(j, 0);
            pthread_barrier_wait(&j->end);
            const double dt = roofline_now() - t0;
            if (best == 0.0 || dt < best) best = dt;
        }
    } else {
        /* could not start every thread: release those that did, report failure */
        j->passes = 0;
    }
    for (int32_t i = 1; i < started; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&j->start);
    pthread_barrier_destroy(&j->end);
    free(th), free(args);
    return best;
}

static int32_t roofline_threads(int32_t n) {
    if (n > 0) return n;
    const long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int32_t)c : 1;
}

double gokv_cpu_measure_read_gbps(int32_t n_threads, uint64_t bytes) {
    n_threads = roofline_threads(n_threads);
    if (bytes == 0) bytes = (uint64_t)1 << 30;
    if (bytes < (uint64_t)n_threads * 4096u) bytes = (uint64_t)n_threads * 4096u;
    void *raw = NULL;
    if (posix_memalign(&raw, 4096, (size_t)bytes) != 0) return 0.0;
    /* touch every page (and give the lines distinct content) so that reads hit DRAM, not the zero page */
    uint64_t *w = raw;
    for (size_t i = 0; i < (size_t)bytes / 8; i++) w[i] = i * 0x9E3779B97F4A7C15ull;
    roofline_job j = {0};
    j.n_threads = n_threads;
    j.passes = 3;
    j.buf = raw;
    j.bytes = (size_t)bytes;
    j.read = roofline_pick_read();
    /* every hint in each of three rounds 50 ms apart, the best pass wins (roofline_hints; the FMA peak below) */
    double dt = 0.0;
    for (int round = 0; round < 3; round++) {
        if (round > 0) {
            const struct timespec pause = {0, 50 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
        for (int h = 0; h < ROOFLINE_HINTS; h++) {
            j.hint = roofline_hints[h];
            const double r = roofline_run(&j);
            if (r > 0.0 && (dt == 0.0 || r < dt)) dt = r;
        }
    }
    const size_t read = ((j.bytes / (size_t)n_threads) & ~(size_t)255u) * (size_t)n_threads;
    free(raw);
    return dt > 0.0 ? (double)read / dt * 1e-9 : 0.0;
}

double gokv_cpu_measure_peak_gflops(int32_t n_threads) {
    n_threads = roofline_threads(n_threads);
    roofline_job j = {0};
    j.n_threads = n_threads;
    j.passes = 5;
    j.iters = ROOFLINE_FMA_ITERS;
    double flops_per_iter = roofline_flops_scalar;
    j.fma = roofline_fma_scalar;
    switch (gokv_cpu_simd_level()) {
#if defined(__x86_64__)
    case GOKV_CPU_AVX512: j.fma = roofline_fma_avx512, flops_per_iter = roofline_flops_avx512; break;
    case GOKV_CPU_AVX2: j.fma = roofline_fma_avx2, flops_per_iter = roofline_flops_avx2; break;
#endif
#if defined(__aarch64__)
    case GOKV_CPU_NEON: j.fma = roofline_fma_neon, flops_per_iter = roofline_flops_neon; break;
#endif
    default: j.iters = ROOFLINE_FMA_ITERS / 8; break;
    }
    /* Three rounds of passes 50 ms apart, best pass wins: on a shared or virtual machine a core can be taken
     * away for a few milliseconds, and a peak measured during that would halve every floor it feeds. */
    double dt = 0.0;
    for (int round = 0; round < 3; round++) {
        if (round > 0) {
            const struct timespec pause = {0, 50 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
        const double r = roofline_run(&j);
        if (r > 0.0 && (dt == 0.0 || r < dt)) dt = r;
    }
    return dt > 0.0 ? flops_per_iter * (double)j.iters * n_threads / dt * 1e-9 : 0.0;
}
