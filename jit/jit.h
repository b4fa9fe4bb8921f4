/* jit/jit.h - compilers: each turns source text into an artifact file and
 * diagnostics. Knows nothing of the cache or the runtime. */
#ifndef OPJIT_JIT_H
#define OPJIT_JIT_H

#include <stddef.h>

typedef struct jit_tcc_job {
    const char *source_name; /* for diagnostics: "ops-src/nms.c" */
    const char *text;        /* the source, as hashed into the cache key */
    const char *const *include_dirs; /* NULL-terminated */
    const char *const *defines;      /* "NAME" or "NAME=VALUE", NULL-terminated */
    const char *const *libraries;    /* "openblas", "m"; NULL-terminated */
    const char *const *library_dirs; /* NULL-terminated, may be NULL */
    const char *tcc_lib_dir;         /* libtcc1.a and tcc's own headers */
    const char *out_path;            /* the shared object to write */
} jit_tcc_job;

/* Compile job->text as C into a shared object at job->out_path. On failure
 * returns OPJIT_ECOMPILE (or OPJIT_EIO when the file cannot be written) and
 * puts the diagnostics into diag: "file:line: error: ..." followed by the
 * offending source line. libtcc is not reentrant: calls are serialised. */
int jit_tcc_compile(const jit_tcc_job *job, char *diag, size_t diaglen);

#endif
