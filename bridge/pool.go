//go:build cgo

package bridge

/*
#include "gokv.h"
#include "gokv_cgo.h"
*/
import "C"

import (
	"math"
	"runtime"
	"strconv"
	"sync"
	"unsafe"
)

// Pool is a page pool on a device (gokv_pool*). It stores K/V pages (quantized on write) and, for KIVI
// formats, per-sequence residual rings. Page tables belong to the caller.
//
// Thread-safety: methods may be called from many goroutines, but writes must not race with attention
// calls or other writes that touch the same pages or residual slots (the ABI's rule: the caller owns the
// page tables, so it knows). Close waits for calls in flight on the pool.
type Pool struct {
	mu     sync.RWMutex // held shared by calls, exclusively by Close
	handle *C.gokv_pool
	dev    *Device
	desc   PoolDesc // PageSize defaulted
}

// NewPool creates a pool on dev. The caller must Close it (closing the device also closes it).
func NewPool(dev *Device, desc PoolDesc) (*Pool, error) {
	const op = "gokv_pool_create"
	if err := dev.acquire(op); err != nil {
		return nil, err
	}
	defer dev.mu.RUnlock()
	cd := desc.cDesc()
	var h *C.gokv_pool
	err := resultError(op, C.gokv_cgo_pool_create(dev.handle, &cd, &h))
	runtime.KeepAlive(dev)
	if err != nil {
		return nil, err
	}
	if desc.PageSize == 0 {
		desc.PageSize = DefaultPageSize
	}
	p := &Pool{handle: h, dev: dev, desc: desc}
	dev.poolsMu.Lock()
	dev.pools[p] = struct{}{}
	dev.poolsMu.Unlock()
	return p, nil
}

// cDesc is desc as the C struct, every count clamped to int32 (the core rejects what is out of range).
func (desc PoolDesc) cDesc() C.gokv_pool_desc {
	prefix, bounds := C.int32_t(0), C.int32_t(0)
	if desc.VIsKPrefix {
		prefix = 1
	}
	if desc.KeyBounds {
		bounds = 1
	}
	return C.gokv_pool_desc{
		struct_size:      C.uint32_t(unsafe.Sizeof(C.gokv_pool_desc{})),
		format:           C.int32_t(desc.Format),
		group_size:       C.int32_t(clampInt32(desc.GroupSize)),
		residual:         C.int32_t(clampInt32(desc.Residual)),
		n_kv_heads:       C.int32_t(clampInt32(desc.KVHeads)),
		head_dim_k:       C.int32_t(clampInt32(desc.HeadDimK)),
		head_dim_v:       C.int32_t(clampInt32(desc.HeadDimV)),
		v_is_k_prefix:    prefix,
		page_size:        C.int32_t(clampInt32(desc.PageSize)),
		n_pages:          C.int32_t(clampInt32(desc.Pages)),
		n_residual_slots: C.int32_t(clampInt32(desc.ResidualSlots)),
		key_bounds:       bounds,
	}
}

// Desc returns the pool's description, with PageSize defaulted.
func (p *Pool) Desc() PoolDesc { return p.desc }

// Device returns the device the pool lives on.
func (p *Pool) Device() *Device { return p.dev }

// Sizes returns the bytes of one page and of one residual slot (0 if the format has none).
func (p *Pool) Sizes() (pageBytes, residualSlotBytes uint64, err error) {
	const op = "gokv_pool_sizes"
	if err := p.acquire(op); err != nil {
		return 0, 0, err
	}
	defer p.mu.RUnlock()
	var pb, rb C.uint64_t
	err = resultError(op, C.gokv_cgo_pool_sizes(p.handle, &pb, &rb))
	runtime.KeepAlive(p)
	return uint64(pb), uint64(rb), err
}

// Write quantizes and stores a batch of tokens (gokv_pool_write). The slices are read only during the call.
func (p *Pool) Write(b WriteBatch) error {
	const op = "gokv_pool_write"
	if err := p.checkWrite(op, &b); err != nil {
		return err
	}
	defer afterLongCall(beforeLongCall())
	if err := p.acquire(op); err != nil {
		return err
	}
	defer p.mu.RUnlock()
	var pin runtime.Pinner
	defer pin.Unpin()
	d := b.cDesc(&pin)
	err := resultError(op, C.gokv_cgo_pool_write(p.handle, &d))
	runtime.KeepAlive(p)
	return err
}

// checkWrite proves every slice of b is as long as C will use for this pool.
func (p *Pool) checkWrite(op string, b *WriteBatch) error {
	n, err := seqCount(op, "TokIndptr", b.TokIndptr)
	if err != nil {
		return err
	}
	rows := int(b.TokIndptr[n])
	if err := firstErr(
		wantLen(op, "PageIndptr", len(b.PageIndptr), n+1),
		wantIndptrEnd(op, "PageIDs", "PageIndptr", len(b.PageIDs), b.PageIndptr),
		wantLen(op, "StartPos", len(b.StartPos), n),
		wantOptLen(op, "ResidualSlot", b.ResidualSlot, n),
		wantShape(op, "K", len(b.K), rows, p.desc.KVHeads, p.desc.HeadDimK),
	); err != nil {
		return err
	}
	if b.V != nil || !p.desc.VIsKPrefix {
		return wantShape(op, "V", len(b.V), rows, p.desc.KVHeads, p.desc.HeadDimV)
	}
	return nil
}

// cDesc builds the C descriptor of a checked batch, pinning its slices in pin.
func (b *WriteBatch) cDesc(pin *runtime.Pinner) C.gokv_write_desc {
	return C.gokv_write_desc{
		struct_size:   C.uint32_t(unsafe.Sizeof(C.gokv_write_desc{})),
		n_seqs:        C.int32_t(len(b.TokIndptr) - 1),
		tok_indptr:    ptrOf[int32, C.int32_t](pin, b.TokIndptr),
		page_indptr:   ptrOf[int32, C.int32_t](pin, b.PageIndptr),
		page_ids:      ptrOf[int32, C.int32_t](pin, b.PageIDs),
		start_pos:     ptrOf[int32, C.int32_t](pin, b.StartPos),
		residual_slot: ptrOf[int32, C.int32_t](pin, b.ResidualSlot),
		k:             ptrOf[float32, C.float](pin, b.K),
		v:             ptrOf[float32, C.float](pin, b.V),
	}
}

// Read dequantizes a batch of stored tokens into K and V (gokv_pool_read). For persistence and
// debugging, not for attention. The slices are used only during the call.
func (p *Pool) Read(b ReadBatch) error {
	const op = "gokv_pool_read"
	n, err := seqCount(op, "TokIndptr", b.TokIndptr)
	if err != nil {
		return err
	}
	rows := int(b.TokIndptr[n])
	if err := firstErr(
		wantLen(op, "PageIndptr", len(b.PageIndptr), n+1),
		wantIndptrEnd(op, "PageIDs", "PageIndptr", len(b.PageIDs), b.PageIndptr),
		wantLen(op, "KVLen", len(b.KVLen), n),
		wantLen(op, "StartPos", len(b.StartPos), n),
		wantOptLen(op, "ResidualSlot", b.ResidualSlot, n),
		wantShape(op, "K", len(b.K), rows, p.desc.KVHeads, p.desc.HeadDimK),
	); err != nil {
		return err
	}
	if b.V != nil {
		if err := wantShape(op, "V", len(b.V), rows, p.desc.KVHeads, p.desc.HeadDimV); err != nil {
			return err
		}
	}
	defer afterLongCall(beforeLongCall())
	if err := p.acquire(op); err != nil {
		return err
	}
	defer p.mu.RUnlock()
	var pin runtime.Pinner
	defer pin.Unpin()
	d := C.gokv_read_desc{
		struct_size:   C.uint32_t(unsafe.Sizeof(C.gokv_read_desc{})),
		n_seqs:        C.int32_t(n),
		tok_indptr:    ptrOf[int32, C.int32_t](&pin, b.TokIndptr),
		page_indptr:   ptrOf[int32, C.int32_t](&pin, b.PageIndptr),
		page_ids:      ptrOf[int32, C.int32_t](&pin, b.PageIDs),
		kv_len:        ptrOf[int32, C.int32_t](&pin, b.KVLen),
		start_pos:     ptrOf[int32, C.int32_t](&pin, b.StartPos),
		residual_slot: ptrOf[int32, C.int32_t](&pin, b.ResidualSlot),
		k_out:         ptrOf[float32, C.float](&pin, b.K),
		v_out:         ptrOf[float32, C.float](&pin, b.V),
	}
	err = resultError(op, C.gokv_cgo_pool_read(p.handle, &d))
	runtime.KeepAlive(p)
	return err
}

// Copy copies pages and residual slots inside the pool (gokv_pool_copy).
func (p *Pool) Copy(b CopyBatch) error {
	const op = "gokv_pool_copy"
	if err := firstErr(
		wantLen(op, "DstPages", len(b.DstPages), len(b.SrcPages)),
		wantLen(op, "DstSlots", len(b.DstSlots), len(b.SrcSlots)),
	); err != nil {
		return err
	}
	if len(b.SrcPages) > math.MaxInt32 || len(b.SrcSlots) > math.MaxInt32 {
		return newError(op, codeInvalid, "too many pages or slots for one call")
	}
	defer afterLongCall(beforeLongCall())
	if err := p.acquire(op); err != nil {
		return err
	}
	defer p.mu.RUnlock()
	var pin runtime.Pinner
	defer pin.Unpin()
	d := C.gokv_copy_desc{
		struct_size: C.uint32_t(unsafe.Sizeof(C.gokv_copy_desc{})),
		n_pages:     C.int32_t(len(b.SrcPages)),
		src_pages:   ptrOf[int32, C.int32_t](&pin, b.SrcPages),
		dst_pages:   ptrOf[int32, C.int32_t](&pin, b.DstPages),
		n_slots:     C.int32_t(len(b.SrcSlots)),
		src_slots:   ptrOf[int32, C.int32_t](&pin, b.SrcSlots),
		dst_slots:   ptrOf[int32, C.int32_t](&pin, b.DstSlots),
	}
	err := resultError(op, C.gokv_cgo_pool_copy(p.handle, &d))
	runtime.KeepAlive(p)
	return err
}

// Gather moves token rows between pages byte for byte (gokv_pool_gather_rows): compaction after
// per-kv-head eviction. Formats whose rows lie within a token only (not KIVI), pools without key bounds.
func (p *Pool) Gather(b GatherBatch) error {
	const op = "gokv_pool_gather_rows"
	n := len(b.SrcPages)
	if err := firstErr(
		wantLen(op, "SrcSlots", len(b.SrcSlots), n),
		wantLen(op, "DstPages", len(b.DstPages), n),
		wantLen(op, "DstSlots", len(b.DstSlots), n),
		wantLen(op, "KVHeads", len(b.KVHeads), n),
	); err != nil {
		return err
	}
	if n > math.MaxInt32 {
		return newError(op, codeInvalid, "too many rows for one call")
	}
	defer afterLongCall(beforeLongCall())
	if err := p.acquire(op); err != nil {
		return err
	}
	defer p.mu.RUnlock()
	var pin runtime.Pinner
	defer pin.Unpin()
	d := C.gokv_gather_desc{
		struct_size: C.uint32_t(unsafe.Sizeof(C.gokv_gather_desc{})),
		n_rows:      C.int32_t(n),
		src_pages:   ptrOf[int32, C.int32_t](&pin, b.SrcPages),
		src_slots:   ptrOf[int32, C.int32_t](&pin, b.SrcSlots),
		dst_pages:   ptrOf[int32, C.int32_t](&pin, b.DstPages),
		dst_slots:   ptrOf[int32, C.int32_t](&pin, b.DstSlots),
		kv_heads:    ptrOf[int32, C.int32_t](&pin, b.KVHeads),
	}
	err := resultError(op, C.gokv_cgo_pool_gather_rows(p.handle, &d))
	runtime.KeepAlive(p)
	return err
}

// Close destroys the pool and its storage. It is safe to call twice, on a nil *Pool, and concurrently
// with other calls (it waits for them); later calls on the pool fail with ErrInvalid.
func (p *Pool) Close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	if p.handle == nil {
		p.mu.Unlock()
		return nil
	}
	C.gokv_pool_destroy(p.handle)
	p.handle = nil
	p.mu.Unlock()
	p.dev.poolsMu.Lock()
	delete(p.dev.pools, p)
	p.dev.poolsMu.Unlock()
	return nil
}

// acquire takes p.mu shared for one call and checks that the pool is open; the caller releases it.
// An open pool implies an open device: Device.Close closes its pools first.
func (p *Pool) acquire(op string) error {
	if p == nil {
		return newError(op, codeInvalid, "pool is nil")
	}
	p.mu.RLock()
	if p.handle == nil {
		p.mu.RUnlock()
		return newError(op, codeInvalid, "pool is closed")
	}
	return nil
}

// ---- length checks: C trusts the lengths, so Go proves every slice is exactly as long as C will use ----

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// seqCount returns n for an indptr of n+1 entries and checks that its end is a sane row count.
func seqCount(op, name string, indptr []int32) (int, error) {
	if len(indptr) == 0 {
		return 0, newError(op, codeInvalid, name+" is empty, want n_seqs+1 entries")
	}
	if len(indptr)-1 > math.MaxInt32 {
		return 0, newError(op, codeInvalid, name+" has too many entries")
	}
	n := len(indptr) - 1
	if indptr[n] < 0 {
		return 0, newError(op, codeInvalid, name+"["+strconv.Itoa(n)+"] = "+strconv.Itoa(int(indptr[n]))+" is negative")
	}
	return n, nil
}

func wantLen(op, name string, got, want int) error {
	if got != want {
		return newError(op, codeInvalid, "len("+name+") = "+strconv.Itoa(got)+", want "+strconv.Itoa(want))
	}
	return nil
}

func wantOptLen(op, name string, s []int32, want int) error {
	if s == nil {
		return nil
	}
	return wantLen(op, name, len(s), want)
}

// wantIndptrEnd checks len(data) == indptr[last] for an indptr whose own length was checked (or not yet:
// then it reports nothing, and the indptr's length check reports the problem).
func wantIndptrEnd(op, dataName, indptrName string, dataLen int, indptr []int32) error {
	if len(indptr) == 0 {
		return nil
	}
	end := int(indptr[len(indptr)-1])
	if end < 0 {
		return newError(op, codeInvalid, indptrName+"["+strconv.Itoa(len(indptr)-1)+"] = "+strconv.Itoa(end)+" is negative")
	}
	if dataLen != end {
		return newError(op, codeInvalid, "len("+dataName+") = "+strconv.Itoa(dataLen)+", want "+indptrName+
			"["+strconv.Itoa(len(indptr)-1)+"] = "+strconv.Itoa(end))
	}
	return nil
}

// wantShape checks got == rows*a*b without overflow (all factors must be non-negative).
func wantShape(op, name string, got, rows, a, b int) error {
	want, ok := mulNonNeg(rows, a, b)
	if !ok {
		return newError(op, codeInvalid, name+": shape ["+strconv.Itoa(rows)+", "+strconv.Itoa(a)+", "+
			strconv.Itoa(b)+"] is negative or overflows")
	}
	if got != want {
		return newError(op, codeInvalid, "len("+name+") = "+strconv.Itoa(got)+", want "+strconv.Itoa(rows)+
			"*"+strconv.Itoa(a)+"*"+strconv.Itoa(b)+" = "+strconv.Itoa(want))
	}
	return nil
}

func mulNonNeg(xs ...int) (int, bool) {
	r := 1
	for _, x := range xs {
		if x < 0 {
			return 0, false
		}
		if x != 0 && r > math.MaxInt/x {
			return 0, false
		}
		r *= x
	}
	return r, true
}
