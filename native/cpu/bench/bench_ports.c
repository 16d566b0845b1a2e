/*
 * bench_ports.c: how many 512-bit FMAs (vfmadd231ps) and VNNI dot products (vpdpbusd) one core retires per
 * cycle, alone and mixed. This is the question behind the AVX-512 kernels' design: an int8 VNNI score
 * kernel only pays if vpdpbusd runs beside the FMAs, or if its 4 products per lane outweigh the query split
 * into int8 pieces it needs (README, "Status and known gaps"). It also times 16 FMAs beside 4 of the
 * shuffles the q4 kernels add to them (vpermps, vpmovzxbd, vshuff32x4): they mostly run on other pipes. Each loop runs 16 independent accumulator
 * chains in inline assembly, so the compiler can neither merge nor spill them. Last, the AVX-512 values
 * kernel's token loop (2 tokens: 16 FMAs, 8 weight broadcasts from memory, the codes' decode by vpermps or
 * by and + convert) beside 16 FMAs with their broadcasts alone. x86-64 with AVX-512 VNNI
 * only; elsewhere it says so and exits 0. Build by hand:
 *   gcc -O2 native/cpu/bench/bench_ports.c -o /tmp/bench_ports && /tmp/bench_ports
 * Prints ns per loop iteration and instructions per ns; divide by the clock (GHz) for per cycle.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>

#if defined(__x86_64__)
enum { ITERS = 50000000 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define FMA(i) "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define DP(i) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define CLOBBERS                                                                                                \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",   \
        "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm30", "xmm31"
/* One timed loop of ITERS iterations around body; returns ns per iteration (best of 3). */
#define TIMED(body)                                                                                             \
    __attribute__((target("avx512f,avx512vnni"), noinline)) static double body##_loop(void) {                  \
        double best = 1e30;                                                                                     \
        for (int r = 0; r < 3; r++) {                                                                           \
            long n = ITERS;                                                                                     \
            const double t = now();                                                                             \
            __asm__ volatile("vpxord %%zmm30, %%zmm30, %%zmm30\n\tvpxord %%zmm31, %%zmm31, %%zmm31\n\t"         \
                             "1:\n\t" body##_ASM "dec %0\n\tjnz 1b\n\t"                                        \
                             : "+r"(n)                                                                          \
                             :                                                                                  \
                             : CLOBBERS);                                                                       \
            const double dt = (now() - t) / ITERS * 1e9;                                                        \
            best = dt < best ? dt : best;                                                                       \
        }                                                                                                       \
        return best;                                                                                            \
    }

#define fma16_ASM FMA(1) FMA(2) FMA(3) FMA(4) FMA(5) FMA(6) FMA(7) FMA(8) FMA(9) FMA(10) FMA(11) FMA(12) FMA(13) FMA(14) FMA(15) FMA(16)
#define dp16_ASM DP(1) DP(2) DP(3) DP(4) DP(5) DP(6) DP(7) DP(8) DP(9) DP(10) DP(11) DP(12) DP(13) DP(14) DP(15) DP(16)
#define mix16_ASM DP(1) FMA(2) DP(3) FMA(4) DP(5) FMA(6) DP(7) FMA(8) DP(9) FMA(10) DP(11) FMA(12) DP(13) FMA(14) DP(15) FMA(16)
#define both32_ASM fma16_ASM dp16_ASM
/* what the q4 kernels add to their FMAs: table lookups (vpermps), widening (vpmovzxbd), lane shuffles */
#define PERM(i) "vpermps %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define ZX(i) "vpmovzxbd %%xmm31, %%zmm" #i "\n\t"
#define SHUF(i) "vshuff32x4 $0x44, %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define perm4_ASM fma16_ASM PERM(17) PERM(18) PERM(19) PERM(20)
#define zx4_ASM fma16_ASM ZX(17) ZX(18) ZX(19) ZX(20)
#define shuf4_ASM fma16_ASM SHUF(17) SHUF(18) SHUF(19) SHUF(20)
/* The same around a body that reads memory at %1 (a 64-byte aligned 256-byte buffer). */
#define TIMEDM(body)                                                                                            \
    __attribute__((target("avx512f,avx512vnni"), noinline)) static double body##_loop(void) {                  \
        static float buf[64] __attribute__((aligned(64)));                                                     \
        double best = 1e30;                                                                                     \
        for (int r = 0; r < 3; r++) {                                                                           \
            long n = ITERS;                                                                                     \
            const float *p = buf;                                                                               \
            const double t = now();                                                                             \
            __asm__ volatile("vpxord %%zmm30, %%zmm30, %%zmm30\n\tvpxord %%zmm31, %%zmm31, %%zmm31\n\t"         \
                             "1:\n\t" body##_ASM "dec %0\n\tjnz 1b\n\t"                                        \
                             : "+r"(n)                                                                          \
                             : "r"(p)                                                                           \
                             : CLOBBERS, "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28",  \
                               "xmm29", "memory");                                                              \
            const double dt = (now() - t) / ITERS * 1e9;                                                        \
            best = dt < best ? dt : best;                                                                       \
        }                                                                                                       \
        return best;                                                                                            \
    }
/* the values loop: weight broadcasts (each for 2 FMAs), and a token's 16 code bytes widened and decoded */
#define BC(i, off) "vbroadcastss " #off "(%1), %%zmm" #i "\n\t"
#define FMAR(i, r) "vfmadd231ps %%zmm" #r ", %%zmm31, %%zmm" #i "\n\t"
#define ZXM(i, off) "vpmovzxbd " #off "(%1), %%zmm" #i "\n\t"
#define PERMR(i, src) "vpermps %%zmm30, %%zmm" #src ", %%zmm" #i "\n\t"
#define SRL(i) "vpsrld $4, %%zmm" #i ", %%zmm" #i "\n\t"
#define CVT(i, src) "vcvtdq2ps %%zmm" #src ", %%zmm" #i "\n\t"
#define AND(i, src) "vpandd %%zmm30, %%zmm" #src ", %%zmm" #i "\n\t"
#define bc8_ASM                                                                                                 \
    BC(21, 0) FMAR(1, 21) FMAR(2, 21) BC(22, 4) FMAR(3, 22) FMAR(4, 22) BC(23, 8) FMAR(5, 23) FMAR(6, 23)       \
    BC(24, 12) FMAR(7, 24) FMAR(8, 24) BC(25, 16) FMAR(9, 25) FMAR(10, 25) BC(26, 20) FMAR(11, 26)             \
    FMAR(12, 26) BC(27, 24) FMAR(13, 27) FMAR(14, 27) BC(28, 28) FMAR(15, 28) FMAR(16, 28)
#define valperm_ASM ZXM(17, 128) PERMR(18, 17) SRL(17) PERMR(19, 17) ZXM(20, 144) PERMR(29, 20) SRL(20) PERMR(20, 20) bc8_ASM
#define valcvt_ASM                                                                                              \
    ZXM(17, 128) AND(18, 17) CVT(18, 18) SRL(17) CVT(19, 17) ZXM(20, 144) AND(29, 20) CVT(29, 29) SRL(20)      \
    CVT(20, 20) bc8_ASM
TIMEDM(bc8)
TIMEDM(valperm)
TIMEDM(valcvt)
TIMED(fma16)
TIMED(dp16)
TIMED(mix16)
TIMED(both32)
TIMED(perm4)
TIMED(zx4)
TIMED(shuf4)

int main(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512vnni")) {
        printf("bench_ports: this CPU has no AVX-512 VNNI; nothing to measure\n");
        return 0;
    }
    const double f = fma16_loop(), d = dp16_loop(), m = mix16_loop(), b = both32_loop();
    printf("%-34s %8s %12s\n", "loop (16 chains per kind)", "ns/iter", "instr/ns");
    printf("%-34s %8.3f %12.2f\n", "16 vfmadd231ps", f, 16 / f);
    printf("%-34s %8.3f %12.2f\n", "16 vpdpbusd", d, 16 / d);
    printf("%-34s %8.3f %12.2f\n", "8 vpdpbusd + 8 vfmadd231ps", m, 16 / m);
    printf("%-34s %8.3f %12.2f\n", "16 vpdpbusd + 16 vfmadd231ps", b, 32 / b);
    printf("%-34s %8.3f %12.2f\n", "16 vfmadd231ps + 4 vpermps", perm4_loop(), 20 / perm4_loop());
    printf("%-34s %8.3f %12.2f\n", "16 vfmadd231ps + 4 vpmovzxbd", zx4_loop(), 20 / zx4_loop());
    printf("%-34s %8.3f %12.2f\n", "16 vfmadd231ps + 4 vshuff32x4", shuf4_loop(), 20 / shuf4_loop());
    printf("%-34s %8.3f\n", "16 fma + 8 vbroadcastss (memory)", bc8_loop());
    printf("%-34s %8.3f\n", "values loop, vpermps decode", valperm_loop());
    printf("%-34s %8.3f\n", "values loop, and + convert decode", valcvt_loop());
    printf("vpdpbusd %s the FMA pipes (mixed loop %.2fx the FMA-only one; separate pipes would give ~1.0x "
           "for 16+16)\n",
           b > 1.6 * f ? "shares" : "does not share", b / f);
    return 0;
}
#else
int main(void) {
    printf("bench_ports: x86-64 only\n");
    return 0;
}
#endif
