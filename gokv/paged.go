package gokv

import (
	"github.com/gokv/gokv/bridge"
)

// PagedPool is a low-level page pool on an engine's device, for engines that keep their own page tables
// (a vLLM-style block manager) and for benchmarks that time attention alone: pages of one format and
// geometry, written and attended with explicit FlashInfer-style page tables, one native call each. A
// Cache does all of this itself (page allocation, sequences, KIVI rings, eviction); a PagedPool leaves
// it to the caller, who owns the page tables and so must not let a write race with an attention call
// that reads the same pages (docs/architecture.md §3).
//
// Positions: token i of a sequence sits in page PageIDs[PageIndptr[s] + i/PageSize], slot i%PageSize. A
// page id of -1 marks a released page: its tokens are invisible.
//
// Thread-safety: as the note above; Close waits for calls in flight. Closing the engine closes its pools.
type PagedPool struct {
	e      *Engine
	pool   *bridge.Pool
	opts   PagedPoolOptions
	layout PageLayout
}

// PagedPoolOptions describe a PagedPool: NewCache's rules apply (Format.Validate, kvHeads in [1, 1024],
// PageSize a multiple of 8 in [8, 1024] and of the KIVI group size).
type PagedPoolOptions struct {
	Format        Format
	KVHeads       int  // kv heads (MLA: 1)
	HeadDimK      int  // d_qk
	HeadDimV      int  // d_v; with VIsKPrefix at most HeadDimK
	VIsKPrefix    bool // MLA absorbed form: values are the first HeadDimV dims of the keys, not stored
	PageSize      int  // tokens per page; 0 = DefaultPageSize
	Pages         int  // capacity in pages, >= 1
	ResidualSlots int  // KIVI: one fp16 residual ring per live sequence (PagedWrite.ResidualSlot); else 0
	// KeyBounds keeps Quest's key bounds beside each page (PagedAttend.QuestPages; DeviceCaps.Quest),
	// Layout().PageBoundsBytes per page.
	KeyBounds bool
}

// PagedWrite appends tokens to n sequences: sequence s holds StartPos[s] tokens and receives the rows
// [TokIndptr[s], TokIndptr[s+1]) of K and V; its page table PageIDs[PageIndptr[s]:PageIndptr[s+1]] must
// cover every position up to its new length. Shapes (rows = TokIndptr[n]):
//
//	TokIndptr, PageIndptr  [n+1]
//	PageIDs                [PageIndptr[n]]
//	StartPos               [n]
//	ResidualSlot           [n] KIVI: the sequence's ring; nil otherwise
//	K                      [rows, KVHeads, HeadDimK]
//	V                      [rows, KVHeads, HeadDimV]; nil with VIsKPrefix
type PagedWrite struct {
	TokIndptr, PageIndptr, PageIDs, StartPos, ResidualSlot []int32
	K, V                                                   []float32
}

// PagedAttend is one batched attention call over n sequences (docs/architecture.md §5): sequence s has
// KVLen[s] stored tokens and the query rows [QIndptr[s], QIndptr[s+1]) at positions QPos[s], QPos[s]+1,
// ... (decode: one row at KVLen[s]-1). Query head h reads kv head h / (HeadsQ / KVHeads). A query at
// position p sees token t iff t < KVLen, t <= p, its page is not released, and (Window == 0 or
// t > p - Window or t < SinkTokens); a query that sees nothing outputs zeros. Shapes (rows = QIndptr[n]):
//
//	QIndptr, PageIndptr  [n+1]
//	PageIDs              [PageIndptr[n]], -1 = released page
//	KVLen, QPos          [n]
//	ResidualSlot         [n] KIVI: the sequence's ring; nil otherwise
//	Q                    [rows, HeadsQ, HeadDimK]
//	Out                  [rows, HeadsQ, HeadDimV] (written)
//	SinkLogits           [HeadsQ] learned sink logits (gpt-oss), or nil
type PagedAttend struct {
	QIndptr, PageIndptr, PageIDs, KVLen, QPos, ResidualSlot []int32

	HeadsQ     int // a multiple of KVHeads
	Q, Out     []float32
	Scale      float32 // α > 0, typically 1/sqrt(HeadDimK)
	SinkLogits []float32
	SinkTokens int // first positions always visible under a window (StreamingLLM)
	Window     int // sliding window W; 0 = none
	ChunkSize  int // split-K chunk in tokens; 0 = the backend's choice
	// Baseline uses the dequantize-then-attend path (materializes float32 K and V first) instead of the
	// fused kernels: the reference point of benchmarks. DeviceCaps.Baseline says whether a device has it.
	Baseline bool
	// ValidMask and ValidIndptr: optional validity masks, bit t%32 of word t/32 set = token t visible,
	// sequence s's words from ValidIndptr[s]; with MaskPerKVHead, HeadsKV masks of ceil(KVLen[s]/32) words
	// per sequence, one per kv head (DeviceCaps.KVHeadMasks).
	ValidMask     []uint32
	ValidIndptr   []int32
	MaskPerKVHead bool
	// Quest (a pool with KeyBounds): each sequence's decode row reads, per kv head, only the QuestPages
	// pages with the highest key bound plus the pages of the sink tokens (SinkTokens) and the QuestRecent
	// newest tokens. QuestSelected, optional, receives the chosen page-table indices
	// [n][KVHeads][QuestPages] (-1 where fewer competed).
	QuestPages, QuestRecent int
	QuestSelected           []int32
}

// NewPagedPool creates a page pool on the engine's device; Close it when done (Engine.Close does too).
// It fails with ErrInvalid for options no pool can have, ErrNotSupported for a format the device lacks,
// ErrOutOfMemory when the device cannot hold it.
func (e *Engine) NewPagedPool(o PagedPoolOptions) (*PagedPool, error) {
	const op = "Engine.NewPagedPool"
	if err := e.check(op); err != nil {
		return nil, err
	}
	if o.PageSize == 0 {
		o.PageSize = DefaultPageSize
	}
	layout, err := o.Format.Layout(o.KVHeads, o.HeadDimK, o.HeadDimV, o.PageSize, o.VIsKPrefix)
	if err != nil {
		return nil, err
	}
	pool, err := bridge.NewPool(e.dev, bridge.PoolDesc{Format: bridge.Format(o.Format.Kind), GroupSize: o.Format.Group,
		Residual: o.Format.Residual, KVHeads: o.KVHeads, HeadDimK: o.HeadDimK, HeadDimV: o.HeadDimV,
		VIsKPrefix: o.VIsKPrefix, PageSize: o.PageSize, Pages: o.Pages, ResidualSlots: o.ResidualSlots,
		KeyBounds: o.KeyBounds})
	if err != nil {
		return nil, wrapErr(op, "format "+o.Format.String(), err)
	}
	return &PagedPool{e: e, pool: pool, opts: o, layout: layout}, nil
}

// Options returns the pool's options, PageSize defaulted.
func (p *PagedPool) Options() PagedPoolOptions { return p.opts }

// Layout returns the bytes of one page and one residual ring of the pool, as allocated.
func (p *PagedPool) Layout() PageLayout { return p.layout }

// Write quantizes and stores a batch of tokens (the slices are read only during the call). A rejected
// write stores nothing.
func (p *PagedPool) Write(w PagedWrite) error {
	if err := p.pool.Write(bridge.WriteBatch{TokIndptr: w.TokIndptr, PageIndptr: w.PageIndptr, PageIDs: w.PageIDs,
		StartPos: w.StartPos, ResidualSlot: w.ResidualSlot, K: w.K, V: w.V}); err != nil {
		return p.fail("PagedPool.Write", err)
	}
	return nil
}

// Attend computes a batch's attention over the pool into a.Out, in one native call that allocates
// nothing on the Go side: what an engine calls per layer, and what benchmarks time.
func (p *PagedPool) Attend(a PagedAttend) error {
	var flags bridge.AttendFlags
	if a.Baseline {
		flags = bridge.AttendDequantBaseline
	}
	if a.MaskPerKVHead {
		flags |= bridge.AttendMaskPerKVHead
	}
	if err := bridge.Attend(p.e.dev, bridge.AttendBatch{Pool: p.pool, QIndptr: a.QIndptr, PageIndptr: a.PageIndptr,
		PageIDs: a.PageIDs, KVLen: a.KVLen, QPos: a.QPos, ResidualSlot: a.ResidualSlot, HeadsQ: a.HeadsQ, Q: a.Q,
		Out: a.Out, Scale: a.Scale, SinkLogits: a.SinkLogits, SinkTokens: a.SinkTokens, Window: a.Window,
		ChunkSize: a.ChunkSize, Flags: flags, ValidMask: a.ValidMask, ValidIndptr: a.ValidIndptr,
		QuestPages: a.QuestPages, QuestRecent: a.QuestRecent, QuestSelected: a.QuestSelected}); err != nil {
		return p.fail("PagedPool.Attend", err)
	}
	return nil
}

// fail reports a failed call: ErrClosed once the pool or its engine is closed, else the native error.
func (p *PagedPool) fail(op string, err error) error {
	if cerr := p.e.check(op); cerr != nil {
		return cerr
	}
	return wrapErr(op, "", err)
}

// Close frees the pool. It is idempotent.
func (p *PagedPool) Close() error {
	if p == nil {
		return nil
	}
	return wrapErr("PagedPool.Close", "", p.pool.Close())
}
