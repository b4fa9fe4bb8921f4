/* tests/test_cache_listing.c - an entry holds what its manifest lists,
 * once each, and nothing else (issue 20, defect 14): a sealed manifest
 * naming host.so twice beside a file it does not list, or a file slipped
 * into an entry, is damage: verify reports it, listing does not count it
 * twice, and a load rebuilds the entry without the stranger. */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "opjit.h"
#include "cache/cache_int.h"
#include <xxhash.h>
#include "t.h"

static char root[PATH_MAX];

static cache_request mkreq(const char *tag)
{
    cache_request r;
    memset(&r, 0, sizeof r);
    cache_keygen *g = cache_keygen_new();
    cache_keygen_add_str(g, "listing", tag);
    cache_keygen_finish(g, &r.key);
    r.op_name = "k";
    r.source_name = "k.c";
    r.compiler = "testcc 1.0";
    r.options = "-O1";
    r.target = "x86_64-linux";
    r.tier = "tcc";
    return r;
}

static int write_file(const char *dir, const char *name, const char *text)
{
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return -1;
    ssize_t w = write(fd, text, strlen(text));
    close(fd);
    return w == (ssize_t)strlen(text) ? 0 : -1;
}

static int builds;

static int build(void *ud, const char *dir, char *err, size_t errlen)
{
    (void)ud;
    (void)err;
    (void)errlen;
    builds++;
    return write_file(dir, "host.so", "not really a shared object\n") ? OPJIT_EIO : OPJIT_OK;
}

static cache *open_cache(const char *name)
{
    char dir[PATH_MAX + 32], err[512];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    cache_config cfg = {.dir = dir, .offline = 0, .readonly = "", .remote_url = ""};
    cache *c = NULL;
    CHECKF(cache_open(&cfg, &c, err, sizeof err) == OPJIT_OK, "%s", err);
    return c;
}

/* A published entry of req: its directory in dir. */
static int publish(cache *c, const cache_request *req, char *dir, size_t n)
{
    cache_entry *e = NULL;
    char err[512];
    int rc = cache_fetch(c, req, build, NULL, &e, NULL, err, sizeof err);
    CHECKF(rc == OPJIT_OK, "%s", err);
    if (rc)
        return -1;
    snprintf(dir, n, "%s", cache_entry_dir(e));
    cache_entry_release(e);
    return 0;
}

/* Reseal the manifest of dir listing host.so twice: what a forger who can
 * sign (or write the cache) would make. */
static int reseal_twice(const char *dir, const cache_request *req)
{
    char host[PATH_MAX + 16], man[PATH_MAX + 16];
    snprintf(host, sizeof host, "%s/host.so", dir);
    snprintf(man, sizeof man, "%s/manifest", dir);
    int fd = open(host, O_RDONLY);
    char buf[256];
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf);
    if (fd >= 0)
        close(fd);
    if (n <= 0)
        return -1;
    cache_artifact a[2] = {{"host.so", (uint64_t)n, XXH3_64bits(buf, (size_t)n)},
                           {"host.so", (uint64_t)n, XXH3_64bits(buf, (size_t)n)}};
    char err[256];
    uint64_t size;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    int rc = dfd < 0 || unlink(man) != 0 ? -1
             : cache_manifest_write(dfd, req, a, 2, 1700000000, &size, err, sizeof err);
    if (dfd >= 0)
        close(dfd);
    return rc;
}

typedef struct seen {
    int n, damaged, nart;
    char problem[512];
} seen;

static int note(void *ud, const cache_entry_info *info)
{
    seen *s = ud;
    s->n++;
    if (info->problem) {
        s->damaged++;
        snprintf(s->problem, sizeof s->problem, "%s", info->problem);
    } else {
        s->nart = info->nartifacts;
    }
    return 0;
}

static int has_file(const char *dir, const char *name)
{
    char p[PATH_MAX + 64];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return lstat(p, &st) == 0;
}

/* A file nobody listed, slipped into an entry. */
static void unlisted_file_is_damage(void)
{
    cache *c = open_cache("unlisted");
    cache_request req = mkreq("unlisted");
    char dir[PATH_MAX];
    if (!c || publish(c, &req, dir, sizeof dir))
        goto out;
    CHECK(write_file(dir, "evil.so", "payload\n") == 0);
    seen s = {0};
    int nd = -1;
    char err[512];
    CHECK(cache_verify_all(c, 0, note, &s, &nd, err, sizeof err) == OPJIT_OK);
    CHECKF(nd == 1 && s.damaged == 1, "%d damaged", nd);
    CHECK_STR_CONTAINS(s.problem, "evil.so");
    CHECK_STR_CONTAINS(s.problem, "does not list");
    /* A load evicts it and builds the entry again, without the stranger. */
    builds = 0;
    cache_entry *e = NULL;
    CHECK(cache_fetch(c, &req, build, NULL, &e, NULL, err, sizeof err) == OPJIT_OK);
    CHECK(builds == 1 && e && !has_file(cache_entry_dir(e), "evil.so"));
    cache_entry_release(e);
out:
    cache_close(c);
}

/* The case: host.so listed twice, an extra file, all sealed. */
static void name_listed_twice_is_damage(void)
{
    cache *c = open_cache("twice");
    cache_request req = mkreq("twice");
    char dir[PATH_MAX], err[512];
    if (!c || publish(c, &req, dir, sizeof dir))
        goto out;
    CHECK(reseal_twice(dir, &req) == 0);
    CHECK(write_file(dir, "evil.so", "payload\n") == 0);
    seen s = {0};
    CHECK(cache_foreach(c, note, &s, err, sizeof err) == OPJIT_OK);
    CHECKF(s.damaged == 1, "ls: %d damaged, %d artifacts", s.damaged, s.nart);
    CHECK_STR_CONTAINS(s.problem, "host.so twice");
    memset(&s, 0, sizeof s);
    int nd = -1;
    CHECK(cache_verify_all(c, 1, note, &s, &nd, err, sizeof err) == OPJIT_OK);
    CHECKF(nd == 1, "verify: %d damaged", nd);
    CHECK(!has_file(dir, "manifest") && !has_file(dir, "evil.so")); /* repaired */
    builds = 0;
    cache_entry *e = NULL;
    CHECK(cache_fetch(c, &req, build, NULL, &e, NULL, err, sizeof err) == OPJIT_OK);
    CHECK(builds == 1 && e && cache_entry_path(e, "host.so") && !cache_entry_path(e, "evil.so"));
    cache_entry_release(e);
out:
    cache_close(c);
}

/* A name with a terminal escape in it is reported escaped. */
static void stranger_named_with_escapes_is_reported_escaped(void)
{
    cache *c = open_cache("escaped");
    cache_request req = mkreq("escaped");
    char dir[PATH_MAX], err[512];
    if (!c || publish(c, &req, dir, sizeof dir))
        goto out;
    CHECK(write_file(dir, "x\033[2J\ny", "payload\n") == 0);
    seen s = {0};
    CHECK(cache_foreach(c, note, &s, err, sizeof err) == OPJIT_OK);
    CHECK(s.damaged == 1);
    CHECK_STR_CONTAINS(s.problem, "x\\x1b[2J\\ny");
    CHECK(!strchr(s.problem, '\033') && !strchr(s.problem, '\n'));
out:
    cache_close(c);
}

int main(void)
{
    const char *base = getenv("OPJIT_CACHE_DIR");
    snprintf(root, sizeof root, "%s", base && *base ? base : "/tmp/opjit-test-cache-listing");
    mkdir(root, 0700);
    T_RUN(unlisted_file_is_damage);
    T_RUN(name_listed_twice_is_damage);
    T_RUN(stranger_named_with_escapes_is_reported_escaped);
    return t_done();
}
