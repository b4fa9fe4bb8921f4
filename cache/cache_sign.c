/*
 * cache/cache_sign.c - the fleet key and the signatures of remote entries:
 * HMAC-SHA256 (SHA-256 from OpenSSL's libcrypto, loaded on first use) over a domain tag, the Redis key the
 * value is stored under, and the value's body. Covering the Redis key means
 * a value copied under another key no longer verifies.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache_int.h"
#include "cache/cache_libs.h"
#include "cache/cache_remote.h"

#define SIGN_KEY_MIN 16
#define SIGN_KEY_MAX 4096
#define SIGN_DOMAIN "opjit-remote-signature 1\n"

/* Whether the key file may be trusted with a secret: a regular file that
 * we or root own, readable and writable by nobody else, in directories
 * only we or root can change. 0, or -1 and why. */
static int sign_key_file_ok(const char *path, int fd, uid_t euid, char *why, size_t whylen)
{
    struct stat st;
    const char *bad;
    if (fstat(fd, &st) != 0) {
        snprintf(why, whylen, "cannot stat %s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, whylen, "%s is not a regular file", path);
        return -1;
    }
    if ((bad = cache_untrusted(&st, CACHE_OWNER_TRUSTED, euid))) {
        snprintf(why, whylen, "%s is %s", path, bad);
        return -1;
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        snprintf(why, whylen, "%s is readable by group or others (chmod 600 it)", path);
        return -1;
    }
    if (st.st_size < SIGN_KEY_MIN || st.st_size > SIGN_KEY_MAX) {
        snprintf(why, whylen, "%s holds %lld bytes; a key is %d to %d bytes", path,
                 (long long)st.st_size, SIGN_KEY_MIN, SIGN_KEY_MAX);
        return -1;
    }
    return 0;
}

int sign_key_load(const char *path, uid_t euid, unsigned char **key, size_t *len, char *why,
                  size_t whylen)
{
    *key = NULL;
    *len = 0;
    if (path[0] != '/') {
        snprintf(why, whylen, "%s is not an absolute path", path);
        return OPJIT_EINVAL;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    if (cache_trusted_path(dir, euid, why, whylen) != 0)
        return OPJIT_EINVAL;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "cannot open %s: %s", path, strerror(errno));
        return OPJIT_EINVAL;
    }
    unsigned char *buf = NULL;
    ssize_t n = -1;
    if (sign_key_file_ok(path, fd, euid, why, whylen) == 0 && (buf = malloc(SIGN_KEY_MAX + 1)))
        n = read(fd, buf, SIGN_KEY_MAX + 1);
    close(fd);
    if (n < SIGN_KEY_MIN || n > SIGN_KEY_MAX) {
        if (buf && n >= 0)
            snprintf(why, whylen, "%s: cannot read a key of %d to %d bytes", path, SIGN_KEY_MIN,
                     SIGN_KEY_MAX);
        else if (!buf && !*why)
            snprintf(why, whylen, "out of memory");
        else if (n < 0 && buf)
            snprintf(why, whylen, "cannot read %s: %s", path, strerror(errno));
        if (buf)
            explicit_bzero(buf, SIGN_KEY_MAX + 1);
        free(buf);
        return OPJIT_EINVAL;
    }
    *key = buf;
    *len = (size_t)n;
    return OPJIT_OK;
}

void sign_key_free(unsigned char *key, size_t len)
{
    if (key)
        explicit_bzero(key, len);
    free(key);
}

/* HMAC (RFC 2104) over SHA-256 from libcrypto's SHA256_* functions: they
 * need none of OpenSSL's providers, whose first use costs milliseconds (a
 * remote hit is meant to take about one). -1 also when libcrypto cannot
 * be loaded. */
int sign_compute(const unsigned char *key, size_t keylen, const char *rkey, const void *body,
                 size_t len, unsigned char mac[SIGN_MAC_LEN])
{
    enum { BLOCK = 64 };
    unsigned char k[BLOCK] = {0}, pad[BLOCK], inner[SHA256_DIGEST_LENGTH];
    SHA256_CTX ctx;
    char why[512];
    const remote_libs *L = remote_libs_get(why, sizeof why);
    if (!L)
        return OPJIT_EIO;
    int ok = 1;
    if (keylen > BLOCK)
        ok = L->sha256_init(&ctx) && L->sha256_update(&ctx, key, keylen) &&
             L->sha256_final(k, &ctx);
    else
        memcpy(k, key, keylen);
    for (int i = 0; i < BLOCK; i++)
        pad[i] = k[i] ^ 0x36;
    ok = ok && L->sha256_init(&ctx) && L->sha256_update(&ctx, pad, BLOCK) &&
         L->sha256_update(&ctx, SIGN_DOMAIN, strlen(SIGN_DOMAIN)) &&
         L->sha256_update(&ctx, rkey, strlen(rkey) + 1) && L->sha256_update(&ctx, body, len) &&
         L->sha256_final(inner, &ctx);
    for (int i = 0; i < BLOCK; i++)
        pad[i] = k[i] ^ 0x5c;
    ok = ok && L->sha256_init(&ctx) && L->sha256_update(&ctx, pad, BLOCK) &&
         L->sha256_update(&ctx, inner, sizeof inner) && L->sha256_final(mac, &ctx);
    explicit_bzero(k, sizeof k);
    explicit_bzero(pad, sizeof pad);
    explicit_bzero(&ctx, sizeof ctx);
    return ok ? OPJIT_OK : OPJIT_EIO;
}

int sign_equal(const unsigned char *a, const unsigned char *b)
{
    char why[512];
    const remote_libs *L = remote_libs_get(why, sizeof why);
    return L && L->memcmp_ct(a, b, SIGN_MAC_LEN) == 0;
}
