package gokv

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// saveInputs are one step's inputs per layer.
type saveInputs struct{ q, k, v [][]float32 }

func genSaveInputs(spec ModelSpec, rng *rand.Rand, rows int) saveInputs {
	var in saveInputs
	for _, l := range spec.Layers {
		in.q = append(in.q, randVec(rng, rows*l.HeadsQ*l.HeadDimK, 1))
		k := randVec(rng, rows*l.HeadsKV*l.HeadDimK, 1)
		for r := 0; r < rows*l.HeadsKV; r++ {
			k[r*l.HeadDimK+l.HeadDimK/3] *= 6 // an outlier channel, as real keys have
		}
		in.k = append(in.k, k)
		if l.VIsKPrefix() {
			in.v = append(in.v, nil)
		} else {
			in.v = append(in.v, randVec(rng, rows*l.HeadsKV*l.HeadDimV, 1))
		}
	}
	return in
}

// saveStep runs one step of entries on c with inputs in and returns every layer's outputs.
func saveStep(t testing.TB, c *Cache, in saveInputs, entries ...StepEntry) [][]float32 {
	t.Helper()
	st, err := c.Begin(entries...)
	require.NoError(t, err)
	var outs [][]float32
	for l, ls := range c.spec.Layers {
		out := make([]float32, st.Rows()*ls.HeadsQ*ls.HeadDimV)
		require.NoError(t, st.Layer(l, in.q[l], in.k[l], in.v[l], out), "layer %d", l)
		outs = append(outs, out)
	}
	require.NoError(t, st.Commit())
	return outs
}

// run steps a few sequences of one cache with inputs drawn from its own generator.
type saveRun struct {
	t   testing.TB
	c   *Cache
	rng *rand.Rand
}

// step runs entries with random inputs. Entries without Tokens get random token ids (so the cache names
// their pages for prefix reuse); an entry whose Tokens is empty but not nil is run without ids.
func (r saveRun) step(entries ...StepEntry) {
	r.t.Helper()
	rows := 0
	for i, e := range entries {
		rows += e.NewTokens
		switch {
		case e.Tokens == nil:
			entries[i].Tokens = genTokens(r.rng, e.NewTokens)
		case len(e.Tokens) == 0:
			entries[i].Tokens = nil
		}
	}
	saveStep(r.t, r.c, genSaveInputs(r.c.spec, r.rng, rows), entries...)
}

func genTokens(rng *rand.Rand, n int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = rng.Int32N(1000)
	}
	return ids
}

// twinStep runs the same step (same inputs) on the original sequences of a and the loaded ones of b and
// requires bit-identical outputs in every layer.
func twinStep(t *testing.T, rng *rand.Rand, a *Cache, as []*Sequence, b *Cache, bs []*Sequence, newTokens ...int) {
	t.Helper()
	var ea, eb []StepEntry
	rows := 0
	for i := range as {
		n := 1
		if i < len(newTokens) {
			n = newTokens[i]
		}
		ids := genTokens(rng, n)
		ea, eb = append(ea, StepEntry{Seq: as[i], NewTokens: n, Tokens: ids}), append(eb, StepEntry{Seq: bs[i], NewTokens: n, Tokens: ids})
		rows += n
	}
	in := genSaveInputs(a.spec, rng, rows)
	oa, ob := saveStep(t, a, in, ea...), saveStep(t, b, in, eb...)
	for l := range oa {
		requireSameBits(t, oa[l], ob[l], "layer %d", l)
	}
}

func requireSameBits(t *testing.T, want, got []float32, format string, args ...any) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			require.Failf(t, "outputs differ", "%s: element %d of %d: %g, want %g", sprintf(format, args...), i, len(want), got[i], want[i])
		}
	}
}

// requireSameState requires that a's sequences as and b's bs hold the same state and bytes: what Save
// would write for them, pages and rings included (page ids aside: tables name pages by first use).
func requireSameState(t *testing.T, a *Cache, as []*Sequence, b *Cache, bs []*Sequence) {
	t.Helper()
	fa, da, err := a.snapshotLocked("test", as)
	require.NoError(t, err)
	fb, db, err := b.snapshotLocked("test", bs)
	require.NoError(t, err)
	require.Equal(t, fa.state, fb.state)
	require.Equal(t, len(da), len(db))
	for name, x := range da {
		require.Equal(t, x, db[name], "tensor %s", name)
	}
}

// saveCase is a cache configuration and a history of steps that leaves some sequences to save.
type saveCase struct {
	name  string
	spec  ModelSpec
	opts  CacheOptions
	build func(r saveRun) []*Sequence
	// check, when set, looks at the saved sequences before the save (e.g. that compaction happened)
	check func(t *testing.T, c *Cache, seqs []*Sequence)
	// reuse: a prompt starting with the first sequence's tokens reuses some of its pages
	reuse bool
}

// forkedHistory: a long prompt, a fork (the two share pages), decode steps on both, and a third sequence.
func forkedHistory(prompt, decodes int) func(r saveRun) []*Sequence {
	return func(r saveRun) []*Sequence {
		a, err := r.c.NewSequence()
		require.NoError(r.t, err)
		r.step(StepEntry{Seq: a, NewTokens: prompt})
		b, err := a.Fork()
		require.NoError(r.t, err)
		for i := 0; i < decodes; i++ {
			r.step(StepEntry{Seq: a, NewTokens: 1}, StepEntry{Seq: b, NewTokens: 1})
		}
		c, err := r.c.NewSequence()
		require.NoError(r.t, err)
		// c's token ids are unknown to the cache: it is not tracked for prefix reuse.
		r.step(StepEntry{Seq: c, NewTokens: prompt/2 + 3, Tokens: []int32{}}, StepEntry{Seq: a, NewTokens: 1})
		d, err := c.Fork() // shares c's pages, not one of its own written
		require.NoError(r.t, err)
		return []*Sequence{a, b, c, d}
	}
}

func saveCases() []saveCase {
	spec := smallSpec(2, 32)
	hybrid := smallSpec(3, 32)
	hybrid.Layers[1].Window = 24
	var cases []saveCase
	for _, f := range []string{"f32", "f16", "q8:32", "q4:32", "kivi2:32:32", "kivi4:32:64"} {
		cases = append(cases, saveCase{name: f, spec: spec,
			opts:  CacheOptions{Format: MustParseFormat(f), PageSize: 32, MaxTokens: 2048, MaxSequences: 8},
			build: forkedHistory(150, 20), reuse: !strings.HasPrefix(f, "kivi")})
	}
	mla := ModelSpec{Name: "mla", SinkTokens: 4, Layers: []LayerSpec{MLALayer(4, 64, 32), MLALayer(4, 64, 32)}}
	sinks := ModelSpec{Name: "sinks", Layers: []LayerSpec{AttentionLayer(4, 2, 32), AttentionLayer(4, 2, 32)}}
	sinks.Layers[0].Window = 16
	for l := range sinks.Layers {
		sinks.Layers[l].LearnedSinks = true
	}
	cases = append(cases,
		saveCase{name: "mla-kivi4", spec: mla,
			opts:  CacheOptions{Format: MustParseFormat("kivi4:32:32"), LayerFormats: map[int]Format{1: MustParseFormat("q8:32")}, PageSize: 32, MaxTokens: 2048, MaxSequences: 8},
			build: forkedHistory(100, 10)},
		saveCase{name: "learned-sinks", spec: sinks,
			opts: CacheOptions{Format: MustParseFormat("f16"), PageSize: 16, MaxTokens: 2048, MaxSequences: 8,
				SinkLogits: map[int][]float32{0: {0.5, -1, 2, 0}, 1: {1, 1.5, -0.5, 0.25}}},
			build: forkedHistory(60, 10), reuse: true})
	cases = append(cases,
		saveCase{name: "mixed-formats", spec: hybrid,
			opts: CacheOptions{Format: MustParseFormat("q4:32"), LayerFormats: map[int]Format{0: MustParseFormat("kivi2:32:32"),
				2: MustParseFormat("q8:32")}, PageSize: 32, MaxTokens: 2048, MaxSequences: 8},
			build: forkedHistory(120, 30)},
		saveCase{name: "sink-window", spec: spec,
			opts:  CacheOptions{Format: MustParseFormat("q4:32"), PageSize: 8, MaxTokens: 2048, MaxSequences: 8, Eviction: SinkWindow{Sinks: 4, Window: 24}},
			build: forkedHistory(80, 30),
			check: func(t *testing.T, c *Cache, seqs []*Sequence) {
				assert.Contains(t, seqs[0].tables[0], int32(-1), "no page was released")
			}},
		saveCase{name: "h2o-compacted", spec: spec,
			opts:  CacheOptions{Format: MustParseFormat("q4:32"), PageSize: 8, MaxTokens: 4096, MaxSequences: 8, Eviction: H2O{Budget: 24, Recent: 4}},
			build: forkedHistory(30, 40),
			check: func(t *testing.T, c *Cache, seqs []*Sequence) {
				assert.Positive(t, seqs[0].shift[0], "sequence a was never compacted")
				assert.Positive(t, seqs[0].heads[0][0].nHidden)
			}},
		saveCase{name: "h2o-kivi-hybrid", spec: hybrid,
			opts: CacheOptions{Format: MustParseFormat("kivi4:32:32"), LayerFormats: map[int]Format{2: MustParseFormat("f16")},
				PageSize: 32, MaxTokens: 4096, MaxSequences: 8, Eviction: H2O{Budget: 40, Recent: 8}},
			build: forkedHistory(100, 30)},
		saveCase{name: "snapkv", spec: spec,
			opts: CacheOptions{Format: MustParseFormat("f16"), PageSize: 8, MaxTokens: 4096, MaxSequences: 8,
				Eviction: SnapKV{Budget: 16, Window: 5, Kernel: 3}},
			build: func(r saveRun) []*Sequence {
				seqs := forkedHistory(40, 10)(r)
				// One more sequence saved between its prefill and its decision: its scores travel.
				e, err := r.c.NewSequence()
				require.NoError(r.t, err)
				r.step(StepEntry{Seq: e, NewTokens: 30})
				return append(seqs, e)
			},
			check: func(t *testing.T, c *Cache, seqs []*Sequence) {
				assert.True(t, seqs[0].snapDone)
				assert.False(t, seqs[4].snapDone)
				assert.NotNil(t, seqs[4].heads[0][0].score)
			}},
		saveCase{name: "quest", spec: spec,
			opts:  CacheOptions{Format: MustParseFormat("q4:32"), PageSize: 8, MaxTokens: 4096, MaxSequences: 8, Eviction: Quest{Pages: 2, Recent: 8}},
			build: forkedHistory(70, 12),
			check: func(t *testing.T, c *Cache, seqs []*Sequence) {
				assert.NotNil(t, seqs[0].questRead)
			}},
	)
	return cases
}

// TestSaveLoadRoundTrip: for every format and policy, sequences saved and loaded into another cache (whose
// page ids are taken differently) hold the same state and bytes, attend bit for bit as the originals on the
// next steps (decode and prefill), and keep doing so through forks; the loaded pages shared by forks are
// shared again.
func TestSaveLoadRoundTrip(t *testing.T) {
	e := openTestEngine(t)
	for _, tc := range saveCases() {
		t.Run(tc.name, func(t *testing.T) {
			a, err := e.NewCache(tc.spec, tc.opts)
			require.NoError(t, err)
			defer a.Close()
			seqs := tc.build(saveRun{t: t, c: a, rng: newRand(7)})
			if tc.check != nil {
				tc.check(t, a, seqs)
			}
			path := filepath.Join(t.TempDir(), "cache.safetensors")
			require.NoError(t, a.Save(path, seqs...))

			b, err := e.NewCache(tc.spec, tc.opts)
			require.NoError(t, err)
			defer b.Close()
			filler, err := b.NewSequence()
			require.NoError(t, err)
			saveRun{t: t, c: b, rng: newRand(8)}.step(StepEntry{Seq: filler, NewTokens: 37})
			before := b.Stats()
			loaded, err := b.Load(path)
			require.NoError(t, err)
			require.Len(t, loaded, len(seqs))
			after := b.Stats()
			f, _, err := a.snapshotLocked("test", seqs)
			require.NoError(t, err)
			for gi, g := range f.state.Groups {
				assert.Equal(t, before.Groups[gi].PagesUsed+g.Pages, after.Groups[gi].PagesUsed, "group %d: pages used after Load", gi)
			}
			assert.Equal(t, before.Sequences+len(seqs), after.Sequences)
			for i, s := range loaded {
				assert.Equal(t, seqs[i].Len(), s.Len())
			}
			requireSameState(t, a, seqs, b, loaded)

			rng := newRand(9)
			for step := 0; step < 12; step++ {
				twinStep(t, rng, a, seqs, b, loaded)
				requireSameState(t, a, seqs, b, loaded)
			}
			twinStep(t, rng, a, seqs, b, loaded, 5, 1, 9, 1)
			requireSameState(t, a, seqs, b, loaded)

			// Prefix reuse: the loaded pages are named as the originals are, so a new prompt starting
			// with a's tokens reuses as much in both caches, and continues alike. (Pages the originals
			// released stay cached in a, not saved: a may then reuse more.)
			require.False(t, seqs[0].untracked)
			require.True(t, loaded[2].untracked)
			prompt := append(slices.Clone(seqs[0].tokens[:min(len(seqs[0].tokens), 70)]), 1, 2, 3)
			cached := 0
			for _, g := range a.Stats().Groups {
				cached += g.PagesCached
			}
			na, ma, err := a.NewSequenceFrom(prompt)
			require.NoError(t, err)
			nb, mb, err := b.NewSequenceFrom(prompt)
			require.NoError(t, err)
			if cached == 0 {
				assert.Equal(t, ma, mb, "tokens reused")
				if tc.reuse {
					assert.Positive(t, ma, "nothing reused")
				}
				twinStep(t, rng, a, []*Sequence{na}, b, []*Sequence{nb}, len(prompt)-ma)
				seqs, loaded = append(seqs, na), append(loaded, nb)
				requireSameState(t, a, seqs, b, loaded)
			} else {
				assert.LessOrEqual(t, mb, ma, "tokens reused")
				require.NoError(t, na.Release())
				require.NoError(t, nb.Release())
			}
			fa, err := seqs[1].Fork()
			require.NoError(t, err)
			fb, err := loaded[1].Fork()
			require.NoError(t, err)
			seqs, loaded = append(seqs, fa), append(loaded, fb)
			for step := 0; step < 8; step++ {
				twinStep(t, rng, a, seqs, b, loaded)
			}
			requireSameState(t, a, seqs, b, loaded)
			// Truncation (rolling back speculative tokens) is allowed or refused alike.
			for i := range seqs {
				n := seqs[i].Len() - 2
				ea, eb := seqs[i].Truncate(n), loaded[i].Truncate(n)
				require.Equal(t, ea == nil, eb == nil, "sequence %d: Truncate(%d): %v vs %v", i, n, ea, eb)
			}
			for step := 0; step < 3; step++ {
				twinStep(t, rng, a, seqs, b, loaded)
			}
			requireSameState(t, a, seqs, b, loaded)
			for l := range tc.spec.Layers {
				va, err := seqs[0].VisibleTokens(l)
				require.NoError(t, err)
				vb, err := loaded[0].VisibleTokens(l)
				require.NoError(t, err)
				assert.Equal(t, va, vb, "layer %d", l)
			}

			// Saving the loaded sequences gives the same file as saving the originals did, when both
			// are at the same point: save both again and compare.
			pa, pb := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
			require.NoError(t, a.Save(pa, seqs...))
			require.NoError(t, b.Save(pb, loaded...))
			ba, err := os.ReadFile(pa)
			require.NoError(t, err)
			bb, err := os.ReadFile(pb)
			require.NoError(t, err)
			assert.True(t, string(ba) == string(bb), "the two files differ")

			// Release everything loaded: the cache is back to the filler alone.
			for _, s := range loaded {
				require.NoError(t, s.Release())
			}
			assert.Equal(t, 1, b.Stats().Sequences)
			assert.Equal(t, before.PagesUsed, b.Stats().PagesUsed)
		})
	}
}
