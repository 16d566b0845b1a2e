# Vendor modules (docs/architecture.md §7). Vulkan is built when its SDK is found, Metal on macOS on the
# framework and elsewhere as its emulated backend, SYCL with a SYCL compiler and elsewhere as its emulated
# backend.
include_guard(GLOBAL)

# The GPU dispatch plan (native/gpu, library gokv_gpu): one copy shared by every GPU module. A GPU module's
# block calls gokv_use_gpu_plan() just before adding the module: the first call adds native/gpu, later
# ones do nothing, and a build without GPU modules never builds it.
macro(gokv_use_gpu_plan)
  if(NOT TARGET gokv_gpu)
    add_subdirectory(native/gpu)
  endif()
endmacro()

# Vulkan: AUTO builds it when the headers, the loader and glslc are all found; ON insists.
if(NOT GOKV_VULKAN STREQUAL "OFF")
  find_package(Vulkan QUIET COMPONENTS glslc)
  if(Vulkan_FOUND AND TARGET Vulkan::glslc)
    message(STATUS "gokv: building the Vulkan module (${Vulkan_LIBRARY}, ${Vulkan_GLSLC_EXECUTABLE})")
    gokv_use_gpu_plan()
    add_subdirectory(native/vulkan)
  elseif(GOKV_VULKAN STREQUAL "AUTO")
    message(STATUS "gokv: Vulkan headers/loader or glslc not found; the Vulkan module is not built")
  else()
    message(FATAL_ERROR "gokv: GOKV_VULKAN=ON but the Vulkan headers/loader or glslc were not found "
                        "(Debian: build/deps.sh installs libvulkan-dev and glslc)")
  endif()
endif()

# Metal (native/metal): on macOS the host (native/metal/host) on the Metal framework; elsewhere, or with
# GOKV_METAL_EMULATE=ON, the emulated backend: the same kernels and dispatch plan, the kernels compiled as
# C++17 against an MSL shim and run on the CPU by the SIMT emulator (native/metal/README.md), which needs
# only a compiler with C++17 and _Float16. AUTO builds whichever this machine allows; ON insists.
option(GOKV_METAL_EMULATE "Build the Metal module's emulated backend (kernels on the CPU) even on macOS" OFF)
if(GOKV_METAL)
  if(APPLE AND NOT GOKV_METAL_EMULATE)
    find_library(GOKV_METAL_FRAMEWORK Metal)
    if(GOKV_METAL_FRAMEWORK AND EXISTS "${PROJECT_SOURCE_DIR}/native/metal/host/CMakeLists.txt")
      message(STATUS "gokv: building the Metal module (${GOKV_METAL_FRAMEWORK})")
      gokv_use_gpu_plan()
      add_subdirectory(native/metal)
    elseif(GOKV_METAL STREQUAL "AUTO")
      message(STATUS "gokv: the Metal framework or native/metal/host is missing; the Metal module is not built")
    else()
      message(FATAL_ERROR "gokv: GOKV_METAL=ON but the Metal framework or native/metal/host is missing "
                          "(GOKV_METAL_EMULATE=ON builds the emulated backend instead)")
    endif()
  else()
    include(CheckCXXSourceCompiles)
    check_cxx_source_compiles([=[
      #include <type_traits>
      template <int N> int f() { if constexpr (N == 3) return 1; else return 0; }
      int main() { _Float16 h = (_Float16)0.5f; return f<3>() + (int)(float)h - 1 + (__builtin_LINE() > 0 ? 0 : 1); }
    ]=] GOKV_HAVE_METAL_EMULATOR)
    if(GOKV_HAVE_METAL_EMULATOR)
      message(STATUS "gokv: building the Metal module's emulated backend (kernels on the CPU, native/simt)")
      gokv_use_gpu_plan()
      add_subdirectory(native/metal)
    elseif(GOKV_METAL STREQUAL "AUTO")
      message(STATUS "gokv: the C++ compiler lacks C++17 or _Float16; the Metal module's emulated backend is not built")
    else()
      message(FATAL_ERROR "gokv: GOKV_METAL=ON needs a C++17 compiler with _Float16 (GCC 12, Clang 15) for the "
                          "emulated backend")
    endif()
  endif()
endif()

# SYCL (native/sycl): the real module when the C++ compiler is a SYCL compiler (configure with CXX=icpx after
# sourcing oneAPI's setvars.sh): every file compiles with -fsycl, and the kernels are embedded in the library
# (ahead of time for GOKV_SYCL_AOT_DEVICES when ocloc is there, SPIR-V for the driver otherwise). Elsewhere,
# or with GOKV_SYCL_EMULATE=ON, the emulated backend: the same host code and kernels compiled as C++17
# against the header-only SYCL shim (native/sycl/emu), the kernels run on the CPU by the SIMT emulator, which
# needs only C++17 and _Float16. AUTO builds whichever this machine allows; ON insists.
option(GOKV_SYCL_EMULATE "Build the SYCL module's emulated backend (kernels on the CPU) even with a SYCL compiler" OFF)
set(GOKV_SYCL_AOT_DEVICES "pvc,dg2" CACHE STRING
    "Intel GPUs the SYCL kernels are compiled for ahead of time (ocloc -device list); empty: SPIR-V only")
if(GOKV_SYCL)
  include(CheckCXXSourceCompiles)
  set(GOKV_SYCL_EMULATED_BUILD OFF)
  if(NOT GOKV_SYCL_EMULATE)
    set(CMAKE_REQUIRED_FLAGS -fsycl)
    check_cxx_source_compiles("#include <sycl/sycl.hpp>\nint main() { sycl::queue q; return 0; }" GOKV_HAVE_SYCL)
    unset(CMAKE_REQUIRED_FLAGS)
  endif()
  if(GOKV_HAVE_SYCL AND NOT GOKV_SYCL_EMULATE)
    message(STATUS "gokv: building the SYCL module (${CMAKE_CXX_COMPILER} -fsycl)")
    gokv_use_gpu_plan()
    add_subdirectory(native/sycl)
  else()
    check_cxx_source_compiles([=[
      #include <type_traits>
      template <int N> int f() { if constexpr (N == 3) return 1; else return 0; }
      int main() { _Float16 h = (_Float16)0.5f; return f<3>() + (int)(float)h - 1 + (__builtin_LINE() > 0 ? 0 : 1); }
    ]=] GOKV_HAVE_SYCL_EMULATOR)
    if(GOKV_HAVE_SYCL_EMULATOR AND EXISTS "${PROJECT_SOURCE_DIR}/native/sycl/emu/sycl/sycl.hpp")
      message(STATUS "gokv: building the SYCL module's emulated backend (kernels on the CPU, native/simt)")
      set(GOKV_SYCL_EMULATED_BUILD ON)
      gokv_use_gpu_plan()
      add_subdirectory(native/sycl)
    elseif(GOKV_SYCL STREQUAL "AUTO")
      message(STATUS "gokv: no SYCL compiler, and the C++ compiler lacks C++17 or _Float16 (or native/sycl/emu is "
                     "missing); the SYCL module is not built")
    else()
      message(FATAL_ERROR "gokv: GOKV_SYCL=ON needs a SYCL 2020 compiler (oneAPI: source setvars.sh, configure with "
                          "CXX=icpx) or, for the emulated backend, a C++17 compiler with _Float16 (GCC 12, Clang 15)")
    endif()
  endif()
endif()
