/* jit/compilers.c - the table of compilers, walked by the loader. What
 * the compilers share (the machine's triple, a cheap identity of a
 * compiler's file, include and library paths) is jit/shared.c's: the
 * table names the compilers, none of them calls back into it. */
#include <stddef.h>

#include "jit/jit.h"

/* For each half, the compiler whose code runs faster comes first: a load
 * uses the first whose artifact is cached, else builds with the first
 * that is not a background compiler, and queues the background ones above
 * it. */
#ifdef OPJIT_EXTRA_COMPILER /* a test build's extra entry (CMake: OPJIT_EXTRA_COMPILER) */
extern const jit_compiler OPJIT_EXTRA_COMPILER;
#define EXTRA_COMPILER &OPJIT_EXTRA_COMPILER,
#else
#define EXTRA_COMPILER
#endif
const jit_compiler *const jit_compilers[] = {EXTRA_COMPILER &jit_cc, &jit_tcc, &jit_nvrtc, NULL};

const jit_compiler *jit_first(unsigned half)
{
    for (int i = 0; jit_compilers[i]; i++)
        if ((jit_compilers[i]->halves & half) && !jit_compilers[i]->background)
            return jit_compilers[i];
    return NULL;
}

void jit_fork_prepare(void)
{
    for (int i = 0; jit_compilers[i]; i++)
        if (jit_compilers[i]->fork_prepare)
            jit_compilers[i]->fork_prepare();
}

void jit_fork_done(void)
{
    for (int i = 0; jit_compilers[i]; i++)
        if (jit_compilers[i]->fork_done)
            jit_compilers[i]->fork_done();
}
