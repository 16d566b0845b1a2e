package gokv

import (
	"errors"
	"strconv"

	"github.com/gokv/gokv/bridge"
)

// Compaction under a token rule (H2O, SnapKV; docs/architecture.md §6).
//
// Hiding tokens per kv head saves the bytes a decode step reads but not memory: a page stays while any kv
// head of any layer of its group still sees one of its tokens, and with each kv head keeping its own
// heavy hitters almost every page keeps one. Compaction moves each (layer, kv head)'s surviving rows into
// fresh pages, byte for byte (gokv_pool_gather_rows: no requantization), so that the group's page table
// shrinks to the survivors:
//
//   - Slots. A compacted group stores a token at a slot, not at its position: slot = position - shift for
//     the tokens appended since, and the survivors of each (layer, kv head) in order before them. The
//     kernels never need positions (keys are stored after RoPE, and a decode or prefill row sees every
//     earlier slot), so a step passes the group's slots as kv_len and q_pos; Sequence.Len and
//     Step.StartPos stay positions.
//   - Uneven survivors. (Layer, kv head) pairs may keep different counts; the group keeps the largest,
//     V. A pair with fewer survivors keeps its sink tokens in slots [0, sinks) and the rest at the end of
//     [0, V), and hides the hole between: sinks stay at the front and the newest tokens (the recent window
//     no rule may hide) stay the last slots of every kv head, so the rules work on slots unchanged.
//   - When. At the start of a step (Begin), for a sequence whose group would shrink by at least a quarter
//     of its pages (and one page), if the group has the pages for the compacted copy free; otherwise the
//     sequence waits (hidden tokens are still skipped by the kernels, only memory is not yet returned).
//   - Formats. Only groups whose layers all store rows within a token (f32, f16, q8, q4): a KIVI key group
//     spans g tokens, so a KIVI group keeps its holes until whole pages are hidden (visibility.go).
//   - Forks and copy-on-write. Compaction writes only fresh pages and then drops the sequence's references
//     to its old ones: a page shared with a fork stays with the fork, which compacts on its own. Each
//     sequence keeps its own shift.
//   - Truncate cannot go below the length at the last compaction (the positions before it are gone).
//   - Failure. A native failure frees the fresh pages and changes nothing (the old pages were only read);
//     a backend without the raw-page slots (ErrNotSupported) turns compaction off for the cache.

// compactShare: a group is compacted once that would free at least 1/compactShare of its pages.
const compactShare = 4

// compactable reports whether group g can be compacted: full attention under the cache's token rule, no
// KIVI layer.
func (c *Cache) compactable(g *layerGroup) bool {
	return !c.noCompact && g.rule.window == 0 && len(g.layers) > 0 && c.tokenLayer(g.layers[0]) && len(g.kivi) == 0
}

// compactLocked compacts the groups of s that qualify (see above); c.mu is held and s is in no step.
func (c *Cache) compactLocked(s *Sequence) error {
	for gi, g := range c.groups {
		if !c.compactable(g) {
			continue
		}
		if err := c.compactGroupLocked(s, gi); err != nil {
			if errors.Is(err, ErrNotSupported) {
				c.noCompact = true
				c.eng.logger().Debug().Str("op", "compact").Err(err).Msg("gokv: compaction is off for this cache")
				return nil
			}
			return err
		}
	}
	return nil
}

// compactGroupLocked compacts group gi of s when it frees enough pages and the fresh pages are free.
func (c *Cache) compactGroupLocked(s *Sequence, gi int) error {
	g, P := c.groups[gi], c.pageSize
	n := s.slots(gi)
	// The largest survivor count first, from the hidden counts: Begin asks at every step, and the
	// survivors are listed only when the group will compact.
	V := 0
	for _, l := range g.layers {
		for h := range s.heads[l] {
			if s.heads[l][h].nHidden == 0 {
				return nil // a kv head that sees everything keeps every page
			}
			V = max(V, s.heads[l][h].visible(n))
		}
	}
	have, want := len(s.tables[gi]), ceilDiv(V, P)
	if freed := have - want; freed < 1 || freed*compactShare < have || want > g.available() {
		return nil
	}
	keep := make([][][]int, len(g.layers)) // survivors per (layer, kv head)
	for li, l := range g.layers {
		keep[li] = make([][]int, len(s.heads[l]))
		for h := range s.heads[l] {
			hs := &s.heads[l][h]
			k := make([]int, 0, hs.visible(n))
			for t := 0; t < n; t++ {
				if !hs.hidden.has(t) {
					k = append(k, t)
				}
			}
			keep[li][h] = k
		}
	}
	sinks := min(c.spec.SinkTokens, n)
	dstSlot := func(j, kept int) int {
		if j < sinks {
			return j
		}
		return j + V - kept
	}

	fresh := make([]int32, want)
	for j := range fresh {
		fresh[j] = g.alloc()
	}
	table := s.tables[gi]
	for li, l := range g.layers {
		var b bridge.GatherBatch
		for h, k := range keep[li] {
			for j, t := range k {
				d := dstSlot(j, len(k))
				b.SrcPages = append(b.SrcPages, table[t/P])
				b.SrcSlots = append(b.SrcSlots, int32(t%P))
				b.DstPages = append(b.DstPages, fresh[d/P])
				b.DstSlots = append(b.DstSlots, int32(d%P))
				b.KVHeads = append(b.KVHeads, int32(h))
			}
		}
		if err := c.layers[l].pool.Gather(b); err != nil {
			for _, id := range fresh {
				g.unref(id)
			}
			return wrapErr("compact", "sequence "+itoa(s.id)+", layer "+strconv.Itoa(l), err)
		}
	}

	if c.onCompact != nil {
		c.onCompact(s, gi, keep, V, sinks)
	}
	// The rows are in place: move the rule state to the slots, then swap the pages.
	for li, l := range g.layers {
		for h, k := range keep[li] {
			hs := &s.heads[l][h]
			var hidden tokenBits
			for t := sinks; t < sinks+V-len(k); t++ {
				hidden.set(t)
			}
			var score []float32
			if hs.score != nil {
				score = make([]float32, V)
				for j, t := range k {
					if t < len(hs.score) {
						score[dstSlot(j, len(k))] = hs.score[t]
					}
				}
			}
			*hs = headState{hidden: hidden, nHidden: V - len(k), score: score}
		}
	}
	for _, id := range table {
		g.unref(id)
	}
	s.tables[gi] = fresh
	s.shift[gi] += n - V
	s.compacted[gi] = s.length
	s.evicted[gi] = 0
	return nil
}
