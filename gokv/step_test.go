package gokv

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStepMatchesReference runs prefill, decode and mixed decode+prefill steps over two sequences in
// every format and compares each output row with the float64 references.
func TestStepMatchesReference(t *testing.T) {
	e := openTestEngine(t)
	cases := []struct {
		format   string
		pageSize int
	}{
		{"f32", 16}, {"f16", 32}, {"q8", 32}, {"q4", 64}, {"kivi2:32:32", 32}, {"kivi4:32:64", 64},
	}
	for i, tc := range cases {
		t.Run(tc.format, func(t *testing.T) {
			f := MustParseFormat(tc.format)
			h := newTCache(t, e, smallSpec(2, 32), CacheOptions{Format: f, PageSize: tc.pageSize, MaxTokens: 1024, MaxSequences: 4}, uint64(i))
			tl := uniform(tolFor(f))
			a, b := h.newSeq(), h.newSeq()
			h.run(tl, prefill(a, 50), prefill(b, 70)) // batched prefill
			for range 3 {
				h.run(tl, decode(a), decode(b)) // batched decode
			}
			h.run(tl, decode(a), prefill(b, 37)) // mixed
			h.run(tl, prefill(a, 90))            // KIVI: crosses several ring flushes in one step
			assert.Equal(t, 50+3+1+90, a.Len())
			assert.Equal(t, 70+3+37, b.Len())
		})
	}
}

// TestStepMLA: DeepSeek-like absorbed MLA (V is a prefix of the latent K), small dims.
func TestStepMLA(t *testing.T) {
	e := openTestEngine(t)
	spec := ModelSpec{Name: "mla", SinkTokens: DefaultSinkTokens, Layers: []LayerSpec{MLALayer(4, 64, 32), MLALayer(4, 64, 32)}}
	for i, name := range []string{"f16", "q4", "kivi2:32:32"} {
		t.Run(name, func(t *testing.T) {
			f := MustParseFormat(name)
			h := newTCache(t, e, spec, CacheOptions{Format: f, PageSize: 32, MaxTokens: 512, MaxSequences: 2, Scale: 0.07}, uint64(10+i))
			s := h.newSeq()
			h.run(uniform(tolFor(f)), prefill(s, 45))
			h.run(uniform(tolFor(f)), decode(s))
			h.run(uniform(tolFor(f)), prefill(s, 20))
			assert.InDelta(t, 0.07, h.c.layers[0].scale, 1e-9)
		})
	}
}

// TestStepHybridFormats: per-layer formats (q8, kivi2, f16) in one layer group, with a fork so that a
// KIVI flush and a plain write hit shared pages in the same step.
func TestStepHybridFormats(t *testing.T) {
	e := openTestEngine(t)
	opts := CacheOptions{Format: MustParseFormat("f16"), PageSize: 32, MaxTokens: 1024, MaxSequences: 4,
		LayerFormats: map[int]Format{0: MustParseFormat("q8"), 1: MustParseFormat("kivi2:32:32")}}
	h := newTCache(t, e, smallSpec(3, 32), opts, 20)
	require.Len(t, h.c.Stats().Groups, 1)
	tl := func(l int) tol {
		return tolFor([]Format{MustParseFormat("q8"), MustParseFormat("kivi2:32:32"), MustParseFormat("f16")}[l])
	}
	a := h.newSeq()
	h.run(tl, prefill(a, 60))
	b := h.fork(a)
	h.run(tl, prefill(a, 10), prefill(b, 12))
	h.run(tl, decode(a), decode(b))
}

// TestSlidingWindowLayers: a gpt-oss-like model (alternating sliding window 24 / full, learned sinks,
// no sink tokens) keeps only the window's pages in the sliding group.
func TestSlidingWindowLayers(t *testing.T) {
	e := openTestEngine(t)
	spec := ModelSpec{Name: "oss-like"}
	for i := range 4 {
		l := AttentionLayer(4, 2, 32)
		l.LearnedSinks = true
		if i%2 == 0 {
			l.Window = 24
		}
		spec.Layers = append(spec.Layers, l)
	}
	h := newTCache(t, e, spec, CacheOptions{Format: MustParseFormat("f16"), PageSize: 8, MaxTokens: 512, MaxSequences: 2, MaxStepTokens: 64}, 30)
	st := h.c.Stats()
	require.Len(t, st.Groups, 2)
	assert.Equal(t, []int{0, 2}, st.Groups[0].Layers)
	assert.Equal(t, GroupStats{Layers: []int{0, 2}, Window: 24, Sinks: 0, PagesUsed: 0, PagesTotal: 2*(0+3+1) + 8 + 1}, st.Groups[0])
	assert.Equal(t, 64, st.Groups[1].PagesTotal)

	tl := uniform(tolFor(MustParseFormat("f16")))
	s := h.newSeq()
	h.run(tl, prefill(s, 40))
	for range 30 {
		h.run(tl, decode(s))
		// Tokens <= len-24 are invisible from now on: at most ceil(23/8)+1 pages of the window remain.
		assert.LessOrEqual(t, pagesUsed(h.c, 0), 4, "sliding group at len %d", s.Len())
		assert.Equal(t, ceilDiv(s.Len(), 8), pagesUsed(h.c, 1), "full group at len %d", s.Len())
	}
	h.run(tl, prefill(s, 50))
	assert.LessOrEqual(t, pagesUsed(h.c, 0), 4)
}

// TestLearnedSinksRequired: a LearnedSinks layer refuses to run before its logits are set.
func TestLearnedSinksRequired(t *testing.T) {
	e := openTestEngine(t)
	spec := smallSpec(1, 32)
	spec.Layers[0].LearnedSinks = true
	c, err := e.NewCache(spec, CacheOptions{MaxTokens: 64})
	require.NoError(t, err)
	defer c.Close()
	s, err := c.NewSequence()
	require.NoError(t, err)
	st, err := c.Begin(decode(s))
	require.NoError(t, err)
	q, k, v, out := make([]float32, 4*32), make([]float32, 2*32), make([]float32, 2*32), make([]float32, 4*32)
	err = st.Layer(0, q, k, v, out)
	assert.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, "SetSinkLogits")

	for _, tc := range []struct {
		layer  int
		logits []float32
		want   error
	}{
		{1, make([]float32, 4), ErrRange},
		{0, make([]float32, 3), ErrInvalid},
		{0, []float32{0, 1, float32(nan()), 2}, ErrInvalid},
		{0, []float32{0, 1, 2, 3}, nil},
	} {
		err := c.SetSinkLogits(tc.layer, tc.logits)
		if tc.want == nil {
			assert.NoError(t, err)
		} else {
			assert.ErrorIs(t, err, tc.want)
		}
	}
	require.NoError(t, st.Layer(0, q, k, v, out))
	require.NoError(t, st.Commit())

	c2, err := e.NewCache(smallSpec(1, 32), CacheOptions{MaxTokens: 64})
	require.NoError(t, err)
	defer c2.Close()
	assert.ErrorIs(t, c2.SetSinkLogits(0, make([]float32, 4)), ErrInvalid, "layer without learned sinks")
}

// TestStepMisuse: wrong shapes, unfinished steps, ended steps and bad entries are clear errors that
// store nothing.
func TestStepMisuse(t *testing.T) {
	e := openTestEngine(t)
	h := newTCache(t, e, smallSpec(2, 32), CacheOptions{PageSize: 16, MaxTokens: 256, MaxSequences: 4}, 40)
	tl := uniform(tolFor(Format{}))
	s := h.newSeq()
	h.run(tl, prefill(s, 20))

	other := openTestCacheSeq(t, e)
	for _, tc := range []struct {
		name    string
		entries []StepEntry
		want    error
		msg     string
	}{
		{"none", nil, ErrInvalid, "no entries"},
		{"nil seq", []StepEntry{{NewTokens: 1}}, ErrInvalid, "Seq is nil"},
		{"zero tokens", []StepEntry{{Seq: s}}, ErrInvalid, "NewTokens 0"},
		{"twice", []StepEntry{decode(s), decode(s)}, ErrInvalid, "both sequence"},
		{"foreign", []StepEntry{decode(other)}, ErrInvalid, "another cache"},
	} {
		_, err := h.c.Begin(tc.entries...)
		assert.ErrorIs(t, err, tc.want, tc.name)
		assert.ErrorContains(t, err, tc.msg, tc.name)
	}

	st, err := h.c.Begin(prefill(s, 2))
	require.NoError(t, err)
	_, err = h.c.Begin(decode(s))
	assert.ErrorIs(t, err, ErrInvalid, "sequence already in a step")
	assert.ErrorIs(t, s.Release(), ErrInvalid, "release during a step")
	_, err = s.Fork()
	assert.ErrorIs(t, err, ErrInvalid, "fork during a step")

	d := h.gen(2)
	for _, tc := range []struct {
		name         string
		layer        int
		q, k, v, out []float32
		want         error
		msg          string
	}{
		{"layer", 2, d.q[0], d.k[0], d.v[0], d.out[0], ErrRange, "layer 2"},
		{"q", 0, d.q[0][1:], d.k[0], d.v[0], d.out[0], ErrInvalid, "len(q)"},
		{"k", 0, d.q[0], d.k[0][:10], d.v[0], d.out[0], ErrInvalid, "len(k)"},
		{"v nil", 0, d.q[0], d.k[0], nil, d.out[0], ErrInvalid, "len(v)"},
		{"out", 1, d.q[1], d.k[1], d.v[1], d.out[1][:5], ErrInvalid, "len(out)"},
	} {
		err := st.Layer(tc.layer, tc.q, tc.k, tc.v, tc.out)
		assert.ErrorIs(t, err, tc.want, tc.name)
		assert.ErrorContains(t, err, tc.msg, tc.name)
	}
	require.NoError(t, st.Layer(0, d.q[0], d.k[0], d.v[0], d.out[0]))
	err = st.Commit()
	assert.ErrorIs(t, err, ErrInvalid, "commit before every layer ran")
	assert.ErrorContains(t, err, "layers 1")
	require.NoError(t, st.Abort())
	assert.NoError(t, st.Abort(), "abort twice")
	assert.ErrorIs(t, st.Commit(), ErrClosed)
	assert.ErrorIs(t, st.Layer(0, d.q[0], d.k[0], d.v[0], d.out[0]), ErrClosed)
	assert.Equal(t, 20, s.Len())

	// The cache is intact: a normal step still matches the reference.
	h.run(tl, decode(s))
}

// TestStepBadValuesStoreNothing: a non-finite key is rejected by the native validation (ErrInvalid with
// the native message), nothing is stored, and the next steps still match the reference.
func TestStepBadValuesStoreNothing(t *testing.T) {
	e := openTestEngine(t)
	for i, name := range []string{"f32", "q4", "kivi2:32:32"} {
		t.Run(name, func(t *testing.T) {
			f := MustParseFormat(name)
			h := newTCache(t, e, smallSpec(1, 32), CacheOptions{Format: f, PageSize: 32, MaxTokens: 512, MaxSequences: 2}, uint64(50+i))
			s := h.newSeq()
			h.run(uniform(tolFor(f)), prefill(s, 40))
			st, err := h.c.Begin(prefill(s, 3))
			require.NoError(t, err)
			d := h.gen(3)
			d.k[0][40] = float32(nan())
			err = st.Layer(0, d.q[0], d.k[0], d.v[0], d.out[0])
			assert.ErrorIs(t, err, ErrInvalid)
			assert.ErrorContains(t, err, "layer 0")
			assert.ErrorContains(t, err, "not finite")
			require.NoError(t, st.Abort())
			h.run(uniform(tolFor(f)), prefill(s, 3))
			h.run(uniform(tolFor(f)), decode(s))
		})
	}
}

// TestAbort returns the reserved pages and leaves lengths alone; a KIVI step that overwrote its ring
// makes its sequence unusable instead of silently wrong.
func TestAbort(t *testing.T) {
	e := openTestEngine(t)
	h := newTCache(t, e, smallSpec(1, 32), CacheOptions{Format: MustParseFormat("kivi2:32:32"), PageSize: 32, MaxTokens: 1024, MaxSequences: 4}, 60)
	tl := uniform(tolFor(MustParseFormat("kivi2:32:32")))
	a, b := h.newSeq(), h.newSeq()
	h.run(tl, prefill(a, 50), prefill(b, 50))
	before := h.c.Stats()

	// Abort right after Begin, and after a small KIVI write: fully undone.
	for _, run := range []bool{false, true} {
		st, err := h.c.Begin(prefill(a, 5))
		require.NoError(t, err)
		if run {
			d := h.gen(5)
			require.NoError(t, st.Layer(0, d.q[0], d.k[0], d.v[0], d.out[0]))
		}
		require.NoError(t, st.Abort())
		assert.Equal(t, before, h.c.Stats())
		assert.Equal(t, 50, a.Len())
	}
	h.run(tl, decode(a))

	// A long step overwrites the ring rows of b's newest tokens: Abort says so and retires b.
	st, err := h.c.Begin(prefill(b, 80))
	require.NoError(t, err)
	d := h.gen(80)
	require.NoError(t, st.Layer(0, d.q[0], d.k[0], d.v[0], d.out[0]))
	err = st.Abort()
	assert.ErrorIs(t, err, ErrNotSupported)
	_, err = h.c.Begin(decode(b))
	assert.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, "unusable")
	require.NoError(t, b.Release())
	h.run(tl, decode(a))
}

func openTestCacheSeq(t *testing.T, e *Engine) *Sequence {
	t.Helper()
	c, err := e.NewCache(smallSpec(2, 32), CacheOptions{MaxTokens: 64})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	s, err := c.NewSequence()
	require.NoError(t, err)
	return s
}

func TestStepLayerWriteOnly(t *testing.T) {
	needNative(t)
	eng, err := Open(WithBackend("cpu"), WithThreads(1))
	require.NoError(t, err)
	defer eng.Close()
	spec := ModelSpec{Name: "tiny", Layers: []LayerSpec{AttentionLayer(4, 2, 32)}}
	c, err := eng.NewCache(spec, CacheOptions{Format: MustParseFormat("f16"), MaxTokens: 256})
	require.NoError(t, err)
	defer c.Close()
	seq, err := c.NewSequence()
	require.NoError(t, err)
	// write 10 tokens without attention, then decode one token with attention
	st, err := c.Begin(StepEntry{Seq: seq, NewTokens: 10})
	require.NoError(t, err)
	k := make([]float32, 10*2*32)
	v := make([]float32, 10*2*32)
	for i := range k {
		k[i], v[i] = float32(i%7)/7, float32(i%5)/5
	}
	require.NoError(t, st.Layer(0, nil, k, v, nil))
	require.NoError(t, st.Commit())
	assert.Equal(t, 10, seq.Len())
	st, err = c.Begin(StepEntry{Seq: seq, NewTokens: 1})
	require.NoError(t, err)
	q := make([]float32, 4*32)
	out := make([]float32, 4*32)
	for i := range out {
		out[i] = float32(math.NaN())
	}
	require.NoError(t, st.Layer(0, q, k[:2*32], v[:2*32], out))
	require.NoError(t, st.Commit())
	// q = 0: uniform attention over 11 tokens, so out is the mean of the stored values
	for h := 0; h < 4; h++ {
		for c := 0; c < 32; c++ {
			var want float64
			for tok := 0; tok < 11; tok++ {
				row := tok
				if tok == 10 {
					row = 0
				}
				want += float64(v[(row*2+h/2)*32+c])
			}
			assert.InDelta(t, want/11, out[h*32+c], 2e-3)
		}
	}
	// a half-given query is an error naming it
	st, err = c.Begin(StepEntry{Seq: seq, NewTokens: 1})
	require.NoError(t, err)
	assert.ErrorContains(t, st.Layer(0, q, k[:64], v[:64], nil), "out")
	require.NoError(t, st.Abort())
}

// TestLayerTwiceReplacesOrRefuses: calling Layer a second time for a layer in one step (first with other
// data, then the real data) either stores exactly what one call with the real data stores, or is refused
// with ErrInvalid, for every format; never a mix of the two calls. The step's outputs and every later
// decode are compared bit for bit with a sequence that called Layer once.
func TestLayerTwiceReplacesOrRefuses(t *testing.T) {
	e := openTestEngine(t)
	spec := ModelSpec{Name: "one", SinkTokens: DefaultSinkTokens, Layers: []LayerSpec{AttentionLayer(4, 2, 64)}}
	const rowQ, rowKV = 4 * 64, 2 * 64
	for _, name := range []string{"f32", "f16", "q8", "q4", "kivi2:32:32", "kivi2", "kivi4:32:64"} {
		t.Run(name, func(t *testing.T) {
			f := MustParseFormat(name)
			refused := 0
			for _, start := range []int{0, 31, 63, 64, 100, 190} {
				for _, n := range []int{1, 2, 33, 70} {
					c, err := e.NewCache(spec, CacheOptions{Format: f, PageSize: 64, MaxTokens: 1024, MaxSequences: 3})
					require.NoError(t, err)
					rng := newRand(uint64(start*131 + n))
					once, twice, retried := mustSeq(t, c), mustSeq(t, c), mustSeq(t, c)
					if start > 0 {
						k, v := randVec(rng, start*rowKV, 1), randVec(rng, start*rowKV, 1)
						for _, s := range []*Sequence{once, twice, retried} {
							st, err := c.Begin(prefill(s, start))
							require.NoError(t, err)
							require.NoError(t, st.Layer(0, nil, k, v, nil))
							require.NoError(t, st.Commit())
						}
					}
					q, k, v := randVec(rng, n*rowQ, 1), randVec(rng, n*rowKV, 1), randVec(rng, n*rowKV, 1)
					junkQ, junkK, junkV := randVec(rng, n*rowQ, 3), randVec(rng, n*rowKV, 3), randVec(rng, n*rowKV, 3)
					want, got := poisoned(n*rowQ), poisoned(n*rowQ)
					st, err := c.Begin(prefill(once, n))
					require.NoError(t, err)
					require.NoError(t, st.Layer(0, q, k, v, want))
					require.NoError(t, st.Commit())

					// A call refused for a bad value stores nothing: the retry is exact, whatever the format.
					st, err = c.Begin(prefill(retried, n))
					require.NoError(t, err)
					badK := slices.Clone(k)
					badK[len(badK)-1] = float32(math.Inf(1))
					require.ErrorIs(t, st.Layer(0, q, badK, v, poisoned(n*rowQ)), ErrInvalid)
					retriedOut := poisoned(n * rowQ)
					require.NoError(t, st.Layer(0, q, k, v, retriedOut))
					require.NoError(t, st.Commit())
					require.Equal(t, want, retriedOut, "start %d, %d new tokens: retried after a refused call", start, n)

					st, err = c.Begin(prefill(twice, n))
					require.NoError(t, err)
					require.NoError(t, st.Layer(0, junkQ, junkK, junkV, poisoned(n*rowQ)))
					if err := st.Layer(0, q, k, v, got); err != nil {
						assert.ErrorIs(t, err, ErrInvalid)
						assert.ErrorContains(t, err, "layer 0")
						assert.ErrorContains(t, err, "already stored")
						refused++
						require.NoError(t, c.Close())
						continue
					}
					require.NoError(t, st.Commit())
					require.Equal(t, want, got, "start %d, %d new tokens: the step's output", start, n)
					for range 3 {
						q, k, v := randVec(rng, rowQ, 1), randVec(rng, rowKV, 1), randVec(rng, rowKV, 1)
						outs := [2][]float32{poisoned(rowQ), poisoned(rowQ)}
						for i, s := range []*Sequence{once, twice} {
							st, err := c.Begin(decode(s))
							require.NoError(t, err)
							require.NoError(t, st.Layer(0, q, k, v, outs[i]))
							require.NoError(t, st.Commit())
						}
						require.Equal(t, outs[0], outs[1], "start %d, %d new tokens: a later decode", start, n)
					}
					require.NoError(t, c.Close())
				}
			}
			if f.Kind.IsKIVI() {
				assert.Positive(t, refused, "the 70-token steps overwrite KIVI rings")
			} else {
				assert.Zero(t, refused, "only KIVI steps that overwrote their residual ring may refuse")
			}
		})
	}
}

func mustSeq(t *testing.T, c *Cache) *Sequence {
	t.Helper()
	s, err := c.NewSequence()
	require.NoError(t, err)
	return s
}
