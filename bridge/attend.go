package bridge

/*
#include "gokv.h"
#include "gokv_cgo.h"
*/
import "C"

import (
	"math"
	"runtime"
	"unsafe"
)

// AttendFlags are the GOKV_ATTEND_* flags.
type AttendFlags uint32

// The attention flags.
const (
	// AttendDequantBaseline uses the dequantize-then-attend baseline (benchmarks only).
	AttendDequantBaseline AttendFlags = C.GOKV_ATTEND_DEQUANT_BASELINE
	// AttendForceScalar uses the plain scalar kernels even where a SIMD path exists.
	AttendForceScalar AttendFlags = C.GOKV_ATTEND_FORCE_SCALAR
)

// DefaultChunkSize is the split-K chunk the backends use when AttendBatch.ChunkSize is 0.
const DefaultChunkSize = 512

// AttendBatch is one batched attention call over n sequences of one pool (gokv_attend_desc,
// docs/architecture.md §5). Sequence i has KVLen[i] stored tokens and the query rows [QIndptr[i],
// QIndptr[i+1]) at positions QPos[i], QPos[i]+1, ... (decode: one row at KVLen[i]-1; prefill: T rows ending
// at KVLen[i]-1, after their K/V were written). Head h reads kv head h / (HeadsQ / KVHeads).
//
// A query at position p sees token t iff t < KVLen, t <= p, the page of t is not released (page id -1),
// bit t of its validity mask is set (when ValidMask is given), and (Window == 0 or t > p - Window or
// t < SinkTokens). A query that sees nothing outputs zeros.
//
// Shapes (n = len(QIndptr) - 1, rows = QIndptr[n], d_k/d_v the pool's head dims):
//
//	QIndptr, PageIndptr  [n+1]
//	PageIDs              [PageIndptr[n]], -1 = released page
//	KVLen, QPos          [n]
//	ResidualSlot         [n] for KIVI formats, nil otherwise
//	ValidMask            [ValidIndptr[n]] bit t%32 of word t/32 per sequence, or nil (all valid)
//	ValidIndptr          [n+1] word offsets into ValidMask; nil when ValidMask is nil
//	Q                    [rows, HeadsQ, d_k]
//	Out                  [rows, HeadsQ, d_v] (written)
//	SinkLogits           [HeadsQ] learned sink logits, or nil
type AttendBatch struct {
	Pool         *Pool
	QIndptr      []int32
	PageIndptr   []int32
	PageIDs      []int32
	KVLen        []int32
	QPos         []int32
	ResidualSlot []int32
	ValidMask    []uint32
	ValidIndptr  []int32
	HeadsQ       int // a multiple of the pool's KVHeads
	Q            []float32
	Out          []float32
	Scale        float32 // α, > 0 and finite (typically 1/sqrt(d_k))
	SinkLogits   []float32
	SinkTokens   int // first positions always visible under a window (StreamingLLM)
	Window       int // sliding window W, 0 = none
	ChunkSize    int // split-K chunk in tokens, 0 = DefaultChunkSize
	Flags        AttendFlags
}

// Attend runs batched attention on dev over b.Pool, which must live on dev (gokv_attend). The slices are
// used only during the call. Attend may be called from many goroutines on one device; calls whose Out
// buffers differ do not interfere (the CPU backend serializes them on its thread pool).
func Attend(dev *Device, b AttendBatch) error {
	return AppendAttend(dev, nil, b)
}

// AppendAttend is one batch step of a layer in one cgo call: it appends w's tokens to a.Pool (w may be
// nil or have no rows), then attends (gokv_append_attend; gokv_attend when w is nil). Both batches are
// validated before anything is written, so a rejected step leaves the cache as it was.
func AppendAttend(dev *Device, w *WriteBatch, a AttendBatch) error {
	op := "gokv_append_attend"
	if w == nil {
		op = "gokv_attend"
	}
	if err := checkAttend(op, dev, &a); err != nil {
		return err
	}
	if w != nil {
		if err := a.Pool.checkWrite(op, w); err != nil {
			return err
		}
	}
	beforeLongCall()
	if err := dev.acquire(op); err != nil {
		return err
	}
	defer dev.mu.RUnlock()
	if err := a.Pool.acquire(op); err != nil {
		return err
	}
	defer a.Pool.mu.RUnlock()
	var pin runtime.Pinner
	defer pin.Unpin()
	ad := a.cDesc(&pin)
	var err error
	if w == nil {
		err = resultError(op, C.gokv_cgo_attend(dev.handle, &ad))
	} else {
		wd := w.cDesc(&pin)
		err = resultError(op, C.gokv_cgo_append_attend(dev.handle, &wd, &ad))
	}
	runtime.KeepAlive(dev)
	runtime.KeepAlive(a.Pool)
	return err
}

// checkAttend proves every slice of b is as long as C will use, and that its pool lives on dev.
func checkAttend(op string, dev *Device, b *AttendBatch) error {
	if b.Pool == nil {
		return newError(op, codeInvalid, "Pool is nil")
	}
	if b.Pool.dev != dev {
		return newError(op, codeInvalid, "Pool belongs to another device")
	}
	n, err := seqCount(op, "QIndptr", b.QIndptr)
	if err != nil {
		return err
	}
	rows := int(b.QIndptr[n])
	pd := &b.Pool.desc
	if err := firstErr(
		wantLen(op, "PageIndptr", len(b.PageIndptr), n+1),
		wantIndptrEnd(op, "PageIDs", "PageIndptr", len(b.PageIDs), b.PageIndptr),
		wantLen(op, "KVLen", len(b.KVLen), n),
		wantLen(op, "QPos", len(b.QPos), n),
		wantOptLen(op, "ResidualSlot", b.ResidualSlot, n),
		wantShape(op, "Q", len(b.Q), rows, b.HeadsQ, pd.HeadDimK),
		wantShape(op, "Out", len(b.Out), rows, b.HeadsQ, pd.HeadDimV),
	); err != nil {
		return err
	}
	if b.SinkLogits != nil {
		if err := wantLen(op, "SinkLogits", len(b.SinkLogits), b.HeadsQ); err != nil {
			return err
		}
	}
	if b.ValidMask != nil || b.ValidIndptr != nil {
		if b.ValidMask == nil || b.ValidIndptr == nil {
			return newError(op, codeInvalid, "ValidMask and ValidIndptr must be given together")
		}
		if err := firstErr(
			wantLen(op, "ValidIndptr", len(b.ValidIndptr), n+1),
			wantIndptrEnd(op, "ValidMask", "ValidIndptr", len(b.ValidMask), b.ValidIndptr),
		); err != nil {
			return err
		}
	}
	if b.HeadsQ > math.MaxInt32 {
		return newError(op, codeInvalid, "HeadsQ is too large")
	}
	return nil
}

// cDesc builds the C descriptor of a checked batch, pinning its slices in pin.
func (b *AttendBatch) cDesc(pin *runtime.Pinner) C.gokv_attend_desc {
	return C.gokv_attend_desc{
		struct_size:   C.uint32_t(unsafe.Sizeof(C.gokv_attend_desc{})),
		pool:          b.Pool.handle,
		n_seqs:        C.int32_t(len(b.QIndptr) - 1),
		q_indptr:      ptrOf[int32, C.int32_t](pin, b.QIndptr),
		page_indptr:   ptrOf[int32, C.int32_t](pin, b.PageIndptr),
		page_ids:      ptrOf[int32, C.int32_t](pin, b.PageIDs),
		kv_len:        ptrOf[int32, C.int32_t](pin, b.KVLen),
		q_pos:         ptrOf[int32, C.int32_t](pin, b.QPos),
		residual_slot: ptrOf[int32, C.int32_t](pin, b.ResidualSlot),
		valid_mask:    ptrOf[uint32, C.uint32_t](pin, b.ValidMask),
		valid_indptr:  ptrOf[int32, C.int32_t](pin, b.ValidIndptr),
		n_heads_q:     C.int32_t(b.HeadsQ),
		q:             ptrOf[float32, C.float](pin, b.Q),
		out:           ptrOf[float32, C.float](pin, b.Out),
		scale:         C.float(b.Scale),
		sink_logits:   ptrOf[float32, C.float](pin, b.SinkLogits),
		n_sink_tokens: C.int32_t(clampInt32(b.SinkTokens)),
		window:        C.int32_t(clampInt32(b.Window)),
		chunk_size:    C.int32_t(clampInt32(b.ChunkSize)),
		flags:         C.uint32_t(b.Flags),
	}
}
