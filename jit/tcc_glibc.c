/* jit/tcc_glibc.c - glibc's stdout, stderr and environ for the libtcc
 * inside libopjit.so.
 *
 * Debian's libtcc.a reaches those three with PC32 relocations, which cannot
 * bind to a variable in libc.so from a shared object. The build links a
 * copy of the archive with them renamed to opjit_tcc_* (cmake/
 * OpjitShared.cmake); they are defined here, hidden, and point at glibc's
 * from a constructor. libtcc reads stdout/stderr only when no error
 * callback is set (jit/tcc.c sets one) and environ only in tcc_run (not
 * used): a later assignment to stdout or a setenv that moves environ is
 * not seen, and need not be. libopjit.a links the unpatched archive and
 * does not contain this file. */
#include <stdio.h>

extern char **environ;

#define OPJIT_HIDDEN __attribute__((visibility("hidden")))

extern OPJIT_HIDDEN FILE *opjit_tcc_stdout;
extern OPJIT_HIDDEN FILE *opjit_tcc_stderr;
extern OPJIT_HIDDEN char **opjit_tcc_environ;

OPJIT_HIDDEN FILE *opjit_tcc_stdout;
OPJIT_HIDDEN FILE *opjit_tcc_stderr;
OPJIT_HIDDEN char **opjit_tcc_environ;

__attribute__((constructor)) static void opjit_tcc_glibc_init(void)
{
    opjit_tcc_stdout = stdout;
    opjit_tcc_stderr = stderr;
    opjit_tcc_environ = environ;
}
