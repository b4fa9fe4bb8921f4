/* loader/loader.h - private loader services for the CLI and tests. */
#ifndef OPJIT_LOADER_H
#define OPJIT_LOADER_H

#include <stddef.h>

#include "opjit.h"

/* Read a whole file, NUL-terminated; NULL with errno on failure. */
char *loader_read_file(const char *path, size_t *len);

/* Call fn for each source of op `name` on the search path (name.c, name.cu
 * in each directory, in order); stops when fn returns non-zero. */
int loader_each_source(opjit_runtime *rt, const char *name,
                       int (*fn)(void *ud, const char *path), void *ud);

/* The colon-separated search path in use. */
const char *loader_ops_path(opjit_runtime *rt);

#endif
