package gokv

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/bridge"
)

// The cache side of H2O and SnapKV. The bookkeeping tests (budgets, forks, pages, KIVI) drive steps that
// only store tokens (Step.Layer with q and out nil: no kernel runs) and hand the cache the mass an attend
// call would have written, so they run whether or not the backend computes mass yet; the device is told
// it can (the caps only gate NewCache). TestTokenAttentionMatchesReference runs the kernels.

// tokenTestCache creates a cache under policy on the CPU backend, pretending the device has the mass and
// per-kv-head mask capabilities when it does not (write-only steps never call the kernels). Compaction is
// off: these tests watch hidden positions and page releases; compact_test.go turns it on.
func tokenTestCache(t *testing.T, spec ModelSpec, opts CacheOptions) *Cache {
	t.Helper()
	c := compactingTestCache(t, spec, opts)
	c.noCompact = true
	return c
}

// compactingTestCache is tokenTestCache with compaction on.
func compactingTestCache(t *testing.T, spec ModelSpec, opts CacheOptions) *Cache {
	t.Helper()
	e := openTestEngine(t)
	e.info.Caps |= bridge.CapMass | bridge.CapKVHeadMasks
	c, err := e.NewCache(spec, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// massFunc is the attention mass a test feeds for entry i, layer l, kv head h and token tok.
type massFunc func(i, l, h, tok int) float32

// massStep runs one step that stores random tokens in every layer and gives the cache mass(...) as each
// token layer's mass output, then commits.
func massStep(t *testing.T, c *Cache, mass massFunc, entries ...StepEntry) {
	t.Helper()
	st, err := c.Begin(entries...)
	require.NoError(t, err)
	rng := newRand(uint64(st.rows))
	for l, ls := range c.spec.Layers {
		k := randVec(rng, st.rows*ls.HeadsKV*ls.HeadDimK, 1)
		v := randVec(rng, st.rows*ls.HeadsKV*ls.HeadDimV, 1)
		require.NoError(t, st.Layer(l, nil, k, v, nil))
		if c.tokenLayer(l) && st.massRows >= 0 {
			var m []float32
			for i := range st.seqs {
				for h := 0; h < ls.HeadsKV; h++ {
					for tok := 0; tok < int(st.groups[c.layers[l].group.index].kvLen[i]); tok++ {
						m = append(m, mass(i, l, h, tok))
					}
				}
			}
			st.mass[l] = m
		}
	}
	require.NoError(t, st.Commit())
}

// hiddenSnapshot copies a sequence's hidden sets [layer][kv head].
func hiddenSnapshot(c *Cache, s *Sequence) [][]tokenBits {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([][]tokenBits, len(s.heads))
	for l := range s.heads {
		for h := range s.heads[l] {
			out[l] = append(out[l], slices.Clone(s.heads[l][h].hidden))
		}
	}
	return out
}

// checkTokenInvariants: per (layer, kv head) of s, the sinks and the protected newest tokens are visible
// and at most budget tokens are; a page is released from s's table exactly when it is full, stored and
// hidden from every kv head of every layer of its group; the group's used pages are those some sequence
// holds.
func checkTokenInvariants(t *testing.T, c *Cache, budget int, seqs ...*Sequence) {
	t.Helper()
	r := c.tokens
	for _, s := range seqs {
		for l := range c.layers {
			vis, err := s.VisibleTokens(l)
			require.NoError(t, err)
			c.mu.Lock()
			n := s.slots(c.layers[l].group.index)
			for h, hs := range s.heads[l] {
				assert.LessOrEqual(t, vis[h], budget, "seq %d layer %d head %d", s.id, l, h)
				if r.kind == ruleH2O {
					assert.Equal(t, min(n, r.budget), vis[h], "seq %d layer %d head %d: H2O keeps exactly its budget", s.id, l, h)
				}
				for tok := 0; tok < n; tok++ {
					if tok < c.spec.SinkTokens || (r.kind == ruleH2O && tok >= n-r.protect) {
						require.False(t, hs.hidden.has(tok), "seq %d layer %d head %d hid protected token %d of %d", s.id, l, h, tok, n)
					}
				}
			}
			c.mu.Unlock()
		}
		c.mu.Lock()
		for gi, g := range c.groups {
			limit := g.quantLimit(s.slots(gi))
			for j, id := range s.tables[gi] {
				full := (j+1)*c.pageSize <= limit
				assert.Equal(t, full && c.pageHiddenLocked(s, g, j), id < 0, "seq %d group %d page %d", s.id, gi, j)
			}
		}
		c.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for gi, g := range c.groups {
		held := map[int32]bool{}
		for _, s := range c.seqs {
			for _, id := range s.tables[gi] {
				if id >= 0 {
					held[id] = true
				}
			}
		}
		assert.Equal(t, len(held), g.pages-len(g.free), "group %d: pages in use", gi)
	}
}

// TestH2OBudgetPerSequenceAndKVHead: under random mass, every (sequence, layer, kv head) keeps exactly
// its budget (sinks and recent included), kv heads decide differently, and pages go as soon as no head
// sees them.
func TestH2OBudgetPerSequenceAndKVHead(t *testing.T) {
	spec := smallSpec(2, 32)
	c := tokenTestCache(t, spec, CacheOptions{Format: Format{Kind: F16}, PageSize: 8, MaxTokens: 2048, MaxSequences: 4,
		Eviction: H2O{Budget: 24, Recent: 8}})
	rng := newRand(5)
	a, err := c.NewSequence()
	require.NoError(t, err)
	b, err := c.NewSequence()
	require.NoError(t, err)
	random := func(i, l, h, tok int) float32 { return float32(rng.Float64()) }
	massStep(t, c, random, prefill(a, 20), prefill(b, 37))
	checkTokenInvariants(t, c, 24, a, b)
	released := 0
	for step := 0; step < 70; step++ {
		massStep(t, c, random, decode(a), decode(b))
		checkTokenInvariants(t, c, 24, a, b)
	}
	for _, s := range []*Sequence{a, b} {
		for _, id := range s.tables[0] {
			if id < 0 {
				released++
			}
		}
	}
	assert.Greater(t, released, 0, "pages no head sees are released")
	snap := hiddenSnapshot(c, a)
	assert.NotEqual(t, snap[0][0], snap[0][1], "kv heads decide on their own")
	assert.NotEqual(t, snap[0][0], snap[1][0], "layers decide on their own")
}

// TestTokenForksDecideOnTheirOwn: a fork starts with its parent's visibility, then each decides from its
// own mass; the child's steps leave the parent's decisions alone.
func TestTokenForksDecideOnTheirOwn(t *testing.T) {
	for _, policy := range []EvictionPolicy{H2O{Budget: 20, Recent: 4}, SnapKV{Budget: 20, Window: 4}} {
		c := tokenTestCache(t, smallSpec(2, 32), CacheOptions{Format: Format{Kind: F16}, PageSize: 8, MaxTokens: 2048,
			MaxSequences: 4, Eviction: policy})
		p, err := c.NewSequence()
		require.NoError(t, err)
		early := func(i, l, h, tok int) float32 { return float32(100 - tok) } // older tokens are heavier
		late := func(i, l, h, tok int) float32 { return float32(tok) }
		massStep(t, c, early, prefill(p, 40))
		child, err := p.Fork()
		require.NoError(t, err)
		assert.Equal(t, hiddenSnapshot(c, p), hiddenSnapshot(c, child), "%T: a fork copies its parent's visibility", policy)
		massStep(t, c, late, prefill(child, 10)) // SnapKV: the child's prefill goes on, the parent's is over
		parentBefore := hiddenSnapshot(c, p)
		for range 6 {
			massStep(t, c, late, decode(child))
		}
		assert.Equal(t, parentBefore, hiddenSnapshot(c, p), "%T: the child's steps changed the parent", policy)
		massStep(t, c, early, decode(p))
		ps, cs := hiddenSnapshot(c, p), hiddenSnapshot(c, child)
		assert.NotEqual(t, ps, cs, "%T: different mass, different decisions", policy)
		if _, ok := policy.(H2O); ok {
			assert.True(t, ps[0][0].has(35) && !ps[0][0].has(5), "the parent keeps its early heavy hitters")
			assert.True(t, cs[0][0].has(5) || cs[0][0].has(6), "the child, fed late mass, drops early tokens")
		}
		checkTokenInvariants(t, c, 20+7, p, child)
	}
}

// TestTokenPagesFreedWhenAllHoldersHide: a page shared by a parent and its fork is released from each
// sequence's table when all kv heads of all layers of that sequence hid its tokens, and freed only when
// both did.
func TestTokenPagesFreedWhenAllHoldersHide(t *testing.T) {
	spec := smallSpec(2, 32)
	c := tokenTestCache(t, spec, CacheOptions{Format: Format{Kind: F16}, PageSize: 8, MaxTokens: 1024, MaxSequences: 4,
		Eviction: H2O{Budget: 12, Recent: 4}})
	g := c.groups[0]
	p, err := c.NewSequence()
	require.NoError(t, err)
	massStep(t, c, func(i, l, h, tok int) float32 { return 1 }, prefill(p, 8)) // page 0: sinks and 4 more
	massStep(t, c, func(i, l, h, tok int) float32 { return 1 }, prefill(p, 4))
	child, err := p.Fork()
	require.NoError(t, err)
	// Both grow to 24 tokens (pages 0..2); page 1 (tokens 8..15) is light everywhere for the parent, and
	// heavy in layer 1, kv head 1 for the child.
	pageOne := func(tok int) bool { return tok >= 8 && tok < 16 }
	parentMass := func(i, l, h, tok int) float32 {
		if pageOne(tok) {
			return 0
		}
		return 1
	}
	childMass := func(i, l, h, tok int) float32 {
		switch {
		case pageOne(tok) && l == 1 && h == 1:
			return 10
		case pageOne(tok):
			return 0
		}
		return 1 + float32(tok)/100
	}
	massStep(t, c, parentMass, prefill(p, 12))
	massStep(t, c, childMass, prefill(child, 12))
	c.mu.Lock()
	shared := p.tables[0][1]
	require.Less(t, shared, int32(0), "the parent hid page 1 in every head: released from its table")
	id := child.tables[0][1]
	require.GreaterOrEqual(t, id, int32(0), "layer 1, kv head 1 of the child still sees page 1")
	assert.Equal(t, int32(1), g.refs[id], "the child alone holds page 1 now")
	assert.NotContains(t, g.free, id)
	c.mu.Unlock()
	checkTokenInvariants(t, c, 12, p, child)

	used := pagesUsed(c, 0)
	// Now page 1 turns light for the child's last head too: everything else gets far more mass, and H2O
	// hides one token per decode step.
	for range 6 {
		massStep(t, c, func(i, l, h, tok int) float32 {
			if pageOne(tok) {
				return 0
			}
			return 100
		}, decode(child))
	}
	c.mu.Lock()
	assert.Less(t, child.tables[0][1], int32(0), "no head of the child sees page 1: released")
	assert.Contains(t, g.free, id, "no holder sees page 1: freed")
	c.mu.Unlock()
	assert.LessOrEqual(t, pagesUsed(c, 0), used, "page 1 went back to the free list")
	checkTokenInvariants(t, c, 12, p, child)
	require.NoError(t, p.Release())
	require.NoError(t, child.Release())
	assert.Equal(t, 0, pagesUsed(c, 0))
}

// TestTokenKIVIRing: tokens still in a KIVI residual ring may be hidden, but their page is released only
// once the ring has flushed them into it.
func TestTokenKIVIRing(t *testing.T) {
	kivi := Format{Kind: KIVI2, Group: 32, Residual: 32}
	c := tokenTestCache(t, smallSpec(1, 32), CacheOptions{Format: kivi, PageSize: 32, MaxTokens: 4096, MaxSequences: 2,
		Eviction: H2O{Budget: 38, Recent: 4}})
	s, err := c.NewSequence()
	require.NoError(t, err)
	inPageOne := func(tok int) bool { return tok >= 32 && tok < 64 }
	mass := func(i, l, h, tok int) float32 {
		if inPageOne(tok) {
			return 0
		}
		return 1 + float32(tok)
	}
	massStep(t, c, mass, prefill(s, 70)) // quantized: (70-32)/32*32 = 32 tokens
	snap := hiddenSnapshot(c, s)
	for tok := 32; tok < 64; tok++ {
		require.True(t, snap[0][0].has(tok), "token %d", tok)
	}
	c.mu.Lock()
	assert.GreaterOrEqual(t, s.tables[0][1], int32(0), "page 1 is hidden but its tokens are still in the ring: kept")
	c.mu.Unlock()
	checkTokenInvariants(t, c, 38, s)
	for s.Len() < 96 {
		massStep(t, c, mass, decode(s))
		checkTokenInvariants(t, c, 38, s)
	}
	c.mu.Lock()
	assert.Less(t, s.tables[0][1], int32(0), "the ring flushed page 1: released")
	c.mu.Unlock()
}

// TestTokenTruncate: Truncate keeps the kept tokens' decisions, refuses to resume into a released page or
// (H2O) a recent window with hidden tokens.
func TestTokenTruncate(t *testing.T) {
	c := tokenTestCache(t, smallSpec(1, 32), CacheOptions{Format: Format{Kind: F16}, PageSize: 8, MaxTokens: 1024,
		MaxSequences: 2, Eviction: H2O{Budget: 12, Recent: 4}})
	s, err := c.NewSequence()
	require.NoError(t, err)
	light := func(i, l, h, tok int) float32 {
		if tok >= 8 && tok < 16 {
			return 0
		}
		return 1
	}
	massStep(t, c, light, prefill(s, 30))
	// Hidden: tokens 8..15 (page 1, released) and 10 more of the lightest.
	err = s.Truncate(12)
	assert.ErrorIs(t, err, ErrNotSupported)
	assert.ErrorContains(t, err, "released page 1")
	err = s.Truncate(17)
	assert.ErrorIs(t, err, ErrNotSupported)
	assert.ErrorContains(t, err, "recent window")
	// Hidden: 4..21 (page 1 released); visible: the sinks and 22..29.
	before := hiddenSnapshot(c, s)
	require.NoError(t, s.Truncate(30))
	require.NoError(t, s.Truncate(26))
	after := hiddenSnapshot(c, s)
	for tok := 0; tok < 26; tok++ {
		assert.Equal(t, before[0][0].has(tok), after[0][0].has(tok), "token %d", tok)
	}
	vis, err := s.VisibleTokens(0)
	require.NoError(t, err)
	assert.Equal(t, []int{8, 8}, vis)
	massStep(t, c, light, decode(s))
	vis, err = s.VisibleTokens(0)
	require.NoError(t, err)
	assert.Equal(t, []int{9, 9}, vis)
}

// TestTokenPolicyNeedsCaps: NewCache refuses H2O and SnapKV on a device without mass output and
// per-kv-head masks, and checks the budget against the model's sinks.
func TestTokenPolicyNeedsCaps(t *testing.T) {
	e := openTestEngine(t)
	spec := smallSpec(1, 32)
	if !e.info.Caps.Has(bridge.CapMass | bridge.CapKVHeadMasks) {
		_, err := e.NewCache(spec, CacheOptions{MaxTokens: 256, Eviction: H2O{Budget: 64, Recent: 8}})
		assert.ErrorIs(t, err, ErrNotSupported)
		assert.ErrorContains(t, err, "H2O and SnapKV eviction")
	}
	e.info.Caps |= bridge.CapMass | bridge.CapKVHeadMasks
	_, err := e.NewCache(spec, CacheOptions{MaxTokens: 256, Eviction: &H2O{Budget: 10, Recent: 8}})
	assert.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, "Budget 10 must be >= Recent 8 + the model's 4 sink tokens")
	_, err = e.NewCache(spec, CacheOptions{MaxTokens: 256, Eviction: SnapKV{Budget: 8, Window: 8}})
	assert.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, "SnapKV{Budget: 8, Window: 8, Kernel: 0}: Budget must be > Window")
}

// TestTokenAttentionMatchesReference: with the kernels, attention through an H2O or SnapKV cache equals
// the float64 reference over exactly the tokens each kv head keeps, and the mass the cache ranks by
// equals the reference's softmax mass.
func TestTokenAttentionMatchesReference(t *testing.T) {
	e := openTestEngine(t)
	if !e.info.Caps.Has(bridge.CapMass | bridge.CapKVHeadMasks) {
		t.Skip("the CPU backend does not compute attention mass and per-kv-head masks yet")
	}
	spec := smallSpec(2, 32)
	for _, tc := range []struct {
		name   string
		policy EvictionPolicy
		format Format
	}{
		{"h2o-f32", H2O{Budget: 20, Recent: 6}, Format{Kind: F32}},
		{"h2o-q8", H2O{Budget: 20, Recent: 6}, Format{Kind: Q8, Group: 32}},
		{"h2o-kivi4", H2O{Budget: 40, Recent: 6}, Format{Kind: KIVI4, Group: 32, Residual: 32}},
		{"snapkv-f32", SnapKV{Budget: 16, Window: 5}, Format{Kind: F32}},
		{"snapkv-f16-avg", SnapKV{Budget: 16, Window: 5, Kernel: 3, AvgPool: true}, Format{Kind: F16}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			page := 8
			if tc.format.Kind.IsKIVI() {
				page = 32
			}
			h := newTCache(t, e, spec, CacheOptions{Format: tc.format, PageSize: page, MaxTokens: 4096, MaxSequences: 4,
				Eviction: tc.policy}, 77)
			a, b := h.newSeq(), h.newSeq()
			h.tokenRun(prefill(a, 30), prefill(b, 45))
			for step := 0; step < 50; step++ {
				h.tokenRun(decode(a), decode(b))
			}
			checkTokenInvariants(t, h.c, math.MaxInt, a, b)
			c := h.fork(a)
			for step := 0; step < 10; step++ {
				h.tokenRun(decode(a), decode(c))
			}
		})
	}
}

// tokenRun is tcache.run for a token-rule cache: every layer's output is checked against the float64
// reference over the dequantized cache with each kv head's own visible tokens (taken after Begin, which
// makes SnapKV's decisions), and H2O's mass against the reference mass.
func (h *tcache) tokenRun(entries ...StepEntry) {
	h.t.Helper()
	t := h.t
	st, err := h.c.Begin(entries...)
	require.NoError(t, err)
	hidden := map[*Sequence][][]tokenBits{}
	for _, s := range st.seqs {
		hidden[s] = hiddenSnapshot(h.c, s)
	}
	d := h.gen(st.rows)
	for l := range h.spec.Layers {
		require.NoError(t, st.Layer(l, d.q[l], d.k[l], d.v[l], d.out[l]), "layer %d", l)
	}
	for l, ls := range h.spec.Layers {
		cl := h.c.layers[l]
		g := ls.HeadsQ / ls.HeadsKV
		row := 0
		sg := st.groups[cl.group.index]
		for i, s := range st.seqs {
			dk, dv := h.deqRead(st, l, i)
			h.checkCompactedRows(s, l, dk, dv)
			n := int(sg.kvLen[i])
			massRef := make([]float64, ls.HeadsKV*n)
			first := st.newTokens[i] - st.newTokens[i]
			if st.massRows > 0 {
				first = max(0, st.newTokens[i]-st.massRows)
			}
			for j := 0; j < st.newTokens[i]; j++ {
				p := int(sg.startPos[i]) + j // slots: a compacted group's kernels see no positions
				q := d.q[l][(row+j)*ls.HeadsQ*ls.HeadDimK : (row+j+1)*ls.HeadsQ*ls.HeadDimK]
				got := d.out[l][(row+j)*ls.HeadsQ*ls.HeadDimV : (row+j+1)*ls.HeadsQ*ls.HeadDimV]
				want := make([]float64, ls.HeadsQ*ls.HeadDimV)
				for kh := 0; kh < ls.HeadsKV; kh++ {
					vis := func(tok int) bool { return tok <= p && !hidden[s][l][kh].has(tok) }
					o := refAttend(ls, q, dk, dv, p, vis, float64(cl.scale), cl.sinks)
					copy(want[kh*g*ls.HeadDimV:(kh+1)*g*ls.HeadDimV], o[kh*g*ls.HeadDimV:(kh+1)*g*ls.HeadDimV])
					if j >= first {
						refMassAdd(ls, q, dk, p, vis, float64(cl.scale), cl.sinks, kh, massRef[kh*n:(kh+1)*n])
					}
				}
				assertClose(t, want, got, 1e-3, "layer %d seq %d pos %d (kv heads' own tokens)", l, s.ID(), p)
			}
			if st.massRows >= 0 && st.mass[l] != nil {
				for kh := 0; kh < ls.HeadsKV; kh++ {
					assertClose(t, massRef[kh*n:(kh+1)*n], st.massOf(l, ls.HeadsKV, i, kh), 1e-3,
						"layer %d seq %d kv head %d: mass", l, s.ID(), kh)
				}
			}
			row += st.newTokens[i]
		}
	}
	row := 0
	for _, e := range entries {
		for j := 0; j < e.NewTokens; j++ {
			for l, ls := range h.spec.Layers {
				kr, vr := ls.HeadsKV*ls.HeadDimK, ls.HeadsKV*ls.HeadDimV
				h.hist[e.Seq].k[l] = append(h.hist[e.Seq].k[l], d.k[l][(row+j)*kr:(row+j+1)*kr])
				h.hist[e.Seq].v[l] = append(h.hist[e.Seq].v[l], d.v[l][(row+j)*vr:(row+j+1)*vr])
			}
		}
		row += e.NewTokens
	}
	require.NoError(t, st.Commit())
}

// refMassAdd adds one query row's softmax mass over the tokens kv head kh sees (Σ over its query heads,
// learned sink in the denominator) to acc [tokens].
func refMassAdd(l LayerSpec, q, k []float32, p int, vis func(int) bool, scale float64, sinks []float32, kh int, acc []float64) {
	dk, hkv, g := l.HeadDimK, l.HeadsKV, l.HeadsQ/l.HeadsKV
	for hq := kh * g; hq < (kh+1)*g; hq++ {
		qh := q[hq*dk : (hq+1)*dk]
		var ts []int
		var ss []float64
		m := math.Inf(-1)
		for t := 0; t <= p && t < len(acc); t++ {
			if !vis(t) {
				continue
			}
			kt := k[(t*hkv+kh)*dk : (t*hkv+kh+1)*dk]
			s := 0.0
			for c := range qh {
				s += float64(qh[c]) * float64(kt[c])
			}
			ts, ss, m = append(ts, t), append(ss, s*scale), math.Max(m, s*scale)
		}
		if len(ts) == 0 {
			continue
		}
		if sinks != nil {
			m = math.Max(m, float64(sinks[hq]))
		}
		den := 0.0
		for _, s := range ss {
			den += math.Exp(s - m)
		}
		if sinks != nil {
			den += math.Exp(float64(sinks[hq]) - m)
		}
		for i, t := range ts {
			acc[t] += math.Exp(ss[i]-m) / den
		}
	}
}

// TestTokenRequestsOnlyWhatItNeeds: Full and SinkWindow caches pass no masks and request no mass; H2O
// requests mass on every step and passes masks once a token is hidden; SnapKV requests the observation
// window's mass during the prefill only.
func TestTokenRequestsOnlyWhatItNeeds(t *testing.T) {
	spec := smallSpec(1, 32)
	begin := func(c *Cache, e StepEntry) *Step {
		st, err := c.Begin(e)
		require.NoError(t, err)
		require.NoError(t, st.Abort())
		return st
	}
	for _, policy := range []EvictionPolicy{nil, SinkWindow{Sinks: 4, Window: 8}} {
		c := tokenTestCache(t, spec, CacheOptions{Format: Format{Kind: F16}, PageSize: 8, MaxTokens: 512, Eviction: policy})
		s, err := c.NewSequence()
		require.NoError(t, err)
		massStep(t, c, nil, prefill(s, 30))
		st := begin(c, decode(s))
		assert.Equal(t, -1, st.massRows, "%#v", policy)
		assert.Nil(t, st.masks, "%#v", policy)
	}
	one := func(i, l, h, tok int) float32 { return 1 }
	c := tokenTestCache(t, spec, CacheOptions{Format: Format{Kind: F16}, PageSize: 8, MaxTokens: 512, Eviction: H2O{Budget: 20, Recent: 4}})
	s, err := c.NewSequence()
	require.NoError(t, err)
	massStep(t, c, one, prefill(s, 12))
	st := begin(c, decode(s))
	assert.Equal(t, 0, st.massRows, "H2O: every row's mass")
	assert.Nil(t, st.masks[0], "H2O: nothing hidden yet, no mask")
	massStep(t, c, one, prefill(s, 12))
	st = begin(c, decode(s))
	require.NotNil(t, st.masks[0], "H2O: tokens hidden, one mask per kv head")
	assert.Len(t, st.masks[0], 2*1) // 2 kv heads x ceil(25/32) words
	assert.Equal(t, bridge.AttendMaskPerKVHead, func() bridge.AttendFlags {
		var a bridge.AttendBatch
		st.attendTokens(0, &a)
		return a.Flags
	}())

	c = tokenTestCache(t, spec, CacheOptions{Format: Format{Kind: F16}, PageSize: 8, MaxTokens: 512, Eviction: SnapKV{Budget: 16, Window: 6}})
	s, err = c.NewSequence()
	require.NoError(t, err)
	st = begin(c, prefill(s, 30))
	assert.Equal(t, 6, st.massRows, "SnapKV: the observation window's rows")
	massStep(t, c, one, prefill(s, 30))
	st = begin(c, decode(s))
	assert.Equal(t, -1, st.massRows, "SnapKV: no mass once the prefill is over")
	assert.NotNil(t, st.masks[0], "SnapKV decided at the first decode step")
}

// TestTokenHybridModel: in a model mixing full-attention and sliding-window layers, H2O governs the
// full-attention layers only; the sliding layers keep their window (and their own page group).
func TestTokenHybridModel(t *testing.T) {
	spec := smallSpec(2, 32)
	spec.Layers[1].Window = 16
	c := tokenTestCache(t, spec, CacheOptions{Format: Format{Kind: F16}, PageSize: 8, MaxTokens: 1024, MaxSequences: 2,
		Eviction: H2O{Budget: 20, Recent: 4}})
	require.Len(t, c.groups, 2)
	s, err := c.NewSequence()
	require.NoError(t, err)
	rng := newRand(9)
	random := func(i, l, h, tok int) float32 { return float32(rng.Float64()) }
	massStep(t, c, random, prefill(s, 40))
	for range 10 {
		massStep(t, c, random, decode(s))
	}
	assert.Nil(t, s.heads[1], "the sliding layer has no token-rule state")
	vis, err := s.VisibleTokens(0)
	require.NoError(t, err)
	assert.Equal(t, []int{20, 20}, vis)
	vis, err = s.VisibleTokens(1)
	require.NoError(t, err)
	assert.Equal(t, []int{4 + 16, 4 + 16}, vis, "sinks and window")
	assert.Less(t, pagesUsed(c, 1), 50/8, "the sliding layer's group released its old pages")
}
