# cmake/abi_grow.cmake - IN (include/) -> OUT: opjit.h and opjit_admin.h
# as a later version of opjit might have them, every struct a host hands in
# grown by fields at its end. Test only: libopjit.so built with them
# (abi-grown/, target opjit_grown) is what tests/test_abi_grow.sh runs a
# host built against IN on.
set(structs opjit_config opjit_load_info opjit_op_info opjit_arg_info opjit_warm_options
            opjit_warm_result opjit_cache_info opjit_cache_prune_result opjit_cache_remote_info)
set(found "")
foreach(h opjit.h opjit_admin.h)
  file(READ ${IN}/${h} text)
  foreach(s ${structs})
    string(FIND "${text}" "} ${s};" at)
    if(NOT at EQUAL -1)
      list(APPEND found ${s})
      string(REPLACE "} ${s};"
        "    int grown_flag; /* a later version's fields */\n    char grown_text[300];\n} ${s};"
        text "${text}")
    endif()
  endforeach()
  file(WRITE ${OUT}/${h}.tmp "${text}")
  file(COPY_FILE ${OUT}/${h}.tmp ${OUT}/${h} ONLY_IF_DIFFERENT)
endforeach()
foreach(s ${structs})
  list(FIND found ${s} at)
  if(at EQUAL -1)
    message(FATAL_ERROR "abi_grow.cmake: no struct ${s} in ${IN}")
  endif()
endforeach()
