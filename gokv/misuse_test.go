package gokv

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestZeroValuesAndNilReceivers: every method on a nil or zero Engine, Cache, Sequence or Step returns
// ErrInvalid saying what is wrong (or a harmless zero for the accessors), never a panic.
func TestZeroValuesAndNilReceivers(t *testing.T) {
	spec := smallSpec(1, 32)
	q, kv := make([]float32, 4*32), make([]float32, 2*32)
	calls := []struct {
		name string
		call func() error
		msg  string
	}{
		{"nil Engine.NewCache", func() error { _, err := (*Engine)(nil).NewCache(spec, CacheOptions{}); return err }, "engine is nil"},
		{"zero Engine.NewCache", func() error { _, err := (&Engine{}).NewCache(spec, CacheOptions{}); return err }, "zero Engine"},
		{"zero Engine.Info", func() error { _, err := (&Engine{}).Info(); return err }, "zero Engine"},
		{"nil Cache.NewSequence", func() error { _, err := (*Cache)(nil).NewSequence(); return err }, "cache is nil"},
		{"zero Cache.NewSequence", func() error { _, err := (&Cache{}).NewSequence(); return err }, "zero Cache"},
		{"zero Cache.Begin", func() error { _, err := (&Cache{}).Begin(StepEntry{NewTokens: 1}); return err }, "zero Cache"},
		{"nil Cache.Begin", func() error { _, err := (*Cache)(nil).Begin(); return err }, "cache is nil"},
		{"zero Cache.SetSinkLogits", func() error { return (&Cache{}).SetSinkLogits(0, nil) }, "zero Cache"},
		{"nil Sequence.Fork", func() error { _, err := (*Sequence)(nil).Fork(); return err }, "sequence is nil"},
		{"zero Sequence.Fork", func() error { _, err := (&Sequence{}).Fork(); return err }, "zero Sequence"},
		{"zero Sequence.Truncate", func() error { return (&Sequence{}).Truncate(0) }, "zero Sequence"},
		{"zero Sequence.Release", func() error { return (&Sequence{}).Release() }, "zero Sequence"},
		{"nil Step.Layer", func() error { return (*Step)(nil).Layer(0, q, kv, kv, q) }, "step is nil"},
		{"zero Step.Layer", func() error { return (&Step{}).Layer(0, q, kv, kv, q) }, "zero Step"},
		{"zero Step.Commit", func() error { return (&Step{}).Commit() }, "zero Step"},
		{"zero Step.Abort", func() error { return (&Step{}).Abort() }, "zero Step"},
	}
	for _, tc := range calls {
		var err error
		require.NotPanics(t, func() { err = tc.call() }, tc.name)
		assert.ErrorIs(t, err, ErrInvalid, tc.name)
		assert.ErrorContains(t, err, tc.msg, tc.name)
	}
	assert.NotPanics(t, func() {
		assert.Zero(t, (*Sequence)(nil).Len())
		assert.Zero(t, (&Sequence{}).Len())
		assert.Equal(t, -1, (&Sequence{}).ID())
		assert.Zero(t, (*Step)(nil).Rows())
		assert.Zero(t, (*Cache)(nil).Stats())
		assert.Zero(t, (&Cache{}).Stats())
		assert.Empty(t, (*Cache)(nil).Spec().Layers)
		assert.NoError(t, (*Cache)(nil).Close())
		assert.NoError(t, (&Cache{}).Close())
		assert.NoError(t, (&Engine{}).Close())
	})

	// A zero Sequence in a real cache's step is named as such.
	e := openTestEngine(t)
	c, err := e.NewCache(spec, CacheOptions{MaxTokens: 64})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Begin(StepEntry{Seq: &Sequence{}, NewTokens: 1})
	assert.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, "zero Sequence")
}

// TestCommitAfterCacheClose: a step whose cache was closed says so, whatever its layers did.
func TestCommitAfterCacheClose(t *testing.T) {
	e := openTestEngine(t)
	c, err := e.NewCache(smallSpec(2, 32), CacheOptions{MaxTokens: 64})
	require.NoError(t, err)
	s := mustSeq(t, c)
	st, err := c.Begin(decode(s))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	err = st.Commit()
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorContains(t, err, "cache is closed")
	assert.NotContains(t, err.Error(), "did not run")
	assert.ErrorIs(t, st.Commit(), ErrClosed)
	assert.NoError(t, st.Abort())
}

// TestSinkLogitsOption: CacheOptions.SinkLogits makes a learned-sinks cache complete at creation (the
// same outputs as SetSinkLogits), and a bad entry fails NewCache naming the layer.
func TestSinkLogitsOption(t *testing.T) {
	e := openTestEngine(t)
	spec := smallSpec(2, 32)
	spec.Layers[1].LearnedSinks = true
	logits := []float32{0.5, -1, 2, 0}
	run := func(c *Cache) []float32 {
		s := mustSeq(t, c)
		rng := newRand(3)
		var out []float32
		for _, n := range []int{5, 1} {
			st, err := c.Begin(prefill(s, n))
			require.NoError(t, err)
			assert.Equal(t, s.Len(), st.StartPos(0))
			assert.Equal(t, -1, st.StartPos(1))
			out = poisoned(n * 4 * 32)
			for l := range 2 {
				require.NoError(t, st.Layer(l, randVec(rng, n*4*32, 1), randVec(rng, n*2*32, 1), randVec(rng, n*2*32, 1), out))
			}
			require.NoError(t, st.Commit())
		}
		return out
	}
	byOption, err := e.NewCache(spec, CacheOptions{MaxTokens: 64, SinkLogits: map[int][]float32{1: logits}})
	require.NoError(t, err)
	defer byOption.Close()
	bySetter, err := e.NewCache(spec, CacheOptions{MaxTokens: 64})
	require.NoError(t, err)
	defer bySetter.Close()
	require.NoError(t, bySetter.SetSinkLogits(1, logits))
	logits[0] = 9 // both copied
	assert.Equal(t, run(bySetter), run(byOption))

	for _, tc := range []struct {
		sinks map[int][]float32
		want  error
		msg   string
	}{
		{map[int][]float32{0: make([]float32, 4)}, ErrInvalid, "layer 0"},
		{map[int][]float32{2: make([]float32, 4)}, ErrRange, "layer 2"},
		{map[int][]float32{1: make([]float32, 3)}, ErrInvalid, "HeadsQ"},
		{map[int][]float32{1: {0, 0, float32(nan()), 0}}, ErrInvalid, "not finite"},
	} {
		_, err := e.NewCache(spec, CacheOptions{MaxTokens: 64, SinkLogits: tc.sinks})
		assert.ErrorIs(t, err, tc.want, tc.msg)
		assert.ErrorContains(t, err, tc.msg)
	}
}

// TestEvictionPolicyForms: a SinkWindow works as a value or a pointer, a nil *SinkWindow keeps
// everything, and a bad one is refused whichever form it comes in.
func TestEvictionPolicyForms(t *testing.T) {
	e := openTestEngine(t)
	spec := smallSpec(1, 32)
	for _, tc := range []struct {
		policy EvictionPolicy
		window int
	}{{SinkWindow{Sinks: 4, Window: 16}, 16}, {&SinkWindow{Sinks: 4, Window: 24}, 24}, {(*SinkWindow)(nil), 0}, {nil, 0}} {
		c, err := e.NewCache(spec, CacheOptions{MaxTokens: 256, PageSize: 8, Eviction: tc.policy})
		require.NoError(t, err)
		assert.Equal(t, tc.window, c.Stats().Groups[0].Window, "%#v", tc.policy)
		require.NoError(t, c.Close())
	}
	for _, bad := range []EvictionPolicy{SinkWindow{Sinks: 4}, &SinkWindow{Sinks: -1, Window: 8}} {
		_, err := e.NewCache(spec, CacheOptions{MaxTokens: 256, Eviction: bad})
		assert.ErrorIs(t, err, ErrInvalid)
		assert.ErrorContains(t, err, "Window must be >= 1")
	}
}
