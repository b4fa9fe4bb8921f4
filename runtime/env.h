/* runtime/env.h - reading opjit's environment variables, one way for all. */
#ifndef OPJIT_RUNTIME_ENV_H
#define OPJIT_RUNTIME_ENV_H

#include <stdint.h>

/* A boolean setting: 1 for 1/true/yes/on, 0 for 0/false/no/off (any case,
 * surrounding blanks ignored), dflt when the text is NULL or empty, and -1
 * when it is none of these (the caller warns and uses its default). */
int env_bool_parse(const char *text, int dflt);

/* A duration in seconds (a decimal number, "2.5"), as milliseconds; dflt
 * when the text is NULL or empty, -1 when it is not a non-negative number. */
long env_seconds_parse(const char *text, long dflt_ms);

/* A size in bytes ("512M", "2GiB", "3k"; "0" is 0) into *out: 0, or -1
 * when it is not one. */
int env_size_parse(const char *text, uint64_t *out);

#endif
