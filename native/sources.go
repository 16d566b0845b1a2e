// Package native holds the C sources of gokv's native modules; it has no API. Package bridge imports it
// only so that Go's build cache sees those sources: cgo compiles native/cpu through bridge/gokv_unity.c,
// which #includes files outside bridge's folder, and the cache does not follow #include (golang/go#24355),
// so an edited kernel would go on being linked from the cache. Embedded, the files' contents are inputs of
// this package and hence of every package that imports it. The variable is never read, so the linker
// drops the bytes and binaries do not grow.
package native

import "embed"

//go:embed cpu/*.c cpu/*.h cpu/kernels/*.c cpu/kernels/*.h vulkan/*.c vulkan/*.h vulkan/shaders gpu/*.c gpu/*.h
//go:embed metal/*.h metal/kernels metal/emu/*.c metal/emu/*.cc metal/emu/*.h metal/emu/msl metal/host/*.m metal/host/*.h simt/*.cc simt/*.h
//go:embed sycl/*.h sycl/*.hpp sycl/*.cpp sycl/*.in sycl/kernels sycl/emu/sycl
var sources embed.FS
