//go:build cgo

package bridge

// This file holds the one exported (//export) Go function, so its preamble may only declare.

/*
#include <stdint.h>
*/
import "C"

import "unsafe"

// gokvGoLog is the Go end of the native log callback (gokv_cgo_log_trampoline in gokv_cgo.h). The
// strings are copied before returning: C owns them.
//
//export gokvGoLog
func gokvGoLog(user unsafe.Pointer, level C.int32_t, backend, op, msg *C.char) {
	_ = user
	fp := logFunc.Load()
	if fp == nil {
		return
	}
	(*fp)(int(level), C.GoString(backend), C.GoString(op), C.GoString(msg))
}
