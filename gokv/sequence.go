package gokv

import (
	"slices"

	"github.com/gokv/gokv/bridge"
)

// Sequence is one token sequence in a cache: its length and one page table per layer group. Tokens are
// appended by steps (Cache.Begin); Fork shares its pages copy-on-write, Truncate rolls it back, Release
// frees it.
//
// Thread-safety: methods may be called from many goroutines (the cache's mutex guards the state), but a
// sequence in an open step cannot be forked, truncated or released until the step ends.
type Sequence struct {
	c    *Cache
	id   int
	slot int32 // residual ring index in every KIVI layer's pool (and the MaxSequences count)

	// Guarded by c.mu.
	length  int
	tables  [][]int32 // per group: page id of each page index, -1 = released; len = ceil(slots(g)/P)
	evicted []int     // per group: page indices below this were already considered for eviction
	// Compaction (compact.go), per group: the positions compacted away (the group's slot of a token is
	// its position minus shift), and the length at the last compaction (Truncate cannot go below it).
	shift     []int
	compacted []int
	// Prefix reuse (prefix.go): the token ids, while every step gave them (untracked once one did not),
	// and per group the names of the full pages they fill.
	tokens    []int32
	untracked bool
	chain     [][]pageKey
	step      *Step         // the open step holding the sequence, or nil
	heads     [][]headState // token rules: per layer (nil for layers they do not govern), per kv head
	snapDone  bool          // SnapKV: the prefill is over and its decision made
	// questRead: per layer (nil for layers Quest does not govern), per kv head, the pages the last Quest
	// decode step read; nil before one
	questRead [][]int
	released  bool
	broken    string // why the sequence is unusable (an aborted KIVI step lost its ring), or ""
}

// NewSequence creates an empty sequence. It fails with ErrCapacity when MaxSequences sequences are live.
func (c *Cache) NewSequence() (*Sequence, error) {
	const op = "Cache.NewSequence"
	if err := c.made(op); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, newErr(op, ErrorClosed, "cache is closed")
	}
	if c.slotsAvailable() == 0 {
		return nil, &CapacityError{Op: op, Group: -1, Needed: 1, Free: 0, Total: c.opts.MaxSequences, Detail: "new sequence"}
	}
	return c.newSequenceLocked(), nil
}

// newSequenceLocked takes a slot and registers an empty sequence; c.mu is held and a slot is available.
func (c *Cache) newSequenceLocked() *Sequence {
	slot, _ := c.takeSlotLocked(-1)
	return c.registerSequenceLocked(slot)
}

// registerSequenceLocked registers an empty sequence in slot; c.mu is held.
func (c *Cache) registerSequenceLocked(slot int32) *Sequence {
	s := &Sequence{c: c, id: c.nextID, slot: slot, tables: make([][]int32, len(c.groups)), evicted: make([]int, len(c.groups)),
		shift: make([]int, len(c.groups)), compacted: make([]int, len(c.groups)), chain: make([][]pageKey, len(c.groups)),
		heads: c.newHeads()}
	c.nextID++
	c.seqs[s.id] = s
	return s
}

// slots returns how many slots the sequence fills in group gi's pages: its length, less what compaction
// removed (c.mu held).
func (s *Sequence) slots(gi int) int { return s.length - s.shift[gi] }

// ID returns the sequence's identifier, unique within its cache (-1 for a nil or zero Sequence).
func (s *Sequence) ID() int {
	if s == nil || s.c == nil {
		return -1
	}
	return s.id
}

// Len returns the number of tokens in the sequence (its next position), evicted ones included; 0 for a
// nil or zero Sequence.
func (s *Sequence) Len() int {
	if s == nil || s.c == nil {
		return 0
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.length
}

// made fails with ErrInvalid for a nil Sequence or one that did not come from its cache.
func (s *Sequence) made(op string) error {
	switch {
	case s == nil:
		return newErr(op, ErrorInvalid, "sequence is nil")
	case s.c == nil:
		return newErr(op, ErrorInvalid, "sequence was not created (a zero Sequence; create one with Cache.NewSequence or Fork)")
	}
	return nil
}

// usable reports why s cannot take part in an operation (c.mu held), or nil.
func (s *Sequence) usable(op string) error {
	switch {
	case s.c.closed:
		return newErr(op, ErrorClosed, "cache is closed")
	case s.released:
		return newErr(op, ErrorClosed, "sequence %d was released", s.id)
	case s.broken != "":
		return newErr(op, ErrorInvalid, "sequence %d is unusable: %s; release it", s.id, s.broken)
	case s.step != nil:
		return newErr(op, ErrorInvalid, "sequence %d is in an open step; Commit or Abort it first", s.id)
	}
	return nil
}

// Fork returns a new sequence with the same tokens. The two share their pages copy-on-write: a step that
// appends into a shared page first copies it, so neither sees the other's new tokens. KIVI residual rings
// are copied (one native copy per KIVI layer). Under H2O or SnapKV the child starts with the parent's
// per-kv-head visibility and scores and then decides on its own; a page the two share is freed only when
// both released it (visibility.go). Fails with ErrCapacity when MaxSequences are live.
func (s *Sequence) Fork() (*Sequence, error) {
	const op = "Sequence.Fork"
	if err := s.made(op); err != nil {
		return nil, err
	}
	c := s.c
	c.life.RLock()
	defer c.life.RUnlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := s.usable(op); err != nil {
		return nil, err
	}
	if c.slotsAvailable() == 0 {
		return nil, &CapacityError{Op: op, Group: -1, Needed: 1, Free: 0, Total: c.opts.MaxSequences,
			Detail: "fork of sequence " + itoa(s.id)}
	}
	child := c.newSequenceLocked()
	if s.length > 0 && c.hasKIVI {
		for _, cl := range c.layers {
			if !cl.format.Kind.IsKIVI() {
				continue
			}
			err := cl.pool.Copy(bridge.CopyBatch{SrcSlots: []int32{s.slot}, DstSlots: []int32{child.slot}})
			if err != nil {
				c.slots = append(c.slots, child.slot)
				c.dropSequenceLocked(child)
				return nil, wrapErr(op, "layer "+itoa(cl.index)+": copying the residual ring of sequence "+itoa(s.id), err)
			}
		}
	}
	child.length = s.length
	for gi, g := range c.groups {
		child.tables[gi] = slices.Clone(s.tables[gi])
		for _, id := range child.tables[gi] {
			if id >= 0 {
				g.refs[id]++
			}
		}
	}
	copy(child.evicted, s.evicted)
	copy(child.shift, s.shift)
	copy(child.compacted, s.compacted)
	child.tokens, child.untracked = slices.Clone(s.tokens), s.untracked
	for gi := range s.chain {
		child.chain[gi] = slices.Clone(s.chain[gi])
	}
	// Token rules: the child starts from the parent's visibility and scores, then decides on its own.
	child.heads, child.snapDone = cloneHeads(s.heads), s.snapDone
	if s.questRead != nil {
		child.questRead = make([][]int, len(s.questRead))
		for l, r := range s.questRead {
			child.questRead[l] = slices.Clone(r)
		}
	}
	return child, nil
}

// Truncate rolls the sequence back to its first n tokens (0 <= n <= Len), e.g. to drop rejected
// speculative tokens, and frees the pages past them. It fails with ErrNotSupported, changing nothing,
// when the tokens the shorter sequence would see again were evicted (H2O: its recent window; H2O and
// SnapKV: the page its next token goes into was released, or n is below the length at which the
// sequence was last compacted), or in a KIVI layer when the
// rollback crosses a quantization boundary: a KIVI sequence can only drop tokens while its quantized
// prefix stays the same (Format.QuantizedTokens(n) == Format.QuantizedTokens(Len)), i.e. the tokens
// appended since its residual ring last flushed a group.
func (s *Sequence) Truncate(n int) error {
	const op = "Sequence.Truncate"
	if err := s.made(op); err != nil {
		return err
	}
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := s.usable(op); err != nil {
		return err
	}
	if n < 0 || n > s.length {
		return newErr(op, ErrorRange, "sequence %d: n = %d is outside [0, %d]", s.id, n, s.length)
	}
	if n == s.length {
		return nil
	}
	for _, cl := range c.layers {
		f := cl.format
		if f.Kind.IsKIVI() && f.QuantizedTokens(n) != f.QuantizedTokens(s.length) {
			return newErr(op, ErrorNotSupported, "sequence %d, layer %d (%s): tokens [%d, %d) are already quantized; a KIVI sequence of %d tokens can be truncated to no fewer than %d",
				s.id, cl.index, f, f.QuantizedTokens(n), f.QuantizedTokens(s.length), s.length, kiviMinTruncate(f, s.length))
		}
	}
	for gi, g := range c.groups {
		if n < s.compacted[gi] {
			return newErr(op, ErrorNotSupported, "sequence %d: layer group %d (layers %s) was compacted when the sequence had %d tokens; it can be truncated to no fewer",
				s.id, gi, joinInts(g.layers), s.compacted[gi])
		}
	}
	if err := c.truncateTokensLocked(s, n, false); err != nil {
		return newErr(op, ErrorNotSupported, "sequence %d: %v", s.id, err)
	}
	P := c.pageSize
	for gi, g := range c.groups {
		if g.rule.window == 0 {
			continue
		}
		// The next query (position n) sees the sinks and positions in (n - window, n).
		lo := max(0, n-g.rule.window+1)
		for j := lo / P; j < ceilDiv(n, P); j++ {
			if s.tables[gi][j] < 0 {
				return newErr(op, ErrorNotSupported, "sequence %d: layer group %d (layers %s) already evicted page %d (tokens [%d, %d)), which the window of a %d-token sequence needs",
					s.id, gi, joinInts(g.layers), j, j*P, (j+1)*P, n)
			}
		}
	}
	for gi, g := range c.groups {
		keep := ceilDiv(n-s.shift[gi], P)
		for _, id := range s.tables[gi][keep:] {
			g.unref(id)
		}
		s.tables[gi] = s.tables[gi][:keep:keep]
		s.evicted[gi] = min(s.evicted[gi], keep)
	}
	_ = c.truncateTokensLocked(s, n, true)
	c.dropOverwrittenNamesLocked(s, n)
	s.length = n
	return nil
}

// kiviMinTruncate returns the shortest length a KIVI sequence of n tokens can be truncated to.
func kiviMinTruncate(f Format, n int) int {
	q := f.QuantizedTokens(n)
	m := n
	for m > 0 && f.QuantizedTokens(m-1) == q {
		m--
	}
	return m
}

// Release frees the sequence's pages (those it shares stay with the other holders) and its slot. It is
// idempotent, and a no-op after the cache was closed. It fails with ErrInvalid while the sequence is in
// an open step.
func (s *Sequence) Release() error {
	const op = "Sequence.Release"
	if err := s.made(op); err != nil {
		return err
	}
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.released || c.closed {
		return nil
	}
	if s.step != nil {
		return newErr(op, ErrorInvalid, "sequence %d is in an open step; Commit or Abort it first", s.id)
	}
	if !c.keepRingLocked(s) {
		c.slots = append(c.slots, s.slot)
	}
	c.dropSequenceLocked(s)
	return nil
}

// dropSequenceLocked drops s's pages (named ones stay cached) and unregisters it; the caller gives its
// slot back (or keeps it as a cached ring); c.mu is held.
func (c *Cache) dropSequenceLocked(s *Sequence) {
	for gi, g := range c.groups {
		for _, id := range s.tables[gi] {
			g.unref(id)
		}
		s.tables[gi] = nil
	}
	delete(c.seqs, s.id)
	s.released = true
}

// evictLocked releases the pages of s that no future query of group gi can see; c.mu is held.
func (c *Cache) evictLocked(s *Sequence, gi int) {
	g := c.groups[gi]
	n := s.slots(gi) // windowed groups are never compacted: slots are positions
	from, to := evictablePages(g.rule, n, g.quantLimit(n), c.pageSize)
	table := s.tables[gi]
	for j := max(from, s.evicted[gi]); j < to; j++ {
		g.unref(table[j])
		table[j] = -1
	}
	if to > s.evicted[gi] {
		s.evicted[gi] = to
	}
}
