//go:build cgo

package bridge

/*
#include "gokv.h"
#include "gokv_cgo.h"
*/
import "C"

import (
	"strconv"
	"sync"
	"sync/atomic"
)

var (
	logMu   sync.Mutex              // serializes SetLogFunc
	logFunc atomic.Pointer[LogFunc] // read by every callback
)

// SetLogFunc installs fn as the process-wide receiver of native log messages at minLevel and above
// (gokv_set_log_callback); nil restores the default, silence. Safe to call concurrently with anything.
func SetLogFunc(fn LogFunc, minLevel int) error {
	const op = "gokv_set_log_callback"
	logMu.Lock()
	defer logMu.Unlock()
	if fn == nil {
		err := resultError(op, C.gokv_cgo_set_log(0, C.int32_t(LogError)))
		logFunc.Store(nil)
		return err
	}
	if minLevel < LogDebug || minLevel > LogError {
		return newError(op, codeInvalid, "minLevel "+strconv.Itoa(minLevel)+" is not a Log* level")
	}
	logFunc.Store(&fn)
	if err := resultError(op, C.gokv_cgo_set_log(1, C.int32_t(minLevel))); err != nil {
		logFunc.Store(nil)
		return err
	}
	return nil
}
