package gokv

import (
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/rs/zerolog"

	"github.com/gokv/gokv/bridge"
)

// CacheOptions configures Engine.NewCache.
type CacheOptions struct {
	// Format is the storage format of every layer without an entry in LayerFormats. The zero value is
	// f32; most callers want F16 or a quantized format.
	Format Format
	// LayerFormats overrides Format per layer (key: layer index), e.g. q8 for the first and last layers.
	LayerFormats map[int]Format
	// PageSize is P, tokens per page: a multiple of 8 in [8, 1024] and of the group size of every KIVI
	// format in use; 0 means 64.
	PageSize int
	// MaxTokens is the capacity in tokens of each layer group, over all live sequences: a full-attention
	// group gets ceil(MaxTokens / PageSize) pages. Required, > 0. Pages are whole, so sequences whose
	// last pages are partly filled hold fewer tokens in total.
	MaxTokens int
	// MaxSequences is the number of live sequences (forks included); each has one residual ring per KIVI
	// layer. 0 means 64.
	MaxSequences int
	// MaxStepTokens sizes the windowed groups (sliding-window layers, and every layer under a SinkWindow):
	// such a group gets MaxSequences times the pages of one window (plus sinks and a partial page) plus
	// the pages of MaxStepTokens new tokens, when that is less than the MaxTokens sizing. It counts the
	// new tokens of one step over all its sequences (a batched prefill of K prompts of P tokens adds
	// K·P): a step that appends more may fail with ErrCapacity when the cache is nearly full; split long
	// prefills into chunks. 0 means 2048.
	MaxStepTokens int
	// Eviction is the eviction policy of the full-attention layers, e.g. &SinkWindow{Sinks: 4, Window:
	// 4096}, H2O{Budget: 512, Recent: 64}, SnapKV{Budget: 1024, Window: 32} or Quest{Pages: 16, Recent:
	// 64}; nil keeps everything (Full). The policy is copied. H2O and SnapKV need a device with attention
	// mass output and per-kv-head masks (DeviceCaps.Mass, KVHeadMasks); Quest needs DeviceCaps.Quest.
	Eviction EvictionPolicy
	// Scale is the attention scale α; 0 means 1/sqrt(HeadDimK) of each layer. MLA callers, whose query
	// heads are absorbed, pass their model's own scale.
	Scale float32
	// SinkLogits gives the learned sink logits σ_h (gpt-oss) of layers with LearnedSinks, by layer index:
	// [HeadsQ] finite values each, copied. Layers left out must get theirs from Cache.SetSinkLogits before
	// their first step; an entry for a layer without LearnedSinks is an error.
	SinkLogits map[int][]float32
}

// The defaults of CacheOptions.
const (
	DefaultPageSize      = 64
	DefaultMaxSequences  = 64
	DefaultMaxStepTokens = 2048
)

// Cache is a paged, compressed KV cache for one model on one engine: a native page pool per layer (in
// the layer's format), page tables and refcounts per layer group, and the sequences that live in it.
//
// Layer groups: layers with the same page-table behaviour (full attention, or the same window and sink
// count, see SinkWindow and LayerSpec.Window) share one page allocator, and each sequence has one page
// table per group; every layer of a group stores the same token in the same page id of its own pool.
//
// Thread-safety: every method of Cache, Sequence and Step may be called from many goroutines. A mutex
// guards the control plane (page tables, refcounts, lengths); it is held only for bookkeeping and for
// the rare native copies of Begin (copy-on-write) and Fork (KIVI rings). Step.Layer does not hold it
// during its native call: the pages a step writes belong to its own sequences only (shared pages are
// copied first), so steps on different sequences run their native calls concurrently. Close waits for
// native calls in flight (an RWMutex held shared by each of them).
type Cache struct {
	eng      *Engine
	spec     ModelSpec
	opts     CacheOptions // defaulted
	pageSize int
	groups   []*layerGroup
	layers   []*cacheLayer
	hasKIVI  bool
	tokens   *tokenRule // H2O or SnapKV (visibility.go), nil for Full and SinkWindow
	quest    *Quest     // Quest (quest.go), nil otherwise
	// noCompact: the backend cannot move rows (no raw-page slots), so token rules keep holes (compact.go);
	// under mu
	noCompact bool
	// onCompact, when set (tests), sees each compaction before the state moves: the survivors (slots) of
	// each (layer of the group, kv head), the compacted length and the sinks
	onCompact func(s *Sequence, gi int, keep [][][]int, V, sinks int)
	// rings: released KIVI sequences' residual slots kept for prefix reuse, oldest first (prefix.go)
	rings    []cachedRing
	ringSalt pageKey

	// life is held shared by every native call on the pools, exclusively by Close. closed is written
	// under both life and mu, so either lock makes reading it safe.
	life   sync.RWMutex
	mu     sync.Mutex // the control plane: everything below, and the groups' allocators
	closed bool
	seqs   map[int]*Sequence
	nextID int
	slots  []int32 // free sequence slots (KIVI residual ring index), a stack
}

// layerGroup is the page allocator shared by the layers with one groupRule.
type layerGroup struct {
	index  int
	rule   groupRule
	layers []int
	kivi   []Format  // the KIVI formats among its layers: they delay eviction and widen writes
	plain  bool      // some layer of the group has a non-KIVI format (writes the new tokens' pages)
	pages  int       // capacity
	refs   []int32   // refcount per page id: sequences (and open steps) holding it
	free   []int32   // free page ids, a stack (lowest id on top)
	names  pageIndex // page names and cached pages (prefix.go)
}

// cacheLayer is one layer's storage.
type cacheLayer struct {
	index     int
	spec      LayerSpec
	format    Format
	group     *layerGroup
	pool      *bridge.Pool
	scale     float32
	sinks     []float32 // learned sink logits [HeadsQ], replaced (never mutated) by SetSinkLogits; under mu
	pageBytes uint64
	slotBytes uint64
	// boundsBytes: the key bounds kept beside each page (Quest layers), 0 otherwise
	boundsBytes uint64
}

// NewCache creates a cache for spec on the engine. spec is copied. Per layer, the format must fit the
// layer (Format.Validate), and the device must support it; the layer groups are sized from opts (see
// CacheOptions). The caller must Close the cache (closing the engine also closes it).
//
// Errors: ErrInvalid for a bad spec or option (naming the layer and field), ErrNotSupported for a format
// or attention feature the device lacks, ErrOutOfMemory when the pools do not fit, ErrClosed after the
// engine was closed.
func (e *Engine) NewCache(spec ModelSpec, opts CacheOptions) (*Cache, error) {
	const op = "NewCache"
	if err := e.check(op); err != nil {
		return nil, err
	}
	if err := spec.Validate(); err != nil {
		return nil, &Error{Op: op, Code: ErrorInvalid, Msg: err.Error()}
	}
	spec = spec.Clone()
	if err := defaultCacheOptions(&opts); err != nil {
		return nil, &Error{Op: op, Code: ErrorInvalid, Msg: err.Error()}
	}
	if err := checkLayerFormatKeys(spec, opts.LayerFormats); err != nil {
		return nil, &Error{Op: op, Code: ErrorInvalid, Msg: err.Error()}
	}
	c := &Cache{eng: e, spec: spec, opts: opts, pageSize: opts.PageSize, seqs: make(map[int]*Sequence)}
	if rule, _ := resolveEviction(opts.Eviction); rule.tokens != nil {
		if err := rule.tokens.check(spec.SinkTokens); err != nil {
			return nil, &Error{Op: op, Code: ErrorInvalid, Msg: err.Error()}
		}
		c.tokens = rule.tokens
	} else if rule.quest != nil {
		c.quest = rule.quest
	}

	// Formats and device support, layer by layer.
	for i, l := range spec.Layers {
		f := opts.Format
		if o, ok := opts.LayerFormats[i]; ok {
			f = o
		}
		if err := c.checkLayer(i, l, f); err != nil {
			return nil, err
		}
		scale := opts.Scale
		if scale == 0 {
			scale = float32(1 / math.Sqrt(float64(l.HeadDimK)))
		}
		c.layers = append(c.layers, &cacheLayer{index: i, spec: l, format: f, scale: scale})
		c.hasKIVI = c.hasKIVI || f.Kind.IsKIVI()
	}

	// Layer groups by rule, in order of first appearance.
	for i, cl := range c.layers {
		r := layerRule(spec, cl.spec, c.window())
		var g *layerGroup
		for _, x := range c.groups {
			if x.rule == r {
				g = x
			}
		}
		if g == nil {
			g = &layerGroup{index: len(c.groups), rule: r}
			c.groups = append(c.groups, g)
		}
		g.layers = append(g.layers, i)
		if !cl.format.Kind.IsKIVI() {
			g.plain = true
		} else if !slices.Contains(g.kivi, cl.format) {
			g.kivi = append(g.kivi, cl.format)
		}
		cl.group = g
	}
	for _, g := range c.groups {
		g.pages = ceilDiv(opts.MaxTokens, c.pageSize)
		ring := 0
		for _, f := range g.kivi {
			ring = max(ring, f.Residual+f.Group)
		}
		if b := boundedGroupPages(g.rule, ring, c.pageSize, opts.MaxSequences, opts.MaxStepTokens); b > 0 && b < g.pages {
			g.pages = b
		}
		if g.pages > math.MaxInt32 {
			return nil, newErr(op, ErrorInvalid, "layer group %d needs %d pages, more than the ABI's 2^31-1 (lower MaxTokens or raise PageSize)", g.index, g.pages)
		}
	}

	// One native pool per layer (first, so that absurd sizes fail natively before Go allocates tables).
	for _, cl := range c.layers {
		desc := bridge.PoolDesc{
			Format: bridge.Format(cl.format.Kind), GroupSize: cl.format.Group, Residual: cl.format.Residual,
			KVHeads: cl.spec.HeadsKV, HeadDimK: cl.spec.HeadDimK, HeadDimV: cl.spec.HeadDimV,
			VIsKPrefix: cl.spec.VIsKPrefix(), PageSize: c.pageSize, Pages: cl.group.pages,
			KeyBounds: c.questLayer(cl.index),
		}
		if cl.format.Kind.IsKIVI() {
			desc.ResidualSlots = opts.MaxSequences
		}
		pool, err := bridge.NewPool(e.dev, desc)
		if err == nil {
			cl.pool = pool
			cl.pageBytes, cl.slotBytes, err = pool.Sizes()
		}
		if err == nil && desc.KeyBounds {
			var sizes bridge.LayoutSizes
			sizes, err = bridge.SizesOf(desc)
			cl.boundsBytes = sizes.PageBoundsBytes
		}
		if err != nil {
			c.closePools()
			return nil, wrapErr(op, fmt.Sprintf("layer %d (%s, %s, %d pages)", cl.index, cl.spec, cl.format, cl.group.pages), err)
		}
	}

	for _, g := range c.groups {
		g.refs = make([]int32, g.pages)
		g.free = make([]int32, g.pages)
		for j := range g.free {
			g.free[j] = int32(g.pages - 1 - j)
		}
		g.names = newPageIndex(c.groupSalt(g), g.pages, c.quest == nil || !c.questLayer(g.layers[0]))
	}
	c.ringSalt = c.groupSalt(&layerGroup{layers: func() []int {
		var ls []int
		for _, cl := range c.layers {
			ls = append(ls, cl.index)
		}
		return ls
	}()})
	c.slots = make([]int32, opts.MaxSequences)
	for j := range c.slots {
		c.slots[j] = int32(opts.MaxSequences - 1 - j)
	}

	for li, logits := range opts.SinkLogits {
		if li < 0 || li >= len(c.layers) {
			c.closePools()
			return nil, newErr(op, ErrorRange, "SinkLogits: layer %d is outside [0, %d)", li, len(c.layers))
		}
		if err := c.layers[li].checkSinkLogits(logits); err != nil {
			c.closePools()
			return nil, newErr(op, ErrorInvalid, "SinkLogits: %v", err)
		}
		c.layers[li].sinks = slices.Clone(logits)
	}

	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		c.closePools()
		return nil, newErr(op, ErrorClosed, "engine is closed")
	}
	e.caches[c] = struct{}{}
	e.mu.Unlock()

	if l := e.logger(); l.GetLevel() <= zerolog.DebugLevel {
		for _, g := range c.groups {
			l.Debug().Str("backend", e.info.Backend).Str("op", op).Str("model", spec.Name).Int("group", g.index).
				Ints("layers", g.layers).Int("window", g.rule.window).Int("sinks", g.rule.sinks).
				Int("pages", g.pages).Int("page_size", c.pageSize).Msg("gokv cache layer group")
		}
	}
	return c, nil
}

// defaultCacheOptions fills the zero fields of o and checks the rest.
func defaultCacheOptions(o *CacheOptions) error {
	if o.PageSize == 0 {
		o.PageSize = DefaultPageSize
	}
	if o.MaxSequences == 0 {
		o.MaxSequences = DefaultMaxSequences
	}
	if o.MaxStepTokens == 0 {
		o.MaxStepTokens = DefaultMaxStepTokens
	}
	switch {
	case o.PageSize < 8 || o.PageSize > 1024 || o.PageSize%8 != 0:
		return fmt.Errorf("PageSize %d must be a multiple of 8 in [8, 1024] (0 = %d)", o.PageSize, DefaultPageSize)
	case o.MaxTokens <= 0:
		return fmt.Errorf("MaxTokens %d must be > 0 (the capacity in tokens of each layer group)", o.MaxTokens)
	case o.MaxTokens > math.MaxInt32:
		return fmt.Errorf("MaxTokens %d exceeds the ABI's 2^31-1 positions", o.MaxTokens)
	case o.MaxSequences < 1 || o.MaxSequences > 1<<20:
		return fmt.Errorf("MaxSequences %d must be in [1, 2^20] (0 = %d)", o.MaxSequences, DefaultMaxSequences)
	case o.MaxStepTokens < 1 || o.MaxStepTokens > math.MaxInt32:
		return fmt.Errorf("MaxStepTokens %d must be in [1, 2^31-1] (0 = %d)", o.MaxStepTokens, DefaultMaxStepTokens)
	case math.IsNaN(float64(o.Scale)) || math.IsInf(float64(o.Scale), 0) || o.Scale < 0:
		return fmt.Errorf("Scale %g must be finite and >= 0 (0 = 1/sqrt(HeadDimK))", o.Scale)
	}
	rule, err := resolveEviction(o.Eviction)
	if err != nil {
		return err
	}
	// A copy, as a pointer: the caller may reuse its struct.
	switch p := o.Eviction.(type) {
	case nil:
	case SinkWindow, *SinkWindow:
		o.Eviction = nil
		if rule.window != nil {
			o.Eviction = rule.window
		}
	case H2O:
		o.Eviction = &p
	case *H2O:
		o.Eviction = nil
		if p != nil {
			cp := *p
			o.Eviction = &cp
		}
	case SnapKV:
		o.Eviction = &p
	case *SnapKV:
		o.Eviction = nil
		if p != nil {
			cp := *p
			o.Eviction = &cp
		}
	case Quest:
		o.Eviction = &p
	case *Quest:
		o.Eviction = nil
		if p != nil {
			cp := *p
			o.Eviction = &cp
		}
	}
	return nil
}

// window is the cache's resolved eviction rule (defaultCacheOptions stored it), or nil for Full.
func (c *Cache) window() *SinkWindow {
	sw, _ := c.opts.Eviction.(*SinkWindow)
	return sw
}

// checkLayer validates layer i's format against its geometry, the page size and the device.
func (c *Cache) checkLayer(i int, l LayerSpec, f Format) error {
	const op = "NewCache"
	if err := f.Validate(l.HeadDimK, l.HeadDimV); err != nil {
		return newErr(op, ErrorInvalid, "layer %d (%s): %v", i, l, err)
	}
	if f.Kind.IsKIVI() && c.pageSize%f.Group != 0 {
		return newErr(op, ErrorInvalid, "layer %d: PageSize %d is not a multiple of the group size of %s (KIVI quantizes keys %d tokens at a time)",
			i, c.pageSize, f, f.Group)
	}
	info := c.eng.info
	if !info.SupportsFormat(bridge.Format(f.Kind)) {
		return newErr(op, ErrorNotSupported, "layer %d: backend %s does not support format %s", i, info.Backend, f)
	}
	need := []struct {
		on   bool
		cap  bridge.Caps
		what string
	}{
		{l.Windowed(), bridge.CapWindow, "sliding-window attention"},
		{l.LearnedSinks, bridge.CapLearnedSinks, "learned sinks"},
		{l.Kind == MLA, bridge.CapMLA, "MLA (V a prefix of K)"},
		{c.window() != nil, bridge.CapWindow, "SinkWindow eviction (windowed attention)"},
		{c.tokens != nil && !l.Windowed(), bridge.CapMass, "H2O and SnapKV eviction (attention mass output)"},
		{c.tokens != nil && !l.Windowed(), bridge.CapKVHeadMasks, "H2O and SnapKV eviction (per-kv-head masks)"},
		{c.quest != nil && !l.Windowed(), bridge.CapQuest, "Quest eviction (key bounds and page selection)"},
	}
	for _, n := range need {
		if n.on && !info.Caps.Has(n.cap) {
			return newErr(op, ErrorNotSupported, "layer %d: backend %s does not support %s", i, info.Backend, n.what)
		}
	}
	return nil
}

// checkLayerFormatKeys rejects per-layer formats for layers the model does not have.
func checkLayerFormatKeys(spec ModelSpec, m map[int]Format) error {
	bad := -1
	for i := range m {
		if (i < 0 || i >= len(spec.Layers)) && (bad < 0 || i < bad) {
			bad = i
		}
	}
	if bad >= 0 {
		return fmt.Errorf("LayerFormats has layer %d but the model has layers 0..%d", bad, len(spec.Layers)-1)
	}
	return nil
}

// closePools closes every pool created so far (NewCache failures and Close).
func (c *Cache) closePools() {
	for _, cl := range c.layers {
		if cl.pool != nil {
			_ = cl.pool.Close()
		}
	}
}

// Close frees the cache's native storage. It waits for native calls in flight; afterwards every method of
// the cache, its sequences and its steps fails with ErrClosed (Release and Abort return nil). It is
// idempotent and safe on a nil *Cache.
func (c *Cache) Close() error {
	if c == nil || c.eng == nil {
		return nil
	}
	c.life.Lock()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.life.Unlock()
		return nil
	}
	c.closed = true
	c.closePools()
	for _, s := range c.seqs {
		s.released = true
	}
	c.seqs = nil
	c.mu.Unlock()
	c.life.Unlock()

	c.eng.mu.Lock()
	delete(c.eng.caches, c)
	c.eng.mu.Unlock()
	return nil
}

// Spec returns a copy of the model spec the cache was created for (empty for a nil Cache).
func (c *Cache) Spec() ModelSpec {
	if c == nil {
		return ModelSpec{}
	}
	return c.spec.Clone()
}

// made fails with ErrInvalid for a nil Cache or one that did not come from Engine.NewCache.
func (c *Cache) made(op string) error {
	switch {
	case c == nil:
		return newErr(op, ErrorInvalid, "cache is nil (create one with Engine.NewCache)")
	case c.eng == nil:
		return newErr(op, ErrorInvalid, "cache was not created (a zero Cache; create one with Engine.NewCache)")
	}
	return nil
}

// SetSinkLogits sets the learned sink logits σ_h of a layer with LearnedSinks (gpt-oss): one per query
// head, [HeadsQ], finite. logits is copied. Steps that run the layer afterwards use them; a step of a
// LearnedSinks layer fails until they are set.
func (c *Cache) SetSinkLogits(layer int, logits []float32) error {
	const op = "Cache.SetSinkLogits"
	if err := c.made(op); err != nil {
		return err
	}
	if layer < 0 || layer >= len(c.layers) {
		return newErr(op, ErrorRange, "layer %d is outside [0, %d)", layer, len(c.layers))
	}
	cl := c.layers[layer]
	if err := cl.checkSinkLogits(logits); err != nil {
		return newErr(op, ErrorInvalid, "%v", err)
	}
	cp := slices.Clone(logits)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return newErr(op, ErrorClosed, "cache is closed")
	}
	cl.sinks = cp
	return nil
}

// checkSinkLogits reports why logits cannot be the layer's learned sink logits, or nil.
func (cl *cacheLayer) checkSinkLogits(logits []float32) error {
	if !cl.spec.LearnedSinks {
		return fmt.Errorf("layer %d (%s) has no learned sinks (LayerSpec.LearnedSinks is false)", cl.index, cl.spec)
	}
	if len(logits) != cl.spec.HeadsQ {
		return fmt.Errorf("layer %d: len(logits) = %d, want HeadsQ = %d", cl.index, len(logits), cl.spec.HeadsQ)
	}
	for h, x := range logits {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return fmt.Errorf("layer %d: logits[%d] = %g is not finite", cl.index, h, x)
		}
	}
	return nil
}

// CacheStats is a snapshot of a cache's occupancy.
type CacheStats struct {
	Groups        []GroupStats
	PagesUsed     int    // over all groups
	PagesTotal    int    // over all groups
	BytesUsed     uint64 // pages in use times their bytes (and Quest's key bounds) in every layer, plus the live sequences' KIVI rings
	BytesReserved uint64 // all native storage: every pool's pages (with their key bounds) and rings
	Sequences     int    // live sequences
}

// GroupStats is the occupancy of one layer group.
type GroupStats struct {
	Layers    []int // the layers sharing the group's page tables
	Window    int   // attention window of the group (0 = full attention, nothing evicted)
	Sinks     int   // sink positions that are never evicted
	PagesUsed int   // pages held by sequences or reserved by open steps
	// PagesCached: pages no sequence holds that keep their tokens for prefix reuse (NewSequenceFrom);
	// allocations take them once no page is free
	PagesCached int
	PagesTotal  int
}

// Stats returns the cache's occupancy (zero after Close, and for a nil Cache).
func (c *Cache) Stats() CacheStats {
	if c == nil {
		return CacheStats{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var st CacheStats
	if c.closed {
		return st
	}
	st.Sequences = len(c.seqs)
	for _, g := range c.groups {
		used := g.pages - g.available()
		st.Groups = append(st.Groups, GroupStats{Layers: slices.Clone(g.layers), Window: g.rule.window,
			Sinks: g.rule.sinks, PagesUsed: used, PagesCached: g.names.cached, PagesTotal: g.pages})
		st.PagesUsed += used
		st.PagesTotal += g.pages
	}
	for _, cl := range c.layers {
		used := uint64(cl.group.pages - cl.group.available())
		st.BytesUsed += used*(cl.pageBytes+cl.boundsBytes) + uint64(len(c.seqs))*cl.slotBytes
		st.BytesReserved += uint64(cl.group.pages)*(cl.pageBytes+cl.boundsBytes) + uint64(c.opts.MaxSequences)*cl.slotBytes
	}
	return st
}

// ---- page allocation (c.mu held) ----

// alloc pops a free page, or else the oldest cached one (forgetting its name), and gives it one
// reference; the caller checked that enough are available.
func (g *layerGroup) alloc() int32 {
	var id int32
	if len(g.free) > 0 {
		id = g.free[len(g.free)-1]
		g.free = g.free[:len(g.free)-1]
	} else {
		id = g.names.tail
		g.names.removeCached(id)
	}
	g.names.dropName(id)
	g.refs[id] = 1
	return id
}

// unref drops one reference to page id; at zero a named page is cached, any other freed. Negative ids
// (released entries) are ignored.
func (g *layerGroup) unref(id int32) {
	if id < 0 {
		return
	}
	g.refs[id]--
	if g.refs[id] == 0 {
		if g.names.named(id) {
			g.names.pushCached(id)
		} else {
			g.free = append(g.free, id)
		}
	}
}

// quantLimit returns how many of a sequence's n tokens are in pages in every layer of the group (n when
// it has no KIVI layer): pages beyond it are still written by ring flushes and cannot be released.
func (g *layerGroup) quantLimit(n int) int {
	q := n
	for _, f := range g.kivi {
		q = min(q, f.QuantizedTokens(n))
	}
	return q
}

// writtenPages returns the page indices [lo, hi) that appending t tokens to a sequence of length n may
// write in some layer of the group: those of the new tokens, and for KIVI those the ring flushes quantize
// into. In a group mixing KIVI and other formats it is the hull of both ranges, so a shared page between
// them may be copied without need (harmless: one page, only after a Fork).
func (g *layerGroup) writtenPages(n, t, pageSize int) (lo, hi int) {
	first, end := n, n+t // token range written into pages
	if !g.plain {
		first, end = math.MaxInt, 0
	}
	for _, f := range g.kivi {
		q0, q1 := f.QuantizedTokens(n), f.QuantizedTokens(n+t)
		if q1 > q0 {
			first, end = min(first, q0), max(end, q1)
		}
	}
	if end <= first {
		return 0, 0
	}
	return first / pageSize, (end-1)/pageSize + 1
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
