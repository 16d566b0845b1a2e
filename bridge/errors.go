package bridge

/*
#include "gokv.h"
#include "gokv_cgo.h"
*/
import "C"

import (
	"strings"
	"unsafe"
)

// Error is a failed gokv call: the C function (Op), its status (Code, Name) and the message that names
// the argument at fault (Msg), fetched inside the same cgo call as the failure. Errors raised by this
// package's own checks (slice lengths, closed handles) carry GOKV_EINVAL and the same shape.
//
// Match the kind of failure with errors.Is(err, ErrInvalid) and friends: Is compares codes.
type Error struct {
	Op   string // the C function, e.g. "gokv_attend"
	Code int    // the gokv_status (GOKV_E*)
	Name string // the status name, e.g. "GOKV_EINVAL"
	Msg  string // the message naming the argument at fault
}

// The status codes of gokv.h.
const (
	codeOK       = int(C.GOKV_OK)
	codeInvalid  = int(C.GOKV_EINVAL)
	codeRange    = int(C.GOKV_ERANGE)
	codeNoMem    = int(C.GOKV_ENOMEM)
	codeNotSup   = int(C.GOKV_ENOTSUP)
	codeNoDev    = int(C.GOKV_ENODEV)
	codeVersion  = int(C.GOKV_EVERSION)
	codeDevice   = int(C.GOKV_EDEVICE)
	codeInternal = int(C.GOKV_EINTERNAL)
)

// Sentinel errors, one per status code, for errors.Is. They carry only Code, Name and the generic message.
var (
	ErrInvalid      = sentinel(codeInvalid)  // GOKV_EINVAL: invalid argument
	ErrRange        = sentinel(codeRange)    // GOKV_ERANGE: index out of range
	ErrNoMem        = sentinel(codeNoMem)    // GOKV_ENOMEM: out of memory
	ErrNotSupported = sentinel(codeNotSup)   // GOKV_ENOTSUP: not supported by this backend
	ErrNoDevice     = sentinel(codeNoDev)    // GOKV_ENODEV: no such backend or device
	ErrVersion      = sentinel(codeVersion)  // GOKV_EVERSION: descriptor or ABI version mismatch
	ErrDevice       = sentinel(codeDevice)   // GOKV_EDEVICE: lost device or failed submission
	ErrInternal     = sentinel(codeInternal) // GOKV_EINTERNAL: internal error
)

func sentinel(code int) *Error {
	return &Error{Code: code, Name: statusName(code), Msg: statusMessage(code)}
}

// Error formats the failure as "<msg> (<NAME>)", prefixing the op when the message does not start with it.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("gokv: ")
	if e.Op != "" && !strings.HasPrefix(e.Msg, e.Op+":") {
		b.WriteString(e.Op)
		b.WriteString(": ")
	}
	msg := e.Msg
	if msg == "" {
		msg = statusMessage(e.Code)
	}
	b.WriteString(msg)
	b.WriteString(" (")
	b.WriteString(e.Name)
	b.WriteString(")")
	return b.String()
}

// Is reports whether target is an *Error with the same Code (so errors.Is(err, ErrRange) works on any
// error a call returned).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t != nil && e != nil && t.Code == e.Code
}

// statusName and statusMessage come from the C X-macro list, so Go never disagrees with the header.
func statusName(code int) string    { return C.GoString(C.gokv_status_name(C.gokv_status(code))) }
func statusMessage(code int) string { return C.GoString(C.gokv_status_message(C.gokv_status(code))) }

// newError builds an *Error raised by this package's own checks.
func newError(op string, code int, msg string) *Error {
	return &Error{Op: op, Code: code, Name: statusName(code), Msg: op + ": " + msg}
}

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
