package bridge

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Why the long cgo calls (attention, writes, reads, copies) yield first, at most once every yieldEvery.
//
// A goroutine that spends its time in back-to-back cgo calls is never rescheduled: each call returns to
// the same goroutine, so its P's schedtick does not move. Once it has not moved for 10 ms (the runtime's
// forcePreemptNS), sysmon treats the goroutine as a long runner and takes its P inside the cgo call even
// while another P is idle (retake), handing the P to an idle M that wakes, finds no work and sleeps again.
// The goroutine leaves cgo on the idle P, whose schedtick is as old, so its next call loses that P too,
// and so on for hundreds of calls until something reschedules it. On a machine with as many cores as
// compute threads, each woken M lands on a core the CPU module's workers are using and holds one off.
//
// One runtime.Gosched every few milliseconds reschedules the goroutine and keeps sysmon away; Gosched
// itself wakes an M, so a yield before every call would cost more than it saves (docs/performance.md has
// the trace). The period must stay well under 10 ms, calls included: a call of up to 8 ms still finds the
// goroutine rescheduled within 10 ms.
//
// A call of 10 ms or more loses its P inside the call whatever the goroutine did before (sysmon retakes a
// P that one syscall has held that long), so a yield before it buys nothing, and its woken M costs the
// call's start: the goroutine may resume on that M while the one it left still runs, three threads on two
// cores for a while. After a call that long, the next one does not yield (q8 at 128K, 17 ms calls, ran
// 1.1x faster so); shorter calls still yield, and 4K calls need it.
const (
	yieldEvery  = 2 * time.Millisecond
	retakeAfter = 10 * time.Millisecond
)

var (
	epoch     = time.Now()
	lastYield atomic.Int64 // nanoseconds after epoch of the last yield, by any goroutine
	lastCall  atomic.Int64 // how long the last long call took, in nanoseconds, by any goroutine
)

// yieldDue reports whether a call at now (nanoseconds after epoch) should yield first, and claims the yield
// when it should: of the goroutines that ask at once, one yields.
func yieldDue(now int64) bool {
	last := lastYield.Load()
	return now-last >= int64(yieldEvery) && lastYield.CompareAndSwap(last, now)
}

// beforeLongCall is called by the bridge just before a cgo call that may run for long (see yieldEvery); it
// returns the call's start for afterLongCall, which the bridge defers: defer afterLongCall(beforeLongCall()).
func beforeLongCall() int64 {
	if lastCall.Load() < int64(retakeAfter) && yieldDue(int64(time.Since(epoch))) {
		runtime.Gosched()
	}
	return int64(time.Since(epoch))
}

// afterLongCall records how long the call that began at start (from beforeLongCall) took.
func afterLongCall(start int64) {
	lastCall.Store(int64(time.Since(epoch)) - start)
}
