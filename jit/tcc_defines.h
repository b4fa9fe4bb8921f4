/*
 * jit/tcc_defines.h - the defines every op compiled by libtcc gets; one
 * list for jit/tcc.c and for the prelude made at build time
 * (jit/gen/tcc_prelude_gen.c), which must see what an op's compile does.
 */
#ifndef OPJIT_JIT_TCC_DEFINES_H
#define OPJIT_JIT_TCC_DEFINES_H

#define JIT_TCC_DEFINES "FORCE_OPENBLAS_COMPLEX_STRUCT", "OPJIT_TIER_TCC"

#endif
