//go:build cgo

package bridge

/*
#include <stdlib.h>
#include "gokv.h"
#include "gokv_cgo.h"
*/
import "C"

import "unsafe"

// resultError turns a wrapper's result into nil or an *Error, freeing the C copy of the message.
func resultError(op string, r C.gokv_cgo_result) error {
	if r.status == C.GOKV_OK {
		return nil
	}
	msg := ""
	if r.msg != nil {
		msg = C.GoString(r.msg)
		C.free(unsafe.Pointer(r.msg))
	}
	code := int(r.status)
	if msg == "" {
		msg = op + ": " + statusMessage(code)
	}
	return &Error{Op: op, Code: code, Name: statusName(code), Msg: msg}
}
