package bridge

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestYieldDueOncePerPeriod(t *testing.T) {
	saved := lastYield.Load()
	defer lastYield.Store(saved)

	base := int64(time.Hour)
	lastYield.Store(base)
	assert.False(t, yieldDue(base+int64(yieldEvery)-1), "one nanosecond short of the period")
	assert.Equal(t, base, lastYield.Load(), "a call that does not yield leaves the last yield alone")
	assert.True(t, yieldDue(base+int64(yieldEvery)), "a whole period after the last yield")
	assert.Equal(t, base+int64(yieldEvery), lastYield.Load(), "the yield is claimed")
	assert.False(t, yieldDue(base+int64(yieldEvery)), "the same instant again")
	assert.True(t, yieldDue(base+10*int64(yieldEvery)), "long after")
}

func TestYieldDueClaimedByOneCaller(t *testing.T) {
	saved := lastYield.Load()
	defer lastYield.Store(saved)

	base := int64(time.Hour)
	for round := 1; round <= 20; round++ {
		lastYield.Store(base)
		now := base + int64(yieldEvery)
		var yes atomic.Int32
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if yieldDue(now) {
					yes.Add(1)
				}
			}()
		}
		wg.Wait()
		assert.Equal(t, int32(1), yes.Load(), "round %d: callers asking at once", round)
	}
}

func TestBeforeLongCallAdvancesTheLastYield(t *testing.T) {
	saved, savedCall := lastYield.Load(), lastCall.Load()
	defer lastYield.Store(saved)
	defer lastCall.Store(savedCall)
	lastCall.Store(0)

	lastYield.Store(int64(time.Since(epoch)) - int64(yieldEvery))
	before := lastYield.Load()
	beforeLongCall()
	assert.Greater(t, lastYield.Load(), before, "a call a period after the last yield yields")
	recent := int64(time.Since(epoch)) + int64(time.Hour) // later than any call of this test
	lastYield.Store(recent)
	beforeLongCall()
	assert.Equal(t, recent, lastYield.Load(), "a call less than a period after the last yield does not")
}

func TestNoYieldAfterACallLongEnoughToLoseItsP(t *testing.T) {
	saved, savedCall := lastYield.Load(), lastCall.Load()
	defer lastYield.Store(saved)
	defer lastCall.Store(savedCall)

	due := func() int64 { return int64(time.Since(epoch)) - int64(yieldEvery) }
	lastCall.Store(int64(retakeAfter))
	last := due()
	lastYield.Store(last)
	beforeLongCall()
	assert.Equal(t, last, lastYield.Load(), "after a call of %v the next one does not yield", retakeAfter)

	lastCall.Store(int64(retakeAfter) - 1)
	beforeLongCall()
	assert.Greater(t, lastYield.Load(), last, "after a shorter call a due yield happens")
}

func TestAfterLongCallRecordsTheDuration(t *testing.T) {
	saved, savedCall := lastYield.Load(), lastCall.Load()
	defer lastYield.Store(saved)
	defer lastCall.Store(savedCall)

	start := beforeLongCall()
	time.Sleep(2 * time.Millisecond)
	afterLongCall(start)
	assert.GreaterOrEqual(t, lastCall.Load(), int64(2*time.Millisecond), "the sleep is part of the call")
	afterLongCall(int64(time.Since(epoch)))
	assert.Less(t, lastCall.Load(), int64(retakeAfter), "a call that returns at once")
}
