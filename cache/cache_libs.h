/*
 * cache/cache_libs.h - the remote layer's libraries, hiredis (the Redis
 * protocol) and libcrypto (SHA-256), loaded on first use with dlopen, so a
 * process that never uses a remote cache neither loads them nor needs them
 * installed. Shared by the remote layer's files of cache/ only.
 *
 * The headers are the ones opjit was built against; the libraries are
 * opened by the sonames those headers name (the same ABI).
 */
#ifndef OPJIT_CACHE_LIBS_H
#define OPJIT_CACHE_LIBS_H

#include <stddef.h>

#include <hiredis/hiredis.h>
/* SHA256_Init and friends are deprecated in OpenSSL 3.0 in favour of
 * EVP, which loads providers on first use; they are still there. */
#define OPENSSL_API_COMPAT 10101
#include <openssl/sha.h>

typedef struct remote_libs {
    /* hiredis */
    int (*format_argv)(char **target, int argc, const char **argv, const size_t *argvlen);
    void (*free_command)(char *cmd);
    redisReader *(*reader_create)(void);
    redisReader *(*reader_create_with)(redisReplyObjectFunctions *fn);
    void (*reader_free)(redisReader *r);
    int (*reader_feed)(redisReader *r, const char *buf, size_t len);
    int (*reader_get_reply)(redisReader *r, void **reply);
    void (*free_reply)(void *reply);
    /* libcrypto */
    int (*sha256_init)(SHA256_CTX *c);
    int (*sha256_update)(SHA256_CTX *c, const void *data, size_t len);
    int (*sha256_final)(unsigned char *md, SHA256_CTX *c);
    int (*memcmp_ct)(const void *a, const void *b, size_t len);
} remote_libs;

/* The libraries, loaded at the first call in the process (a failure is
 * kept: it would fail the same way again). NULL with why when either
 * cannot be loaded or lacks a function. Thread-safe. */
const remote_libs *remote_libs_get(char *why, size_t whylen);
/* The loaded table; only after remote_libs_get succeeded (the remote
 * layer exists only then). */
extern remote_libs remote_lib;

#endif
