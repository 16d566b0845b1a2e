// Package bridge is the cgo glue between gokv's Go code and its C ABI (bridge/gokv.h).
//
// It is a thin, safe wrapper: one Go call makes one cgo call, descriptors mirror the C ones field by
// field with slices in place of pointer+length, and every slice length is checked in Go before C reads
// or writes it, so a wrong length is an *Error, never a memory fault. Handles (Device, Pool) must be
// closed; Close is idempotent, nil-safe, and waits for calls in flight on the handle. Go memory is
// passed to C only for the duration of a call (pinned with runtime.Pinner) and C never retains it.
//
// The CPU module is compiled by cgo from this directory: the core's *.c files directly and the CPU
// backend through gokv_unity.c. No -march flag: SIMD paths are chosen at run time (docs/architecture.md §2).
//
// This package is internal to gokv's use: the public API is package gokv.
package bridge

/*
#cgo CFLAGS: -O2 -std=c11 -I${SRCDIR} -I${SRCDIR}/../native/cpu
#cgo LDFLAGS: -lm -lpthread
#include "gokv.h"
#include "gokv_cgo.h"
*/
import "C"

import (
	"math"
	"runtime"
	"strconv"
	"unsafe"

	_ "github.com/gokv/gokv/native" // the native sources, as build-cache inputs (see native/sources.go)
)

// ABIHeaderVersion is the ABI version this package was written against (GOKV_ABI_VERSION in gokv.h).
const ABIHeaderVersion = uint32(C.GOKV_ABI_VERSION)

// abiErr is non-nil when the linked C library reports another ABI version than the header: every
// OpenDevice then fails with it (no panic at init).
var abiErr error

func init() {
	if v := ABIVersion(); v != ABIHeaderVersion {
		abiErr = &Error{Op: "gokv_abi_version", Code: codeVersion, Name: statusName(codeVersion),
			Msg: "gokv_abi_version: the C library reports ABI " + strconv.Itoa(int(v)) + ", package bridge expects " +
				strconv.Itoa(int(ABIHeaderVersion))}
	}
}

// ABIVersion returns the ABI version of the linked C library (gokv_abi_version).
func ABIVersion() uint32 { return uint32(C.gokv_abi_version()) }

// Backends returns the names of the backends compiled into this build, "cpu" first.
func Backends() []string {
	n := int(C.gokv_backend_count())
	names := make([]string, 0, n)
	for i := 0; i < n; i++ {
		if p := C.gokv_backend_name(C.int32_t(i)); p != nil {
			names = append(names, C.GoString(p))
		}
	}
	return names
}

// Format is a storage format of K and V (GOKV_FORMAT_*, docs/architecture.md §4).
type Format int32

// The storage formats.
const (
	FormatF32   Format = C.GOKV_FORMAT_F32
	FormatF16   Format = C.GOKV_FORMAT_F16
	FormatQ8    Format = C.GOKV_FORMAT_Q8    // per token, groups of g along head_dim, 8-bit
	FormatQ4    Format = C.GOKV_FORMAT_Q4    // per token, groups of g along head_dim, 4-bit
	FormatKIVI2 Format = C.GOKV_FORMAT_KIVI2 // keys per channel over g tokens, values per token, 2-bit; residual in f16
	FormatKIVI4 Format = C.GOKV_FORMAT_KIVI4 // as KIVI2 with 4 bits
)

// Formats lists every format, in ABI order.
var Formats = []Format{FormatF32, FormatF16, FormatQ8, FormatQ4, FormatKIVI2, FormatKIVI4}

// String returns the format's ABI name ("f32", "q4", "kivi2", ...), or "format(N)" if unknown.
func (f Format) String() string {
	if p := C.gokv_format_name(C.int32_t(f)); p != nil {
		return C.GoString(p)
	}
	return "format(" + strconv.Itoa(int(f)) + ")"
}

// Bits returns the bits per stored element of the format (32, 16, 8, 4, 2), or 0 if unknown.
func (f Format) Bits() int {
	switch f {
	case FormatF32:
		return 32
	case FormatF16:
		return 16
	case FormatQ8:
		return 8
	case FormatQ4, FormatKIVI4:
		return 4
	case FormatKIVI2:
		return 2
	}
	return 0
}

// Quantized reports whether the format stores affine-quantized groups (q8, q4, kivi2, kivi4).
func (f Format) Quantized() bool { return f >= FormatQ8 && f <= FormatKIVI4 }

// KIVI reports whether the format quantizes keys per channel with a full-precision residual.
func (f Format) KIVI() bool { return f == FormatKIVI2 || f == FormatKIVI4 }

// KIVIQuantizedLen returns how many of a KIVI sequence's n tokens are quantized into pages (the rest are
// in its residual ring): max(0, floor((n - residual) / group) * group).
func KIVIQuantizedLen(n, group, residual int) int {
	return int(C.gokv_kivi_quantized_len(C.int32_t(clampInt32(n)), C.int32_t(clampInt32(group)),
		C.int32_t(clampInt32(residual))))
}

// ptrOf pins s's backing array in p and returns a C-typed pointer to its first element, or nil for an
// empty slice (C then sees NULL, which the ABI accepts where the count is 0 and rejects, by name, where
// it is required).
func ptrOf[T any, CT any](p *runtime.Pinner, s []T) *CT {
	if len(s) == 0 {
		return nil
	}
	ptr := unsafe.SliceData(s)
	p.Pin(ptr)
	return (*CT)(unsafe.Pointer(ptr))
}

func clampInt32(v int) int {
	if v > math.MaxInt32 {
		return math.MaxInt32
	}
	if v < math.MinInt32 {
		return math.MinInt32
	}
	return v
}
