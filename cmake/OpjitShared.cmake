# cmake/OpjitShared.cmake - can libopjit.so be built here?
#
# Debian's libtcc.a is position independent except for PC32 references to
# glibc's stdout, stderr and environ, which cannot go into a shared object.
# A copy of it, made in the build directory with those three renamed to
# opjit_tcc_* (defined, hidden, by jit/tcc_glibc.c), links into one with
# -Wl,--exclude-libs,ALL. The cache key keeps naming the original
# libtcc.a (OPJIT_TCC_HASH): the compiler is the same code.
#
# In:  OPJIT_SHARED (option), TCC_LIBRARY, TCC_INCLUDE_DIR.
# Out: OPJIT_BUILD_SHARED (ON/OFF); when ON, OPJIT_TCC_PIC_LIBRARY (the
#      patched copy) and the target opjit_tcc_pic that makes it.

set(OPJIT_BUILD_SHARED OFF)
set(OPJIT_TCC_RENAMES
  --redefine-sym stdout=opjit_tcc_stdout
  --redefine-sym stderr=opjit_tcc_stderr
  --redefine-sym environ=opjit_tcc_environ)

function(opjit_shared_check out_ok out_why)
  set(${out_ok} OFF PARENT_SCOPE)
  if(CMAKE_OBJCOPY)
    set(objcopy ${CMAKE_OBJCOPY})
  else()
    find_program(OPJIT_OBJCOPY objcopy)
    set(objcopy ${OPJIT_OBJCOPY})
  endif()
  if(NOT objcopy)
    set(${out_why} "objcopy not found (Debian package binutils)" PARENT_SCOPE)
    return()
  endif()
  set(OPJIT_OBJCOPY_EXE ${objcopy} PARENT_SCOPE)

  # Checked once per libtcc, shim, objcopy and compiler.
  file(SHA256 ${TCC_LIBRARY} hash)
  file(SHA256 ${PROJECT_SOURCE_DIR}/jit/tcc_glibc.c shim_hash)
  set(key "${hash}|${shim_hash}|${objcopy}|${CMAKE_C_COMPILER}")
  if(DEFINED CACHE{OPJIT_SHARED_CHECK} AND "$CACHE{OPJIT_SHARED_CHECK_KEY}" STREQUAL "${key}")
    set(${out_ok} ${OPJIT_SHARED_CHECK} PARENT_SCOPE)
    set(${out_why} "$CACHE{OPJIT_SHARED_CHECK_WHY}" PARENT_SCOPE)
    return()
  endif()

  set(dir ${CMAKE_CURRENT_BINARY_DIR}/CMakeFiles/opjit-shared-check)
  file(REMOVE_RECURSE ${dir})
  file(MAKE_DIRECTORY ${dir}/src)
  execute_process(COMMAND ${objcopy} ${OPJIT_TCC_RENAMES} ${TCC_LIBRARY} ${dir}/libtcc.a
    RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
  if(rc)
    set(ok OFF)
    set(why "objcopy failed on ${TCC_LIBRARY}: ${log}")
  else()
    # A shared object holding all of the patched libtcc, with no text
    # relocations (-z text) and libtcc's symbols local.
    file(WRITE ${dir}/src/CMakeLists.txt [[
cmake_minimum_required(VERSION 3.25)
project(opjit_shared_check C)
add_library(check SHARED check.c ${SHIM})
target_include_directories(check PRIVATE ${TCC_INCLUDE_DIR})
target_link_options(check PRIVATE -Wl,--exclude-libs,ALL -Wl,-z,text)
target_link_libraries(check PRIVATE -Wl,--whole-archive ${TCC_PIC} -Wl,--no-whole-archive ${CMAKE_DL_LIBS} m)
]])
    file(WRITE ${dir}/src/check.c [[
#include <libtcc.h>
int check_tcc(void)
{
    TCCState *s = tcc_new();
    if (!s)
        return -1;
    tcc_set_output_type(s, TCC_OUTPUT_MEMORY);
    int rc = tcc_compile_string(s, "int f(void) { return 1; }");
    tcc_delete(s);
    return rc;
}
]])
    try_compile(ok PROJECT opjit_shared_check SOURCE_DIR ${dir}/src BINARY_DIR ${dir}/build
      CMAKE_FLAGS -DTCC_PIC=${dir}/libtcc.a -DTCC_INCLUDE_DIR=${TCC_INCLUDE_DIR}
                  -DSHIM=${PROJECT_SOURCE_DIR}/jit/tcc_glibc.c -DCMAKE_C_COMPILER=${CMAKE_C_COMPILER}
      NO_CACHE OUTPUT_VARIABLE log)
    if(ok)
      set(why "")
    else()
      string(REGEX MATCHALL "[^\n]*(relocation|undefined|rror)[^\n]*" lines "${log}")
      list(JOIN lines " | " lines)
      if(NOT lines)
        set(lines "see ${dir}")
      endif()
      set(why "the patched libtcc.a does not link into a shared object: ${lines}")
    endif()
  endif()
  set(OPJIT_SHARED_CHECK ${ok} CACHE INTERNAL "libopjit.so can be built")
  set(OPJIT_SHARED_CHECK_WHY "${why}" CACHE INTERNAL "why not")
  set(OPJIT_SHARED_CHECK_KEY "${key}" CACHE INTERNAL "what OPJIT_SHARED_CHECK was checked for")
  set(${out_ok} ${ok} PARENT_SCOPE)
  set(${out_why} "${why}" PARENT_SCOPE)
endfunction()

if(OPJIT_SHARED)
  opjit_shared_check(opjit_shared_ok opjit_shared_why)
  if(opjit_shared_ok)
    set(OPJIT_BUILD_SHARED ON)
    message(STATUS "opjit: building libopjit.so and libopjit.a")
  else()
    message(WARNING "opjit: building the static library libopjit.a only, no libopjit.so: "
                    "${opjit_shared_why}\n(-DOPJIT_SHARED=OFF asks for static only and silences this.)")
  endif()
else()
  message(STATUS "opjit: OPJIT_SHARED=OFF: building the static library libopjit.a only")
endif()

if(OPJIT_BUILD_SHARED)
  # The copy the build links, made at build time from the archive as installed.
  set(OPJIT_TCC_PIC_LIBRARY ${CMAKE_CURRENT_BINARY_DIR}/tcc-pic/libtcc.a)
  add_custom_command(OUTPUT ${OPJIT_TCC_PIC_LIBRARY}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/tcc-pic
    COMMAND ${OPJIT_OBJCOPY_EXE} ${OPJIT_TCC_RENAMES} ${TCC_LIBRARY} ${OPJIT_TCC_PIC_LIBRARY}
    DEPENDS ${TCC_LIBRARY}
    COMMENT "Renaming stdout, stderr, environ in a copy of libtcc.a for libopjit.so"
    VERBATIM)
  add_custom_target(opjit_tcc_pic DEPENDS ${OPJIT_TCC_PIC_LIBRARY})
endif()
