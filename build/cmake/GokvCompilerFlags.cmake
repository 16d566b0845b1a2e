# Compiler flags shared by every gokv target.
#
# No -march: one build serves every CPU of an architecture; SIMD kernels carry function-level target
# attributes and are chosen at run time (docs/architecture.md §2). Fast-math stays off: the kernels
# rely on IEEE semantics (inf in the softmax max, NaN checks in validation). C is compiled as ISO C11
# (-std=c11, as cgo does), so both builds see the same language.
include_guard(GLOBAL)

if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
  add_compile_options(-Wall -Wextra -fno-fast-math)
endif()

if(GOKV_SANITIZE)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
    message(FATAL_ERROR "GOKV_SANITIZE needs GCC or Clang")
  endif()
  set(_gokv_san -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
  # -O1 as the ASan docs advise: at -O2 the AVX-512 kernels take minutes to compile instrumented.
  add_compile_options(${_gokv_san} -O1)
  add_link_options(${_gokv_san})
  message(STATUS "gokv: building with ASan + UBSan")
endif()
