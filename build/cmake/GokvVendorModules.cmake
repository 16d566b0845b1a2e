# Vendor modules (docs/architecture.md §7). Vulkan is built when its SDK is found; Metal and SYCL are not
# implemented yet: their checks only report what they found, so that turning an option on never pretends
# to build a module that does not exist.
include_guard(GLOBAL)

# Vulkan: AUTO builds it when the headers, the loader and glslc are all found; ON insists.
if(NOT GOKV_VULKAN STREQUAL "OFF")
  find_package(Vulkan QUIET COMPONENTS glslc)
  if(Vulkan_FOUND AND TARGET Vulkan::glslc)
    message(STATUS "gokv: building the Vulkan module (${Vulkan_LIBRARY}, ${Vulkan_GLSLC_EXECUTABLE})")
    add_subdirectory(native/vulkan)
  elseif(GOKV_VULKAN STREQUAL "AUTO")
    message(STATUS "gokv: Vulkan headers/loader or glslc not found; the Vulkan module is not built")
  else()
    message(FATAL_ERROR "gokv: GOKV_VULKAN=ON but the Vulkan headers/loader or glslc were not found "
                        "(Debian: build/deps.sh installs libvulkan-dev and glslc)")
  endif()
endif()

if(GOKV_METAL)
  if(APPLE)
    find_library(GOKV_METAL_FRAMEWORK Metal)
  endif()
  if(GOKV_METAL_FRAMEWORK)
    message(STATUS "gokv: Metal framework found; the Metal module is not yet implemented")
  else()
    message(STATUS "gokv: GOKV_METAL=ON but the Metal framework was not found (macOS only); the Metal module is not yet implemented")
  endif()
endif()

if(GOKV_SYCL)
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS -fsycl)
  check_cxx_source_compiles("#include <sycl/sycl.hpp>\nint main() { sycl::queue q; return 0; }" GOKV_HAVE_SYCL)
  unset(CMAKE_REQUIRED_FLAGS)
  if(GOKV_HAVE_SYCL)
    message(STATUS "gokv: SYCL compiler found; the SYCL module is not yet implemented")
  else()
    message(STATUS "gokv: GOKV_SYCL=ON but no SYCL 2020 compiler was found; the SYCL module is not yet implemented")
  endif()
endif()
