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
	"unsafe"
)

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
	defer afterLongCall(beforeLongCall())
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
	if b.Flags&AttendMaskPerKVHead != 0 && b.ValidMask == nil {
		return newError(op, codeInvalid, "Flags has AttendMaskPerKVHead but ValidMask is nil")
	}
	if b.HeadsQ > math.MaxInt32 {
		return newError(op, codeInvalid, "HeadsQ is too large")
	}
	if b.MassRows < 0 || b.MassRows > math.MaxInt32 {
		return newError(op, codeInvalid, "MassRows "+strconv.Itoa(b.MassRows)+" must be in [0, 2^31-1] (0 = every row)")
	}
	if b.Mass != nil {
		if b.Flags&AttendDequantBaseline != 0 {
			return newError(op, codeInvalid, "Mass is not computed by the dequantize-then-attend baseline (AttendDequantBaseline)")
		}
		// Σ KVHeads*KVLen[i] elements are written: negative lengths are left to the C core's validation,
		// which rejects them before anything is written.
		want := int64(0)
		for _, kv := range b.KVLen {
			want += int64(max(kv, 0)) * int64(pd.KVHeads)
		}
		if int64(len(b.Mass)) != want {
			return newError(op, codeInvalid, "len(Mass) = "+strconv.Itoa(len(b.Mass))+", want KVHeads "+
				strconv.Itoa(pd.KVHeads)+" * sum(KVLen) = "+strconv.FormatInt(want, 10))
		}
	}
	return checkQuest(op, b, n)
}

// checkQuest checks the Quest fields: the counts in range, the outputs only with QuestPages and exactly as
// long as C writes them.
func checkQuest(op string, b *AttendBatch, n int) error {
	pd := &b.Pool.desc
	switch {
	case b.QuestPages < 0 || b.QuestPages > math.MaxInt32:
		return newError(op, codeInvalid, "QuestPages "+strconv.Itoa(b.QuestPages)+" must be in [0, 2^31-1] (0 = Quest off)")
	case b.QuestRecent < 0 || b.QuestRecent > math.MaxInt32:
		return newError(op, codeInvalid, "QuestRecent "+strconv.Itoa(b.QuestRecent)+" must be in [0, 2^31-1]")
	case b.QuestPages == 0 && (b.QuestBounds != nil || b.QuestSelected != nil):
		return newError(op, codeInvalid, "QuestBounds or QuestSelected given without QuestPages")
	}
	if b.QuestBounds != nil {
		if err := wantShape(op, "QuestBounds", len(b.QuestBounds), int(b.PageIndptr[n]), pd.KVHeads, 1); err != nil {
			return err
		}
	}
	if b.QuestSelected != nil {
		if err := wantShape(op, "QuestSelected", len(b.QuestSelected), n, pd.KVHeads, b.QuestPages); err != nil {
			return err
		}
	}
	return nil
}

// cDesc builds the C descriptor of a checked batch, pinning its slices in pin.
func (b *AttendBatch) cDesc(pin *runtime.Pinner) C.gokv_attend_desc {
	return C.gokv_attend_desc{
		struct_size:    C.uint32_t(unsafe.Sizeof(C.gokv_attend_desc{})),
		pool:           b.Pool.handle,
		n_seqs:         C.int32_t(len(b.QIndptr) - 1),
		q_indptr:       ptrOf[int32, C.int32_t](pin, b.QIndptr),
		page_indptr:    ptrOf[int32, C.int32_t](pin, b.PageIndptr),
		page_ids:       ptrOf[int32, C.int32_t](pin, b.PageIDs),
		kv_len:         ptrOf[int32, C.int32_t](pin, b.KVLen),
		q_pos:          ptrOf[int32, C.int32_t](pin, b.QPos),
		residual_slot:  ptrOf[int32, C.int32_t](pin, b.ResidualSlot),
		valid_mask:     ptrOf[uint32, C.uint32_t](pin, b.ValidMask),
		valid_indptr:   ptrOf[int32, C.int32_t](pin, b.ValidIndptr),
		n_heads_q:      C.int32_t(b.HeadsQ),
		q:              ptrOf[float32, C.float](pin, b.Q),
		out:            ptrOf[float32, C.float](pin, b.Out),
		scale:          C.float(b.Scale),
		sink_logits:    ptrOf[float32, C.float](pin, b.SinkLogits),
		n_sink_tokens:  C.int32_t(clampInt32(b.SinkTokens)),
		window:         C.int32_t(clampInt32(b.Window)),
		chunk_size:     C.int32_t(clampInt32(b.ChunkSize)),
		flags:          C.uint32_t(b.Flags),
		mass:           ptrOf[float32, C.float](pin, b.Mass),
		mass_rows:      C.int32_t(clampInt32(b.MassRows)),
		quest_pages:    C.int32_t(clampInt32(b.QuestPages)),
		quest_recent:   C.int32_t(clampInt32(b.QuestRecent)),
		quest_bounds:   ptrOf[float32, C.float](pin, b.QuestBounds),
		quest_selected: ptrOf[int32, C.int32_t](pin, b.QuestSelected),
	}
}
