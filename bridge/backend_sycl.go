//go:build cgo && sycl

package bridge

// The SYCL module (native/sycl), linked under the sycl build tag from the static library that CMake builds
// (GOKV_SYCL=AUTO or ON), found through pkg-config: point PKG_CONFIG_PATH at build/out/release/pkgconfig (or
// at an installed lib/pkgconfig). Built with a SYCL compiler (oneAPI icpx) the library runs the kernels on
// Intel GPUs, and its .pc adds the kernels' linked device code and the SYCL runtime; built without one it
// is the emulated backend, which runs the same kernels on the CPU under the SIMT emulator (slow: for
// tests; its device info says so), and its .pc adds the C++ runtime. The C core and the CPU module still
// come from this package's cgo files; the library adds only the backend, which init registers as "sycl".

/*
#cgo pkg-config: gokv-sycl
#include "gokv_sycl.h"
*/
import "C"

func init() {
	// Registration fails only when the registry is full (8 backends); "sycl" is then absent and
	// OpenDevice names it as not compiled in. No panic at init.
	_ = C.gokv_sycl_register()
}
