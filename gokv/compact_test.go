package gokv

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// compacted is the tcache's onCompact hook: it moves its slot -> position map of every (layer, kv head)
// of the group the way compactGroupLocked moves the rows.
func (h *tcache) compacted(s *Sequence, gi int, keep [][][]int, V, sinks int) {
	hist := h.hist[s]
	if hist.slotPos == nil {
		hist.slotPos = map[[2]int][]int{}
	}
	for li, l := range h.c.groups[gi].layers {
		for kh, k := range keep[li] {
			key := [2]int{l, kh}
			m := make([]int, V)
			for u := range m {
				m[u] = -1
			}
			for j, t := range k {
				d := j
				if j >= sinks {
					d = j + V - len(k)
				}
				m[d] = h.posOf(s, l, kh, t)
			}
			hist.slotPos[key] = m
		}
	}
}

// posOf returns the position of the token in slot u of layer l, kv head kh of s (-1 in a hole).
func (h *tcache) posOf(s *Sequence, l, kh, u int) int {
	if m := h.hist[s].slotPos[[2]int{l, kh}]; u < len(m) {
		return m[u]
	}
	return u + s.shift[h.c.layers[l].group.index]
}

// checkCompactedRows holds the rows the kernels read (dk, dv: every slot of a step's entry, as deqRead
// returns them) to the rows read at the same positions before any compaction, bit for bit, for every
// (kv head, visible slot) of a layer of a compactable group: compaction moves bytes, it never requantizes.
func (h *tcache) checkCompactedRows(s *Sequence, l int, dk, dv []float32) {
	h.t.Helper()
	c, ls := h.c, h.spec.Layers[l]
	cl := c.layers[l]
	if !c.compactable(cl.group) {
		return
	}
	hist := h.hist[s]
	if hist.rows == nil {
		hist.rows = map[[2]int]map[int][]float32{}
	}
	dkk, dvv, hkv := ls.HeadDimK, ls.HeadDimV, ls.HeadsKV
	n := len(dk) / (hkv * dkk)
	for kh := 0; kh < hkv; kh++ {
		key := [2]int{l, kh}
		if hist.rows[key] == nil {
			hist.rows[key] = map[int][]float32{}
		}
		for u := 0; u < n; u++ {
			if s.heads[l][kh].hidden.has(u) {
				continue
			}
			p := h.posOf(s, l, kh, u)
			require.GreaterOrEqual(h.t, p, 0, "layer %d kv head %d: visible slot %d is a hole", l, kh, u)
			row := slices.Clone(dk[(u*hkv+kh)*dkk : (u*hkv+kh+1)*dkk])
			if dv != nil {
				row = append(row, dv[(u*hkv+kh)*dvv:(u*hkv+kh+1)*dvv]...)
			}
			if was, ok := hist.rows[key][p]; ok {
				require.Equal(h.t, was, row, "layer %d kv head %d: the row of position %d (now slot %d) changed", l, kh, p, u)
			} else {
				hist.rows[key][p] = row
			}
		}
	}
}

// TestCompaction: under H2O and SnapKV, in every format whose rows lie within a token, sequences compact
// (their group holds fewer pages than their length needs), each kv head's visible rows are the rows it
// saw at the same positions before, bit for bit, and attention over the compacted cache equals the
// float64 reference over each kv head's visible slots (tokenRun); forks compact on their own and share
// nothing they wrote.
func TestCompaction(t *testing.T) {
	e := openTestEngine(t)
	spec := smallSpec(2, 32)
	for _, tc := range []struct {
		name   string
		policy EvictionPolicy
		format Format
	}{
		{"h2o-f32", H2O{Budget: 20, Recent: 6}, Format{Kind: F32}},
		{"h2o-f16", H2O{Budget: 20, Recent: 6}, Format{Kind: F16}},
		{"h2o-q8", H2O{Budget: 24, Recent: 6}, Format{Kind: Q8, Group: 32}},
		{"h2o-q4", H2O{Budget: 24, Recent: 4}, Format{Kind: Q4, Group: 32}},
		{"snapkv-f16", SnapKV{Budget: 16, Window: 5}, Format{Kind: F16}},
		{"snapkv-q4", SnapKV{Budget: 16, Window: 5, Kernel: 3, AvgPool: true}, Format{Kind: Q4, Group: 32}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newTCache(t, e, spec, CacheOptions{Format: tc.format, PageSize: 8, MaxTokens: 4096, MaxSequences: 4,
				Eviction: tc.policy}, 91)
			a, b := h.newSeq(), h.newSeq()
			h.tokenRun(prefill(a, 30), prefill(b, 61))
			for step := 0; step < 40; step++ {
				h.tokenRun(decode(a), decode(b))
			}
			for _, s := range []*Sequence{a, b} {
				gi := h.c.layers[0].group.index
				assert.Positive(t, s.shift[gi], "sequence %d never compacted", s.ID())
				assert.Less(t, len(s.tables[gi]), ceilDiv(s.Len(), 8), "sequence %d holds a page per 8 positions", s.ID())
				vis, err := s.VisibleTokens(0)
				require.NoError(t, err)
				for kh, n := range vis {
					if h.c.tokens.kind == ruleH2O {
						assert.Equal(t, h.c.tokens.budget, n, "kv head %d", kh)
					}
				}
			}
			checkTokenInvariants(t, h.c, math.MaxInt, a, b)
			c := h.fork(a)
			for step := 0; step < 30; step++ {
				h.tokenRun(decode(a), decode(c))
			}
			checkTokenInvariants(t, h.c, math.MaxInt, a, b, c)
			// A truncate below the last compaction is refused, changing nothing; above it, SnapKV (which
			// hides nothing after its decision) truncates as before.
			gi := h.c.layers[0].group.index
			at := a.compacted[gi]
			if at < a.Len() && h.c.tokens.kind == ruleSnapKV {
				h.truncate(a, a.Len()-1)
			}
			err := a.Truncate(at - 1)
			require.ErrorIs(t, err, ErrNotSupported)
			assert.Contains(t, err.Error(), "compacted")
			h.tokenRun(decode(a), decode(c))
		})
	}
}

// TestCompactionSavesMemory: a long H2O sequence holds about its budget's pages, not its length's.
func TestCompactionSavesMemory(t *testing.T) {
	spec := smallSpec(1, 32)
	c := compactingTestCache(t, spec, CacheOptions{Format: Format{Kind: Q4, Group: 32}, PageSize: 8, MaxTokens: 1024,
		MaxSequences: 2, Eviction: H2O{Budget: 32, Recent: 8}})
	s, err := c.NewSequence()
	require.NoError(t, err)
	mass := func(i, l, h, tok int) float32 { return float32((tok*7+h*3)%11) + 0.5 }
	massStep(t, c, mass, StepEntry{Seq: s, NewTokens: 40})
	for step := 0; step < 600; step++ {
		massStep(t, c, mass, StepEntry{Seq: s, NewTokens: 1})
	}
	used := c.Stats().PagesUsed
	// Budget 32 in pages of 8, plus at most a quarter more before the next compaction, plus a partial page.
	assert.LessOrEqual(t, used, ceilDiv(32*5/4, 8)+2, "pages in use for a 640-token sequence under a 32-token budget")
	assert.Equal(t, 640, s.Len())
}

// TestCompactionSkipsKIVI: KIVI groups keep their holes (a key group spans g tokens); nothing moves.
func TestCompactionSkipsKIVI(t *testing.T) {
	spec := smallSpec(1, 32)
	c := compactingTestCache(t, spec, CacheOptions{Format: Format{Kind: KIVI4, Group: 32, Residual: 32}, PageSize: 32,
		MaxTokens: 2048, MaxSequences: 2, Eviction: H2O{Budget: 48, Recent: 8}})
	s, err := c.NewSequence()
	require.NoError(t, err)
	mass := func(i, l, h, tok int) float32 { return float32((tok*5+h)%13) + 0.25 }
	massStep(t, c, mass, StepEntry{Seq: s, NewTokens: 100})
	for step := 0; step < 200; step++ {
		massStep(t, c, mass, StepEntry{Seq: s, NewTokens: 1})
	}
	assert.Zero(t, s.shift[0])
	assert.Equal(t, ceilDiv(s.Len(), 32), len(s.tables[0]))
}
