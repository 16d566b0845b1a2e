package gokv

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func nan() float64 { return math.NaN() }

// TestForkCopyOnWrite: parent and child share their prefix pages; each appends its own tokens into the
// shared partial page (which gets copied), and both keep matching their own histories.
func TestForkCopyOnWrite(t *testing.T) {
	e := openTestEngine(t)
	for i, name := range []string{"f32", "q4", "kivi2:32:32"} {
		t.Run(name, func(t *testing.T) {
			f := MustParseFormat(name)
			tl := uniform(tolFor(f))
			h := newTCache(t, e, smallSpec(2, 32), CacheOptions{Format: f, PageSize: 32, MaxTokens: 1024, MaxSequences: 4}, uint64(100+i))
			parent := h.newSeq()
			h.run(tl, prefill(parent, 45)) // 2 pages, the second partly filled
			assert.Equal(t, 2, pagesUsed(h.c, 0))

			child := h.fork(parent)
			assert.Equal(t, 45, child.Len())
			assert.Equal(t, 2, pagesUsed(h.c, 0), "a fork shares every page")
			assert.Equal(t, 2, h.c.Stats().Sequences)

			h.run(tl, prefill(parent, 3), prefill(child, 5)) // both write into the shared page 1: one copy each
			if f.Kind.IsKIVI() {
				// Nothing was flushed into pages yet (the new tokens are in the private rings): no copies.
				assert.Equal(t, 2, pagesUsed(h.c, 0), "KIVI: pages still shared")
			} else {
				assert.Equal(t, 3, pagesUsed(h.c, 0), "page 0 shared, page 1 copied twice, original dropped")
			}
			for range 3 {
				h.run(tl, decode(child))
				h.run(tl, decode(parent))
			}
			h.run(tl, prefill(child, 40)) // crosses into new pages; KIVI flushes into copied pages
			h.run(tl, prefill(parent, 50), prefill(child, 10))
			h.run(tl, prefill(parent, 30))
			minCos := map[FormatKind]float64{KIVI2: 0.6}[f.Kind] // 2-bit keys per channel are coarse
			if minCos == 0 {
				minCos = 0.95
			}
			for _, s := range []*Sequence{parent, child} {
				for l := range 2 {
					assert.Greater(t, h.storedCosine(s, l), minCos, "sequence %d layer %d holds its own tokens", s.ID(), l)
				}
			}

			// Releasing the parent keeps the shared page for the child.
			require.NoError(t, parent.Release())
			require.NoError(t, parent.Release(), "release is idempotent")
			h.run(tl, decode(child))
			grand := h.fork(child)
			h.run(tl, decode(grand), decode(child))
		})
	}
}

// TestTruncate rolls sequences back, frees their pages, and refuses what cannot be undone.
func TestTruncate(t *testing.T) {
	e := openTestEngine(t)
	t.Run("f16", func(t *testing.T) {
		f := MustParseFormat("f16")
		tl := uniform(tolFor(f))
		h := newTCache(t, e, smallSpec(2, 32), CacheOptions{Format: f, PageSize: 16, MaxTokens: 512, MaxSequences: 4}, 200)
		s := h.newSeq()
		h.run(tl, prefill(s, 50))
		h.run(tl, prefill(s, 4)) // speculative tokens
		h.truncate(s, 51)        // reject three
		assert.Equal(t, 51, s.Len())
		h.run(tl, decode(s) /* new token replaces the rejected ones */)
		assert.Equal(t, 4, pagesUsed(h.c, 0))
		h.truncate(s, 10)
		assert.Equal(t, 1, pagesUsed(h.c, 0), "pages past the new length are freed")
		h.run(tl, prefill(s, 30))

		// A fork keeps the pages its parent drops.
		child := h.fork(s)
		h.truncate(s, 0)
		assert.Equal(t, 3, pagesUsed(h.c, 0))
		h.run(tl, decode(child), prefill(s, 7))

		assert.ErrorIs(t, s.Truncate(-1), ErrRange)
		assert.ErrorIs(t, s.Truncate(s.Len()+1), ErrRange)
		assert.NoError(t, s.Truncate(s.Len()), "no-op")
	})
	t.Run("kivi", func(t *testing.T) {
		f := MustParseFormat("kivi2:32:32") // R = g = 32: the ring holds 32..63 tokens
		tl := uniform(tolFor(f))
		h := newTCache(t, e, smallSpec(1, 32), CacheOptions{Format: f, PageSize: 32, MaxTokens: 512, MaxSequences: 2}, 201)
		s := h.newSeq()
		h.run(tl, prefill(s, 70)) // 32 quantized, [32, 70) in the ring
		h.truncate(s, 64)         // still 32 quantized
		h.run(tl, decode(s))
		err := s.Truncate(50) // would need [32, 50) back in the ring
		assert.ErrorIs(t, err, ErrNotSupported)
		assert.ErrorContains(t, err, "no fewer than 64")
		assert.Equal(t, 65, s.Len(), "a refused truncate changes nothing")
		h.run(tl, decode(s))
	})
	t.Run("evicted", func(t *testing.T) {
		tl := uniform(tolFor(Format{}))
		h := newTCache(t, e, smallSpec(1, 32), CacheOptions{PageSize: 8, MaxTokens: 512, MaxSequences: 2,
			Eviction: &SinkWindow{Sinks: 4, Window: 16}}, 202)
		s := h.newSeq()
		h.run(tl, prefill(s, 60))
		used := pagesUsed(h.c, 0)
		err := s.Truncate(40) // the window of 40 tokens needs [25, 40), already evicted
		assert.ErrorIs(t, err, ErrNotSupported)
		assert.ErrorContains(t, err, "evicted")
		assert.Equal(t, used, pagesUsed(h.c, 0))
		h.truncate(s, 58) // needs [43, 58): still there
		h.run(tl, decode(s))
	})
}

// TestReleaseFreesPages checks page accounting through Stats.
func TestReleaseFreesPages(t *testing.T) {
	e := openTestEngine(t)
	f := MustParseFormat("q8")
	h := newTCache(t, e, smallSpec(2, 32), CacheOptions{Format: f, PageSize: 16, MaxTokens: 256, MaxSequences: 3}, 300)
	empty := h.c.Stats()
	assert.Equal(t, 0, empty.PagesUsed)
	assert.Equal(t, 16, empty.PagesTotal)
	assert.Zero(t, empty.BytesUsed)
	pageBytes := uint64(f.PageBytes(2, 32, 32, 16, false))
	assert.Equal(t, 2*16*pageBytes, empty.BytesReserved)

	a, b := h.newSeq(), h.newSeq()
	h.run(uniform(tolFor(f)), prefill(a, 40), prefill(b, 17))
	st := h.c.Stats()
	assert.Equal(t, 3+2, st.PagesUsed)
	assert.Equal(t, 2, st.Sequences)
	assert.Equal(t, 2*5*pageBytes, st.BytesUsed)
	require.NoError(t, a.Release())
	assert.Equal(t, 2, h.c.Stats().PagesUsed)
	require.NoError(t, b.Release())
	assert.Equal(t, empty, h.c.Stats())

	_, err := h.c.Begin(decode(a))
	assert.ErrorIs(t, err, ErrClosed, "step on a released sequence")
	assert.ErrorIs(t, a.Truncate(0), ErrClosed)
}

// TestCapacity: a step that does not fit fails with a typed ErrCapacity and changes nothing.
func TestCapacity(t *testing.T) {
	e := openTestEngine(t)
	tl := uniform(tolFor(Format{}))
	h := newTCache(t, e, smallSpec(2, 32), CacheOptions{PageSize: 16, MaxTokens: 100, MaxSequences: 2}, 400) // 7 pages
	a, b := h.newSeq(), h.newSeq()
	h.run(tl, prefill(a, 60)) // 4 pages
	before := h.c.Stats()

	_, err := h.c.Begin(decode(a), prefill(b, 50)) // needs 0 + 4 pages, 3 free
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrCapacity)
	var ce *CapacityError
	require.True(t, errors.As(err, &ce))
	assert.Equal(t, CapacityError{Op: "Cache.Begin", Group: 0, Layers: []int{0, 1}, Needed: 4, Free: 3, Total: 7}, *ce)
	var ge *Error
	require.True(t, errors.As(err, &ge))
	assert.Equal(t, ErrorCapacity, ge.Code)
	assert.Contains(t, err.Error(), "needs 4 pages, 3 of 7 free")
	assert.Equal(t, before, h.c.Stats(), "nothing changed")
	assert.Equal(t, 60, a.Len())
	assert.Equal(t, 0, b.Len())

	h.run(tl, decode(a), prefill(b, 30)) // fits: 0 + 2 pages
	assert.Equal(t, 6, h.c.Stats().PagesUsed)

	// Sequence slots.
	_, err = h.c.NewSequence()
	assert.ErrorIs(t, err, ErrCapacity)
	_, err = a.Fork()
	assert.ErrorIs(t, err, ErrCapacity)
	assert.ErrorContains(t, err, "MaxSequences")
	require.NoError(t, b.Release())
	c := h.fork(a)
	h.run(tl, decode(c)) // copy of the shared partial page
	assert.Equal(t, 5, h.c.Stats().PagesUsed)
	_, err = h.c.Begin(prefill(a, 51)) // 61 -> 112 tokens: 3 new pages, 2 free
	assert.ErrorIs(t, err, ErrCapacity)
	require.True(t, errors.As(err, &ce))
	assert.Equal(t, [2]int{3, 2}, [2]int{ce.Needed, ce.Free})
}

// TestSinkWindow: StreamingLLM eviction frees pages as the window moves, and the output equals attention
// over the sinks plus the window.
func TestSinkWindow(t *testing.T) {
	e := openTestEngine(t)
	for i, name := range []string{"f32", "q4", "kivi2:32:32"} {
		t.Run(name, func(t *testing.T) {
			f := MustParseFormat(name)
			tl := uniform(tolFor(f))
			P := 32
			h := newTCache(t, e, smallSpec(2, 32), CacheOptions{Format: f, PageSize: P, MaxTokens: 4096, MaxSequences: 2,
				MaxStepTokens: 64, Eviction: &SinkWindow{Sinks: 4, Window: 40}}, uint64(500+i))
			ring := f.Residual + f.Group
			g := h.c.Stats().Groups[0]
			assert.Equal(t, 40, g.Window)
			assert.Equal(t, 4, g.Sinks)
			assert.Equal(t, 2*(1+ceilDiv(max(40, ring), P)+1)+2+1, g.PagesTotal, "bounded by the window, not MaxTokens")

			s := h.newSeq()
			h.run(tl, prefill(s, 50))
			maxUsed := 0
			for range 12 {
				h.run(tl, prefill(s, 9))
				h.run(tl, decode(s))
				maxUsed = max(maxUsed, pagesUsed(h.c, 0))
			}
			// sinks page + window (or KIVI ring, whose pages cannot go yet) + a partial page
			assert.LessOrEqual(t, maxUsed, 1+ceilDiv(max(40, ring), P)+1)
			assert.Less(t, maxUsed, ceilDiv(s.Len(), P))
			fork := h.fork(s)
			h.run(tl, decode(fork), decode(s))
		})
	}
}

// TestEvictablePages checks the page-release rule on its own.
func TestEvictablePages(t *testing.T) {
	for _, tc := range []struct {
		rule        groupRule
		n, quant, p int
		from, to    int
	}{
		{groupRule{}, 100, 100, 8, 0, 0},
		{groupRule{window: 16, sinks: 4}, 16, 16, 8, 1, 1}, // nothing old enough
		{groupRule{window: 16, sinks: 4}, 24, 24, 8, 1, 1}, // token 8 is the last invisible one: page 1 not whole
		{groupRule{window: 16, sinks: 4}, 30, 30, 8, 1, 1}, // token 15 is still visible
		{groupRule{window: 16, sinks: 4}, 31, 31, 8, 1, 2}, // tokens <= 15 invisible: page 1 = [8,16) goes
		{groupRule{window: 16, sinks: 9}, 40, 40, 8, 2, 3}, // page 1 holds sink 8
		{groupRule{window: 16, sinks: 0}, 40, 40, 8, 0, 3},
		{groupRule{window: 16, sinks: 0}, 40, 17, 8, 0, 2}, // KIVI: only quantized tokens [0, 17)
	} {
		from, to := evictablePages(tc.rule, tc.n, tc.quant, tc.p)
		assert.Equal(t, [2]int{tc.from, tc.to}, [2]int{from, to}, "%+v", tc)
	}
}
