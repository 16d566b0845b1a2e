//go:build cgo

package bridge

/*
#include "gokv.h"
#include "gokv_cgo.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// SizesOf returns the sizes a pool of desc would allocate, without a device (gokv_layout_sizes_get).
// desc is validated as NewPool validates it (Pages and ResidualSlots included).
func SizesOf(desc PoolDesc) (LayoutSizes, error) {
	const op = "gokv_layout_sizes_get"
	cd := desc.cDesc()
	var out C.gokv_layout_sizes
	out.struct_size = C.uint32_t(unsafe.Sizeof(out))
	if err := resultError(op, C.gokv_cgo_layout_sizes(&cd, &out)); err != nil {
		return LayoutSizes{}, err
	}
	return LayoutSizes{
		PageBytes:         uint64(out.page_bytes),
		PageCodeBytes:     uint64(out.page_code_bytes),
		PageMetaBytes:     uint64(out.page_meta_bytes),
		ResidualSlotBytes: uint64(out.residual_slot_bytes),
		PageBoundsBytes:   uint64(out.page_bounds_bytes),
	}, nil
}

// PageBytes returns page `page` of the pool exactly as stored (bridge/gokv_layout.h), for tests that hold
// a backend's bytes against the layout and against the CPU backend. ErrNotSupported where the backend
// has no such slot.
func (p *Pool) PageBytes(page int) ([]byte, error) {
	return p.rawBytes("gokv_pool_page_bytes", page, false)
}

// SlotBytes returns KIVI residual slot `slot` of the pool exactly as stored.
func (p *Pool) SlotBytes(slot int) ([]byte, error) {
	return p.rawBytes("gokv_pool_slot_bytes", slot, true)
}

func (p *Pool) rawBytes(op string, index int, slot bool) ([]byte, error) {
	pageBytes, slotBytes, err := p.Sizes()
	if err != nil {
		return nil, err
	}
	n := pageBytes
	if slot {
		n = slotBytes
	}
	if err := p.acquire(op); err != nil {
		return nil, err
	}
	defer p.mu.RUnlock()
	buf := make([]byte, max(n, 1))
	var pin runtime.Pinner
	pin.Pin(&buf[0])
	defer pin.Unpin()
	out := unsafe.Pointer(&buf[0])
	if slot {
		err = resultError(op, C.gokv_cgo_pool_slot_bytes(p.handle, C.int32_t(clampInt32(index)), out, C.uint64_t(n)))
	} else {
		err = resultError(op, C.gokv_cgo_pool_page_bytes(p.handle, C.int32_t(clampInt32(index)), out, C.uint64_t(n)))
	}
	runtime.KeepAlive(p)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// SetPageBytes writes page `page` exactly as stored (the bytes PageBytes returns); nTokens is how many
// leading slots hold tokens (KIVI: quantized into the page), for the key bounds of pools that keep them.
// The bytes are checked (every scale, bias and f32/f16 element of those slots finite) before anything is
// written.
func (p *Pool) SetPageBytes(page int, b []byte, nTokens int) error {
	return p.setRawBytes("gokv_pool_set_page_bytes", page, b, nTokens, false)
}

// SetSlotBytes writes KIVI residual slot `slot` exactly as stored (the bytes SlotBytes returns).
func (p *Pool) SetSlotBytes(slot int, b []byte) error {
	return p.setRawBytes("gokv_pool_set_slot_bytes", slot, b, 0, true)
}

func (p *Pool) setRawBytes(op string, index int, b []byte, nTokens int, slot bool) error {
	if len(b) == 0 {
		return newError(op, codeInvalid, "no bytes")
	}
	if err := p.acquire(op); err != nil {
		return err
	}
	defer p.mu.RUnlock()
	var pin runtime.Pinner
	pin.Pin(&b[0])
	defer pin.Unpin()
	in := unsafe.Pointer(&b[0])
	var err error
	if slot {
		err = resultError(op, C.gokv_cgo_pool_set_slot_bytes(p.handle, C.int32_t(clampInt32(index)), in, C.uint64_t(len(b))))
	} else {
		err = resultError(op, C.gokv_cgo_pool_set_page_bytes(p.handle, C.int32_t(clampInt32(index)), in,
			C.uint64_t(len(b)), C.int32_t(clampInt32(nTokens))))
	}
	runtime.KeepAlive(p)
	return err
}

// Measure measures the device's ceilings over about `bytes` of memory (0: the backend's default).
// It takes up to a few seconds; ErrNotSupported where the backend has no measurement.
func (d *Device) Measure(bytes uint64) (Ceilings, error) {
	const op = "gokv_device_measure"
	if err := d.acquire(op); err != nil {
		return Ceilings{}, err
	}
	defer d.mu.RUnlock()
	var c C.gokv_device_ceilings
	c.struct_size = C.uint32_t(unsafe.Sizeof(c))
	err := resultError(op, C.gokv_cgo_device_measure(d.handle, C.uint64_t(bytes), &c))
	runtime.KeepAlive(d)
	if err != nil {
		return Ceilings{}, err
	}
	return Ceilings{ReadGBps: float64(c.read_gbps), PeakGFLOPs: float64(c.peak_gflops), Method: cArrayString(c.method[:])}, nil
}

// InjectFault makes the next operation of site on any device of backend fail with the backend's own
// error code (Vulkan: a VkResult, e.g. -4 device lost, -2 out of device memory); code 0 disarms. For
// tests of the error paths; ErrNotSupported where the backend cannot inject faults.
func InjectFault(backend string, site, code int) error {
	const op = "gokv_inject_fault"
	cb := C.CString(backend)
	defer C.free(unsafe.Pointer(cb))
	return resultError(op, C.gokv_cgo_inject_fault(cb, C.int32_t(clampInt32(site)), C.int32_t(clampInt32(code))))
}
