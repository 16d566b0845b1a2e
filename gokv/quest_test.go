package gokv

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/bridge"
)

// TestQuestValidation: Quest's settings are checked by NewCache and Plan, and the errors name the field.
func TestQuestValidation(t *testing.T) {
	for _, tc := range []struct {
		q    EvictionPolicy
		want string
	}{
		{Quest{Pages: 0}, "Quest{Pages: 0, Recent: 0}: Pages must be >= 1"},
		{&Quest{Pages: -3, Recent: 2}, "Pages must be >= 1"},
		{Quest{Pages: 2, Recent: -1}, "Quest{Pages: 2, Recent: -1}: Recent must be >= 0"},
	} {
		_, err := Plan(smallSpec(1, 32), PlanOptions{Context: 100, Eviction: tc.q})
		assert.ErrorContains(t, err, tc.want)
		if !t.Failed() && bridge.CgoEnabled {
			e := openTestEngine(t)
			_, err := e.NewCache(smallSpec(1, 32), CacheOptions{MaxTokens: 256, Eviction: tc.q})
			assert.ErrorIs(t, err, ErrInvalid)
			assert.ErrorContains(t, err, tc.want)
		}
	}
	rule, err := resolveEviction((*Quest)(nil))
	require.NoError(t, err)
	assert.Nil(t, rule.quest, "a nil *Quest keeps everything")
}

// TestQuestForcedPages: the sink and recent pages, listed and counted.
func TestQuestForcedPages(t *testing.T) {
	assert.Equal(t, []int{0, 7}, QuestForcedPages(512, 4, 16, 64))
	assert.Equal(t, []int{0, 6, 7}, QuestForcedPages(500, 4, 64, 64))
	assert.Equal(t, []int{0}, QuestForcedPages(40, 4, 16, 64))
	assert.Equal(t, []int{0, 1, 2}, QuestForcedPages(24, 0, 24, 8))
	assert.Nil(t, QuestForcedPages(0, 4, 4, 8))
	for n := 0; n < 300; n += 7 {
		for _, s := range []int{0, 1, 4, 9, 70} {
			for _, r := range []int{0, 1, 8, 16, 33, 400} {
				for _, p := range []int{8, 16, 64} {
					assert.Equal(t, len(QuestForcedPages(n, s, r, p)), questForcedCount(n, s, r, p), "n %d s %d r %d p %d", n, s, r, p)
				}
			}
		}
	}
}

// TestQuestPlan: Quest adds its key bounds to the memory of the full-attention layers only, and a decode
// step reads Pages + the sink and recent pages, plus every page's bounds.
func TestQuestPlan(t *testing.T) {
	spec := smallSpec(2, 32)
	sliding := AttentionLayer(4, 2, 32)
	sliding.Window = 64
	spec.Layers = append(spec.Layers, sliding)
	f := MustParseFormat("q4:32")
	full, err := Plan(spec, PlanOptions{Format: f, Context: 1000, PageSize: 64})
	require.NoError(t, err)
	q, err := Plan(spec, PlanOptions{Format: f, Context: 1000, PageSize: 64, Eviction: Quest{Pages: 4, Recent: 16}})
	require.NoError(t, err)
	lay, err := f.Layout(2, 32, 32, 64, false)
	require.NoError(t, err)
	assert.Equal(t, int64(2*2*32*2), lay.PageBoundsBytes)
	pages := int64(ceilDiv(1000, 64))
	assert.Equal(t, 2*pages*lay.PageBoundsBytes, q.BoundsBytes)
	assert.Equal(t, full.KVBytes+q.BoundsBytes, q.KVBytes)
	assert.Zero(t, q.Layers[2].PageBoundsBytes, "sliding layers keep no bounds")
	// Pages 4 + page 0 (sinks) + page 15 (the last 16 tokens) = 6 pages read of 16.
	assert.Equal(t, 6*lay.PageBytes+pages*lay.PageBoundsBytes, q.Layers[0].DecodeReadBytes)
	assert.Equal(t, 6*64, q.Layers[0].DecodeReadTokens)
	assert.Equal(t, full.Layers[2].DecodeReadBytes, q.Layers[2].DecodeReadBytes)
	assert.Equal(t, 1000, full.Layers[0].DecodeReadTokens)
	assert.Equal(t, 64+spec.SinkTokens, full.Layers[2].DecodeReadTokens)
	h, err := Plan(spec, PlanOptions{Format: f, Context: 1000, PageSize: 64, Eviction: H2O{Budget: 128, Recent: 16}})
	require.NoError(t, err)
	assert.Equal(t, 128, h.Layers[0].DecodeReadTokens)
	assert.Equal(t, full.KVBytes, h.KVBytes)
	sw, err := Plan(spec, PlanOptions{Format: f, Context: 1000, PageSize: 64, Eviction: SinkWindow{Sinks: 4, Window: 32}})
	require.NoError(t, err)
	assert.Equal(t, 36, sw.Layers[0].DecodeReadTokens)
	assert.Less(t, q.DecodeReadBytes, full.DecodeReadBytes)
}

// TestQuestNeedsCap: a device without Quest refuses a Quest cache at NewCache, naming the layer.
func TestQuestNeedsCap(t *testing.T) {
	e := openTestEngine(t)
	c, err := e.NewCache(smallSpec(2, 32), CacheOptions{MaxTokens: 256, Eviction: Quest{Pages: 2}})
	if e.info.Caps.Has(bridge.CapQuest) {
		require.NoError(t, err)
		require.NoError(t, c.Close())
		return
	}
	assert.ErrorIs(t, err, ErrNotSupported)
	assert.ErrorContains(t, err, "layer 0")
	assert.ErrorContains(t, err, "Quest")
}

// questTestCache opens a Quest cache on the CPU backend, skipping while it has no Quest kernels.
func questTestCache(t *testing.T, spec ModelSpec, opts CacheOptions) *tcache {
	e := openTestEngine(t)
	if !e.info.Caps.Has(bridge.CapQuest) {
		t.Skip("the CPU backend has no Quest kernels yet")
	}
	return newTCache(t, e, spec, opts, 91)
}

// TestQuestMatchesReference: attention through a Quest cache equals the float64 reference over exactly
// the pages the kernels chose (Step.QuestSelected) plus the sink and recent pages, per kv head; prefill
// steps attend in full; the sink and recent pages are never among the chosen ones; Pages read is what
// Sequence.QuestPagesRead reports.
func TestQuestMatchesReference(t *testing.T) {
	spec := smallSpec(2, 32)
	for _, tc := range []struct {
		name   string
		format Format
		quest  Quest
		page   int
	}{
		{"f32", Format{Kind: F32}, Quest{Pages: 2, Recent: 8}, 8},
		{"q8", Format{Kind: Q8, Group: 32}, Quest{Pages: 3, Recent: 0}, 8},
		{"q4", Format{Kind: Q4, Group: 32}, Quest{Pages: 1, Recent: 12}, 16},
		{"kivi4", Format{Kind: KIVI4, Group: 32, Residual: 32}, Quest{Pages: 1, Recent: 4}, 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := questTestCache(t, spec, CacheOptions{Format: tc.format, PageSize: tc.page, MaxTokens: 4096, MaxSequences: 4,
				Eviction: tc.quest})
			a, b := h.newSeq(), h.newSeq()
			h.run(uniform(tolFor(tc.format)), prefill(a, 70), prefill(b, 45)) // prefill: full attention
			for step := 0; step < 30; step++ {
				h.questRun(tc.quest, decode(a), decode(b))
			}
			c := h.fork(a)
			for step := 0; step < 5; step++ {
				h.questRun(tc.quest, decode(a), decode(c))
			}
		})
	}
}

// TestQuestAllPagesIsFull: with Pages at least the number of pages, a Quest decode equals full attention.
func TestQuestAllPagesIsFull(t *testing.T) {
	spec := smallSpec(1, 32)
	h := questTestCache(t, spec, CacheOptions{Format: Format{Kind: F32}, PageSize: 8, MaxTokens: 1024, MaxSequences: 2,
		Eviction: Quest{Pages: 64, Recent: 4}})
	s := h.newSeq()
	h.run(uniform(tol{deq: 1e-6, orig: 1e-5}), prefill(s, 100))
	for step := 0; step < 10; step++ {
		h.run(uniform(tol{deq: 1e-6, orig: 1e-5}), decode(s))
	}
}

// questRun is tcache.run for a Quest cache's step: each decode entry's output is checked against the
// float64 reference over the pages the kernels chose plus the sink and recent pages (and a KIVI ring),
// each prefill entry's rows against full causal attention.
func (h *tcache) questRun(q Quest, entries ...StepEntry) {
	h.t.Helper()
	t := h.t
	st, err := h.c.Begin(entries...)
	require.NoError(t, err)
	d := h.gen(st.rows)
	for l := range h.spec.Layers {
		require.NoError(t, st.Layer(l, d.q[l], d.k[l], d.v[l], d.out[l]), "layer %d", l)
	}
	P := h.c.pageSize
	reads := make([][][]int, len(st.seqs))
	for l, ls := range h.spec.Layers {
		cl := h.c.layers[l]
		g := ls.HeadsQ / ls.HeadsKV
		sel := st.QuestSelected(l)
		require.Len(t, sel, len(st.seqs)*ls.HeadsKV*q.Pages, "layer %d: QuestSelected", l)
		for i, s := range st.seqs {
			dk, dv := h.deqRead(st, l, i)
			n := int(st.kvLen[i])
			row := int(st.tokIndptr[i])
			if st.newTokens[i] > 1 { // prefill: full causal attention, nothing selected
				for j := 0; j < st.newTokens[i]; j++ {
					p := int(st.startPos[i]) + j
					qrow := d.q[l][(row+j)*ls.HeadsQ*ls.HeadDimK : (row+j+1)*ls.HeadsQ*ls.HeadDimK]
					got := d.out[l][(row+j)*ls.HeadsQ*ls.HeadDimV : (row+j+1)*ls.HeadsQ*ls.HeadDimV]
					want := refAttend(ls, qrow, dk, dv, p, func(tok int) bool { return tok <= p }, float64(cl.scale), cl.sinks)
					assertClose(t, want, got, 1e-3, "layer %d seq %d pos %d (prefill in full)", l, s.ID(), p)
				}
				for _, j := range sel[i*ls.HeadsKV*q.Pages : (i+1)*ls.HeadsKV*q.Pages] {
					assert.Equal(t, int32(-1), j, "a prefill entry selects nothing")
				}
				continue
			}
			p := n - 1
			pages := ceilDiv(n, P)
			forced := QuestForcedPages(n, h.spec.SinkTokens, q.Recent, P)
			qrow := d.q[l][row*ls.HeadsQ*ls.HeadDimK : (row+1)*ls.HeadsQ*ls.HeadDimK]
			got := d.out[l][row*ls.HeadsQ*ls.HeadDimV : (row+1)*ls.HeadsQ*ls.HeadDimV]
			want := make([]float64, ls.HeadsQ*ls.HeadDimV)
			var read []int
			for kh := 0; kh < ls.HeadsKV; kh++ {
				chosen := sel[(i*ls.HeadsKV+kh)*q.Pages : (i*ls.HeadsKV+kh+1)*q.Pages]
				readPage := make([]bool, pages)
				for _, j := range forced {
					readPage[j] = true
				}
				count := len(forced)
				prev := int32(-1)
				for _, j := range chosen {
					if j < 0 {
						continue
					}
					require.Less(t, int(j), pages, "layer %d seq %d kv head %d: chosen page out of the table", l, s.ID(), kh)
					require.Greater(t, j, prev, "chosen pages ascending and distinct")
					require.False(t, slices.Contains(forced, int(j)), "layer %d kv head %d: a sink or recent page %d among the chosen", l, kh, j)
					prev = j
					readPage[j] = true
					count++
				}
				if !cl.format.Kind.IsKIVI() { // KIVI: pages still wholly in the ring may not compete
					assert.Equal(t, min(pages, q.Pages+len(forced)), count, "layer %d seq %d kv head %d: pages read", l, s.ID(), kh)
				}
				read = append(read, count)
				ring := cl.format.QuantizedTokens(n) // KIVI: the residual ring's tokens are read besides
				vis := func(tok int) bool { return tok <= p && (readPage[tok/P] || tok >= ring) }
				o := refAttend(ls, qrow, dk, dv, p, vis, float64(cl.scale), cl.sinks)
				copy(want[kh*g*ls.HeadDimV:(kh+1)*g*ls.HeadDimV], o[kh*g*ls.HeadDimV:(kh+1)*g*ls.HeadDimV])
			}
			assertClose(t, want, got, 1e-3, "layer %d seq %d pos %d (the pages Quest read)", l, s.ID(), p)
			if reads[i] == nil {
				reads[i] = make([][]int, len(h.spec.Layers))
			}
			reads[i][l] = read
		}
	}
	for i, e := range entries {
		for j := 0; j < e.NewTokens; j++ {
			r := int(st.tokIndptr[i]) + j
			for l, ls := range h.spec.Layers {
				kr, vr := ls.HeadsKV*ls.HeadDimK, ls.HeadsKV*ls.HeadDimV
				h.hist[e.Seq].k[l] = append(h.hist[e.Seq].k[l], d.k[l][r*kr:(r+1)*kr])
				h.hist[e.Seq].v[l] = append(h.hist[e.Seq].v[l], d.v[l][r*vr:(r+1)*vr])
			}
		}
	}
	require.NoError(t, st.Commit())
	for i, e := range entries {
		if e.NewTokens != 1 {
			continue
		}
		for l := range h.spec.Layers {
			got, err := e.Seq.QuestPagesRead(l)
			require.NoError(t, err)
			assert.Equal(t, reads[i][l], got, "layer %d: QuestPagesRead", l)
		}
	}
}

// TestQuestMixedStep: a step mixing decode and prefill entries reads under Quest in the decode entries
// and attends in full in the prefill ones (two native calls per Quest layer), in any order of entries.
func TestQuestMixedStep(t *testing.T) {
	spec := smallSpec(2, 32)
	for _, f := range []Format{{Kind: F16}, {Kind: KIVI2, Group: 32, Residual: 32}} {
		t.Run(f.String(), func(t *testing.T) {
			q := Quest{Pages: 1, Recent: 4}
			page := 8
			if f.Kind.IsKIVI() {
				page = 32
			}
			h := questTestCache(t, spec, CacheOptions{Format: f, PageSize: page, MaxTokens: 4096, MaxSequences: 4, Eviction: q})
			a, b, c := h.newSeq(), h.newSeq(), h.newSeq()
			h.run(uniform(tolFor(f)), prefill(a, 90), prefill(b, 50))
			h.questRun(q, decode(a), prefill(c, 20), decode(b))
			h.questRun(q, prefill(c, 7), decode(a))
			for step := 0; step < 5; step++ {
				h.questRun(q, decode(a), decode(b), decode(c))
			}
		})
	}
}

// TestQuestPlanEqualsStats: with Quest, the planner's KV bytes (bounds included) equal Cache.Stats.
func TestQuestPlanEqualsStats(t *testing.T) {
	e := openTestEngine(t)
	if !e.info.Caps.Has(bridge.CapQuest) {
		t.Skip("the CPU backend has no Quest kernels yet")
	}
	spec := smallSpec(2, 32)
	for _, name := range []string{"f16", "q4", "kivi2:32:32"} {
		f := MustParseFormat(name)
		for _, n := range []int{1, 70, 200} {
			c, err := e.NewCache(spec, CacheOptions{Format: f, PageSize: 32, MaxTokens: 256, MaxSequences: 1, Eviction: Quest{Pages: 2}})
			require.NoError(t, err)
			s := mustSeq(t, c)
			st, err := c.Begin(prefill(s, n))
			require.NoError(t, err)
			rng := newRand(uint64(n))
			for l := range spec.Layers {
				require.NoError(t, st.Layer(l, nil, randVec(rng, n*2*32, 1), randVec(rng, n*2*32, 1), nil))
			}
			require.NoError(t, st.Commit())
			plan, err := Plan(spec, PlanOptions{Format: f, Context: n, Sequences: 1, PageSize: 32, Eviction: Quest{Pages: 2}})
			require.NoError(t, err)
			assert.Positive(t, plan.BoundsBytes)
			assert.Equal(t, uint64(plan.KVBytes), c.Stats().BytesUsed, "%s, %d tokens", name, n)
			require.NoError(t, c.Close())
		}
	}
}
