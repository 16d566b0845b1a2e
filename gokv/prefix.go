package gokv

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/gokv/gokv/bridge"
)

// Prefix reuse (docs/architecture.md §6): pages named by their content, so that a new sequence starts
// from the longest prefix of its prompt that the cache still holds.
//
//   - Names. A page of a layer group that holds c tokens in every layer of the group (all P of a full page,
//     or the first c of the sequence's last page) is named by a SHA-256 chained over the previous full
//     page's name, the group's salt (model, layers, formats, page size, window rule) and the c token ids:
//     equal names mean equal bytes, as the same tokens at the same positions store the same rows. Names
//     are given at Commit to the pages a step filled, for sequences whose token ids the cache knows (every
//     step gave StepEntry.Tokens, or the sequence came from NewSequenceFrom).
//   - Cached pages. A named page that no sequence holds any more is not freed but cached, least recently
//     released first out: allocation takes free pages first and then the oldest cached page (dropping its
//     name), and every capacity check counts cached pages as free, so reuse never causes an ErrCapacity
//     that would not happen without it.
//   - What is never reused: pages after a compaction (their slots are not positions), partial pages of
//     Quest caches (a page's key bounds cover every token written to it), and a page about to be written
//     in place after a Truncate (its name is dropped).
//   - KIVI. A KIVI sequence's newest tokens live in its fp16 residual ring, not in pages, and the ring
//     cannot be rebuilt from quantized pages. So a KIVI cache reuses only a prefix whose ring it kept: when
//     a sequence with known tokens is released, its residual slot (one ring per KIVI layer) stays as a
//     cached ring, named by all its tokens, until a new sequence needs the slot (oldest first). A new
//     sequence reuses m tokens of it when its prompt starts with the ring's tokens, or with enough of them
//     that dropping the rest only drops ring rows (Format.QuantizedTokens(m) is unchanged).
//   - Exactness. The reused pages and rings are the bytes a cold prefill of the same tokens would have
//     stored, so attention outputs are identical. Under H2O a reused sequence starts with no hidden token
//     and no accumulated mass; SnapKV reuses at most len - Window tokens, so its observation window is
//     always computed, and decides as a cold prefill would.

// pageKey is a page's name.
type pageKey [sha256.Size]byte

// pageIndex is one layer group's names and cached pages (c.mu held for everything).
type pageIndex struct {
	salt  pageKey
	byKey map[pageKey]int32
	// Per page id, two names: [0] the first one given (a partial page keeps the name of the prompt that
	// first filled it, e.g. a shared system prompt's end), [1] the latest; count: the tokens a name
	// covers, 0 for none. The first count tokens of a page never change while it lives, so both stay true.
	key   [][2]pageKey
	count [][2]int32
	// cached pages (named, no holder): a doubly linked list by page id, oldest at tail
	prev, next []int32
	head, tail int32
	cached     int
	partial    bool // partial pages may be named (not in Quest groups)
}

func newPageIndex(salt pageKey, pages int, partial bool) pageIndex {
	ix := pageIndex{salt: salt, byKey: map[pageKey]int32{}, key: make([][2]pageKey, pages), count: make([][2]int32, pages),
		prev: make([]int32, pages), next: make([]int32, pages), head: -1, tail: -1, partial: partial}
	return ix
}

// name returns the name of c tokens toks following the full page named prev (zero for page 0).
func (ix *pageIndex) name(prev pageKey, toks []int32) pageKey {
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(toks)))
	return hashTokens(toks, ix.salt[:], prev[:], n[:])
}

// hashTokens is the SHA-256 of the prefix parts, then the token ids as little-endian uint32s.
func hashTokens(toks []int32, prefix ...[]byte) pageKey {
	h := sha256.New()
	for _, p := range prefix {
		h.Write(p)
	}
	buf := make([]byte, 0, 4*min(len(toks), 1024))
	for len(toks) > 0 {
		n := min(len(toks), 1024)
		buf = buf[:0]
		for _, t := range toks[:n] {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
		}
		h.Write(buf)
		toks = toks[n:]
	}
	var k pageKey
	h.Sum(k[:0])
	return k
}

// named reports whether page id has a name.
func (ix *pageIndex) named(id int32) bool { return ix.count[id][0] > 0 || ix.count[id][1] > 0 }

// setName gives page id a name: its first if it has none, else its latest (a name another page already
// has stays with that page).
func (ix *pageIndex) setName(id int32, k pageKey, count int) {
	for i := range 2 {
		if ix.count[id][i] > 0 && ix.key[id][i] == k {
			return
		}
	}
	if other, ok := ix.byKey[k]; ok && other != id {
		return
	}
	i := 1
	if ix.count[id][0] == 0 {
		i = 0
	}
	ix.forget(id, i)
	ix.byKey[k], ix.key[id][i], ix.count[id][i] = id, k, int32(count)
}

// forget drops name i of page id.
func (ix *pageIndex) forget(id int32, i int) {
	if ix.count[id][i] == 0 {
		return
	}
	if ix.byKey[ix.key[id][i]] == id {
		delete(ix.byKey, ix.key[id][i])
	}
	ix.count[id][i] = 0
}

// dropName forgets page id's names (the caller moves a cached page to the free list).
func (ix *pageIndex) dropName(id int32) {
	ix.forget(id, 0)
	ix.forget(id, 1)
}

// pushCached puts a named page without holders at the head (newest) of the cached list.
func (ix *pageIndex) pushCached(id int32) {
	ix.prev[id], ix.next[id] = -1, ix.head
	if ix.head >= 0 {
		ix.prev[ix.head] = id
	}
	ix.head = id
	if ix.tail < 0 {
		ix.tail = id
	}
	ix.cached++
}

// removeCached takes page id out of the cached list.
func (ix *pageIndex) removeCached(id int32) {
	p, n := ix.prev[id], ix.next[id]
	if p >= 0 {
		ix.next[p] = n
	} else {
		ix.head = n
	}
	if n >= 0 {
		ix.prev[n] = p
	} else {
		ix.tail = p
	}
	ix.cached--
}

// groupSalt names a layer group's storage: what makes its bytes differ for the same tokens.
func (c *Cache) groupSalt(g *layerGroup) pageKey {
	h := sha256.New()
	fmt.Fprintf(h, "gokv pages v1\x00model %s\x00page %d\x00window %d sinks %d\x00", c.spec.Name, c.pageSize, g.rule.window, g.rule.sinks)
	for _, l := range g.layers {
		cl := c.layers[l]
		fmt.Fprintf(h, "layer %d %s %s scale %g\x00", l, cl.spec, cl.format, cl.scale)
	}
	var k pageKey
	h.Sum(k[:0])
	return k
}

// ---- the page allocator with cached pages (c.mu held) ----

// available returns the pages an allocation may take: free and cached.
func (g *layerGroup) available() int { return len(g.free) + g.names.cached }

// ref adds a holder to page id (taking it out of the cached list if it had none).
func (g *layerGroup) ref(id int32) {
	if g.refs[id] == 0 {
		g.names.removeCached(id)
	}
	g.refs[id]++
}

// ---- names given at Commit ----

// tokenKnown reports whether the cache knows every token id of s.
func (s *Sequence) tokenKnown() bool { return !s.untracked }

// chainTo extends s's full-page names in group gi to cover the first n full pages its tokens fill.
func (c *Cache) chainTo(s *Sequence, gi, n int) []pageKey {
	g, P := c.groups[gi], c.pageSize
	ch := s.chain[gi]
	for len(ch) < n && (len(ch)+1)*P <= len(s.tokens) {
		var prev pageKey
		if len(ch) > 0 {
			prev = ch[len(ch)-1]
		}
		j := len(ch)
		ch = append(ch, g.names.name(prev, s.tokens[j*P:(j+1)*P]))
	}
	s.chain[gi] = ch
	return ch
}

// nameStepPagesLocked names the pages of s that a step starting at position from filled (c.mu held,
// length and tables updated, before the window releases its pages).
func (c *Cache) nameStepPagesLocked(s *Sequence, from int) {
	if !s.tokenKnown() {
		return
	}
	P := c.pageSize
	for gi, g := range c.groups {
		if s.shift[gi] != 0 {
			continue
		}
		lim := g.quantLimit(s.length) // tokens in pages in every layer of the group
		lo := g.quantLimit(from) / P
		ch := c.chainTo(s, gi, lim/P)
		table := s.tables[gi]
		for j := lo; j*P < lim && j < len(table); j++ {
			id := table[j]
			if id < 0 {
				continue
			}
			n := min(P, lim-j*P)
			if n == P {
				g.names.setName(id, ch[j], P)
				continue
			}
			if !g.names.partial {
				continue
			}
			var prev pageKey
			if j > 0 {
				prev = ch[j-1]
			}
			g.names.setName(id, g.names.name(prev, s.tokens[j*P:j*P+n]), n)
		}
	}
}

// dropOverwrittenNamesLocked forgets the names that cover more than Truncate(n) keeps of the pages s alone
// holds (its next step writes into them in place), naming the kept tokens instead; c.mu held, before
// s.length changes.
func (c *Cache) dropOverwrittenNamesLocked(s *Sequence, n int) {
	P := c.pageSize
	for gi, g := range c.groups {
		m := n - s.shift[gi]
		if len(s.chain[gi]) > m/P {
			s.chain[gi] = s.chain[gi][:m/P]
		}
		for j := m / P; j < len(s.tables[gi]); j++ {
			id := s.tables[gi][j]
			if id < 0 || g.refs[id] != 1 {
				continue
			}
			for i := range 2 {
				if int(g.names.count[id][i]) > m-j*P {
					g.names.forget(id, i)
				}
			}
			if kept := g.quantLimit(m) - j*P; j == m/P && kept > 0 && s.tokenKnown() && s.shift[gi] == 0 && g.names.partial {
				var prev pageKey
				if j > 0 {
					prev = c.chainTo(s, gi, j)[j-1]
				}
				g.names.setName(id, g.names.name(prev, s.tokens[j*P:j*P+kept]), kept)
			}
		}
	}
	if len(s.tokens) > n {
		s.tokens = s.tokens[:n]
	}
}

// ---- cached rings (KIVI) ----

// cachedRing is a released KIVI sequence's residual slot, kept for reuse.
type cachedRing struct {
	slot   int32
	length int
	name   pageKey // of its tokens
}

// ringName names a token sequence for the cached rings.
func (c *Cache) ringName(toks []int32) pageKey { return hashTokens(toks, c.ringSalt[:]) }

// takeSlotLocked takes a free sequence slot, or the oldest cached ring's but `keep`'s; false if none.
func (c *Cache) takeSlotLocked(keep int32) (int32, bool) {
	if len(c.slots) == 0 {
		for i, r := range c.rings { // oldest first
			if r.slot != keep {
				c.rings = slices.Delete(c.rings, i, i+1)
				c.slots = append(c.slots, r.slot)
				break
			}
		}
	}
	if len(c.slots) == 0 {
		return -1, false
	}
	slot := c.slots[len(c.slots)-1]
	c.slots = c.slots[:len(c.slots)-1]
	return slot, true
}

// slotsAvailable returns how many sequences may still be created: free slots and cached rings.
func (c *Cache) slotsAvailable() int { return len(c.slots) + len(c.rings) }

// keepRingLocked keeps a released sequence's residual slot as a cached ring (KIVI caches with known
// tokens); false when the slot should be freed.
func (c *Cache) keepRingLocked(s *Sequence) bool {
	if !c.hasKIVI || !s.tokenKnown() || s.length == 0 || s.broken != "" || len(s.tokens) != s.length {
		return false
	}
	c.rings = append(c.rings, cachedRing{slot: s.slot, length: s.length, name: c.ringName(s.tokens)})
	return true
}

// ---- reuse ----

// NewSequenceFrom creates a sequence for a prompt of token ids, starting from the longest prefix of them
// whose pages (and, for KIVI, residual ring) the cache still holds: it returns the sequence, already
// holding those `reused` tokens, and the engine prefills tokens[reused:] (passing them as
// StepEntry.Tokens, so that later prompts can reuse them in turn). At most len(tokens) - 1 tokens are
// reused (the last token's logits are always computed; SnapKV: len(tokens) - Window, so its observation
// window is). The shared pages are copy-on-write; the reused tokens' outputs and bytes are those of a cold
// prefill. It fails with ErrCapacity when MaxSequences sequences are live, like NewSequence; reuse itself
// never fails for lack of pages (it reuses less).
func (c *Cache) NewSequenceFrom(tokens []int32) (*Sequence, int, error) {
	const op = "Cache.NewSequenceFrom"
	if err := c.made(op); err != nil {
		return nil, 0, err
	}
	if len(tokens) > math.MaxInt32 {
		return nil, 0, newErr(op, ErrorInvalid, "%d tokens exceed the ABI's 2^31-1 positions", len(tokens))
	}
	c.life.RLock()
	defer c.life.RUnlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, 0, newErr(op, ErrorClosed, "cache is closed")
	}
	if c.slotsAvailable() == 0 {
		return nil, 0, &CapacityError{Op: op, Group: -1, Needed: 1, Free: 0, Total: c.opts.MaxSequences, Detail: "new sequence"}
	}
	upper := len(tokens) - 1
	if c.tokens != nil && c.tokens.kind == ruleSnapKV {
		upper = len(tokens) - c.tokens.protect
	}
	m, ring := c.reusableLocked(tokens, upper)
	s, err := c.adoptLocked(tokens, m, ring)
	if err != nil {
		return nil, 0, wrapErr(op, "", err)
	}
	return s, s.length, nil
}

// reuseProbe is a prompt's view of one group's names.
type reuseProbe struct {
	chain []pageKey // names of the prompt's full pages
	// page j's id and how many of the prompt's tokens it holds (full pages: P), -1 when absent
	id    []int32
	count []int
}

// probe looks up the prompt's pages in group g: full pages by name, and by their best partial name the
// two pages a reused prefix can end in: the first page without a full name, and the last the prompt reaches
// (a windowed group may have lost older pages). A partial lookup hashes up to P-1 candidate counts.
func (c *Cache) probe(g *layerGroup, tokens []int32, upper int) reuseProbe {
	P := c.pageSize
	n := ceilDiv(max(upper, 0), P)
	pr := reuseProbe{id: make([]int32, n), count: make([]int, n)}
	var prev pageKey
	firstMissing := -1
	for j := 0; j < n; j++ {
		pr.id[j] = -1
		if (j+1)*P <= len(tokens) {
			k := g.names.name(prev, tokens[j*P:(j+1)*P])
			pr.chain = append(pr.chain, k)
			prev = k
			if id, ok := g.names.byKey[k]; ok {
				pr.id[j], pr.count[j] = id, P
				continue
			}
		}
		if firstMissing < 0 {
			firstMissing = j
		}
	}
	if !g.names.partial {
		return pr
	}
	for _, j := range []int{firstMissing, n - 1} {
		if j < 0 || pr.id[j] >= 0 {
			continue
		}
		var before pageKey
		if j > 0 {
			before = pr.chain[j-1]
		}
		for cnt := min(P-1, len(tokens)-j*P); cnt >= 1; cnt-- {
			if id, ok := g.names.byKey[g.names.name(before, tokens[j*P:j*P+cnt])]; ok {
				pr.id[j], pr.count[j] = id, cnt
				break
			}
		}
	}
	return pr
}

// groupHolds reports whether group g's probe gives every page a sequence of m tokens needs there.
func (c *Cache) groupHolds(g *layerGroup, pr reuseProbe, m int) bool {
	P := c.pageSize
	need := m // tokens the group keeps in pages
	if len(g.kivi) > 0 {
		need = g.quantLimit(m)
		if g.plain {
			need = m
		}
	}
	from, to := 0, 0
	if g.rule.window > 0 {
		from, to = evictablePages(g.rule, m, g.quantLimit(m), P)
	}
	for j := 0; j*P < need; j++ {
		if j >= from && j < to {
			continue // released by the window at length m
		}
		if j >= len(pr.id) || pr.id[j] < 0 || pr.count[j] < min(P, need-j*P) {
			return false
		}
	}
	return true
}

// reusableLocked finds the longest reusable prefix m <= upper of tokens, and for KIVI caches the cached
// ring (index into c.rings) it needs (-1 if none).
func (c *Cache) reusableLocked(tokens []int32, upper int) (int, int) {
	if upper <= 0 {
		return 0, -1
	}
	probes := make([]reuseProbe, len(c.groups))
	for gi, g := range c.groups {
		probes[gi] = c.probe(g, tokens, upper)
	}
	holds := func(m int) bool {
		for gi, g := range c.groups {
			if !c.groupHolds(g, probes[gi], m) {
				return false
			}
		}
		return true
	}
	if c.hasKIVI {
		best, ring := 0, -1
		for i, r := range c.rings {
			if r.length > len(tokens) || c.ringName(tokens[:r.length]) != r.name {
				continue
			}
			for m := min(r.length, upper); m > best && c.kiviTruncates(r.length, m); m-- {
				if holds(m) {
					best, ring = m, i
					break
				}
			}
		}
		return best, ring
	}
	// Without KIVI, full-attention groups hold a prefix-closed set; windowed groups are checked at the
	// candidates near the top (their needed pages move with m).
	P := c.pageSize
	for m, tries := upper, 0; m > 0 && tries < 4*P; m, tries = m-1, tries+1 {
		if holds(m) {
			return m, -1
		}
	}
	for m := (upper - 4*P) / P * P; m > 0; m -= P {
		if holds(m) {
			return m, -1
		}
	}
	return 0, -1
}

// kiviTruncates reports whether a KIVI sequence of n tokens can be cut to m by dropping ring rows only.
func (c *Cache) kiviTruncates(n, m int) bool {
	for _, cl := range c.layers {
		if f := cl.format; f.Kind.IsKIVI() && f.QuantizedTokens(m) != f.QuantizedTokens(n) {
			return false
		}
	}
	return true
}

// adoptLocked creates the sequence of the prompt's first m tokens from the cache's pages (and cached ring
// `ring`); with m == 0, or when the pages for its unwritten KIVI tail are missing, an empty sequence.
func (c *Cache) adoptLocked(tokens []int32, m, ring int) (*Sequence, error) {
	P := c.pageSize
	// Pages: reused ones by name, fresh ones for a KIVI group's tokens still in the ring.
	tables := make([][]int32, len(c.groups))
	if m > 0 {
		for gi, g := range c.groups {
			pr := c.probe(g, tokens, m)
			fromLRU, fresh := 0, 0
			from, to := 0, 0
			if g.rule.window > 0 {
				from, to = evictablePages(g.rule, m, g.quantLimit(m), P)
			}
			t := make([]int32, ceilDiv(m, P))
			for j := range t {
				switch {
				case j >= from && j < to:
					t[j] = -1
				case j < len(pr.id) && pr.id[j] >= 0 && (j*P < g.quantLimit(m) || g.plain):
					t[j] = pr.id[j]
					if g.refs[t[j]] == 0 {
						fromLRU++
					}
				default:
					t[j] = -2 // fresh
					fresh++
				}
			}
			if fresh > g.available()-fromLRU {
				m = 0
				break
			}
			tables[gi] = t
		}
	}
	keep := int32(-1)
	if m > 0 && ring >= 0 {
		keep = c.rings[ring].slot
	}
	slot, ok := c.takeSlotLocked(keep)
	if !ok { // the one cached ring left is the one to reuse: take it over
		r := c.rings[ring]
		c.rings = slices.Delete(c.rings, ring, ring+1)
		slot, ring = r.slot, -1
	}
	s := c.registerSequenceLocked(slot)
	s.tokens = slices.Clone(tokens[:m])
	if m == 0 {
		return s, nil
	}
	for gi, g := range c.groups {
		for j, id := range tables[gi] {
			switch {
			case id >= 0:
				g.ref(id)
			case id == -2:
				tables[gi][j] = g.alloc()
			}
		}
		s.tables[gi] = tables[gi]
	}
	s.length = m
	if ring >= 0 {
		src := c.rings[ring].slot
		for _, cl := range c.layers {
			if !cl.format.Kind.IsKIVI() {
				continue
			}
			if err := cl.pool.Copy(bridge.CopyBatch{SrcSlots: []int32{src}, DstSlots: []int32{slot}}); err != nil {
				c.slots = append(c.slots, s.slot)
				c.dropSequenceLocked(s)
				return nil, wrapErr("", fmt.Sprintf("layer %d: copying a cached residual ring", cl.index), err)
			}
		}
		// the ring is the newest again
		r := c.rings[ring]
		c.rings = append(slices.Delete(c.rings, ring, ring+1), r)
	}
	for gi := range c.groups {
		c.evictLocked(s, gi)
	}
	return s, nil
}
