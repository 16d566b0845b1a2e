package gokv

import (
	"slices"

	"github.com/gokv/gokv/bridge"
)

// Quest (policy.go): a read rule. The cache keeps every token; the pools of the layers Quest governs (the
// full-attention ones) keep key bounds, and a step whose entries are all single-token decodes passes
// quest_pages, quest_recent and the model's sink count in those layers' attend calls, asking the kernels
// for the pages they chose (quest_selected). Prefill entries attend in full (the ABI's Quest reads one
// query row per sequence): a step mixing them with decode entries makes two native calls per Quest
// layer, the first storing every entry's tokens and attending the prefill entries in full, the second
// attending the decode entries under Quest, so a decode's result does not depend on what shares its
// step. At Commit each decoded sequence records, per Quest layer and kv head, how many pages its decode
// read (Sequence.QuestPagesRead).

// questLayer reports whether layer l is governed by the cache's Quest rule.
func (c *Cache) questLayer(l int) bool { return c.quest != nil && !c.layers[l].spec.Windowed() }

// prepareQuestStep is Begin's part for Quest (c.mu held, entries valid): the step selects pages when some
// entry decodes one token, in two calls when others prefill.
func (st *Step) prepareQuestStep() {
	if st.c.quest == nil {
		return
	}
	for _, n := range st.newTokens {
		if n == 1 {
			st.quest = true
		} else {
			st.questMixed = true
		}
	}
	if st.quest {
		st.questSel = make([][]int32, len(st.c.layers))
	}
}

// attendQuest adds Quest's page selection to a layer's attend call of a decode step (all entries decode).
func (st *Step) attendQuest(layer int, a *bridge.AttendBatch) {
	c := st.c
	if !st.quest || st.questMixed || !c.questLayer(layer) {
		return
	}
	a.QuestPages, a.QuestRecent, a.SinkTokens = c.quest.Pages, c.quest.Recent, c.spec.SinkTokens
	a.QuestSelected = make([]int32, len(st.seqs)*c.layers[layer].spec.HeadsKV*c.quest.Pages)
}

// questMixedCalls is a Quest layer's native work in a step mixing decode and prefill entries (a is the
// whole step's attend call, w its write): one call stores every entry's tokens and attends the prefill
// entries in full, a second attends the decode entries under Quest. Out rows are gathered and scattered
// per entry. When the second call fails the tokens are stored (the caller records that).
func (st *Step) questMixedCalls(layer int, w bridge.WriteBatch, a bridge.AttendBatch) (stored bool, err error) {
	c := st.c
	cl := c.layers[layer]
	hq, dk, dv := cl.spec.HeadsQ, cl.spec.HeadDimK, cl.spec.HeadDimV
	var dec, pre []int
	for i, n := range st.newTokens {
		if n == 1 {
			dec = append(dec, i)
		} else {
			pre = append(pre, i)
		}
	}
	sub := func(idx []int) (bridge.AttendBatch, func()) {
		b := a
		b.QIndptr, b.PageIndptr = []int32{0}, []int32{0}
		b.PageIDs, b.KVLen, b.QPos, b.Q = nil, nil, nil, nil
		if a.ResidualSlot != nil {
			b.ResidualSlot = nil
		}
		for _, i := range idx {
			r0, r1 := int(st.tokIndptr[i]), int(st.tokIndptr[i+1])
			b.QIndptr = append(b.QIndptr, b.QIndptr[len(b.QIndptr)-1]+int32(r1-r0))
			b.PageIDs = append(b.PageIDs, a.PageIDs[a.PageIndptr[i]:a.PageIndptr[i+1]]...)
			b.PageIndptr = append(b.PageIndptr, int32(len(b.PageIDs)))
			b.KVLen, b.QPos = append(b.KVLen, a.KVLen[i]), append(b.QPos, a.QPos[i])
			if a.ResidualSlot != nil {
				b.ResidualSlot = append(b.ResidualSlot, a.ResidualSlot[i])
			}
			b.Q = append(b.Q, a.Q[r0*hq*dk:r1*hq*dk]...)
		}
		b.Out = make([]float32, int(b.QIndptr[len(b.QIndptr)-1])*hq*dv)
		scatter := func() {
			at := 0
			for _, i := range idx {
				r0, r1 := int(st.tokIndptr[i]), int(st.tokIndptr[i+1])
				at += copy(a.Out[r0*hq*dv:r1*hq*dv], b.Out[at:])
			}
		}
		return b, scatter
	}
	bp, scatterP := sub(pre)
	if err := appendAttend(c.eng.dev, w, bp); err != nil {
		return !rejectedBeforeWrite(err), err
	}
	scatterP()
	bd, scatterD := sub(dec)
	hkv, k := cl.spec.HeadsKV, c.quest.Pages
	bd.QuestPages, bd.QuestRecent, bd.SinkTokens = k, c.quest.Recent, c.spec.SinkTokens
	bd.QuestSelected = make([]int32, len(dec)*hkv*k)
	if err := bridge.Attend(c.eng.dev, bd); err != nil {
		return true, err
	}
	scatterD()
	sel := make([]int32, len(st.seqs)*hkv*k)
	for j := range sel {
		sel[j] = -1
	}
	for x, i := range dec {
		copy(sel[i*hkv*k:(i+1)*hkv*k], bd.QuestSelected[x*hkv*k:(x+1)*hkv*k])
	}
	st.questSel[layer] = sel
	return true, nil
}

// QuestSelected returns what the kernels chose in layer's last attend call of this step under Quest: per
// entry and kv head, Quest.Pages page-table indices read by bound ([entries][HeadsKV][Pages], ascending,
// -1 where fewer pages competed, and for prefill entries, which attend in full). The pages holding sink
// tokens or the Recent newest tokens are read besides them and are not listed (see QuestForcedPages).
// Nil when the layer selected nothing (no Quest, a sliding layer, a step of prefill entries only, or the
// layer has not attended yet). The slice is the step's: do not modify it.
func (st *Step) QuestSelected(layer int) []int32 {
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if layer < 0 || layer >= len(st.questSel) {
		return nil
	}
	return st.questSel[layer]
}

// QuestForcedPages returns the page indices a Quest decode of a sequence of n tokens reads whatever the
// bounds: those holding a sink token (t < sinks) or one of the recent newest tokens, in increasing
// order, for pages of pageSize tokens.
func QuestForcedPages(n, sinks, recent, pageSize int) []int {
	if n <= 0 || pageSize <= 0 {
		return nil
	}
	pages := ceilDiv(n, pageSize)
	var out []int
	for j := 0; j < pages; j++ {
		sink := j*pageSize < sinks
		rec := recent > 0 && (j+1)*pageSize > n-recent
		if sink || rec {
			out = append(out, j)
		}
	}
	return out
}

// questForcedCount is len(QuestForcedPages(n, sinks, recent, pageSize)) without listing them.
func questForcedCount(n, sinks, recent, pageSize int) int {
	if n <= 0 || pageSize <= 0 {
		return 0
	}
	pages := ceilDiv(n, pageSize)
	a := min(ceilDiv(max(min(sinks, n), 0), pageSize), pages) // sink pages [0, a)
	if recent <= 0 {
		return a
	}
	b := max(n-recent, 0) / pageSize // recent pages [b, pages)
	return a + (pages - b) - max(0, a-b)
}

// commitQuestLocked is Commit's part for Quest (c.mu held, lengths and tables updated): each sequence
// records how many pages its decode read per Quest layer and kv head.
func (st *Step) commitQuestLocked() {
	c := st.c
	if !st.quest {
		return
	}
	for i, s := range st.seqs {
		if st.newTokens[i] != 1 {
			continue // a prefill entry attended in full
		}
		n := int(st.kvLen[i])
		for l, sel := range st.questSel {
			if sel == nil {
				continue
			}
			cl := c.layers[l]
			hkv, k := cl.spec.HeadsKV, c.quest.Pages
			table := s.tables[cl.group.index]
			forced := 0
			for _, j := range QuestForcedPages(n, c.spec.SinkTokens, c.quest.Recent, c.pageSize) {
				if j < len(table) && table[j] >= 0 {
					forced++
				}
			}
			if s.questRead == nil {
				s.questRead = make([][]int, len(c.layers))
			}
			read := make([]int, hkv)
			for h := range read {
				read[h] = forced
				for _, j := range sel[(i*hkv+h)*k : (i*hkv+h+1)*k] {
					if j >= 0 {
						read[h]++
					}
				}
			}
			s.questRead[l] = read
		}
	}
}

// QuestPagesRead returns, per kv head of layer, how many pages of the sequence its last decode step under
// Quest read in that layer: the pages the kernels chose by bound plus the sink and recent pages. Nil when
// the cache has no Quest policy, the layer is a sliding one, or no decode step has run yet. ErrRange for a
// layer outside the model.
func (s *Sequence) QuestPagesRead(layer int) ([]int, error) {
	unlock, err := s.lockLayer("Sequence.QuestPagesRead", layer)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if s.questRead == nil {
		return nil, nil
	}
	return slices.Clone(s.questRead[layer]), nil
}
