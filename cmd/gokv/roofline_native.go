package main

// The CPU module's measurements of docs/architecture.md §9 (native/cpu/roofline.c). The symbols are linked
// through package bridge's cgo build, which compiles the whole CPU module; this file only includes the
// header.

/*
#cgo CFLAGS: -I${SRCDIR}/../../bridge -I${SRCDIR}/../../native/cpu
#include "gokv_cpu.h"
*/
import "C"

import "runtime"

// measureCeilings measures read bandwidth (over readBytes) and compute peak with n threads (0: all CPUs),
// with the best SIMD path the CPU has.
func measureCeilings(threads int, readBytes int64) ceilings {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	return ceilings{
		ReadGBps:   float64(C.gokv_cpu_measure_read_gbps(C.int32_t(threads), C.uint64_t(readBytes))),
		PeakGFLOPs: float64(C.gokv_cpu_measure_peak_gflops(C.int32_t(threads))),
		Source:     "gokv_cpu_measure_read_gbps / gokv_cpu_measure_peak_gflops",
	}
}
