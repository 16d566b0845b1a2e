package gokv

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The model stand-in of the prefix tests: a token's keys and values, and a row's queries, are functions
// of (layer, position, token id) only, as a real model's would be, so that a cold prefill and a reusing
// one feed the cache the same rows.
func rowsFor(seed uint64, l, pos int, tok int32, n int) []float32 {
	rng := rand.New(rand.NewPCG(seed^uint64(l)<<40^uint64(pos)<<8, uint64(tok)+1))
	return randVec(rng, n, 1)
}

// promptStep appends toks (positions from s.Len()) to s in one step, with their ids, and returns each
// layer's attention outputs.
func promptStep(t *testing.T, c *Cache, s *Sequence, toks []int32) [][]float32 {
	t.Helper()
	st, err := c.Begin(StepEntry{Seq: s, NewTokens: len(toks), Tokens: toks})
	require.NoError(t, err)
	start := st.StartPos(0)
	outs := make([][]float32, len(c.spec.Layers))
	for l, ls := range c.spec.Layers {
		var q, k, v []float32
		for j, tok := range toks {
			p := start + j
			q = append(q, rowsFor(1, l, p, tok, ls.HeadsQ*ls.HeadDimK)...)
			k = append(k, rowsFor(2, l, p, tok, ls.HeadsKV*ls.HeadDimK)...)
			if !ls.VIsKPrefix() {
				v = append(v, rowsFor(3, l, p, tok, ls.HeadsKV*ls.HeadDimV)...)
			}
		}
		outs[l] = make([]float32, len(toks)*ls.HeadsQ*ls.HeadDimV)
		require.NoError(t, st.Layer(l, q, k, v, outs[l]), "layer %d", l)
	}
	require.NoError(t, st.Commit())
	return outs
}

func tokenRange(lo, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(lo + i)
	}
	return out
}

// reuseCase is one cache configuration of the prefix tests.
type reuseCase struct {
	name   string
	spec   ModelSpec
	format Format
	policy EvictionPolicy
	page   int
}

func reuseCases() []reuseCase {
	hybrid := smallSpec(2, 32)
	hybrid.Layers[1].Window = 24
	mla := ModelSpec{Name: "mla", SinkTokens: DefaultSinkTokens, Layers: []LayerSpec{MLALayer(4, 32, 16)}}
	var cases []reuseCase
	for _, f := range []Format{{Kind: F32}, {Kind: F16}, {Kind: Q8, Group: 32}, {Kind: Q4, Group: 32},
		{Kind: KIVI2, Group: 32, Residual: 32}, {Kind: KIVI4, Group: 32, Residual: 64}} {
		page := 16
		if f.Kind.IsKIVI() {
			page = 32
		}
		cases = append(cases, reuseCase{name: f.String(), spec: smallSpec(2, 32), format: f, page: page})
	}
	return append(cases,
		reuseCase{name: "hybrid-window-q4", spec: hybrid, format: Format{Kind: Q4, Group: 32}, page: 8},
		reuseCase{name: "hybrid-window-kivi4", spec: hybrid, format: Format{Kind: KIVI4, Group: 32, Residual: 32}, page: 32},
		reuseCase{name: "mla-f16", spec: mla, format: Format{Kind: F16}, page: 8},
		reuseCase{name: "sinkwindow-q8", spec: smallSpec(1, 32), format: Format{Kind: Q8, Group: 32}, page: 8,
			policy: &SinkWindow{Sinks: 4, Window: 40}},
		reuseCase{name: "h2o-f16", spec: smallSpec(2, 32), format: Format{Kind: F16}, page: 8, policy: H2O{Budget: 48, Recent: 8}},
		reuseCase{name: "snapkv-q4", spec: smallSpec(2, 32), format: Format{Kind: Q4, Group: 32}, page: 8,
			policy: SnapKV{Budget: 40, Window: 6}},
		reuseCase{name: "quest-q4", spec: smallSpec(2, 32), format: Format{Kind: Q4, Group: 32}, page: 8,
			policy: Quest{Pages: 2, Recent: 8}},
	)
}

func (rc reuseCase) open(t *testing.T) *Cache {
	t.Helper()
	e := openTestEngine(t)
	c, err := e.NewCache(rc.spec, CacheOptions{Format: rc.format, PageSize: rc.page, MaxTokens: 4096, MaxSequences: 8,
		Eviction: rc.policy})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// TestPrefixReuseEqualsColdPrefill: a conversation's second turn, started with NewSequenceFrom, reuses the
// first turn's tokens (prompt and generated ones) and its outputs equal, bit for bit, those of a sequence
// that prefilled the same tokens cold in the same steps; every format, windows, MLA and every policy.
func TestPrefixReuseEqualsColdPrefill(t *testing.T) {
	for _, rc := range reuseCases() {
		t.Run(rc.name, func(t *testing.T) {
			c := rc.open(t)
			turn1 := tokenRange(1000, 70)
			s1, reused, err := c.NewSequenceFrom(turn1)
			require.NoError(t, err)
			require.Zero(t, reused, "an empty cache holds nothing")
			promptStep(t, c, s1, turn1)
			for i := 0; i < 9; i++ {
				promptStep(t, c, s1, []int32{int32(5000 + i)})
			}
			all := append(append([]int32(nil), turn1...), tokenRange(5000, 9)...)
			require.NoError(t, s1.Release())

			turn2 := append(append([]int32(nil), all...), tokenRange(7000, 25)...)
			s2, reused, err := c.NewSequenceFrom(turn2)
			require.NoError(t, err)
			switch rc.policy.(type) {
			case H2O, SnapKV: // compaction renames nothing: what was named before it is reused
				assert.Positive(t, reused)
				assert.LessOrEqual(t, reused, len(all))
			case Quest: // whole pages only: a page's key bounds cover every token written to it
				assert.Equal(t, len(all)/rc.page*rc.page, reused)
			default:
				assert.Equal(t, len(all), reused, "the first turn's tokens are reused")
			}
			require.Equal(t, reused, s2.Len())
			got := promptStep(t, c, s2, turn2[reused:])
			gotNext := promptStep(t, c, s2, []int32{9999})

			cold, err := c.NewSequence()
			require.NoError(t, err)
			if _, h2o := rc.policy.(H2O); h2o {
				// H2O decides at every commit, so a cold run in the same two steps would hide tokens
				// the reused sequence (no mass yet) keeps: compare with the one-step cold prefill, whose
				// suffix rows see every token, as the reused sequence's do.
				want := promptStep(t, c, cold, turn2)
				for l, ls := range c.spec.Layers {
					row := ls.HeadsQ * ls.HeadDimV
					assert.InDeltaSlice(t, want[l][reused*row:], got[l], 1e-5, "layer %d: the suffix's outputs", l)
				}
				return
			}
			if reused > 0 {
				promptStep(t, c, cold, turn2[:reused])
			}
			wantOut := promptStep(t, c, cold, turn2[reused:])
			wantNext := promptStep(t, c, cold, []int32{9999})
			for l := range got {
				requireSameFloats(t, wantOut[l], got[l], "layer %d: the suffix's outputs", l)
				requireSameFloats(t, wantNext[l], gotNext[l], "layer %d: the next decode step", l)
			}
			require.NoError(t, s2.Release())
			require.NoError(t, cold.Release())
		})
	}
}

// TestPrefixSharedSystemPrompt: sequences that share only a system prompt reuse its whole pages, and the
// shared pages are copy-on-write: each continues with its own tokens, equal to a cold prefill.
func TestPrefixSharedSystemPrompt(t *testing.T) {
	rc := reuseCase{spec: smallSpec(2, 32), format: Format{Kind: Q4, Group: 32}, page: 16}
	c := rc.open(t)
	system := tokenRange(1, 50)
	a, _, err := c.NewSequenceFrom(system)
	require.NoError(t, err)
	promptStep(t, c, a, system)
	promptStep(t, c, a, tokenRange(300, 5)) // a goes on: its partial page 3 fills
	for i, user := range [][]int32{tokenRange(100, 20), tokenRange(200, 33)} {
		prompt := append(append([]int32(nil), system...), user...)
		s, reused, err := c.NewSequenceFrom(prompt)
		require.NoError(t, err)
		assert.Equal(t, 50, reused, "prompt %d: the system prompt's pages, the partial one included", i)
		got := promptStep(t, c, s, prompt[reused:])
		cold, err := c.NewSequence()
		require.NoError(t, err)
		promptStep(t, c, cold, prompt[:reused])
		want := promptStep(t, c, cold, prompt[reused:])
		for l := range got {
			requireSameFloats(t, want[l], got[l], "prompt %d layer %d", i, l)
		}
	}
}

// TestPrefixCachedPagesNeverCostCapacity: pages no sequence holds stay cached for reuse, yet a cache full
// of them takes every new sequence that would fit an empty cache; a prefix whose pages were taken is not
// reused.
func TestPrefixCachedPagesNeverCostCapacity(t *testing.T) {
	e := openTestEngine(t)
	c, err := e.NewCache(smallSpec(1, 32), CacheOptions{Format: Format{Kind: F16}, PageSize: 8, MaxTokens: 128, MaxSequences: 4})
	require.NoError(t, err)
	defer c.Close()
	first := tokenRange(1, 120)
	s, _, err := c.NewSequenceFrom(first)
	require.NoError(t, err)
	promptStep(t, c, s, first)
	require.NoError(t, s.Release())
	st := c.Stats()
	assert.Equal(t, 0, st.PagesUsed)
	assert.Equal(t, 15, st.Groups[0].PagesCached)

	other := tokenRange(500, 128)
	o, reused, err := c.NewSequenceFrom(other)
	require.NoError(t, err)
	assert.Zero(t, reused)
	promptStep(t, c, o, other) // needs all 16 pages: the cached ones are taken
	require.NoError(t, o.Release())
	_, reused, err = c.NewSequenceFrom(append(first, 7))
	require.NoError(t, err)
	assert.Zero(t, reused, "the first prompt's pages were taken: nothing to reuse")
}

// TestPrefixTruncateForgetsOverwrittenPages: a sequence truncated into a page it alone holds and then
// given other tokens no longer names that page with its old tokens.
func TestPrefixTruncateForgetsOverwrittenPages(t *testing.T) {
	rc := reuseCase{spec: smallSpec(1, 32), format: Format{Kind: F16}, page: 8}
	c := rc.open(t)
	toks := tokenRange(1, 20)
	s, _, err := c.NewSequenceFrom(toks)
	require.NoError(t, err)
	promptStep(t, c, s, toks)
	require.NoError(t, s.Truncate(12))
	promptStep(t, c, s, tokenRange(900, 8)) // positions 12..19 now hold other tokens
	again := append(tokenRange(1, 20), 77)
	s2, reused, err := c.NewSequenceFrom(again)
	require.NoError(t, err)
	assert.Equal(t, 12, reused, "pages 0 and the first 4 tokens of page 1 only")
	got := promptStep(t, c, s2, again[reused:])
	cold, err := c.NewSequence()
	require.NoError(t, err)
	promptStep(t, c, cold, again[:reused])
	want := promptStep(t, c, cold, again[reused:])
	requireSameFloats(t, want[0], got[0], "the suffix's outputs")
}

// TestPrefixUntrackedSequencesNameNothing: steps without token ids name no page.
func TestPrefixUntrackedSequencesNameNothing(t *testing.T) {
	rc := reuseCase{spec: smallSpec(1, 32), format: Format{Kind: F16}, page: 8}
	c := rc.open(t)
	s, err := c.NewSequence()
	require.NoError(t, err)
	st, err := c.Begin(StepEntry{Seq: s, NewTokens: 16})
	require.NoError(t, err)
	ls := c.spec.Layers[0]
	require.NoError(t, st.Layer(0, nil, make([]float32, 16*ls.HeadsKV*ls.HeadDimK), make([]float32, 16*ls.HeadsKV*ls.HeadDimV), nil))
	require.NoError(t, st.Commit())
	require.NoError(t, s.Release())
	assert.Zero(t, c.Stats().Groups[0].PagesCached)
	_, err = c.Begin(StepEntry{Seq: s, NewTokens: 2, Tokens: []int32{1}})
	require.Error(t, err)
}

// TestPrefixReuseConcurrent: many goroutines start sequences from prompts sharing prefixes, step and
// release them at once; every output equals a cold prefill's (run with -race).
func TestPrefixReuseConcurrent(t *testing.T) {
	rc := reuseCase{spec: smallSpec(2, 32), format: Format{Kind: KIVI4, Group: 32, Residual: 32}, page: 32}
	c := rc.open(t)
	system := tokenRange(1, 40)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for turn := 0; turn < 3; turn++ {
				prompt := append(append([]int32(nil), system...), tokenRange(100*w+1000*turn, 10+turn)...)
				s, reused, err := c.NewSequenceFrom(prompt)
				if err != nil {
					errs <- err
					return
				}
				got := promptStep(t, c, s, prompt[reused:])
				cold, err := c.NewSequence()
				if err != nil {
					errs <- err
					return
				}
				if reused > 0 {
					promptStep(t, c, cold, prompt[:reused])
				}
				want := promptStep(t, c, cold, prompt[reused:])
				if fmt.Sprint(want) != fmt.Sprint(got) {
					errs <- fmt.Errorf("worker %d turn %d: outputs differ after reusing %d tokens", w, turn, reused)
				}
				_ = s.Release()
				_ = cold.Release()
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// requireSameFloats fails at the first element where got differs from want in any bit.
func requireSameFloats(t testing.TB, want, got []float32, msg string, args ...any) {
	t.Helper()
	require.Len(t, got, len(want), fmt.Sprintf(msg, args...))
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			require.Failf(t, "outputs differ", "%s: element %d of %d: want %g, got %g", fmt.Sprintf(msg, args...), i, len(want), want[i], got[i])
		}
	}
}
