# gokv_add_backend: a vendor module is one folder and one call (docs/adding-a-backend.md).
#
#   gokv_add_backend(<name> SOURCES <files...> [LIBS <link items...>] [PC_LIBS <-l flags...>]
#                    [PC_REQUIRES <pkg-config modules...>] [HEADERS <public headers...>])
#
# builds the static library gokv_<name> (libgokv_<name>.a) from SOURCES, linked against the C core
# (gokv_core) and LIBS; writes pkgconfig/gokv-<name>.pc into the build tree (what `go build -tags <name>`
# finds through `#cgo pkg-config: gokv-<name>`) and an installed copy; the LIBS that are static libraries
# of this build (e.g. gokv_gpu, the GPU dispatch plan) are named in the .pc after the module's archive
# (-L<their build folder> -l<target>; installed: -l<target> from the libdir, where their own CMakeLists
# install them), so that cgo links them too; installs the library and HEADERS
# with the ABI headers; and adds <name> to the global property GOKV_VENDOR_BACKENDS, which the
# conformance suite (native/tests) runs over. The module's registration function is
# gokv_<name>_register(), declared in gokv_<name>.h in its folder.
include_guard(GLOBAL)
include(GNUInstallDirs)

function(gokv_add_backend name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;LIBS;PC_LIBS;PC_REQUIRES;HEADERS")
  set(target gokv_${name})
  add_library(${target} STATIC ${arg_SOURCES})
  target_include_directories(${target} PUBLIC "${CMAKE_CURRENT_SOURCE_DIR}")
  target_link_libraries(${target} PUBLIC gokv_core ${arg_LIBS})

  # pkg-config for cgo. The core and the CPU module come from cgo's own build of package bridge, so the
  # .pc names only this module's archive and what it needs.
  set(GOKV_PC_NAME "${name}")
  list(JOIN arg_PC_REQUIRES " " GOKV_PC_REQUIRES)
  list(JOIN arg_PC_LIBS " " GOKV_PC_LIBS)
  set(GOKV_PC_ARCHIVES "")
  set(installed_archives "")
  foreach(lib IN LISTS arg_LIBS)
    if(NOT TARGET ${lib})
      continue()
    endif()
    get_target_property(lib_type ${lib} TYPE)
    get_target_property(lib_imported ${lib} IMPORTED)
    if(lib_type STREQUAL "STATIC_LIBRARY" AND NOT lib_imported)
      get_target_property(lib_dir ${lib} BINARY_DIR)
      string(APPEND GOKV_PC_ARCHIVES " -L${lib_dir} -l${lib}")
      string(APPEND installed_archives " -l${lib}")
    endif()
  endforeach()
  set(GOKV_PC_LIBDIR "${CMAKE_CURRENT_BINARY_DIR}")
  set(GOKV_PC_INCLUDEDIR "${CMAKE_CURRENT_SOURCE_DIR}")
  configure_file("${PROJECT_SOURCE_DIR}/build/cmake/gokv-backend.pc.in" "${CMAKE_BINARY_DIR}/pkgconfig/gokv-${name}.pc" @ONLY)
  set(GOKV_PC_ARCHIVES "${installed_archives}")
  set(GOKV_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(GOKV_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}/gokv")
  configure_file("${PROJECT_SOURCE_DIR}/build/cmake/gokv-backend.pc.in" "${CMAKE_CURRENT_BINARY_DIR}/install/gokv-${name}.pc" @ONLY)

  install(TARGETS ${target} ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")
  install(FILES ${arg_HEADERS} "${PROJECT_SOURCE_DIR}/bridge/gokv.h" "${PROJECT_SOURCE_DIR}/bridge/gokv_backend.h"
                "${PROJECT_SOURCE_DIR}/bridge/gokv_layout.h"
          DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/gokv")
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/install/gokv-${name}.pc" DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig")

  set_property(GLOBAL APPEND PROPERTY GOKV_VENDOR_BACKENDS "${name}")
  message(STATUS "gokv: backend \"${name}\" (${target}, pkgconfig/gokv-${name}.pc)")
endfunction()
