# Writes the metallib as a C byte array (cmake -DIN=<metallib> -DOUT=<file.c> -P embed_metallib.cmake), so the
# library carries its kernels and nothing is looked up on disk at run time. Run by native/metal/host/CMakeLists.txt.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n_bytes "${n_hex} / 2")
if(n_bytes EQUAL 0)
  message(FATAL_ERROR "embed_metallib: ${IN} is empty")
endif()
# "0x..," for each byte, 16 to a line (CMake's regular expressions have no {n}: the line is spelled out).
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REPEAT "0x..," 16 line)
string(REGEX REPLACE "(${line})" "\\1\n    " bytes "${bytes}")
file(WRITE "${OUT}.tmp"
  "/* Generated from ${IN} by native/metal/host/embed_metallib.cmake: the Metal kernels. */\n"
  "#include <stddef.h>\n\n"
  "const unsigned char gokv_metal_metallib[] = {\n    ${bytes}\n};\n"
  "const size_t gokv_metal_metallib_size = ${n_bytes};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
