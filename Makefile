# gokv: one entry point for building and testing everything (CI runs `make test` via .ci/run).
#
#   make test      deps, native release build + ctest, ASan+UBSan build + ctest, go vet, go test -race
#   make build     native release build + go build
#   make native    native release build + ctest
#   make go-test   go vet + go test -race
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
GO ?= go
GO_TEST_FLAGS ?= -race -count=1

.PHONY: all test build native native-asan go-build go-vet go-test deps clean

all: build

test: deps native native-asan go-test

deps:
	build/deps.sh

# Configure only if needed; cmake re-runs itself when CMakeLists or globbed sources change.
$(RELEASE_DIR)/CMakeCache.txt:
	cmake -S . -B $(RELEASE_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

$(ASAN_DIR)/CMakeCache.txt:
	cmake -S . -B $(ASAN_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGOKV_SANITIZE=ON $(CMAKE_ARGS)

native: $(RELEASE_DIR)/CMakeCache.txt
	cmake --build $(RELEASE_DIR) -j$(JOBS)
	ctest --test-dir $(RELEASE_DIR) --output-on-failure -j$(JOBS)

native-asan: $(ASAN_DIR)/CMakeCache.txt
	cmake --build $(ASAN_DIR) -j$(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(ASAN_DIR) --output-on-failure -j$(JOBS)

go-build:
	$(GO) build ./...

go-vet:
	$(GO) vet ./...

go-test: go-vet
	$(GO) test $(GO_TEST_FLAGS) ./...

build: $(RELEASE_DIR)/CMakeCache.txt go-build
	cmake --build $(RELEASE_DIR) -j$(JOBS)

clean:
	rm -rf $(OUT)
