package bridge

import "strings"

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
	codeOK       = 0
	codeInvalid  = 1
	codeRange    = 2
	codeNoMem    = 3
	codeNotSup   = 4
	codeNoDev    = 5
	codeVersion  = 6
	codeDevice   = 7
	codeInternal = 8
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

// statusNames and statusMessages are gokv.h's GOKV_STATUS_LIST (gokv_status_name, gokv_status_message);
// TestConstantsMatchHeader holds them to the C list.
var (
	statusNames = [...]string{"GOKV_OK", "GOKV_EINVAL", "GOKV_ERANGE", "GOKV_ENOMEM", "GOKV_ENOTSUP",
		"GOKV_ENODEV", "GOKV_EVERSION", "GOKV_EDEVICE", "GOKV_EINTERNAL"}
	statusMessages = [...]string{"ok", "invalid argument", "index out of range", "out of memory",
		"not supported by this backend", "no such backend or device", "descriptor or ABI version mismatch",
		"device error (lost device or failed submission)", "internal error"}
)

func statusName(code int) string {
	if code >= 0 && code < len(statusNames) {
		return statusNames[code]
	}
	return "GOKV_UNKNOWN"
}

func statusMessage(code int) string {
	if code >= 0 && code < len(statusMessages) {
		return statusMessages[code]
	}
	return "unknown status"
}

// newError builds an *Error raised by this package's own checks.
func newError(op string, code int, msg string) *Error {
	return &Error{Op: op, Code: code, Name: statusName(code), Msg: op + ": " + msg}
}
