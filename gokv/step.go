package gokv

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"

	"github.com/gokv/gokv/bridge"
)

// StepEntry is one sequence of a batched step and the number of new tokens it appends: 1 for decode,
// T for (a chunk of) prefill. Decode and prefill entries may share a step.
type StepEntry struct {
	Seq       *Sequence
	NewTokens int
	// Tokens are the new tokens' ids (len NewTokens), optional: with them the cache names the pages they
	// fill, so that NewSequenceFrom can reuse them (prefix.go); a step without them ends the sequence's
	// reuse from then on.
	Tokens []int32
}

// Step is one batched forward step over several sequences: Begin reserves the pages of the new tokens,
// Layer stores each layer's new keys and values and computes its attention (one native call per layer),
// and Commit makes the tokens part of the sequences (or Abort forgets them).
//
// Rows: the new tokens of all entries, in entry order, form the rows of every Layer call's q, k, v and
// out; entry i's rows start at the sum of the NewTokens before it, and its row j is at position
// Len(entry i) + j. A query row sees the cached tokens and the new tokens up to its own position (causal),
// within its layer's window.
//
// Thread-safety: the methods may be called from any goroutine; calls on one step are serialized. Steps on
// different sequences may run concurrently (see Cache).
type Step struct {
	c  *Cache
	mu sync.Mutex // serializes the step's methods

	seqs      []*Sequence
	newTokens []int
	tokens    [][]int32 // [n] the entries' token ids (nil: unknown)
	rows      int
	tokIndptr []int32 // [n+1] rows of each entry (write and attend)
	startPos  []int32 // [n] length of each sequence before the step
	kvLen     []int32 // [n] length after the step
	slots     []int32 // [n] residual ring of each sequence
	groups    []stepGroup
	ran       []bool // per layer: Layer succeeded at least once
	stored    []bool // per layer: the new tokens may be in the pool (a native write got past validation)
	done      bool

	// Token rules (visibility.go): the MassRows of the step's attend calls (-1: no mass), each token
	// layer's mass output of its last call, and its per-kv-head masks (nil: nothing hidden).
	massRows   int
	mass       [][]float32
	masks      [][]uint32
	maskIndptr [][]int32

	// Quest (quest.go): whether the step selects pages (all entries decode), and per layer the pages its
	// last attend call chose.
	quest      bool // some entry decodes one token
	questMixed bool // some entry prefills (Quest layers then make two native calls)
	questSel   [][]int32
}

// stepGroup is the step's view of one layer group: the page tables the sequences will have after the
// step (shared partially written pages replaced by private copies, new pages appended), and the pages to
// give back on Abort (fresh) or to drop on Commit (replaced originals).
type stepGroup struct {
	// startPos and kvLen per entry in the group's slots (the step's positions less what compaction
	// removed; the same slices when nothing was compacted)
	startPos, kvLen []int32
	pageIndptr      []int32
	pageIDs         []int32
	fresh           []int32
	replaced        []int32
}

// Begin starts a step: for every entry it reserves, in every layer group, the pages its new tokens need,
// and gives it private copies of shared pages it would write into (copy-on-write after Fork). The
// sequences stay in the step until Commit or Abort. It fails with ErrCapacity (a *CapacityError naming
// the group) when some group has too few free pages, and with ErrInvalid for a bad entry (nil, released
// or foreign sequence, a sequence already in a step or listed twice, NewTokens < 1); a failed Begin
// changes nothing.
func (c *Cache) Begin(entries ...StepEntry) (*Step, error) {
	const op = "Cache.Begin"
	if err := c.made(op); err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, newErr(op, ErrorInvalid, "no entries")
	}
	c.life.RLock()
	defer c.life.RUnlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, newErr(op, ErrorClosed, "cache is closed")
	}
	n := len(entries)
	st := &Step{c: c, seqs: make([]*Sequence, n), newTokens: make([]int, n), tokens: make([][]int32, n), tokIndptr: make([]int32, n+1),
		startPos: make([]int32, n), kvLen: make([]int32, n), slots: make([]int32, n),
		groups: make([]stepGroup, len(c.groups)), ran: make([]bool, len(c.layers)), stored: make([]bool, len(c.layers))}
	seen := make(map[*Sequence]int, n)
	for i, e := range entries {
		s := e.Seq
		switch {
		case s == nil:
			return nil, newErr(op, ErrorInvalid, "entry %d: Seq is nil", i)
		case s.c == nil:
			return nil, newErr(op, ErrorInvalid, "entry %d: Seq was not created (a zero Sequence; create one with Cache.NewSequence or Fork)", i)
		case s.c != c:
			return nil, newErr(op, ErrorInvalid, "entry %d: sequence %d belongs to another cache", i, s.id)
		case e.NewTokens < 1:
			return nil, newErr(op, ErrorInvalid, "entry %d (sequence %d): NewTokens %d must be >= 1", i, s.id, e.NewTokens)
		case e.Tokens != nil && len(e.Tokens) != e.NewTokens:
			return nil, newErr(op, ErrorInvalid, "entry %d (sequence %d): len(Tokens) = %d, want NewTokens = %d", i, s.id, len(e.Tokens), e.NewTokens)
		case int64(s.length)+int64(e.NewTokens) > math.MaxInt32:
			return nil, newErr(op, ErrorInvalid, "entry %d (sequence %d): %d + %d tokens exceed the ABI's 2^31-1 positions", i, s.id, s.length, e.NewTokens)
		}
		if j, dup := seen[s]; dup {
			return nil, newErr(op, ErrorInvalid, "entries %d and %d are both sequence %d", j, i, s.id)
		}
		seen[s] = i
		if err := s.usable(op); err != nil {
			return nil, err
		}
		st.seqs[i], st.newTokens[i], st.tokens[i] = s, e.NewTokens, slices.Clone(e.Tokens)
		st.rows += e.NewTokens
		if st.rows > math.MaxInt32 {
			return nil, newErr(op, ErrorInvalid, "the step has more than 2^31-1 new tokens")
		}
		st.tokIndptr[i+1] = int32(st.rows)
		st.startPos[i] = int32(s.length)
		st.kvLen[i] = int32(s.length + e.NewTokens)
		st.slots[i] = s.slot
	}

	// SnapKV decisions due at the end of a prefill and compactions are made first (they release pages; a
	// Begin that then fails keeps them), then the step's slots, mass requests and masks.
	st.mass = make([][]float32, len(c.layers))
	if err := st.decideTokenStep(); err != nil {
		return nil, wrapErr(op, "compaction", err)
	}
	st.setGroupSlots()
	st.prepareTokenStep()
	st.prepareQuestStep()

	// Plan every group before touching any allocator, so a shortage changes nothing.
	P := c.pageSize
	type cow struct{ entry, index int }
	cows := make([][]cow, len(c.groups))
	for gi, g := range c.groups {
		need := 0
		for i, s := range st.seqs {
			old := len(s.tables[gi])
			need += ceilDiv(int(st.groups[gi].kvLen[i]), P) - old
			lo, hi := g.writtenPages(s.slots(gi), st.newTokens[i], P)
			for j := lo; j < min(hi, old); j++ {
				id := s.tables[gi][j]
				if id < 0 {
					return nil, newErr(op, ErrorInternal, "sequence %d: layer group %d writes into released page %d", s.id, gi, j)
				}
				if g.refs[id] > 1 {
					cows[gi] = append(cows[gi], cow{i, j})
					need++
				}
			}
		}
		if free := g.available(); need > free {
			detail := ""
			if g.rule.window > 0 {
				detail = fmt.Sprintf("; window %d, sinks %d: windowed groups hold MaxSequences windows plus MaxStepTokens new tokens, split long prefills or raise MaxStepTokens",
					g.rule.window, g.rule.sinks)
			}
			return nil, &CapacityError{Op: op, Group: gi, Layers: slices.Clone(g.layers), Needed: need, Free: free,
				Total: g.pages, Detail: detail}
		}
	}

	// Reserve: build the post-step tables.
	for gi, g := range c.groups {
		sg := &st.groups[gi]
		sg.pageIndptr = make([]int32, n+1)
		for i, s := range st.seqs {
			sg.pageIDs = append(sg.pageIDs, s.tables[gi]...)
			for j := len(s.tables[gi]); j < ceilDiv(int(sg.kvLen[i]), P); j++ {
				id := g.alloc()
				sg.pageIDs = append(sg.pageIDs, id)
				sg.fresh = append(sg.fresh, id)
			}
			sg.pageIndptr[i+1] = int32(len(sg.pageIDs))
		}
		var src, dst []int32
		for _, w := range cows[gi] {
			at := int(sg.pageIndptr[w.entry]) + w.index
			id := g.alloc()
			src, dst = append(src, sg.pageIDs[at]), append(dst, id)
			sg.replaced = append(sg.replaced, sg.pageIDs[at])
			sg.pageIDs[at] = id
			sg.fresh = append(sg.fresh, id)
		}
		if len(src) == 0 {
			continue
		}
		for _, li := range g.layers {
			cl := c.layers[li]
			if err := cl.pool.Copy(bridge.CopyBatch{SrcPages: src, DstPages: dst}); err != nil {
				st.releaseFreshLocked()
				return nil, wrapErr(op, "layer "+strconv.Itoa(li)+": copy-on-write of shared pages", err)
			}
		}
	}
	for _, s := range st.seqs {
		s.step = st
	}
	return st, nil
}

// setGroupSlots gives each group the entries' start and end in its slots (c.mu held).
func (st *Step) setGroupSlots() {
	for gi := range st.groups {
		sg := &st.groups[gi]
		sg.startPos, sg.kvLen = st.startPos, st.kvLen
		for i, s := range st.seqs {
			if s.shift[gi] == 0 {
				continue
			}
			if &sg.startPos[0] == &st.startPos[0] {
				sg.startPos, sg.kvLen = slices.Clone(st.startPos), slices.Clone(st.kvLen)
			}
			sg.startPos[i] -= int32(s.shift[gi])
			sg.kvLen[i] -= int32(s.shift[gi])
		}
	}
}

// releaseFreshLocked gives back every page the step reserved; c.mu is held.
func (st *Step) releaseFreshLocked() {
	for gi := range st.groups {
		g := st.c.groups[gi]
		for _, id := range st.groups[gi].fresh {
			g.unref(id)
		}
		st.groups[gi].fresh = nil
	}
}

// Rows returns the number of new tokens of the step, Σ NewTokens: the rows of q, k, v and out (0 for a
// nil or zero Step).
func (st *Step) Rows() int {
	if st == nil {
		return 0
	}
	return st.rows
}

// StartPos returns the position of entry i's first new token (its sequence's length before the step):
// the position RoPE needs for the entry's row 0. It returns -1 for an index outside the entries.
func (st *Step) StartPos(i int) int {
	if st == nil || i < 0 || i >= len(st.startPos) {
		return -1
	}
	return int(st.startPos[i])
}

// made fails with ErrInvalid for a nil Step or one that did not come from Cache.Begin.
func (st *Step) made(op string) error {
	switch {
	case st == nil:
		return newErr(op, ErrorInvalid, "step is nil")
	case st.c == nil:
		return newErr(op, ErrorInvalid, "step was not begun (a zero Step; begin one with Cache.Begin)")
	}
	return nil
}

// Layer stores layer's new keys and values for every entry and computes its attention for the new
// queries, in one native call. Shapes (rows = Rows(), row-major):
//
//	q    [rows, HeadsQ, HeadDimK]   the queries (MLA: the absorbed queries over the latent)
//	k    [rows, HeadsKV, HeadDimK]  the new keys (MLA: the new latent vectors)
//	v    [rows, HeadsKV, HeadDimV]  the new values; nil for MLA (they are a prefix of k)
//	out  [rows, HeadsQ, HeadDimV]   written with the attention output
//
// With q and out both nil, Layer only stores the new tokens (a prefill whose outputs the engine does not
// need, e.g. all rows but the last): no attention is computed.
//
// The slices are only used during the call. Every layer must run before Commit. Calling Layer again for
// a layer replaces its new tokens exactly (f32, f16, q8, q4, and KIVI while every sequence's new tokens
// fit its residual ring's free rows); a KIVI layer whose first call overwrote ring rows that storing the
// tokens again would read refuses a second call with ErrInvalid and keeps the first call's tokens.
// Errors name the layer and argument; a rejected call stores nothing, and the step can be retried.
func (st *Step) Layer(layer int, q, k, v, out []float32) error {
	const op = "Step.Layer"
	if err := st.made(op); err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	c := st.c
	if st.done {
		return newErr(op, ErrorClosed, "layer %d: the step has ended (Commit or Abort was called)", layer)
	}
	if layer < 0 || layer >= len(c.layers) {
		return newErr(op, ErrorRange, "layer %d is outside [0, %d)", layer, len(c.layers))
	}
	cl := c.layers[layer]
	l := cl.spec
	shapes := []struct {
		name       string
		got        int
		heads, dim int
	}{
		{"q", len(q), l.HeadsQ, l.HeadDimK},
		{"k", len(k), l.HeadsKV, l.HeadDimK},
		{"v", len(v), l.HeadsKV, l.HeadDimV},
		{"out", len(out), l.HeadsQ, l.HeadDimV},
	}
	writeOnly := q == nil && out == nil // store the tokens, attend nothing (e.g. prefill whose outputs are unused)
	for _, sh := range shapes {
		if writeOnly && (sh.name == "q" || sh.name == "out") {
			continue
		}
		if sh.name == "v" && l.VIsKPrefix() {
			if v != nil {
				return newErr(op, ErrorInvalid, "layer %d (%s): v must be nil: MLA values are the first %d dims of k", layer, l, l.HeadDimV)
			}
			continue
		}
		if want := st.rows * sh.heads * sh.dim; sh.got != want {
			return newErr(op, ErrorInvalid, "layer %d (%s): len(%s) = %d, want rows %d * heads %d * dim %d = %d",
				layer, l, sh.name, sh.got, st.rows, sh.heads, sh.dim, want)
		}
	}

	c.life.RLock()
	defer c.life.RUnlock()
	c.mu.Lock()
	closed, sinks := c.closed, cl.sinks
	c.mu.Unlock()
	if closed {
		return newErr(op, ErrorClosed, "layer %d: cache is closed", layer)
	}
	if l.LearnedSinks && sinks == nil {
		return newErr(op, ErrorInvalid, "layer %d (%s) has learned sinks: call Cache.SetSinkLogits(%d, ...) first", layer, l, layer)
	}
	sg := &st.groups[cl.group.index]
	var slots []int32
	if cl.format.Kind.IsKIVI() {
		slots = st.slots
	}
	w := bridge.WriteBatch{TokIndptr: st.tokIndptr, PageIndptr: sg.pageIndptr, PageIDs: sg.pageIDs,
		StartPos: sg.startPos, ResidualSlot: slots, K: k, V: v}
	a := bridge.AttendBatch{Pool: cl.pool, QIndptr: st.tokIndptr, PageIndptr: sg.pageIndptr, PageIDs: sg.pageIDs,
		KVLen: sg.kvLen, QPos: sg.startPos, ResidualSlot: slots, HeadsQ: l.HeadsQ, Q: q, Out: out,
		Scale: cl.scale, SinkLogits: sinks, SinkTokens: cl.group.rule.sinks, Window: cl.group.rule.window}
	if !writeOnly {
		st.attendTokens(layer, &a)
		st.attendQuest(layer, &a)
	}
	if st.stored[layer] {
		if i := st.ringOverwritten(cl.format); i >= 0 {
			return newErr(op, ErrorInvalid, "layer %d (%s): this step's tokens are already stored, and sequence %d's %d new tokens overwrote residual ring rows (R + g = %d) that storing them again would read; the first call's tokens stay (Commit them, or Abort)",
				layer, cl.format, st.seqs[i].id, st.newTokens[i], cl.format.Residual+cl.format.Group)
		}
	}
	var err error
	switch {
	case writeOnly:
		err = cl.pool.Write(w)
	case st.quest && st.questMixed && c.questLayer(layer):
		var stored bool
		if stored, err = st.questMixedCalls(layer, w, a); err != nil {
			st.stored[layer] = st.stored[layer] || stored
			return wrapErr(op, "layer "+strconv.Itoa(layer), err)
		}
	default:
		err = appendAttend(c.eng.dev, w, a)
	}
	if err != nil {
		st.stored[layer] = st.stored[layer] || !rejectedBeforeWrite(err)
		return wrapErr(op, "layer "+strconv.Itoa(layer), err)
	}
	st.stored[layer], st.ran[layer] = true, true
	if !writeOnly {
		st.mass[layer] = a.Mass // this call's mass replaces an earlier call's
	} else {
		st.mass[layer] = nil
	}
	if st.questSel != nil && !st.questMixed { // questMixedCalls keeps its own
		st.questSel[layer] = a.QuestSelected
	}
	return nil
}

// ringOverwritten returns the first entry whose new tokens, once stored in a layer of format f,
// overwrote KIVI residual ring rows of its older tokens, or -1.
func (st *Step) ringOverwritten(f Format) int {
	for i := range st.seqs {
		if kiviRingClobbered(f, int(st.startPos[i]), st.newTokens[i]) {
			return i
		}
	}
	return -1
}

// rejectedBeforeWrite reports whether a native write failed in the C core's validation, which runs before
// any byte is stored (bad arguments, versions, missing capabilities); other failures may have stored some.
func rejectedBeforeWrite(err error) bool {
	for _, code := range []error{bridge.ErrInvalid, bridge.ErrRange, bridge.ErrVersion, bridge.ErrNotSupported} {
		if errors.Is(err, code) {
			return true
		}
	}
	return false
}

// appendAttend is a layer's native work in a step: store the new tokens, then attend, in ONE cgo call
// (gokv_append_attend validates both descriptors before it writes anything).
func appendAttend(dev *bridge.Device, w bridge.WriteBatch, a bridge.AttendBatch) error {
	return bridge.AppendAttend(dev, &w, a)
}

// Commit ends the step: the new tokens become part of their sequences, pages replaced by copy-on-write
// copies are dropped, and the eviction rules release the pages no future query can see (H2O: after
// adding the step's attention mass to each token's score and hiding, per layer and kv head, the lowest
// scored tokens over the budget; SnapKV: recording a prefill step's mass for the decision). Every layer
// must have run; otherwise Commit fails with ErrInvalid and the step stays open (run the missing layers,
// or Abort). After the step ended, Commit fails with ErrClosed.
func (st *Step) Commit() error {
	const op = "Step.Commit"
	if err := st.made(op); err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return newErr(op, ErrorClosed, "the step has ended (Commit or Abort was called)")
	}
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		st.done = true
		return newErr(op, ErrorClosed, "cache is closed")
	}
	var missing []int
	for li, ok := range st.ran {
		if !ok {
			missing = append(missing, li)
		}
	}
	if len(missing) > 0 {
		return newErr(op, ErrorInvalid, "layers %s did not run in this step (call Layer for each, or Abort)", joinInts(missing))
	}
	st.done = true
	for gi := range c.groups {
		g, sg := c.groups[gi], &st.groups[gi]
		for i, s := range st.seqs {
			s.tables[gi] = slices.Clone(sg.pageIDs[sg.pageIndptr[i]:sg.pageIndptr[i+1]])
		}
		for _, id := range sg.replaced {
			g.unref(id)
		}
	}
	for i, s := range st.seqs {
		s.length = int(st.kvLen[i])
		s.step = nil
		if st.tokens[i] == nil || s.untracked {
			s.untracked, s.tokens, s.chain = true, nil, make([][]pageKey, len(c.groups))
		} else {
			s.tokens = append(s.tokens, st.tokens[i]...)
			c.nameStepPagesLocked(s, int(st.startPos[i]))
		}
		for gi := range c.groups {
			c.evictLocked(s, gi)
		}
	}
	st.commitTokensLocked()
	st.commitQuestLocked()
	return nil
}

// Abort ends the step without adding its tokens: lengths and page tables stay as they were and the
// reserved pages are given back. It is a no-op once the step has ended.
//
// One case cannot be undone: in a KIVI layer that already ran, a sequence whose new tokens outnumbered
// the free rows of its residual ring (R + g rows) overwrote tokens the ring still needed. Abort then
// marks such sequences unusable (later calls on them fail with ErrInvalid; Release still works) and
// returns an ErrNotSupported error naming them, after ending the step.
func (st *Step) Abort() error {
	const op = "Step.Abort"
	if err := st.made(op); err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return nil
	}
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	st.done = true
	if c.closed {
		return nil
	}
	st.releaseFreshLocked()
	var lost []string
	for i, s := range st.seqs {
		s.step = nil
		for li, cl := range c.layers {
			if !st.stored[li] || !kiviRingClobbered(cl.format, int(st.startPos[i]), st.newTokens[i]) {
				continue
			}
			s.broken = fmt.Sprintf("an aborted step of %d tokens overwrote its KIVI residual ring in layer %d", st.newTokens[i], li)
			lost = append(lost, strconv.Itoa(s.id))
			break
		}
	}
	if len(lost) > 0 {
		return newErr(op, ErrorNotSupported, "sequences %s cannot be restored: their KIVI residual rings were overwritten by the aborted tokens; they are now unusable",
			joinStrings(lost))
	}
	return nil
}

// kiviRingClobbered reports whether appending t tokens to a KIVI sequence of n tokens overwrote ring rows
// that still held its tokens [QuantizedTokens(n), n): the ring has R + g rows, row = position % (R + g).
func kiviRingClobbered(f Format, n, t int) bool {
	if !f.Kind.IsKIVI() {
		return false
	}
	q := f.QuantizedTokens(n)
	return q < n && n+t-1-(f.Residual+f.Group) >= q
}

func itoa(x int) string { return strconv.Itoa(x) }

func joinStrings(xs []string) string {
	out := ""
	for i, x := range xs {
		if i > 0 {
			out += ","
		}
		out += x
	}
	return out
}
