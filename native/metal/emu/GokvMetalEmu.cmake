# gokv_metal_emu_kernels: Metal kernel files compiled as C++ for the SIMT emulator (native/metal/emu/README.md).
#
#   gokv_metal_emu_kernels(<target> TABLES <symbol> GEN_DIR <dir> KERNELS <.metal files> [HEADERS <.h files>]
#                          [INCLUDES <dirs searched after GEN_DIR>])
#
# For each file of KERNELS and HEADERS, a build step writes the emulator's copy into GEN_DIR
# (rewrite_kernel.cmake); for each kernel file <stem>.metal, one generated translation unit
# (mtl_emu_kernels.cc.in) compiles the copy and holds its instances, the MTL_INSTANCES_<STEM> list, as a
# table; one more unit (mtl_emu_tables.cc.in) lists the tables as gokv_mtl_emu::<symbol>[]. All are added
# to <target>. One unit per kernel file, so that they compile in parallel; at -O2 whatever the build type,
# since every kernel runs once per GPU thread under the emulator; unsuffixed floating literals are float,
# as in MSL (-fsingle-precision-constant), and nothing is contracted into an fma.
include_guard(GLOBAL)

set(GOKV_MTL_EMU_DIR "${CMAKE_CURRENT_LIST_DIR}")

function(gokv_metal_emu_kernels target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "TABLES;GEN_DIR" "KERNELS;HEADERS;INCLUDES")
  file(MAKE_DIRECTORY "${arg_GEN_DIR}")
  set(script "${GOKV_MTL_EMU_DIR}/rewrite_kernel.cmake")
  set(copies "")
  foreach(src IN LISTS arg_KERNELS arg_HEADERS)
    get_filename_component(file_name "${src}" NAME)
    set(copy "${arg_GEN_DIR}/${file_name}")
    add_custom_command(
      OUTPUT "${copy}"
      COMMAND "${CMAKE_COMMAND}" "-DIN=${src}" "-DOUT=${copy}" -P "${script}"
      DEPENDS "${src}" "${script}"
      COMMENT "metal emulator: ${file_name}"
      VERBATIM)
    list(APPEND copies "${copy}")
  endforeach()
  add_custom_target(${target}_kernel_copies DEPENDS ${copies})
  add_dependencies(${target} ${target}_kernel_copies)

  set(units "")
  set(GOKV_MTL_TABLE_DECLS "")
  set(GOKV_MTL_TABLE_ENTRIES "")
  foreach(src IN LISTS arg_KERNELS)
    get_filename_component(stem "${src}" NAME_WE)
    set(GOKV_MTL_FILE "${stem}.metal")
    string(TOUPPER "${stem}" GOKV_MTL_LIST)
    string(MAKE_C_IDENTIFIER "${stem}" GOKV_MTL_ID)
    set(unit "${arg_GEN_DIR}/mtl_emu_kernel_${stem}.cc")
    configure_file("${GOKV_MTL_EMU_DIR}/mtl_emu_kernels.cc.in" "${unit}" @ONLY)
    list(APPEND units "${unit}")
    string(APPEND GOKV_MTL_TABLE_DECLS "extern const gokv_mtl_emu::Table gokv_mtl_emu_table_${GOKV_MTL_ID};\n")
    string(APPEND GOKV_MTL_TABLE_ENTRIES "    &gokv_mtl_emu_table_${GOKV_MTL_ID},\n")
  endforeach()
  set(GOKV_MTL_TABLES_NAME "${arg_TABLES}")
  set(tables "${arg_GEN_DIR}/mtl_emu_tables.cc")
  configure_file("${GOKV_MTL_EMU_DIR}/mtl_emu_tables.cc.in" "${tables}" @ONLY)

  target_sources(${target} PRIVATE ${units} "${tables}")
  set(includes "${arg_GEN_DIR}" ${arg_INCLUDES} "${GOKV_MTL_EMU_DIR}/msl" "${GOKV_MTL_EMU_DIR}"
               "${PROJECT_SOURCE_DIR}/native/gpu" "${PROJECT_SOURCE_DIR}/native/metal" "${PROJECT_SOURCE_DIR}/native/simt"
               "${PROJECT_SOURCE_DIR}/bridge")
  set_source_files_properties(${units} PROPERTIES
    INCLUDE_DIRECTORIES "${includes}"
    COMPILE_OPTIONS "-O2;-fsingle-precision-constant;-ffp-contract=off;-Wno-attributes;-Wno-unused-parameter")
  set_source_files_properties("${tables}" PROPERTIES INCLUDE_DIRECTORIES "${GOKV_MTL_EMU_DIR};${PROJECT_SOURCE_DIR}/native/simt")
endfunction()
