//go:build vulkan

package bridge

// The Vulkan module (native/vulkan), linked under the vulkan build tag from the static library that
// CMake builds (`make vulkan`), found through pkg-config: point PKG_CONFIG_PATH at build/out/release/pkgconfig
// (or at an installed lib/pkgconfig). The C core and the CPU module still come from this package's cgo
// files; the library adds only the backend, which init registers as "vulkan" (and as the "auto" choice).

/*
#cgo pkg-config: gokv-vulkan
#include "gokv_cgo.h"
#include "gokv_vulkan.h"

static inline gokv_cgo_result gokv_cgo_vulkan_copy_gbps(gokv_device *dev, uint64_t bytes, double *gbps) {
	return gokv_cgo_result_of(gokv_vulkan_measure_copy_gbps(dev, bytes, gbps));
}
*/
import "C"

import "runtime"

func init() {
	// Registration fails only when the registry is full (8 backends); "vulkan" is then absent and
	// OpenDevice names it as not compiled in. No panic at init.
	_ = C.gokv_vulkan_register()
}

// VulkanValidationMessages counts the Vulkan validation messages (warnings and errors) received so far,
// when devices were opened with GOKV_VULKAN_VALIDATION=1. Tests assert it stays at zero.
func VulkanValidationMessages() uint64 { return uint64(C.gokv_vulkan_validation_messages()) }

// VulkanInjectFailure makes the next queue submission (site 0) or memory allocation (site 1) of any
// Vulkan device fail with the given VkResult, to test error paths (device lost = -4, out of device
// memory = -2).
func VulkanInjectFailure(site int, vkResult int) {
	C.gokv_vulkan_test_inject(C.int32_t(site), C.int32_t(vkResult))
}

// VulkanCopyGBps measures a Vulkan device's copy bandwidth in GB/s (bytes read plus bytes written per
// second by buffer copies of about `bytes` bytes, timed with GPU timestamps): the floor that
// `gokv bench --backend vulkan` reports attention against.
func VulkanCopyGBps(d *Device, bytes uint64) (float64, error) {
	const op = "gokv_vulkan_measure_copy_gbps"
	if err := d.acquire(op); err != nil {
		return 0, err
	}
	defer d.mu.RUnlock()
	var g C.double
	err := resultError(op, C.gokv_cgo_vulkan_copy_gbps(d.handle, C.uint64_t(bytes), &g))
	runtime.KeepAlive(d)
	return float64(g), err
}
