/* avx512.c: placeholder being replaced by the SIMD kernels (work in progress this session). */
#include "kernels.h"
#if defined(__x86_64__)
void cpu_kernels_fill_avx512(cpu_kernels *k) { (void)k; }
#endif
