//go:build cgo && metal

package bridge

// The Metal module (native/metal), linked under the metal build tag from the static library that CMake
// builds (-DGOKV_METAL=ON), found through pkg-config: point PKG_CONFIG_PATH at build/out/release/pkgconfig
// (or at an installed lib/pkgconfig). On macOS the library runs the kernels on the GPU; elsewhere it is
// the emulated backend, which runs the same kernels on the CPU under the SIMT emulator (slow: for tests;
// its device info says so), and its .pc adds the C++ runtime. The C core and the CPU module still come
// from this package's cgo files; the library adds only the backend, which init registers as "metal".

/*
#cgo pkg-config: gokv-metal
#include "gokv_metal.h"
*/
import "C"

func init() {
	// Registration fails only when the registry is full (8 backends); "metal" is then absent and
	// OpenDevice names it as not compiled in. No panic at init.
	_ = C.gokv_metal_register()
}
