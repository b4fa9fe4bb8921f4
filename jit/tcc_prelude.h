/*
 * jit/tcc_prelude.h - <opjit_op.h> (and <opjit_op.h> then <math.h>)
 * preprocessed at build time, for libtcc to compile ahead of an op instead
 * of finding, reading and preprocessing them and the system headers they
 * include on every compile (a ninth of a cold compile of nms.c; half of a
 * small op's that includes <math.h>). Made by jit/gen/tcc_prelude_gen.c;
 * used only where the op's compile would see exactly what it holds.
 */
#ifndef OPJIT_JIT_TCC_PRELUDE_H
#define OPJIT_JIT_TCC_PRELUDE_H

#include <stddef.h>

/* A system header the prelude holds, as it was at build time. */
typedef struct jit_prelude_header {
    const char *path;
    long long size, mtime_sec, mtime_nsec;
} jit_prelude_header;

/* One prelude: the leading #include <...> it stands for, in order (NULL
 * ends them), and its text. */
#define JIT_PRELUDE_MAX_INCLUDES 4
typedef struct jit_prelude {
    const char *includes[JIT_PRELUDE_MAX_INCLUDES];
    const unsigned char *text;
    size_t len;
} jit_prelude;

/* The generated data (build/gen/opjit_tcc_prelude.c): the preludes (one
 * with no includes ends them; none when the build could not make them),
 * the system headers they hold ({0} ends them), the first part of each
 * name those were included by ("stdint.h", "bits"), and the paths that
 * must not exist: each header's name in the system directories searched
 * before the one it was found in (NULL ends both). */
extern const jit_prelude jit_tcc_preludes[];
extern const jit_prelude_header jit_tcc_prelude_headers[];
extern const char *const jit_tcc_prelude_names[];
extern const char *const jit_tcc_prelude_absent[];

/* The prelude for a C op compiled by libtcc with the defines of
 * jit/tcc_defines.h: the one standing for the most of text's leading
 * includes (past blanks and comments: <opjit_op.h>, maybe <math.h>), or
 * NULL where none would compile the same:
 * - text's first directive is not #include <opjit_op.h> (a define before
 *   it could change what the headers declare);
 * - a system header changed since the build (size or modification time),
 *   or one of the same name appeared in a directory searched before it;
 * - a directory of dirs (the source's, and op_header_dir, which holds the
 *   library's opjit_op.h) has a file or directory by a name the prelude's
 *   headers were included by, which would be found there first. */
const char *jit_tcc_prelude(const char *text, const char *const *dirs,
                            const char *op_header_dir, size_t *len);

/* Every header of h ({0}-ended) has the size and modification time it
 * records. */
int jit_prelude_headers_unchanged(const jit_prelude_header *h);
/* No path of paths (NULL-ended) exists. */
int jit_prelude_paths_absent(const char *const *paths);

#endif
