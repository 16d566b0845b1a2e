package gokv

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gokv/gokv/bridge"
)

// ErrorCode classifies a failure. Codes 1..8 equal the C ABI's gokv_status values (bridge/gokv.h), so a
// native failure keeps its code; ErrorCapacity and ErrorClosed are raised by the Go control plane only.
type ErrorCode int

// The error codes.
const (
	ErrorInvalid      ErrorCode = 1   // GOKV_EINVAL: invalid argument
	ErrorRange        ErrorCode = 2   // GOKV_ERANGE: index out of range
	ErrorOutOfMemory  ErrorCode = 3   // GOKV_ENOMEM: out of (device) memory
	ErrorNotSupported ErrorCode = 4   // GOKV_ENOTSUP: not supported (by this backend, or by this format)
	ErrorNoDevice     ErrorCode = 5   // GOKV_ENODEV: no such backend or device
	ErrorVersion      ErrorCode = 6   // GOKV_EVERSION: ABI or descriptor version mismatch
	ErrorDevice       ErrorCode = 7   // GOKV_EDEVICE: lost device or failed submission
	ErrorInternal     ErrorCode = 8   // GOKV_EINTERNAL: internal error
	ErrorCapacity     ErrorCode = 100 // the cache has too few free pages or sequence slots; nothing was changed
	ErrorClosed       ErrorCode = 101 // the engine, cache, sequence or step is closed or finished
)

var errorCodeNames = map[ErrorCode]string{
	ErrorInvalid: "invalid argument", ErrorRange: "index out of range", ErrorOutOfMemory: "out of memory",
	ErrorNotSupported: "not supported", ErrorNoDevice: "no such backend or device",
	ErrorVersion: "version mismatch", ErrorDevice: "device error", ErrorInternal: "internal error",
	ErrorCapacity: "cache capacity exceeded", ErrorClosed: "closed",
}

// String returns a short description of the code ("invalid argument", "cache capacity exceeded", ...).
func (c ErrorCode) String() string {
	if s, ok := errorCodeNames[c]; ok {
		return s
	}
	return "error(" + strconv.Itoa(int(c)) + ")"
}

// Error is a failed gokv call: the operation (Op, e.g. "Step.Layer" or "NewCache"), the kind of failure
// (Code) and a message naming the layer, sequence or argument at fault (Msg; for native failures it
// includes the C function and its own message). Compare kinds with errors.Is(err, gokv.ErrOutOfMemory)
// and friends; Is compares codes only.
type Error struct {
	Op   string
	Code ErrorCode
	Msg  string

	cause error // what Unwrap returns (ErrNoCgo), or nil
}

// Unwrap returns the error's cause where it has one (ErrNoCgo for Open in a build without cgo).
func (e *Error) Unwrap() error { return e.cause }

// Error formats the failure as "gokv: <Op>: <Msg>".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("gokv: ")
	if e.Op != "" {
		b.WriteString(e.Op)
		b.WriteString(": ")
	}
	if e.Msg != "" {
		b.WriteString(e.Msg)
	} else {
		b.WriteString(e.Code.String())
	}
	return b.String()
}

// Is reports whether target is an *Error with the same Code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t != nil && e != nil && t.Code == e.Code
}

// Sentinel errors, one per code, for errors.Is. They carry only their Code.
var (
	ErrInvalid      = &Error{Code: ErrorInvalid}
	ErrRange        = &Error{Code: ErrorRange}
	ErrOutOfMemory  = &Error{Code: ErrorOutOfMemory}
	ErrNotSupported = &Error{Code: ErrorNotSupported}
	ErrNoDevice     = &Error{Code: ErrorNoDevice}
	ErrVersion      = &Error{Code: ErrorVersion}
	ErrDevice       = &Error{Code: ErrorDevice}
	ErrInternal     = &Error{Code: ErrorInternal}
	// ErrCapacity: a cache has too few free pages (or sequence slots) for a step or a fork. The failed call
	// changed nothing; the error is a *CapacityError naming the layer group and the pages needed vs free.
	ErrCapacity = &Error{Code: ErrorCapacity}
	// ErrClosed: the engine or cache was closed, the sequence released, or the step already ended.
	ErrClosed = &Error{Code: ErrorClosed}
)

// ErrNoCgo is the cause of Open's failure in a build without cgo (CGO_ENABLED=0): no native backend is
// linked. Open's error is an ErrNoDevice, and errors.Is(err, ErrNoCgo) tells this case apart. Formats,
// model specs, presets, HF configs and Plan work without cgo.
var ErrNoCgo = errors.New("gokv was built without cgo (CGO_ENABLED=0): no native backend is available; " +
	"formats, model specs, HF configs and Plan work without it")

// CapacityError is the ErrCapacity failure of Cache.Begin, Cache.NewSequence or Sequence.Fork: what was
// short and by how much. errors.Is(err, ErrCapacity) is true for it, and errors.As to *Error works too.
type CapacityError struct {
	Op     string
	Group  int   // the layer group short of pages, -1 when sequence slots ran out
	Layers []int // the layers of that group
	Needed int   // pages (or sequence slots) the call needed
	Free   int   // pages (or slots) free at the time
	Total  int   // the group's capacity in pages (or MaxSequences)
	Detail string
}

// Error describes the shortage, e.g. "gokv: Cache.Begin: layer group 1 (layers 0,2; window 128): needs 5
// pages, 3 of 40 free; nothing was changed".
func (e *CapacityError) Error() string { return e.asError().Error() }

func (e *CapacityError) asError() *Error {
	var msg string
	if e.Group < 0 {
		msg = fmt.Sprintf("%s: needs %d sequence slots, %d of %d free (MaxSequences); nothing was changed",
			e.Detail, e.Needed, e.Free, e.Total)
	} else {
		msg = fmt.Sprintf("layer group %d (layers %s%s): needs %d pages, %d of %d free; nothing was changed",
			e.Group, joinInts(e.Layers), e.Detail, e.Needed, e.Free, e.Total)
	}
	return &Error{Op: e.Op, Code: ErrorCapacity, Msg: msg}
}

// Is reports whether target is ErrCapacity (or any *Error with its code).
func (e *CapacityError) Is(target error) bool { return ErrCapacity.Is(target) }

// Unwrap returns the equivalent *Error, so errors.As(err, &*gokv.Error) works.
func (e *CapacityError) Unwrap() error { return e.asError() }

// newErr builds an *Error with a formatted message.
func newErr(op string, code ErrorCode, format string, args ...any) *Error {
	return &Error{Op: op, Code: code, Msg: fmt.Sprintf(format, args...)}
}

// bridgeCodes maps the bridge's sentinels onto ours (the codes are the ABI's in both packages).
var bridgeCodes = []struct {
	b *bridge.Error
	c ErrorCode
}{
	{bridge.ErrInvalid, ErrorInvalid}, {bridge.ErrRange, ErrorRange}, {bridge.ErrNoMem, ErrorOutOfMemory},
	{bridge.ErrNotSupported, ErrorNotSupported}, {bridge.ErrNoDevice, ErrorNoDevice},
	{bridge.ErrVersion, ErrorVersion}, {bridge.ErrDevice, ErrorDevice}, {bridge.ErrInternal, ErrorInternal},
}

// wrapErr turns an error from package bridge into an *Error of op, prefixing context (e.g. "layer 3") to
// the native message. Errors that are already *Error or *CapacityError pass through; nil stays nil.
func wrapErr(op, context string, err error) error {
	if err == nil {
		return nil
	}
	switch err.(type) {
	case *Error, *CapacityError:
		return err
	}
	code := ErrorInternal
	msg := err.Error()
	var be *bridge.Error
	if errors.As(err, &be) {
		for _, m := range bridgeCodes {
			if be.Code == m.b.Code {
				code = m.c
			}
		}
		msg = strings.TrimPrefix(be.Error(), "gokv: ")
	}
	if context != "" {
		msg = context + ": " + msg
	}
	return &Error{Op: op, Code: code, Msg: msg}
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
