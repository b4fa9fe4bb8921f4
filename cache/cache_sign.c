/*
 * cache/cache_sign.c - the fleet key and the signatures of remote entries:
 * HMAC-SHA256 (OpenSSL's libcrypto) over a domain tag, the Redis key the
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

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include "cache/cache_int.h"
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
        return -1;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    if (cache_trusted_path(dir, euid, why, whylen) != 0)
        return -1;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "cannot open %s: %s", path, strerror(errno));
        return -1;
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
            OPENSSL_cleanse(buf, SIGN_KEY_MAX + 1);
        free(buf);
        return -1;
    }
    *key = buf;
    *len = (size_t)n;
    return 0;
}

void sign_key_free(unsigned char *key, size_t len)
{
    if (key)
        OPENSSL_cleanse(key, len);
    free(key);
}

int sign_compute(const unsigned char *key, size_t keylen, const char *rkey, const void *body,
                 size_t len, unsigned char mac[SIGN_MAC_LEN])
{
    EVP_MAC *alg = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = alg ? EVP_MAC_CTX_new(alg) : NULL;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };
    size_t outlen = 0;
    int ok = ctx && EVP_MAC_init(ctx, key, keylen, params) &&
             EVP_MAC_update(ctx, (const unsigned char *)SIGN_DOMAIN, strlen(SIGN_DOMAIN)) &&
             EVP_MAC_update(ctx, (const unsigned char *)rkey, strlen(rkey) + 1) &&
             EVP_MAC_update(ctx, body, len) && EVP_MAC_final(ctx, mac, &outlen, SIGN_MAC_LEN) &&
             outlen == SIGN_MAC_LEN;
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(alg);
    return ok ? 0 : -1;
}

int sign_equal(const unsigned char *a, const unsigned char *b)
{
    return CRYPTO_memcmp(a, b, SIGN_MAC_LEN) == 0;
}
