//go:build cgo

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

// CgoEnabled reports whether the native code is linked (false: built with CGO_ENABLED=0).
const CgoEnabled = true

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

// headerConstants pairs each constant that types.go and errors.go spell in plain Go with gokv.h's value,
// for TestConstantsMatchHeader.
func headerConstants() map[string][2]int64 {
	return map[string][2]int64{
		"FormatF32": {int64(FormatF32), C.GOKV_FORMAT_F32}, "FormatF16": {int64(FormatF16), C.GOKV_FORMAT_F16},
		"FormatQ8": {int64(FormatQ8), C.GOKV_FORMAT_Q8}, "FormatQ4": {int64(FormatQ4), C.GOKV_FORMAT_Q4},
		"FormatKIVI2": {int64(FormatKIVI2), C.GOKV_FORMAT_KIVI2}, "FormatKIVI4": {int64(FormatKIVI4), C.GOKV_FORMAT_KIVI4},
		"formats":   {int64(len(Formats)), C.GOKV_FORMAT_COUNT_},
		"CapDecode": {int64(CapDecode), C.GOKV_CAP_DECODE}, "CapPrefill": {int64(CapPrefill), C.GOKV_CAP_PREFILL},
		"CapLearnedSinks": {int64(CapLearnedSinks), C.GOKV_CAP_LEARNED_SINKS},
		"CapWindow":       {int64(CapWindow), C.GOKV_CAP_WINDOW}, "CapMLA": {int64(CapMLA), C.GOKV_CAP_MLA},
		"CapHoles": {int64(CapHoles), C.GOKV_CAP_HOLES}, "CapBaseline": {int64(CapBaseline), C.GOKV_CAP_BASELINE},
		"CapMass": {int64(CapMass), C.GOKV_CAP_MASS}, "CapKVHeadMasks": {int64(CapKVHeadMasks), C.GOKV_CAP_KV_HEAD_MASKS},
		"CapQuest":              {int64(CapQuest), C.GOKV_CAP_QUEST},
		"AttendMaskPerKVHead":   {int64(AttendMaskPerKVHead), C.GOKV_ATTEND_MASK_PER_KV_HEAD},
		"AttendDequantBaseline": {int64(AttendDequantBaseline), C.GOKV_ATTEND_DEQUANT_BASELINE},
		"AttendForceScalar":     {int64(AttendForceScalar), C.GOKV_ATTEND_FORCE_SCALAR},
		"FaultSubmit":           {int64(FaultSubmit), C.GOKV_FAULT_SUBMIT}, "FaultAlloc": {int64(FaultAlloc), C.GOKV_FAULT_ALLOC},
		"LogDebug": {int64(LogDebug), C.GOKV_LOG_DEBUG}, "LogInfo": {int64(LogInfo), C.GOKV_LOG_INFO},
		"LogWarn": {int64(LogWarn), C.GOKV_LOG_WARN}, "LogError": {int64(LogError), C.GOKV_LOG_ERROR},
		"codeOK": {int64(codeOK), C.GOKV_OK}, "codeInvalid": {int64(codeInvalid), C.GOKV_EINVAL},
		"codeRange": {int64(codeRange), C.GOKV_ERANGE}, "codeNoMem": {int64(codeNoMem), C.GOKV_ENOMEM},
		"codeNotSup": {int64(codeNotSup), C.GOKV_ENOTSUP}, "codeNoDev": {int64(codeNoDev), C.GOKV_ENODEV},
		"codeVersion": {int64(codeVersion), C.GOKV_EVERSION}, "codeDevice": {int64(codeDevice), C.GOKV_EDEVICE},
		"codeInternal": {int64(codeInternal), C.GOKV_EINTERNAL},
	}
}

// headerNames returns gokv.h's name and message of a status and name of a format (gokv_status_name,
// gokv_status_message, gokv_format_name; "" for a NULL name), for TestConstantsMatchHeader.
func headerNames(code int) (status, message, format string) {
	status = C.GoString(C.gokv_status_name(C.gokv_status(code)))
	message = C.GoString(C.gokv_status_message(C.gokv_status(code)))
	if p := C.gokv_format_name(C.int32_t(code)); p != nil {
		format = C.GoString(p)
	}
	return status, message, format
}
