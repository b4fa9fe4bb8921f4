/*
 * cache/cache_libs.c - hiredis and libcrypto, loaded at the remote layer's
 * first use (see cache_libs.h). Linking them would cost every process
 * that links opjit their loading and relocation (libcrypto alone: about 3
 * million instructions before main), remote cache or not.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <openssl/opensslv.h>

#include "cache/cache_libs.h"

#define LIBS_STR2(x) #x
#define LIBS_STR(x) LIBS_STR2(x)
/* The sonames of the libraries whose headers we were built with. */
#define LIBS_HIREDIS "libhiredis.so." LIBS_STR(HIREDIS_SONAME)
#ifdef OPENSSL_SHLIB_VERSION
#define LIBS_CRYPTO "libcrypto.so." LIBS_STR(OPENSSL_SHLIB_VERSION)
#else
#define LIBS_CRYPTO "libcrypto.so." SHLIB_VERSION_NUMBER
#endif

remote_libs remote_lib;
static int libs_ok;
static char libs_why[512];
static pthread_once_t libs_once = PTHREAD_ONCE_INIT;

/* dlsym into *slot (a function pointer of the table); 0 when missing. */
static int libs_sym(void *h, const char *name, void *slot)
{
    void *p = dlsym(h, name);
    memcpy(slot, &p, sizeof p);
    return p != NULL;
}

/* dlopen soname; NULL with libs_why set. */
static void *libs_open(const char *soname)
{
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(libs_why, sizeof libs_why, "cannot load %s (%s)", soname, e ? e : "not found");
    }
    return h;
}

#define LIBS_SYM(h, soname, name, slot)                                                   \
    do {                                                                                  \
        if (!libs_sym(h, name, slot)) {                                                   \
            snprintf(libs_why, sizeof libs_why, "%s has no %s", soname, name);            \
            return;                                                                       \
        }                                                                                 \
    } while (0)

/* Both libraries stay loaded for the process's life, like CUDA's. */
static void libs_load(void)
{
    remote_libs t;
    void *r = libs_open(LIBS_HIREDIS), *c = r ? libs_open(LIBS_CRYPTO) : NULL;
    if (!c)
        return;
    LIBS_SYM(r, LIBS_HIREDIS, "redisFormatCommandArgv", &t.format_argv);
    LIBS_SYM(r, LIBS_HIREDIS, "redisFreeCommand", &t.free_command);
    LIBS_SYM(r, LIBS_HIREDIS, "redisReaderCreate", &t.reader_create);
    LIBS_SYM(r, LIBS_HIREDIS, "redisReaderCreateWithFunctions", &t.reader_create_with);
    LIBS_SYM(r, LIBS_HIREDIS, "redisReaderFree", &t.reader_free);
    LIBS_SYM(r, LIBS_HIREDIS, "redisReaderFeed", &t.reader_feed);
    LIBS_SYM(r, LIBS_HIREDIS, "redisReaderGetReply", &t.reader_get_reply);
    LIBS_SYM(r, LIBS_HIREDIS, "freeReplyObject", &t.free_reply);
    LIBS_SYM(c, LIBS_CRYPTO, "SHA256_Init", &t.sha256_init);
    LIBS_SYM(c, LIBS_CRYPTO, "SHA256_Update", &t.sha256_update);
    LIBS_SYM(c, LIBS_CRYPTO, "SHA256_Final", &t.sha256_final);
    LIBS_SYM(c, LIBS_CRYPTO, "CRYPTO_memcmp", &t.memcmp_ct);
    remote_lib = t;
    libs_ok = 1;
}

const remote_libs *remote_libs_get(char *why, size_t whylen)
{
    pthread_once(&libs_once, libs_load);
    if (libs_ok)
        return &remote_lib;
    snprintf(why, whylen, "%s", libs_why);
    return NULL;
}
