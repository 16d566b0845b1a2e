package gokv

import (
	"fmt"

	"github.com/gokv/gokv/bridge"
)

// Per-kv-head visibility (token rules: H2O, SnapKV; docs/architecture.md §6).
//
// The rules, enforced here and nowhere else:
//
//   - State. Under a token rule, the cache holds for every (sequence, full-attention layer, kv head) the
//     set of tokens hidden from that kv head (a bitset, Sequence.heads) and the scores the rule ranks by.
//     Sliding-window layers keep their window rule and have no such state.
//   - Sinks and recent tokens. The first ModelSpec.SinkTokens positions and the rule's protected newest
//     tokens (H2O: Recent; SnapKV: the observation Window) are never candidates: tokenRule.decide computes
//     the candidates itself and hides nothing outside them, whatever scores it is given.
//   - Attention. A step whose sequences have a hidden token in some layer passes that layer's kernels one
//     validity mask per kv head for every sequence of the call (bridge.AttendMaskPerKVHead); when nothing
//     is hidden no mask is passed, so Full and SinkWindow caches, and a token-rule cache before its first
//     decision, pay nothing. The kernels skip hidden tokens exactly.
//   - Pages. A page is released from a sequence's page table (entry -1, one reference dropped) once it is
//     full, every token of it is stored in the page itself (KIVI: quantized out of the residual ring, so
//     the page's key groups are complete and no ring flush writes it again), and no kv head of any layer
//     of its group sees any of its tokens in that sequence. The page is freed when its last holder drops
//     it: a page shared by forks stays while any of them still sees a token in it.
//   - KIVI. Tokens still in the residual ring may be hidden (the masks cover every position); their page
//     is released only once the ring has flushed them and its whole page, hence every key group in it, is
//     hidden.
//   - Forks. Fork copies the parent's hidden sets and scores (and takes a reference to every page the
//     parent still holds); from then on each sequence decides on its own: the same step on both gives the
//     same decision, different continuations give different ones. Copy-on-write is unchanged: a step that
//     writes into a shared page copies it first, and released pages are never written (they are full and
//     quantized).
//   - Truncate keeps the hidden sets of the kept tokens and forgets the rest; it is refused when the page
//     the next token goes into was released, or (H2O) when a token the shorter sequence's recent window
//     needs was hidden.

// tokenLayer reports whether layer l is governed by the cache's token rule.
func (c *Cache) tokenLayer(l int) bool { return c.tokens != nil && !c.layers[l].spec.Windowed() }

// newHeads allocates the token-rule state of a new sequence.
func (c *Cache) newHeads() [][]headState {
	if c.tokens == nil {
		return nil
	}
	heads := make([][]headState, len(c.layers))
	for l, cl := range c.layers {
		if c.tokenLayer(l) {
			heads[l] = make([]headState, cl.spec.HeadsKV)
		}
	}
	return heads
}

// cloneHeads deep-copies a sequence's token-rule state (Fork).
func cloneHeads(src [][]headState) [][]headState {
	if src == nil {
		return nil
	}
	out := make([][]headState, len(src))
	for l, hs := range src {
		if hs == nil {
			continue
		}
		out[l] = make([]headState, len(hs))
		for h := range hs {
			out[l][h] = hs[h].clone()
		}
	}
	return out
}

// anyHidden reports whether s hides a token in layer l.
func (s *Sequence) anyHidden(l int) bool {
	if s.heads == nil || s.heads[l] == nil {
		return false
	}
	for h := range s.heads[l] {
		if s.heads[l][h].nHidden > 0 {
			return true
		}
	}
	return false
}

// decideTokenStep is Begin's first part for token rules (c.mu held, entries valid): the SnapKV decisions
// due at the end of a prefill, then the compaction of the sequences whose hidden tokens now fill enough
// pages (compact.go). Both stay made if Begin fails later.
func (st *Step) decideTokenStep() error {
	c := st.c
	r := c.tokens
	if r == nil {
		return nil
	}
	for i, s := range st.seqs {
		if r.kind == ruleSnapKV && !s.snapDone && st.newTokens[i] == 1 {
			c.snapDecideLocked(s)
		}
	}
	for _, s := range st.seqs {
		if err := c.compactLocked(s); err != nil {
			return err
		}
	}
	return nil
}

// prepareTokenStep is Begin's part for token rules once the group slots are known (c.mu held): whether the
// step's attend calls request mass, and the per-kv-head masks.
func (st *Step) prepareTokenStep() {
	c := st.c
	r := c.tokens
	st.massRows = -1
	if r == nil {
		return
	}
	switch {
	case r.kind == ruleH2O:
		st.massRows = 0
	case r.kind == ruleSnapKV:
		for i, s := range st.seqs {
			if !s.snapDone && st.newTokens[i] > 1 {
				st.massRows = r.massRows()
			}
		}
	}
	st.masks = make([][]uint32, len(c.layers))
	st.maskIndptr = make([][]int32, len(c.layers))
	for l, cl := range c.layers {
		if !c.tokenLayer(l) {
			continue
		}
		need := false
		for _, s := range st.seqs {
			need = need || s.anyHidden(l)
		}
		if !need {
			continue
		}
		hkv := cl.spec.HeadsKV
		kvLen := st.groups[cl.group.index].kvLen
		indptr := make([]int32, len(st.seqs)+1)
		for i := range st.seqs {
			indptr[i+1] = indptr[i] + int32(hkv*ceilDiv(int(kvLen[i]), 32))
		}
		mask := make([]uint32, indptr[len(st.seqs)])
		for i, s := range st.seqs {
			w := ceilDiv(int(kvLen[i]), 32)
			for h := 0; h < hkv; h++ {
				at := int(indptr[i]) + h*w
				s.heads[l][h].hidden.maskWords(mask[at : at+w])
			}
		}
		st.masks[l], st.maskIndptr[l] = mask, indptr
	}
}

// attendTokens adds the token rule's inputs and outputs to a layer's attend call: the per-kv-head masks
// (when some token is hidden) and a mass buffer (when the rule needs this step's mass).
func (st *Step) attendTokens(layer int, a *bridge.AttendBatch) {
	if st.masks != nil && st.masks[layer] != nil {
		a.ValidMask, a.ValidIndptr = st.masks[layer], st.maskIndptr[layer]
		a.Flags |= bridge.AttendMaskPerKVHead
	}
	if st.massRows >= 0 && st.c.tokenLayer(layer) {
		total := 0
		for _, n := range st.groups[st.c.layers[layer].group.index].kvLen {
			total += int(n)
		}
		a.Mass = make([]float32, total*st.c.layers[layer].spec.HeadsKV)
		a.MassRows = st.massRows
	}
}

// massOf returns entry i's mass for kv head h of layer l's mass output (nil when none), indexed by slot.
func (st *Step) massOf(l, hkv, i, h int) []float32 {
	mass := st.mass[l]
	if mass == nil {
		return nil
	}
	kvLen := st.groups[st.c.layers[l].group.index].kvLen
	off := 0
	for j := 0; j < i; j++ {
		off += hkv * int(kvLen[j])
	}
	n := int(kvLen[i])
	return mass[off+h*n : off+(h+1)*n]
}

// commitTokensLocked is Commit's part for token rules (c.mu held, lengths and tables already updated):
// H2O adds the step's mass to the scores and decides; SnapKV records a prefill step's mass; then the pages
// no kv head sees any more are released.
func (st *Step) commitTokensLocked() {
	c := st.c
	r := c.tokens
	if r == nil {
		return
	}
	sinks := c.spec.SinkTokens
	for i, s := range st.seqs {
		touched := map[int]bool{} // page indices with newly hidden tokens
		for l, cl := range c.layers {
			if !c.tokenLayer(l) {
				continue
			}
			n := s.slots(cl.group.index)
			hkv := cl.spec.HeadsKV
			for h := 0; h < hkv; h++ {
				hs := &s.heads[l][h]
				m := st.massOf(l, hkv, i, h)
				switch r.kind {
				case ruleH2O:
					for len(hs.score) < n {
						hs.score = append(hs.score, 0)
					}
					for t, x := range m {
						hs.score[t] += x
					}
					for _, t := range r.decide(hs, n, sinks, hs.score) {
						touched[t/c.pageSize] = true
					}
				case ruleSnapKV:
					if !s.snapDone && st.newTokens[i] > 1 {
						hs.score = append(hs.score[:0:0], m...)
						if m == nil {
							hs.score = make([]float32, n) // the layer computed no attention: no observation
						}
					}
				}
			}
		}
		c.releaseHiddenPagesLocked(s, touched, int(st.startPos[i]))
	}
}

// snapDecideLocked makes a sequence's SnapKV decision from the mass its last prefill step recorded (none:
// the prompt was a single token, nothing to decide); c.mu is held.
func (c *Cache) snapDecideLocked(s *Sequence) {
	s.snapDone = true
	touched := map[int]bool{}
	for l, cl := range c.layers {
		if !c.tokenLayer(l) {
			continue
		}
		for h := range s.heads[l] {
			hs := &s.heads[l][h]
			if hs.score != nil {
				for _, t := range c.tokens.decide(hs, s.slots(cl.group.index), c.spec.SinkTokens, hs.score) {
					touched[t/c.pageSize] = true
				}
			}
			hs.score = nil
		}
	}
	c.releaseHiddenPagesLocked(s, touched, s.length)
}

// releaseHiddenPagesLocked releases the pages of s that no kv head of any layer of their group sees any
// more (see the rules above): the pages in touched, and those that became full and stored in their page
// since the sequence had `before` tokens. c.mu is held.
func (c *Cache) releaseHiddenPagesLocked(s *Sequence, touched map[int]bool, before int) {
	P := c.pageSize
	for gi, g := range c.groups {
		if g.rule.window != 0 || len(g.layers) == 0 || !c.tokenLayer(g.layers[0]) {
			continue
		}
		limit := g.quantLimit(s.slots(gi)) // tokens stored in their page in every layer of the group
		pages := map[int]bool{}
		for j := range touched {
			pages[j] = true
		}
		for j := g.quantLimit(max(before-s.shift[gi], 0)) / P; j < limit/P; j++ {
			pages[j] = true
		}
		table := s.tables[gi]
		for j := range pages {
			if j >= len(table) || table[j] < 0 || (j+1)*P > limit {
				continue
			}
			if c.pageHiddenLocked(s, g, j) {
				g.unref(table[j])
				table[j] = -1
			}
		}
	}
}

// pageHiddenLocked reports whether no kv head of any layer of group g sees a token of page j of s.
func (c *Cache) pageHiddenLocked(s *Sequence, g *layerGroup, j int) bool {
	P := c.pageSize
	for _, l := range g.layers {
		for h := range s.heads[l] {
			if !s.heads[l][h].hidden.all(j*P, (j+1)*P) {
				return false
			}
		}
	}
	return true
}

// truncateTokensLocked checks and applies Truncate(n) to the token-rule state (c.mu held); it returns an
// error, changing nothing, when the shorter sequence cannot be resumed.
func (c *Cache) truncateTokensLocked(s *Sequence, n int, apply bool) error {
	if c.tokens == nil {
		return nil
	}
	P := c.pageSize
	if !apply {
		for gi, g := range c.groups {
			if g.rule.window != 0 || !c.tokenLayer(g.layers[0]) || n%P == 0 {
				continue
			}
			if j := (n - s.shift[gi]) / P; j < len(s.tables[gi]) && s.tables[gi][j] < 0 {
				return fmt.Errorf("layer group %d (layers %s) released page %d (slots [%d, %d)), into which the sequence's next token would go",
					gi, joinInts(g.layers), j, j*P, (j+1)*P)
			}
		}
		if c.tokens.kind == ruleH2O {
			for l, cl := range c.layers {
				if !c.tokenLayer(l) {
					continue
				}
				shift := s.shift[cl.group.index]
				for h := range s.heads[l] {
					for t := max(n-shift-c.tokens.protect, 0); t < n-shift; t++ {
						if s.heads[l][h].hidden.has(t) {
							return fmt.Errorf("layer %d, kv head %d already hid token %d, which the recent window (Recent %d) of a %d-token sequence needs",
								l, h, t+shift, c.tokens.protect, n)
						}
					}
				}
			}
		}
		return nil
	}
	for l := range s.heads {
		for h := range s.heads[l] {
			s.heads[l][h].truncate(n - s.shift[c.layers[l].group.index])
		}
	}
	return nil
}

// VisibleTokens returns, per kv head of layer, how many of the sequence's tokens a query at its last
// position (Len()-1) sees: the window rule's sinks and window, minus the tokens a token rule hid from
// that kv head. It is what a decode step reads; ErrRange for a layer outside the model.
func (s *Sequence) VisibleTokens(layer int) ([]int, error) {
	unlock, err := s.lockLayer("Sequence.VisibleTokens", layer)
	if err != nil {
		return nil, err
	}
	defer unlock()
	c := s.c
	cl := c.layers[layer]
	n := s.slots(cl.group.index)
	count := n
	if r := cl.group.rule; r.window > 0 {
		p := n - 1
		sk := min(r.sinks, n)
		count = sk + max(0, n-max(p-r.window+1, sk))
	}
	out := make([]int, cl.spec.HeadsKV)
	for h := range out {
		out[h] = count
		if s.heads != nil && s.heads[layer] != nil {
			out[h] -= s.heads[layer][h].nHidden
		}
	}
	return out, nil
}

// lockLayer takes c.mu for a per-layer query on s, after checking the sequence, the cache and the layer;
// the caller defers unlock.
func (s *Sequence) lockLayer(op string, layer int) (unlock func(), err error) {
	if err := s.made(op); err != nil {
		return nil, err
	}
	c := s.c
	c.mu.Lock()
	switch {
	case c.closed:
		err = newErr(op, ErrorClosed, "cache is closed")
	case s.released:
		err = newErr(op, ErrorClosed, "sequence %d was released", s.id)
	case layer < 0 || layer >= len(c.layers):
		err = newErr(op, ErrorRange, "layer %d is outside [0, %d)", layer, len(c.layers))
	}
	if err != nil {
		c.mu.Unlock()
		return nil, err
	}
	return c.mu.Unlock, nil
}
