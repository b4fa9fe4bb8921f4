/* tests/test_sign.c - the remote layer's signatures and fleet key
 * (cache/cache_sign.c) and its URLs (cache/cache_redis.c), without a
 * server: HMAC-SHA256 as OpenSSL's HMAC() computes it, and key files that
 * others could read or write refused. The layer against a real server is
 * tests/test_remote.sh. */
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "cache/cache_remote.h"
#include "t.h"

/* What the signature covers, as one buffer: the domain tag, the Redis key
 * with its NUL, the body. */
static void reference_mac(const unsigned char *key, size_t keylen, const char *rkey,
                          const char *body, size_t len, unsigned char *out)
{
    static const char domain[] = "opjit-remote-signature 1\n";
    unsigned char buf[512];
    size_t n = 0;
    memcpy(buf, domain, sizeof domain - 1);
    n += sizeof domain - 1;
    memcpy(buf + n, rkey, strlen(rkey) + 1);
    n += strlen(rkey) + 1;
    memcpy(buf + n, body, len);
    n += len;
    unsigned int mlen = 0;
    HMAC(EVP_sha256(), key, (int)keylen, buf, n, out, &mlen);
}

static void test_hmac_matches_openssl(void)
{
    unsigned char key[100], a[SIGN_MAC_LEN], b[SIGN_MAC_LEN];
    for (int i = 0; i < 100; i++)
        key[i] = (unsigned char)(i * 7 + 1);
    size_t lens[] = {16, 64, 65, 100}; /* short, one block, longer (hashed first) */
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        CHECK(sign_compute(key, lens[i], "opjit:v1:abc", "body bytes", 10, a) == 0);
        reference_mac(key, lens[i], "opjit:v1:abc", "body bytes", 10, b);
        CHECKF(!memcmp(a, b, SIGN_MAC_LEN), "key of %zu bytes", lens[i]);
        CHECK(sign_equal(a, b));
    }
    /* The Redis key is covered: the same body under another key differs. */
    CHECK(sign_compute(key, 32, "opjit:v1:abd", "body bytes", 10, b) == 0);
    CHECK(sign_compute(key, 32, "opjit:v1:abc", "body bytes", 10, a) == 0);
    CHECK(!sign_equal(a, b));
}

static void write_key(const char *path, size_t n, mode_t mode)
{
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    char buf[64];
    memset(buf, 'k', sizeof buf);
    CHECK(fd >= 0 && write(fd, buf, n) == (ssize_t)n);
    close(fd);
    chmod(path, mode);
}

static void test_key_file(void)
{
    char dir[] = "/tmp/opjit-test-sign-XXXXXX", path[PATH_MAX], why[512];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/fleet.key", dir);
    unsigned char *key = NULL;
    size_t len = 0;
    write_key(path, 32, 0600);
    CHECKF(sign_key_load(path, geteuid(), &key, &len, why, sizeof why) == 0, "%s", why);
    CHECK(key && len == 32 && key[0] == 'k');
    sign_key_free(key, len);
    write_key(path, 32, 0644);
    CHECK(sign_key_load(path, geteuid(), &key, &len, why, sizeof why) != 0);
    CHECK_STR_CONTAINS(why, "readable by group or others");
    write_key(path, 32, 0620);
    CHECK(sign_key_load(path, geteuid(), &key, &len, why, sizeof why) != 0);
    write_key(path, 8, 0600);
    CHECK(sign_key_load(path, geteuid(), &key, &len, why, sizeof why) != 0);
    CHECK_STR_CONTAINS(why, "16 to 4096");
    CHECK(sign_key_load("fleet.key", geteuid(), &key, &len, why, sizeof why) != 0);
    CHECK_STR_CONTAINS(why, "absolute");
    unlink(path);
    snprintf(path, sizeof path, "%s/missing.key", dir);
    CHECK(sign_key_load(path, geteuid(), &key, &len, why, sizeof why) != 0);
    rmdir(dir);
}

static void test_urls(void)
{
    const char *good[] = {"redis://127.0.0.1:6379", "redis://host", "redis://host:1/2",
                          "redis+unix:///run/redis.sock", "redis+unix:///run/r.sock?db=3"};
    const char *bad[] = {"http://host", "redis://", "redis://host:0", "redis://host:99999",
                         "redis://:pw@host", "redis://host/x", "redis+unix://rel/path",
                         "redis+unix:///s?db=", ""};
    char why[256];
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        redis_link *r = redis_link_new(good[i], 50, 1000, 1000, why, sizeof why);
        CHECKF(r != NULL, "%s: %s", good[i], why);
        redis_link_free(r);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        redis_link *r = redis_link_new(bad[i], 50, 1000, 1000, why, sizeof why);
        CHECKF(r == NULL, "%s accepted", bad[i]);
        redis_link_free(r);
    }
}

int main(void)
{
    T_RUN(test_hmac_matches_openssl);
    T_RUN(test_key_file);
    T_RUN(test_urls);
    return t_done();
}
