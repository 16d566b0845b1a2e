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
// Package bridge is not for direct use: it is internal to gokv's use, its API follows the C ABI and may
// change with it. The public API is package gokv (github.com/gokv/gokv/gokv).
//
// Built without cgo (CGO_ENABLED=0), the package keeps its types and constants (types.go, errors.go) and
// every call that needs the native code fails with ErrNoCgo (nocgo.go).
package bridge
