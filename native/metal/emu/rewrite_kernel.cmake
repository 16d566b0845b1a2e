# cmake -DIN=<kernel source> -DOUT=<copy> -P rewrite_kernel.cmake: the emulator's copy of one Metal kernel
# file (native/metal/emu/README.md). `[[threadgroup(n)]]` becomes `[[gokv_threadgroup_memory(n)]]`, since the
# MSL shim defines `threadgroup` as an empty macro (an address space the emulator does not have) and a
# macro would also rewrite the attribute's name; a #line directive keeps the kernel's own file and line
# numbers in compiler messages and in the emulator's barrier and simdgroup errors. Written only when the
# copy changes, so an unchanged kernel is not recompiled.
file(READ "${IN}" text)
string(REPLACE "[[threadgroup(" "[[gokv_threadgroup_memory(" text "${text}")
set(text "#line 1 \"${IN}\"\n${text}")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
