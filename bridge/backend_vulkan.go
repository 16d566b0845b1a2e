//go:build cgo && vulkan

package bridge

// The Vulkan module (native/vulkan), linked under the vulkan build tag from the static library that
// CMake builds (`make vulkan`), found through pkg-config: point PKG_CONFIG_PATH at build/out/release/pkgconfig
// (or at an installed lib/pkgconfig). The C core and the CPU module still come from this package's cgo
// files; the library adds only the backend, which init registers as "vulkan" (and as the "auto" choice).

/*
#cgo pkg-config: gokv-vulkan
#include "gokv_vulkan.h"
*/
import "C"

func init() {
	// Registration fails only when the registry is full (8 backends); "vulkan" is then absent and
	// OpenDevice names it as not compiled in. No panic at init.
	_ = C.gokv_vulkan_register()
}
