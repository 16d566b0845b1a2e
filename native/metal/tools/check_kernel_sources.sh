#!/bin/sh
# check_kernel_sources.sh DIR: fails when a Metal kernel source in DIR (*.metal, *.h) uses something that only
# the emulator would accept (native/metal/emu compiles these files as C++): the emulator's or the C++
# library's names, headers other than <metal_stdlib> and the module's own, preprocessor branches on the
# compiler, double, half literals (0.5h), function constants, or threadgroup memory declared anywhere but
# as a [[threadgroup(n)]] kernel parameter. Run by ctest (metal_emu.kernel_sources) and usable by hand.
set -eu
dir=${1:?usage: check_kernel_sources.sh DIR}
status=0
report() { # pattern, what
    hits=$(grep -nE "$1" "$dir"/*.metal "$dir"/*.h 2>/dev/null | grep -vE '^[^:]+:[0-9]+:\s*//' || true)
    if [ -n "$hits" ]; then
        printf '%s\n%s\n\n' "Metal kernel sources: $2:" "$hits" >&2
        status=1
    fi
}
report '\bsimt\b|\bstd::|\bgokv::' "the emulator's or the C++ library's names"
report '__cplusplus|__GNUC__|GOKV_MTL_EMU|__clang_major__' "branches on the compiler (the same source must mean the same on both)"
report '\bdouble\b' "double (no fp64 on Apple GPUs)"
report '(^|[^A-Za-z0-9_.])([0-9]+\.?[0-9]*|\.[0-9]+)h\b' "half literals such as 0.5h (write half(0.5f))"
report 'function_constant' "function constants (use template parameters)"
report '\bthreadgroup\s+[A-Za-z_][A-Za-z0-9_:<>]*\s+[A-Za-z_][A-Za-z0-9_]*\s*(\[|;|=)' \
    "threadgroup memory declared as a variable (pass it as a [[threadgroup(n)]] parameter)"
# <metal_stdlib> is the one system header allowed.
hits=$(grep -nE '^\s*#\s*include\s*<' "$dir"/*.metal "$dir"/*.h 2>/dev/null | grep -v '<metal_stdlib>' || true)
[ -z "$hits" ] || { printf 'Metal kernel sources: system headers other than <metal_stdlib>:\n%s\n' "$hits" >&2; status=1; }
exit $status
