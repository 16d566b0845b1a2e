#!/usr/bin/env bash
# build/deps.sh: installs what gokv's build and tests need, on Debian/Ubuntu (apt).
#
# Idempotent: apt-get runs only when a package is missing (dpkg -s), and only for packages this
# distribution actually offers (apt-cache policy shows a candidate), so a name missing on some
# release is reported and skipped instead of failing the whole install.
#
#   required: the C/C++ toolchain, CMake, GoogleTest, pkg-config   (missing ones are an error)
#   optional: ninja, and the Vulkan SDK pieces the Vulkan module will need (headers, glslc, lavapipe,
#             the Khronos validation layer; GOKV_DEPS_VULKAN=0 skips them), and an arm64 cross compiler
#             with qemu, which run the NEON kernels' checks on x86-64 (GOKV_DEPS_ARM64=0 skips them).
#
# Go itself is not installed here (Debian's golang is too old): the script checks it and says so.
set -euo pipefail

required=(build-essential g++ gcc make cmake pkg-config libgtest-dev)
optional=(ninja-build)
if [[ "${GOKV_DEPS_VULKAN:-1}" != 0 ]]; then
    optional+=(libvulkan-dev glslc mesa-vulkan-drivers vulkan-validationlayers)
fi
if [[ "${GOKV_DEPS_ARM64:-1}" != 0 && "$(uname -m)" == x86_64 ]]; then
    optional+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
fi

if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1; then
    echo "deps.sh: no apt-get/dpkg here; install by hand: ${required[*]} (optional: ${optional[*]})" >&2
    exit 0
fi

SUDO=()
if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        echo "deps.sh: not root and no sudo" >&2
    fi
fi
export DEBIAN_FRONTEND=noninteractive

installed() { dpkg -s "$1" 2>/dev/null | grep -q '^Status: install ok installed'; }
missing_of() { local p; for p in "$@"; do installed "$p" || echo "$p"; done; }

mapfile -t need_req < <(missing_of "${required[@]}")
mapfile -t need_opt < <(missing_of "${optional[@]}")
if (( ${#need_req[@]} == 0 && ${#need_opt[@]} == 0 )); then
    echo "deps.sh: all packages present"
else
    echo "deps.sh: missing: ${need_req[*]} ${need_opt[*]}"
    "${SUDO[@]}" apt-get update -qq
    # Keep only names this distribution offers (Candidate is not "(none)").
    available() { apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ { ok = ($2 != "(none)") } END { exit !ok }'; }
    install=()
    for p in "${need_req[@]}"; do
        if available "$p"; then install+=("$p"); else echo "deps.sh: required package $p is not available" >&2; exit 1; fi
    done
    for p in "${need_opt[@]}"; do
        if available "$p"; then install+=("$p"); else echo "deps.sh: optional package $p is not available here, skipped" >&2; fi
    done
    if (( ${#install[@]} > 0 )); then
        "${SUDO[@]}" apt-get install -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends "${install[@]}"
    fi
fi

# Go: required for the cgo bridge and the Go tests; the Makefile also looks in /usr/local/go/bin.
if ! command -v go >/dev/null 2>&1 && [[ ! -x /usr/local/go/bin/go ]]; then
    echo "deps.sh: Go (>= 1.26) not found; install it from https://go.dev/dl/ into /usr/local/go" >&2
    exit 1
fi
