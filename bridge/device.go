//go:build cgo

package bridge

/*
#include <stdlib.h>
#include "gokv.h"
#include "gokv_cgo.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// Device is an open gokv device (gokv_device*): one backend instance with its worker threads and memory.
//
// Thread-safety: every method may be called from many goroutines at once. Close waits for the calls in
// flight on the device (and on its pools) to return, closes the device's open pools, then the device.
type Device struct {
	mu     sync.RWMutex // held shared by calls, exclusively by Close
	handle *C.gokv_device

	poolsMu sync.Mutex
	pools   map[*Pool]struct{}
}

// OpenDevice opens device index (-1: the backend's choice) of backend ("cpu", "vulkan", "metal", "sycl",
// or "auto": a vendor module if one is compiled in, else the CPU) with threads worker threads (0: all
// online CPUs). The caller must Close the device.
//
// It fails with ErrVersion when the linked C library has another ABI version than this package, and
// with ErrNoDevice when the backend is not compiled in.
func OpenDevice(backend string, index int, threads int) (*Device, error) {
	const op = "gokv_device_open"
	if abiErr != nil {
		return nil, abiErr
	}
	cBackend := C.CString(backend)
	defer C.free(unsafe.Pointer(cBackend))
	desc := C.gokv_device_desc{
		struct_size:  C.uint32_t(unsafe.Sizeof(C.gokv_device_desc{})),
		backend:      cBackend,
		device_index: C.int32_t(clampInt32(index)),
		n_threads:    C.int32_t(clampInt32(threads)),
	}
	var h *C.gokv_device
	if err := resultError(op, C.gokv_cgo_device_open(&desc, &h)); err != nil {
		return nil, err
	}
	return &Device{handle: h, pools: make(map[*Pool]struct{})}, nil
}

// Info queries the device's description (gokv_device_info_get).
func (d *Device) Info() (DeviceInfo, error) {
	const op = "gokv_device_info_get"
	if err := d.acquire(op); err != nil {
		return DeviceInfo{}, err
	}
	defer d.mu.RUnlock()
	var ci C.gokv_device_info
	ci.struct_size = C.uint32_t(unsafe.Sizeof(ci))
	err := resultError(op, C.gokv_cgo_device_info(d.handle, &ci))
	runtime.KeepAlive(d)
	if err != nil {
		return DeviceInfo{}, err
	}
	return DeviceInfo{
		Backend:      cArrayString(ci.backend[:]),
		Name:         cArrayString(ci.name[:]),
		Features:     cArrayString(ci.features[:]),
		MemoryBytes:  uint64(ci.memory_bytes),
		SubgroupSize: int(ci.subgroup_size),
		Threads:      int(ci.n_threads),
		Caps:         Caps(ci.caps),
		FormatMask:   uint32(ci.formats),
	}, nil
}

// acquire takes d.mu shared for one call and checks that the device is open; the caller releases it.
func (d *Device) acquire(op string) error {
	if d == nil {
		return newError(op, codeInvalid, "device is nil")
	}
	d.mu.RLock()
	if d.handle == nil {
		d.mu.RUnlock()
		return newError(op, codeInvalid, "device is closed")
	}
	return nil
}

// Close closes the device's open pools, then the device. It is safe to call twice, on a nil *Device,
// and concurrently with other calls (it waits for them); later calls on the device fail with ErrInvalid.
func (d *Device) Close() error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.handle == nil {
		return nil
	}
	// No pool can be created meanwhile (NewPool holds d.mu shared); pools closing concurrently take
	// poolsMu themselves, so close a snapshot.
	d.poolsMu.Lock()
	pools := make([]*Pool, 0, len(d.pools))
	for p := range d.pools {
		pools = append(pools, p)
	}
	d.poolsMu.Unlock()
	for _, p := range pools {
		_ = p.Close()
	}
	C.gokv_device_close(d.handle)
	d.handle = nil
	return nil
}

// cArrayString converts a fixed-size, NUL-terminated C char array without reading past its end.
func cArrayString(a []C.char) string {
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(a))), len(a))
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
