# gokv: one entry point for building and testing everything (CI runs `make test` via .ci/run).
#
#   make test      deps, native release build + ctest (CPU, Vulkan on lavapipe with validation on, Metal
#                  and SYCL emulated on the CPU), ASan+UBSan build + ctest, NEON under qemu, go vet,
#                  go test -race, the device-free packages without cgo, go test -tags vulkan|metal|sycl
#   make build     native release build + go build
#   make native    native release build + ctest
#   make vulkan    the Vulkan module: build/out/release/native/vulkan/libgokv_vulkan.a and
#                  build/out/release/pkgconfig/gokv-vulkan.pc (for go build -tags vulkan)
#   make metal     the Metal module (macOS: the host on the Metal framework; elsewhere: emulated on the
#                  CPU): build/out/release/native/metal/libgokv_metal.a and pkgconfig/gokv-metal.pc
#   make sycl      the SYCL module (with a SYCL compiler: the real one; elsewhere: emulated on the CPU):
#                  build/out/release/native/sycl/libgokv_sycl.a and pkgconfig/gokv-sycl.pc
#   make native-arm64   on x86-64: the NEON kernels checked against the scalar ones (check_simd, cross-
#                  compiled for arm64 and run under qemu); skipped when the cross tools are missing
#   make go-test   go vet + go test -race
#   make go-test-nocgo   go vet + go test of the device-free packages with CGO_ENABLED=0
#   make go-test-vulkan   go test -tags vulkan ./... against the Vulkan module, validation layer on
#   make go-test-metal    go test -tags metal against the Metal module
#   make go-test-sycl     go test -tags sycl against the SYCL module
#   make clean     removes build/out
#
# Build output goes only under build/out/ (gitignored).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

# Go is usually installed in /usr/local/go (Debian's golang package is too old).
export PATH := $(PATH):/usr/local/go/bin

JOBS ?= 2
OUT := build/out
RELEASE_DIR := $(OUT)/release
ASAN_DIR := $(OUT)/asan
# Ninja when present, decided when cmake runs (deps.sh may have just installed it).
GENERATOR = $$(command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
CMAKE_ARGS ?=
# The Vulkan module: ON here (build/deps.sh installs what it needs on Debian); OFF skips it everywhere.
GOKV_VULKAN ?= ON
# The Metal module: ON here (on Linux its emulated backend, which needs only g++); OFF skips it everywhere.
GOKV_METAL ?= ON
# The SYCL module: ON here (without icpx its emulated backend, which needs only g++); OFF skips it everywhere.
GOKV_SYCL ?= ON
GOKV_ASAN_GPU ?= OFF
PKG_CONFIG_DIR := $(CURDIR)/$(RELEASE_DIR)/pkgconfig
GO ?= go
GO_TEST_FLAGS ?= -race -count=1

.PHONY: all test build native native-asan native-arm64 vulkan metal sycl go-build go-vet go-test go-test-vulkan go-test-metal go-test-sycl go-test-emulated deps clean FORCE

all: build

test: deps native native-asan native-arm64 go-test go-test-nocgo go-test-vulkan go-test-emulated

deps:
	build/deps.sh

# The release tree is configured on every run (about a second), so that GOKV_VULKAN and CMAKE_ARGS
# always apply, even to a tree configured before; cmake re-runs itself when sources change.
$(RELEASE_DIR)/CMakeCache.txt: FORCE
	cmake -S . -B $(RELEASE_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release -DGOKV_VULKAN=$(GOKV_VULKAN) -DGOKV_METAL=$(GOKV_METAL) -DGOKV_SYCL=$(GOKV_SYCL) $(CMAKE_ARGS)

FORCE:

$(ASAN_DIR)/CMakeCache.txt:
	# No Vulkan here: the sanitizers would instrument lavapipe's LLVM JIT callbacks too, and its leaks. The
	# emulated GPU backends only with GOKV_ASAN_GPU=ON (make native-asan GOKV_ASAN_GPU=ON): the GPU plan, the
	# shims and the kernels under the sanitizers, several minutes more than make test can spend.
	cmake -S . -B $(ASAN_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGOKV_SANITIZE=ON -DGOKV_VULKAN=OFF -DGOKV_METAL=$(GOKV_ASAN_GPU) -DGOKV_SYCL=$(GOKV_ASAN_GPU) $(CMAKE_ARGS)

native: $(RELEASE_DIR)/CMakeCache.txt
	cmake --build $(RELEASE_DIR) -j$(JOBS)
	ctest --test-dir $(RELEASE_DIR) --output-on-failure -j$(JOBS)

# The NEON kernels (native/cpu/kernels/neon.c) on an x86-64 machine: check_simd compares every entry of
# the NEON table with the scalar one on random data, then whole attention calls with the scalar path and a
# float64 reference; static, so qemu needs no arm64 libraries. On arm64 hosts the ctest suite covers NEON.
ARM64_CC ?= aarch64-linux-gnu-gcc
ARM64_RUN ?= qemu-aarch64
ARM64_DIR := $(OUT)/arm64
CPU_CHECK_SOURCES := native/cpu/bench/check_simd.c bridge/gokv_core.c bridge/gokv_layout.c bridge/gokv_validate.c \
                     bridge/gokv_pages.c bridge/gokv_unity.c
native-arm64:
	@if [ "$$(uname -m)" != x86_64 ]; then echo "native-arm64: not an x86-64 host, skipped"; \
	elif ! command -v $(ARM64_CC) >/dev/null || ! command -v $(ARM64_RUN) >/dev/null; then \
	  echo "native-arm64: $(ARM64_CC) or $(ARM64_RUN) missing (build/deps.sh installs them), skipped"; \
	else mkdir -p $(ARM64_DIR) && \
	  $(ARM64_CC) -std=c11 -O2 -static -Wall -Wextra -Ibridge -Inative/cpu $(CPU_CHECK_SOURCES) -lm -lpthread \
	    -o $(ARM64_DIR)/check_simd && $(ARM64_RUN) $(ARM64_DIR)/check_simd; fi

# With GOKV_ASAN_GPU=ON the emulated GPU backends run their emulators' tests and the conformance cases that
# cover the plan's every pass (stores, copies, gathers, stored bytes, KIVI rings, validation, faults); the
# release tree runs every case, and the kernels' arithmetic is not what the sanitizers add to.
ASAN_CTEST_EXCLUDE ?= ^(metal|sycl)(\.[a-z0-9]+)?\.(Table|Formats)/|^sycl\.sg[0-9]+\.
native-asan: $(ASAN_DIR)/CMakeCache.txt
	cmake --build $(ASAN_DIR) -j$(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(ASAN_DIR) --output-on-failure -j$(JOBS) -E '$(ASAN_CTEST_EXCLUDE)'

vulkan: $(RELEASE_DIR)/CMakeCache.txt
	cmake --build $(RELEASE_DIR) -j$(JOBS) --target gokv_vulkan
	@echo "Vulkan module built; for go build -tags vulkan: export PKG_CONFIG_PATH=$(PKG_CONFIG_DIR)"

metal: $(RELEASE_DIR)/CMakeCache.txt
	cmake --build $(RELEASE_DIR) -j$(JOBS) --target gokv_metal
	@echo "Metal module built ($$([ "$$(uname -s)" = Darwin ] && echo on the Metal framework || echo emulated on the CPU)); for go build -tags metal: export PKG_CONFIG_PATH=$(PKG_CONFIG_DIR)"

sycl: $(RELEASE_DIR)/CMakeCache.txt
	cmake --build $(RELEASE_DIR) -j$(JOBS) --target gokv_sycl
	@echo "SYCL module built; for go build -tags sycl: export PKG_CONFIG_PATH=$(PKG_CONFIG_DIR)"

go-build:
	$(GO) build ./...

go-vet:
	$(GO) vet ./...

go-test: go-vet
	$(GO) test $(GO_TEST_FLAGS) ./...

# The device-free parts (formats, model specs, presets, HF configs, Plan, internal/llama's loaders) built
# and tested without cgo; the tests that need a device skip themselves there.
.PHONY: go-test-nocgo
go-test-nocgo:
	CGO_ENABLED=0 $(GO) vet ./...
	CGO_ENABLED=0 $(GO) test -count=1 ./gokv/... ./internal/...

# Runs only when the Vulkan module is on (GOKV_VULKAN=OFF skips it).
go-test-vulkan:
	@if [ "$(GOKV_VULKAN)" = "OFF" ]; then echo "GOKV_VULKAN=OFF: skipping go test -tags vulkan"; else \
	  $(MAKE) --no-print-directory vulkan && \
	  PKG_CONFIG_PATH=$(PKG_CONFIG_DIR) GOKV_VULKAN_VALIDATION=1 $(GO) test -tags vulkan -count=1 ./...; fi

# Runs only when the Metal module is on (GOKV_METAL=OFF skips it). Off macOS the backend is the emulator,
# and make test runs the cross-backend tests of package bridge on it (every format, GQA and MLA, sinks,
# windows, holes, decode and prefill against the CPU); GO_TEST_METAL_PKGS=./... runs every package.
GO_TEST_METAL_PKGS ?= ./bridge/
go-test-metal:
	@if [ "$(GOKV_METAL)" = "OFF" ]; then echo "GOKV_METAL=OFF: skipping go test -tags metal"; else \
	  $(MAKE) --no-print-directory metal && \
	  PKG_CONFIG_PATH=$(PKG_CONFIG_DIR) $(GO) test -tags metal -count=1 $(GO_TEST_METAL_PKGS); fi

# Runs only when the SYCL module is on (GOKV_SYCL=OFF skips it); without icpx on the emulated backend, as
# go-test-metal does.
GO_TEST_SYCL_PKGS ?= ./bridge/
go-test-sycl:
	@if [ "$(GOKV_SYCL)" = "OFF" ]; then echo "GOKV_SYCL=OFF: skipping go test -tags sycl"; else \
	  $(MAKE) --no-print-directory sycl && \
	  PKG_CONFIG_PATH=$(PKG_CONFIG_DIR) $(GO) test -tags sycl -count=1 $(GO_TEST_SYCL_PKGS); fi

# make test: both emulated backends in one go test (one cgo build of package bridge for the two tags).
go-test-emulated:
	@tags="$$([ "$(GOKV_METAL)" != OFF ] && echo metal) $$([ "$(GOKV_SYCL)" != OFF ] && echo sycl)"; \
	if [ -z "$${tags// /}" ]; then echo "GOKV_METAL=OFF and GOKV_SYCL=OFF: skipping their go tests"; else \
	  for t in $$tags; do $(MAKE) --no-print-directory $$t; done && \
	  PKG_CONFIG_PATH=$(PKG_CONFIG_DIR) $(GO) test -tags "$$tags" -count=1 ./bridge/; fi

build: $(RELEASE_DIR)/CMakeCache.txt go-build
	cmake --build $(RELEASE_DIR) -j$(JOBS)

clean:
	rm -rf $(OUT)
