# cmake/abi_grow.cmake - IN (include/opjit.h) -> OUT: the same header as a
# later version of opjit might have it, every struct a host hands in
# grown by fields at its end. Test only: libopjit.so built with it
# (abi-grown/, target opjit_grown) is what tests/test_abi_grow.sh runs a
# host built against IN on.
file(READ ${IN} text)
foreach(s opjit_config opjit_load_info opjit_op_info opjit_arg_info opjit_warm_options
          opjit_warm_result opjit_cache_info opjit_cache_prune_result opjit_cache_remote_info)
  string(FIND "${text}" "} ${s};" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "abi_grow.cmake: no struct ${s} in ${IN}")
  endif()
  string(REPLACE "} ${s};"
    "    int grown_flag; /* a later version's fields */\n    char grown_text[300];\n} ${s};"
    text "${text}")
endforeach()
file(WRITE ${OUT}.tmp "${text}")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
