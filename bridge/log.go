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

// The log levels of the native code (GOKV_LOG_*).
const (
	LogDebug = int(C.GOKV_LOG_DEBUG)
	LogInfo  = int(C.GOKV_LOG_INFO)
	LogWarn  = int(C.GOKV_LOG_WARN)
	LogError = int(C.GOKV_LOG_ERROR)
)

// LogFunc receives one native log message: its level (LogDebug..LogError), the backend ("cpu", ...) and
// the operation ("gokv_device_open", ...) it comes from, and the text.
//
// It may be called from any goroutine or from a native worker thread, concurrently, and while a gokv call
// is in flight: it must be quick, and it must not call back into this package.
type LogFunc func(level int, backend, op, msg string)

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
