/* tests/test_cache.c - the on-disk cache: keys, hits and misses, damage
 * detection, read-only layers, offline, fallback, trust, LRU eviction,
 * leftovers, and real processes: 8 racing on one key, and a process
 * killed with SIGKILL at random moments. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "opjit.h"
#include "cache/cache_int.h"
#include <xxhash.h>
#include "t.h"

/* ---- helpers ------------------------------------------------------------ */

static char base[1024];

static const char *tdir(const char *name)
{
    static char bufs[8][1200];
    static int i;
    char *b = bufs[i++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", base, name);
    return b;
}

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st; (void)flag; (void)f;
    chmod(p, 0700);
    return remove(p) != 0 && errno != ENOENT;
}

static void rm_rf(const char *p)
{
    /* Make directories writable first (tests chmod some of them 0555). */
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "chmod -R u+rwx '%s' 2>/dev/null", p);
    if (system(cmd) != 0) { /* fine: it may not exist */ }
    nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

typedef struct logcap {
    int nwarn;
    char last[4096];
} logcap;

static void logcb(void *ud, int level, const char *msg)
{
    logcap *lc = ud;
    if (level <= OPJIT_LOG_WARN) {
        __atomic_fetch_add(&lc->nwarn, 1, __ATOMIC_SEQ_CST);
        snprintf(lc->last, sizeof lc->last, "%s", msg);
    }
}

typedef struct bctx {
    int calls;
    size_t size;
    unsigned seed;
    int sleep_ms;
    const char *counter; /* append one line per build */
    int status;          /* non-zero: fail with this */
    int weird;           /* 1: write a subdirectory, 2: a file named manifest */
} bctx;

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 8));
}

static int write_file(const char *path, const void *p, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return -1;
    ssize_t w = write(fd, p, n);
    close(fd);
    return w == (ssize_t)n ? 0 : -1;
}

static int build_cb(void *ud, const char *dir, char *err, size_t errlen)
{
    bctx *b = ud;
    __atomic_fetch_add(&b->calls, 1, __ATOMIC_SEQ_CST);
    if (b->sleep_ms)
        usleep((useconds_t)b->sleep_ms * 1000);
    if (b->counter) {
        int fd = open(b->counter, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            char line[64];
            int n = snprintf(line, sizeof line, "built by %ld\n", (long)getpid());
            if (write(fd, line, (size_t)n) != n) { /* checked by the caller */ }
            close(fd);
        }
    }
    if (b->status) {
        snprintf(err, errlen, "x.c:3: error: expected ';'");
        return b->status;
    }
    char path[1400];
    size_t n = b->size ? b->size : 20000;
    unsigned char *data = malloc(n);
    if (!data)
        return OPJIT_ENOMEM;
    fill(data, n, b->seed);
    snprintf(path, sizeof path, "%s/host.so", dir);
    int rc = write_file(path, data, n);
    snprintf(path, sizeof path, "%s/sm_90.cubin", dir);
    if (!rc)
        rc = write_file(path, data, n / 4);
    free(data);
    if (b->weird == 1) {
        snprintf(path, sizeof path, "%s/sub", dir);
        mkdir(path, 0700);
    } else if (b->weird == 2) {
        snprintf(path, sizeof path, "%s/manifest", dir);
        write_file(path, "x", 1);
    }
    if (rc) {
        snprintf(err, errlen, "cannot write %s", path);
        return OPJIT_EIO;
    }
    return OPJIT_OK;
}

/* A request whose key hashes (op, tag). */
static cache_request mkreq(const char *op, const char *tag)
{
    cache_request r;
    memset(&r, 0, sizeof r);
    cache_keygen *g = cache_keygen_new();
    cache_keygen_add_str(g, "op", op);
    cache_keygen_add_str(g, "tag", tag);
    cache_keygen_finish(g, &r.key);
    r.op_name = op;
    r.source_name = "x.c";
    r.compiler = "testcc 1.0";
    r.options = "-O1 -DN=4";
    r.target = "x86_64-linux";
    r.tier = "tcc";
    return r;
}

static cache *open_at(const char *dir, const char *ro, int offline, uint64_t cap, logcap *lc)
{
    cache_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.dir = dir;
    cfg.readonly = ro ? ro : "";
    cfg.offline = offline;
    cfg.max_size = cap;
    cfg.tmpdir = getenv("TMPDIR"); /* what the runtime's settings would hand in */
    cfg.log = lc ? logcb : NULL;
    cfg.log_ud = lc;
    cfg.log_level = OPJIT_LOG_DEBUG;
    cache *c = NULL;
    char err[512];
    int rc = cache_open(&cfg, &c, err, sizeof err);
    CHECKF(rc == OPJIT_OK && c, "cache_open(%s): %d %s", dir, rc, err);
    return c;
}

/* Read host.so of e and compare it with what bctx would write. */
static int entry_ok(cache_entry *e, size_t size, unsigned seed)
{
    const char *p = cache_entry_path(e, "host.so");
    if (!p)
        return 0;
    FILE *f = fopen(p, "rb");
    if (!f)
        return 0;
    unsigned char *want = malloc(size), *got = malloc(size + 1);
    fill(want, size, seed);
    size_t n = fread(got, 1, size + 1, f);
    fclose(f);
    int ok = n == size && !memcmp(want, got, size);
    free(want);
    free(got);
    return ok;
}

static int exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

static int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int n = 0, ch;
    while ((ch = fgetc(f)) != EOF)
        n += ch == '\n';
    fclose(f);
    return n;
}

static int count_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

static int fetch(cache *c, const cache_request *r, bctx *b, cache_entry **e, int *hit)
{
    char err[1024] = "";
    int rc = cache_fetch(c, r, build_cb, b, e, hit, err, sizeof err);
    if (rc != OPJIT_OK && b && !b->status)
        fprintf(stderr, "  fetch failed: %d %s\n", rc, err);
    return rc;
}

static int verify_count(cache *c)
{
    int nd = -1;
    char err[512];
    int rc = cache_verify_all(c, 0, NULL, NULL, &nd, err, sizeof err);
    CHECKF(rc == OPJIT_OK, "%s", err);
    return nd;
}

static void set_mtime(const char *path, time_t t)
{
    struct timespec ts[2] = {{t, 0}, {t, 0}};
    CHECK(utimensat(AT_FDCWD, path, ts, 0) == 0);
}

static char *manifest_of(const char *entrydir)
{
    static char p[1500];
    snprintf(p, sizeof p, "%s/manifest", entrydir);
    return p;
}

/* ---- keys --------------------------------------------------------------- */

static void key_of(cache_key *k, int n, const char **fields)
{
    cache_keygen *g = cache_keygen_new();
    for (int i = 0; i < n; i += 2)
        cache_keygen_add_str(g, fields[i], fields[i + 1]);
    cache_keygen_finish(g, k);
}

static int key_eq(const cache_key *a, const cache_key *b)
{
    return !memcmp(a->bytes, b->bytes, 16) && !strcmp(a->hex, b->hex);
}

static void test_keys(void)
{
    const char *f[] = {"source", "int x;", "compiler", "libtcc 0.9.27", "flags", "-O1",
                       "target", "x86_64-linux"};
    cache_key k1, k2;
    key_of(&k1, 8, f);
    key_of(&k2, 8, f);
    CHECK(key_eq(&k1, &k2));
    CHECK(strlen(k1.hex) == 32 && strspn(k1.hex, "0123456789abcdef") == 32);
    /* Pinned: the serialization (and so every cache on disk) must not
     * change by accident. */
    CHECKF(!strcmp(k1.hex, "774819e6e1f8db0b6ade9548b84e144b"), "key is %s", k1.hex);

    /* Any change of any name or value gives another key. */
    for (int i = 0; i < 8; i++) {
        const char *g[8];
        memcpy(g, f, sizeof g);
        g[i] = "changed";
        key_of(&k2, 8, g);
        CHECKF(!key_eq(&k1, &k2), "field %d", i);
    }
    /* Boundaries matter: between fields, and between a name and its data. */
    const char *a[] = {"x", "ab", "y", "c"}, *b[] = {"x", "a", "y", "bc"};
    key_of(&k1, 4, a);
    key_of(&k2, 4, b);
    CHECK(!key_eq(&k1, &k2));
    const char *c1[] = {"ab", "c"}, *c2[] = {"a", "bc"};
    key_of(&k1, 2, c1);
    key_of(&k2, 2, c2);
    CHECK(!key_eq(&k1, &k2));
    /* Order matters, and an empty field is not an absent one. */
    const char *o1[] = {"x", "1", "y", "2"}, *o2[] = {"y", "2", "x", "1"};
    key_of(&k1, 4, o1);
    key_of(&k2, 4, o2);
    CHECK(!key_eq(&k1, &k2));
    const char *e1[] = {"x", "1", "y", ""};
    key_of(&k2, 4, e1);
    key_of(&k1, 2, e1);
    CHECK(!key_eq(&k1, &k2));
    /* Binary data with NULs is hashed whole. */
    cache_keygen *g = cache_keygen_new();
    cache_keygen_add(g, "blob", "a\0b", 3);
    cache_keygen_finish(g, &k1);
    g = cache_keygen_new();
    cache_keygen_add(g, "blob", "a\0c", 3);
    cache_keygen_finish(g, &k2);
    CHECK(!key_eq(&k1, &k2));
}

/* ---- hit, miss, build failure ------------------------------------------ */

static void test_hit_miss(void)
{
    logcap lc = {0};
    cache *c = open_at(tdir("hit"), NULL, 0, 0, &lc);
    if (!c)
        return;
    CHECK(!strcmp(cache_dir(c), tdir("hit")));
    cache_request r = mkreq("nms", "1");
    bctx b = {0};
    cache_entry *e = NULL;
    int hit = -1;
    CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK);
    CHECK(hit == 0 && b.calls == 1);
    CHECK(entry_ok(e, 20000, 0));
    CHECK(cache_entry_path(e, "sm_90.cubin") != NULL);
    CHECK(cache_entry_path(e, "nope.so") == NULL);
    char dir[1400];
    snprintf(dir, sizeof dir, "%s/v1/entries/%.2s/%s", tdir("hit"), r.key.hex, r.key.hex);
    CHECK(!strcmp(cache_entry_dir(e), dir));
    struct stat st;
    CHECK(stat(dir, &st) == 0 && (st.st_mode & 0777) == 0700);
    CHECK(stat(tdir("hit"), &st) == 0 && (st.st_mode & 0777) == 0700);
    cache_entry_release(e);

    /* The same key again: a hit, from this and from another cache object. */
    CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK);
    CHECK(hit == 1 && b.calls == 1);
    CHECK(entry_ok(e, 20000, 0));
    cache_entry_release(e);
    cache *c2 = open_at(tdir("hit"), NULL, 0, 0, &lc);
    CHECK(fetch(c2, &r, &b, &e, &hit) == OPJIT_OK);
    CHECK(hit == 1 && b.calls == 1);
    cache_entry_release(e);
    cache_close(c2);

    /* Another key: a miss. */
    cache_request r2 = mkreq("nms", "2");
    CHECK(fetch(c, &r2, &b, &e, &hit) == OPJIT_OK);
    CHECK(hit == 0 && b.calls == 2);
    cache_entry_release(e);

    /* A failing build: its status and message come back, nothing stays. */
    cache_request r3 = mkreq("nms", "3");
    bctx bad = {.status = OPJIT_ECOMPILE};
    char err[512] = "";
    CHECK(cache_fetch(c, &r3, build_cb, &bad, &e, &hit, err, sizeof err) == OPJIT_ECOMPILE);
    CHECK(e == NULL);
    CHECK_STR_CONTAINS(err, "expected ';'");
    snprintf(dir, sizeof dir, "%s/v1/entries/%.2s/%s", tdir("hit"), r3.key.hex, r3.key.hex);
    CHECK(!exists(dir));
    CHECK(count_dir(tdir("hit/v1/tmp")) == 0);
    CHECK(cache_fetch(c, &r3, build_cb, &bad, &e, &hit, err, sizeof err) == OPJIT_ECOMPILE);
    CHECK(bad.calls == 2);

    /* A build that writes what cannot be an artifact is refused. */
    bctx w1 = {.weird = 1}, w2 = {.weird = 2};
    cache_request r4 = mkreq("nms", "4");
    CHECK(cache_fetch(c, &r4, build_cb, &w1, &e, &hit, err, sizeof err) == OPJIT_ECACHE);
    CHECK_STR_CONTAINS(err, "sub");
    CHECK(cache_fetch(c, &r4, build_cb, &w2, &e, &hit, err, sizeof err) == OPJIT_ECACHE);
    CHECK_STR_CONTAINS(err, "manifest");
    CHECK(count_dir(tdir("hit/v1/tmp")) == 0);
    CHECK(lc.nwarn == 0);
    CHECK(verify_count(c) == 0);
    cache_close(c);
}

static int find_options(void *ud, const cache_entry_info *info)
{
    const char **want = ud;
    if (!strcmp(info->key, want[0]) && info->options && !strcmp(info->options, want[1]) &&
        !strcmp(info->op_name, "weird op") && info->layer == 0 && info->nartifacts == 2)
        want[2] = "found";
    return 0;
}

static void test_manifest(void)
{
    cache *c = open_at(tdir("manifest"), NULL, 0, 0, NULL);
    if (!c)
        return;
    cache_request r = mkreq("weird op", "m");
    r.options = "-DX=\"a b\"\n-DY=100%";
    bctx b = {.size = 1234};
    cache_entry *e;
    int hit;
    CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK);
    FILE *f = fopen(manifest_of(cache_entry_dir(e)), "r");
    char text[4096] = "";
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = '\0';
    if (f)
        fclose(f);
    CHECK_STR_CONTAINS(text, "opjit-cache-manifest 1\n");
    CHECK_STR_CONTAINS(text, r.key.hex);
    CHECK_STR_CONTAINS(text, "op weird op\n");
    CHECK_STR_CONTAINS(text, "source x.c\n");
    CHECK_STR_CONTAINS(text, "compiler testcc 1.0\n");
    CHECK_STR_CONTAINS(text, "options -DX=\"a b\"%0a-DY=100%25\n");
    CHECK_STR_CONTAINS(text, "target x86_64-linux\n");
    CHECK_STR_CONTAINS(text, "tier tcc\n");
    CHECK_STR_CONTAINS(text, "created ");
    CHECK_STR_CONTAINS(text, "artifact 1234 ");
    CHECK_STR_CONTAINS(text, " host.so\n");
    CHECK_STR_CONTAINS(text, "artifact 308 ");
    CHECK_STR_CONTAINS(text, "\nend ");
    const char *want[3] = {r.key.hex, r.options, NULL};
    char err[256];
    CHECK(cache_foreach(c, find_options, want, err, sizeof err) == OPJIT_OK);
    CHECK(want[2] != NULL);
    cache_entry_release(e);
    cache_close(c);
}

/* ---- damage ------------------------------------------------------------- */

static void flip_byte(const char *path, off_t at)
{
    int fd = open(path, O_RDWR);
    unsigned char ch = 0;
    CHECK(fd >= 0 && pread(fd, &ch, 1, at) == 1);
    ch ^= 0x10;
    CHECK(pwrite(fd, &ch, 1, at) == 1);
    close(fd);
}

enum { D_TRUNCATE, D_BITFLIP, D_REPLACE, D_MANIFEST, D_NO_MANIFEST, D_NO_ARTIFACT,
       D_EMPTY_MANIFEST, D_COUNT };

static void damage(const char *dir, int how)
{
    char p[1400];
    snprintf(p, sizeof p, "%s/host.so", dir);
    switch (how) {
    case D_TRUNCATE:
        CHECK(truncate(p, 5000) == 0);
        break;
    case D_BITFLIP:
        flip_byte(p, 7777);
        break;
    case D_REPLACE: { /* same size, other bytes */
        unsigned char *d = malloc(20000);
        fill(d, 20000, 99);
        CHECK(write_file(p, d, 20000) == 0);
        free(d);
        break;
    }
    case D_MANIFEST:
        flip_byte(manifest_of(dir), 75); /* inside the op/source lines */
        break;
    case D_NO_MANIFEST:
        CHECK(unlink(manifest_of(dir)) == 0);
        break;
    case D_NO_ARTIFACT:
        CHECK(unlink(p) == 0);
        break;
    case D_EMPTY_MANIFEST:
        CHECK(truncate(manifest_of(dir), 0) == 0);
        break;
    }
}

static void test_corruption(void)
{
    for (int how = 0; how < D_COUNT; how++) {
        logcap lc = {0};
        cache *c = open_at(tdir("damage"), NULL, 0, 0, &lc);
        if (!c)
            return;
        char tag[16];
        snprintf(tag, sizeof tag, "d%d", how);
        cache_request r = mkreq("mm", tag);
        bctx b = {0};
        cache_entry *e;
        int hit;
        CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK);
        char dir[1400];
        snprintf(dir, sizeof dir, "%s", cache_entry_dir(e));
        cache_entry_release(e);
        damage(dir, how);
        CHECKF(verify_count(c) == 1, "damage %d", how);
        CHECK(lc.nwarn == 0);
        e = NULL;
        CHECKF(fetch(c, &r, &b, &e, &hit) == OPJIT_OK, "damage %d", how);
        CHECKF(hit == 0 && b.calls == 2, "damage %d: hit %d calls %d", how, hit, b.calls);
        CHECKF(lc.nwarn == 1, "damage %d: %d warnings", how, lc.nwarn);
        CHECK_STR_CONTAINS(lc.last, "damaged");
        CHECK_STR_CONTAINS(lc.last, r.key.hex);
        CHECKF(e && entry_ok(e, 20000, 0), "damage %d", how);
        cache_entry_release(e);
        CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK && hit == 1 && b.calls == 2);
        cache_entry_release(e);
        CHECK(verify_count(c) == 0);
        cache_close(c);
    }
    /* The replaced entries went through tmp/; nothing is left there once
     * nobody uses them. */
    cache *c = open_at(tdir("damage"), NULL, 0, 0, NULL);
    CHECK(count_dir(tdir("damage/v1/tmp")) == 0);
    cache_close(c);
}

/* The repair mode of verify evicts damaged entries. */
static void test_verify_repair(void)
{
    cache *c = open_at(tdir("repair"), NULL, 0, 0, NULL);
    if (!c)
        return;
    cache_request r = mkreq("mm", "repair");
    bctx b = {0};
    cache_entry *e;
    int hit, nd = -1;
    char err[256], dir[1400];
    CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK);
    snprintf(dir, sizeof dir, "%s", cache_entry_dir(e));
    cache_entry_release(e);
    damage(dir, D_BITFLIP);
    CHECK(cache_verify_all(c, 1, NULL, NULL, &nd, err, sizeof err) == OPJIT_OK && nd == 1);
    CHECK(!exists(dir));
    CHECK(verify_count(c) == 0);
    cache_close(c);
}

/* build == NULL: a probe finds a good entry or says ENOTFOUND, never builds. */
static void test_probe(void)
{
    logcap lc = {0};
    cache *c = open_at(tdir("probe"), NULL, 0, 0, &lc);
    if (!c)
        return;
    cache_request r = mkreq("nms", "probe");
    cache_entry *e = NULL;
    int hit = -1;
    char err[512] = "", dir[1400];
    CHECK(cache_fetch(c, &r, NULL, NULL, &e, &hit, err, sizeof err) == OPJIT_ENOTFOUND);
    CHECK(e == NULL && hit == 0);
    CHECK_STR_CONTAINS(err, r.key.hex);
    bctx b = {0};
    CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK);
    snprintf(dir, sizeof dir, "%s", cache_entry_dir(e));
    cache_entry_release(e);
    CHECK(cache_fetch(c, &r, NULL, NULL, &e, &hit, err, sizeof err) == OPJIT_OK && hit == 1);
    CHECK(e && entry_ok(e, 20000, 0));
    cache_entry_release(e);
    /* A damaged entry: warned about, evicted, not found. */
    damage(dir, D_BITFLIP);
    CHECK(cache_fetch(c, &r, NULL, NULL, &e, &hit, err, sizeof err) == OPJIT_ENOTFOUND);
    CHECK(lc.nwarn == 1 && !exists(dir) && b.calls == 1);
    cache_close(c);
    /* Offline, a probe miss is still ENOTFOUND. */
    c = open_at(tdir("probe"), NULL, 1, 0, NULL);
    CHECK(cache_fetch(c, &r, NULL, NULL, &e, &hit, err, sizeof err) == OPJIT_ENOTFOUND);
    cache_close(c);
    /* The all-zero key (cache_keygen_new out of memory) is refused. */
    c = open_at(tdir("probe"), NULL, 0, 0, NULL);
    cache_keygen_finish(NULL, &r.key);
    CHECK(!strcmp(r.key.hex, "00000000000000000000000000000000"));
    CHECK(cache_fetch(c, &r, build_cb, &b, &e, &hit, err, sizeof err) == OPJIT_ENOMEM);
    CHECK(b.calls == 1);
    cache_close(c);
}

/* ---- layers ------------------------------------------------------------- */

/* A listing of every file under root with what must not change. */
static char snap_buf[1 << 16];
static size_t snap_len;
static int snap_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)flag; (void)f;
    int n = snprintf(snap_buf + snap_len, sizeof snap_buf - snap_len, "%s %o %lld %lld.%09ld %lu\n",
                     p, (unsigned)st->st_mode, (long long)st->st_size, (long long)st->st_mtim.tv_sec,
                     st->st_mtim.tv_nsec, (unsigned long)st->st_ino);
    if (n > 0 && (size_t)n < sizeof snap_buf - snap_len)
        snap_len += (size_t)n;
    return 0;
}
static char *snapshot(const char *root)
{
    snap_len = 0;
    snap_buf[0] = '\0';
    nftw(root, snap_cb, 16, FTW_PHYS);
    return strdup(snap_buf);
}

static void test_readonly_layer(void)
{
    const char *ro = tdir("ro-layer");
    /* Fill a cache, then use it as a read-only layer. */
    cache *w = open_at(ro, NULL, 0, 0, NULL);
    if (!w)
        return;
    cache_request r1 = mkreq("conv2d", "ro1"), r3 = mkreq("conv2d", "ro3");
    bctx b = {0};
    cache_entry *e;
    int hit;
    CHECK(fetch(w, &r1, &b, &e, &hit) == OPJIT_OK);
    char ro_e1[1400];
    snprintf(ro_e1, sizeof ro_e1, "%s", cache_entry_dir(e));
    cache_entry_release(e);
    CHECK(fetch(w, &r3, &b, &e, &hit) == OPJIT_OK);
    char ro_e3[1400];
    snprintf(ro_e3, sizeof ro_e3, "%s", cache_entry_dir(e));
    cache_entry_release(e);
    cache_close(w);
    damage(ro_e3, D_BITFLIP);
    /* Old last-use times: a writer would touch them. */
    set_mtime(manifest_of(ro_e1), time(NULL) - 3600);
    set_mtime(manifest_of(ro_e3), time(NULL) - 3600);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "chmod -R a-w '%s'", ro);
    CHECK(system(cmd) == 0);
    char *before = snapshot(ro);

    logcap lc = {0};
    cache *c = open_at(tdir("ro-top"), ro, 0, 0, &lc);
    if (!c) {
        free(before);
        return;
    }
    CHECK(cache_readonly_count(c) == 1 && !strcmp(cache_readonly_dir(c, 0), ro));
    bctx b2 = {0};
    /* In the layer: a hit, served from the layer. */
    CHECK(fetch(c, &r1, &b2, &e, &hit) == OPJIT_OK);
    CHECK(hit == 1 && b2.calls == 0);
    CHECK(e && !strcmp(cache_entry_dir(e), ro_e1));
    CHECK(entry_ok(e, 20000, 0));
    cache_entry_release(e);
    /* Not in it: built into the writable cache. */
    cache_request r2 = mkreq("conv2d", "ro2");
    CHECK(fetch(c, &r2, &b2, &e, &hit) == OPJIT_OK);
    CHECK(hit == 0 && b2.calls == 1);
    CHECK(e && !strncmp(cache_entry_dir(e), tdir("ro-top"), strlen(tdir("ro-top"))));
    cache_entry_release(e);
    /* Damaged in the layer: skipped with a warning, left there, rebuilt
     * in the writable cache. */
    CHECK(fetch(c, &r3, &b2, &e, &hit) == OPJIT_OK);
    CHECK(hit == 0 && b2.calls == 2);
    CHECK(lc.nwarn == 1);
    CHECK_STR_CONTAINS(lc.last, "read-only");
    CHECK(e && !strncmp(cache_entry_dir(e), tdir("ro-top"), strlen(tdir("ro-top"))));
    cache_entry_release(e);
    CHECK(fetch(c, &r3, &b2, &e, &hit) == OPJIT_OK && hit == 1 && b2.calls == 2);
    cache_entry_release(e);
    /* The repair mode of verify and clear do not touch a layer either. */
    int nd = -1;
    char err[256];
    cache_prune_result pr;
    CHECK(cache_verify_all(c, 1, NULL, NULL, &nd, err, sizeof err) == OPJIT_OK && nd == 1);
    CHECK(cache_clear(c, &pr, err, sizeof err) == OPJIT_OK);
    cache_close(c);

    /* Through a config of its own too ($OPJIT_CACHE_READONLY reaches it
     * this way: tests/test_settings.c). */
    cache_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.dir = tdir("ro-top2");
    cfg.readonly = ro;
    CHECK(cache_open(&cfg, &c, err, sizeof err) == OPJIT_OK);
    CHECK(fetch(c, &r1, &b2, &e, &hit) == OPJIT_OK && hit == 1 && b2.calls == 2);
    cache_entry_release(e);
    cache_close(c);

    char *after = snapshot(ro);
    CHECKF(!strcmp(before, after), "the read-only layer changed:\n--- before\n%s--- after\n%s",
           before, after);
    free(before);
    free(after);
}

/* A real read-only file system, where root's permissions do not help: a
 * tmpfs remounted read-only, in a private mount namespace of a child (so
 * nothing outlives the test). Skipped where mounting is not allowed. */
static int rofs_child(const char *mnt)
{
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", mnt, "tmpfs", 0, "size=16m,mode=0700") != 0)
        return 77;
    char dir[1400];
    snprintf(dir, sizeof dir, "%s/cache", mnt);
    cache_request ra = mkreq("nms", "rofs-a"), rb = mkreq("nms", "rofs-b");
    bctx b = {0};
    cache_entry *e = NULL;
    int hit;
    cache *c = open_at(dir, NULL, 0, 0, NULL);
    CHECK(c && fetch(c, &ra, &b, &e, &hit) == OPJIT_OK && hit == 0);
    cache_entry_release(e);
    cache_close(c);
    if (mount(NULL, mnt, NULL, MS_REMOUNT | MS_RDONLY, NULL) != 0)
        return 77;
    /* As a read-only layer. */
    c = open_at(tdir("rofs-top"), dir, 0, 0, NULL);
    CHECK(fetch(c, &ra, &b, &e, &hit) == OPJIT_OK && hit == 1 && b.calls == 1);
    CHECK(!strncmp(cache_entry_dir(e), dir, strlen(dir)));
    cache_entry_release(e);
    CHECK(fetch(c, &rb, &b, &e, &hit) == OPJIT_OK && hit == 0 && b.calls == 2);
    cache_entry_release(e);
    cache_close(c);
    /* As the writable cache: one warning, its entries still serve, a miss
     * builds in a private directory. */
    logcap lc = {0};
    c = open_at(dir, NULL, 0, 0, &lc);
    CHECK(lc.nwarn == 1 && !cache_writable(c));
    CHECK_STR_CONTAINS(lc.last, "Read-only file system");
    CHECK(fetch(c, &ra, &b, &e, &hit) == OPJIT_OK && hit == 1 && b.calls == 2);
    cache_entry_release(e);
    CHECK(fetch(c, &rb, &b, &e, &hit) == OPJIT_OK && hit == 0 && b.calls == 3);
    CHECK(entry_ok(e, 20000, 0));
    cache_entry_release(e);
    CHECK(lc.nwarn == 1);
    cache_close(c);

    /* A full file system: the build fails with an I/O error there, and
     * runs again in a private directory (one warning). */
    char full[1400];
    snprintf(full, sizeof full, "%s/full", tdir("rofs-top"));
    CHECK(mkdir(full, 0700) == 0);
    if (mount("tmpfs", full, "tmpfs", 0, "size=256k,mode=0700") != 0)
        return 77;
    lc.nwarn = 0;
    c = open_at(full, NULL, 0, 0, &lc);
    CHECK(c && cache_writable(c) && lc.nwarn == 0);
    char filler[1500];
    snprintf(filler, sizeof filler, "%s/filler", full);
    int fd = open(filler, O_WRONLY | O_CREAT, 0600);
    static char chunk[4096];
    while (fd >= 0 && write(fd, chunk, sizeof chunk) > 0)
        ;
    if (fd >= 0)
        close(fd);
    cache_request rc_ = mkreq("nms", "rofs-c");
    CHECK(fetch(c, &rc_, &b, &e, &hit) == OPJIT_OK && hit == 0 && b.calls == 5);
    CHECK(e && strncmp(cache_entry_dir(e), full, strlen(full)) != 0 && entry_ok(e, 20000, 0));
    cache_entry_release(e);
    CHECK(lc.nwarn == 1);
    CHECK_STR_CONTAINS(lc.last, "file system full");
    cache_close(c);
    return t_failed_checks ? 1 : 0;
}

static void test_readonly_fs(void)
{
    const char *mnt = tdir("rofs-mnt");
    CHECK(mkdir(mnt, 0700) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(rofs_child(mnt));
    int st = -1;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
        fprintf(stderr, "  (skipped: cannot mount a read-only tmpfs here)\n");
        return;
    }
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
}

static void test_offline(void)
{
    cache_request r = mkreq("nms", "offline");
    bctx b = {0};
    cache_entry *e = NULL;
    int hit;
    char err[512] = "";
    cache *c = open_at(tdir("offline"), NULL, 1, 0, NULL);
    if (!c)
        return;
    CHECK(cache_offline(c) == 1);
    CHECK(cache_fetch(c, &r, build_cb, &b, &e, &hit, err, sizeof err) == OPJIT_EOFFLINE);
    CHECK(e == NULL && b.calls == 0);
    CHECK_STR_CONTAINS(err, "offline");
    CHECK_STR_CONTAINS(err, "nms");
    CHECK_STR_CONTAINS(err, "x.c");
    CHECK_STR_CONTAINS(err, "x86_64-linux");
    CHECK_STR_CONTAINS(err, r.key.hex);
    cache_close(c);

    /* 1: a miss is an error; 0 builds ($OPJIT_OFFLINE: tests/test_settings.c). */
    c = open_at(tdir("offline"), NULL, 1, 0, NULL);
    CHECK(cache_fetch(c, &r, build_cb, &b, &e, &hit, err, sizeof err) == OPJIT_EOFFLINE);
    cache_close(c);
    c = open_at(tdir("offline"), NULL, 0, 0, NULL);
    CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK && b.calls == 1);
    cache_entry_release(e);
    cache_close(c);
    /* Offline, a hit still works. */
    c = open_at(tdir("offline"), NULL, 1, 0, NULL);
    CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK && hit == 1 && b.calls == 1);
    cache_entry_release(e);
    cache_close(c);
}

/* ---- degraded modes ----------------------------------------------------- */

static void test_unwritable_fallback(void)
{
    /* A directory below a regular file cannot be created (ENOTDIR), even
     * by root. */
    const char *file = tdir("a-file");
    CHECK(write_file(file, "x", 1) == 0);
    char dir[1400];
    snprintf(dir, sizeof dir, "%s/cache", file);
    logcap lc = {0};
    cache *c = open_at(dir, NULL, 0, 0, &lc);
    if (!c)
        return;
    CHECK(lc.nwarn == 1);
    CHECK_STR_CONTAINS(lc.last, dir);
    CHECK(!strcmp(cache_dir(c), "") && !cache_writable(c));
    cache_request r = mkreq("nms", "fallback");
    bctx b = {0};
    cache_entry *e1, *e2;
    int hit;
    CHECK(fetch(c, &r, &b, &e1, &hit) == OPJIT_OK && hit == 0);
    CHECK(fetch(c, &r, &b, &e2, &hit) == OPJIT_OK && hit == 0);
    CHECK(b.calls == 2 && lc.nwarn == 1);
    CHECK(e1 && e2 && strcmp(cache_entry_dir(e1), cache_entry_dir(e2)) != 0);
    CHECK(e1 && entry_ok(e1, 20000, 0));
    char d1[1400];
    snprintf(d1, sizeof d1, "%s", e1 ? cache_entry_dir(e1) : "");
    CHECK(exists(d1));
    cache_entry_release(e1);
    CHECK(!exists(d1)); /* the private build is gone with its entry */
    cache_entry_release(e2);
    cache_close(c);

    /* Disabled: the same without a warning. */
    cache_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.disabled = 1;
    cfg.log = logcb;
    cfg.log_ud = &lc;
    cfg.log_level = OPJIT_LOG_DEBUG;
    lc.nwarn = 0;
    char err[256];
    CHECK(cache_open(&cfg, &c, err, sizeof err) == OPJIT_OK);
    CHECK(!strcmp(cache_dir(c), ""));
    CHECK(fetch(c, &r, &b, &e1, &hit) == OPJIT_OK && hit == 0 && b.calls == 3);
    snprintf(d1, sizeof d1, "%s", cache_entry_dir(e1));
    cache_entry_release(e1);
    CHECK(!exists(d1) && lc.nwarn == 0);
    cache_close(c);
}

static void test_untrusted(void)
{
    /* A world-writable cache directory is not used. */
    const char *bad = tdir("ww-cache");
    CHECK(mkdir(bad, 0700) == 0 && chmod(bad, 0777) == 0);
    logcap lc = {0};
    cache *c = open_at(bad, NULL, 0, 0, &lc);
    if (!c)
        return;
    CHECK(lc.nwarn == 1 && !cache_writable(c));
    CHECK_STR_CONTAINS(lc.last, "writable by group or others");
    cache_request r = mkreq("nms", "trust");
    bctx b = {0};
    cache_entry *e;
    int hit;
    CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK && b.calls == 1);
    CHECK(strncmp(cache_entry_dir(e), bad, strlen(bad)) != 0);
    cache_entry_release(e);
    cache_close(c);

    /* A world-writable entry, or a group-writable artifact, is rebuilt. */
    lc.nwarn = 0;
    c = open_at(tdir("trust"), NULL, 0, 0, &lc);
    CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK && b.calls == 2);
    char dir[1400], p[1500];
    snprintf(dir, sizeof dir, "%s", cache_entry_dir(e));
    cache_entry_release(e);
    CHECK(chmod(dir, 0777) == 0);
    CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK && hit == 0 && b.calls == 3);
    CHECK(lc.nwarn == 1);
    CHECK_STR_CONTAINS(lc.last, "writable by group or others");
    cache_entry_release(e);
    struct stat st;
    CHECK(stat(dir, &st) == 0 && (st.st_mode & 022) == 0);
    snprintf(p, sizeof p, "%s/host.so", dir);
    CHECK(stat(p, &st) == 0 && (st.st_mode & 022) == 0);
    CHECK(chmod(p, 0664) == 0);
    CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK && hit == 0 && b.calls == 4);
    CHECK(lc.nwarn == 2);
    cache_entry_release(e);

    /* An entry owned by someone else (root can make one) is rebuilt. */
    if (geteuid() == 0) {
        CHECK(chown(dir, 12345, 12345) == 0);
        CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK && hit == 0 && b.calls == 5);
        CHECK(lc.nwarn == 3);
        CHECK_STR_CONTAINS(lc.last, "owned by another user");
        cache_entry_release(e);
        CHECK(stat(dir, &st) == 0 && st.st_uid == 0);
    }
    CHECK(verify_count(c) == 0);
    cache_close(c);
}

/* ---- size cap ----------------------------------------------------------- */

static void test_lru_eviction(void)
{
    logcap lc = {0};
    /* Entries are 12500 bytes of artifacts plus a small manifest: three fit. */
    const uint64_t cap = 40000;
    cache *c = open_at(tdir("lru"), NULL, 0, cap, &lc);
    if (!c)
        return;
    CHECK(cache_max_size(c) == cap);
    cache_request r[6];
    char dirs[6][1400];
    const char *tags[6] = {"A", "B", "C", "D", "E", "F"};
    bctx b = {.size = 10000};
    cache_entry *e;
    int hit;
    for (int i = 0; i < 3; i++) {
        r[i] = mkreq("lru", tags[i]);
        CHECK(fetch(c, &r[i], &b, &e, &hit) == OPJIT_OK);
        snprintf(dirs[i], sizeof dirs[i], "%s", cache_entry_dir(e));
        cache_entry_release(e);
    }
    time_t now = time(NULL);
    set_mtime(manifest_of(dirs[0]), now - 900); /* A: oldest ... */
    set_mtime(manifest_of(dirs[1]), now - 600);
    set_mtime(manifest_of(dirs[2]), now - 300);
    /* ... until it is used again: now B is the least recently used. */
    CHECK(fetch(c, &r[0], &b, &e, &hit) == OPJIT_OK && hit == 1);
    cache_entry_release(e);
    r[3] = mkreq("lru", tags[3]);
    CHECK(fetch(c, &r[3], &b, &e, &hit) == OPJIT_OK && hit == 0);
    snprintf(dirs[3], sizeof dirs[3], "%s", cache_entry_dir(e));
    CHECK(entry_ok(e, 10000, 0)); /* the new entry is never the victim */
    cache_entry_release(e);
    CHECK(exists(dirs[0]));
    CHECK(!exists(dirs[1]));
    CHECK(exists(dirs[2]));
    CHECK(exists(dirs[3]));

    /* An entry in use is never evicted: hold C, the least recently used. */
    cache_entry *held;
    CHECK(fetch(c, &r[2], &b, &held, &hit) == OPJIT_OK && hit == 1);
    set_mtime(manifest_of(dirs[2]), now - 5000);
    set_mtime(manifest_of(dirs[3]), now - 2000);
    set_mtime(manifest_of(dirs[0]), now - 100);
    r[4] = mkreq("lru", tags[4]);
    CHECK(fetch(c, &r[4], &b, &e, &hit) == OPJIT_OK);
    snprintf(dirs[4], sizeof dirs[4], "%s", cache_entry_dir(e));
    cache_entry_release(e);
    CHECK(exists(dirs[2]) && entry_ok(held, 10000, 0));
    CHECK(!exists(dirs[3]));
    CHECK(exists(dirs[0]) && exists(dirs[4]));

    cache_totals t;
    char err[256];
    CHECK(cache_get_totals(c, &t, err, sizeof err) == OPJIT_OK);
    CHECK(t.entries == 3 && t.bytes <= cap && t.bytes > 3 * 12500);

    /* Prune to a smaller size, and clear: still not the held entry. */
    cache_prune_result pr;
    CHECK(cache_prune(c, 20000, &pr, err, sizeof err) == OPJIT_OK);
    CHECK(pr.removed == 2 && pr.busy == 1 && pr.bytes_after < 20000);
    CHECK(exists(dirs[2]));
    CHECK(cache_clear(c, &pr, err, sizeof err) == OPJIT_OK);
    CHECK(pr.removed == 0 && pr.busy == 1);
    cache_entry_release(held);
    CHECK(cache_clear(c, &pr, err, sizeof err) == OPJIT_OK);
    CHECK(pr.removed == 1 && pr.busy == 0 && pr.bytes_after == 0);
    CHECK(!exists(dirs[2]));
    CHECK(count_dir(tdir("lru/v1/locks")) == 0);
    CHECK(count_dir(tdir("lru/v1/tmp")) == 0);
    CHECK(lc.nwarn == 0);
    cache_close(c);
}

/* The usage ledger (v1/usage): a build counts itself there instead of
 * walking every entry, and walks (evicting) only when the ledger is
 * missing or damaged, says the cap is passed, or every 256 installs. */
static void write_usage(const char *path, const char *text)
{
    CHECK(write_file(path, text, strlen(text)) == 0);
}

static unsigned long long usage_bytes(const char *path, unsigned long long *installs)
{
    unsigned long long b = 0, i = 0;
    FILE *f = fopen(path, "r");
    int ok = f && fscanf(f, "opjit-cache-usage 1 %llu %llu", &b, &i) == 2;
    if (f)
        fclose(f);
    CHECKF(ok, "%s unreadable", path);
    if (installs)
        *installs = i;
    return b;
}

/* The ledger tests' cap: three entries of 12,500 bytes fit. */
#define LEDGER_CAP 40000

/* A cache at dir capped at LEDGER_CAP and a second handle on it with no
 * cap, whose builds count nowhere; usage: the path of its ledger. 0 when
 * either cannot be opened. */
static int ledger_caches(const char *dir, cache **capped, cache **uncapped, char *usage,
                         size_t n)
{
    snprintf(usage, n, "%s/v1/usage", dir);
    *capped = open_at(dir, NULL, 0, LEDGER_CAP, NULL);
    *uncapped = open_at(dir, NULL, 0, UINT64_MAX, NULL);
    return *capped && *uncapped;
}

/* n requests of op (at most 9), each its own key. */
static void ledger_requests(const char *op, cache_request *r, int n)
{
    static const char *const tags[] = {"A", "B", "C", "D", "E", "F", "G", "H", "I"};
    for (int i = 0; i < n; i++)
        r[i] = mkreq(op, tags[i]);
}

/* r[from..to) built through c, each a miss. */
static void build_in(cache *c, cache_request *r, int from, int to)
{
    bctx b = {.size = 10000};
    cache_entry *e;
    int hit;
    for (int i = from; i < to; i++) {
        CHECK(fetch(c, &r[i], &b, &e, &hit) == OPJIT_OK && hit == 0);
        cache_entry_release(e);
    }
}

/* A cache this process made starts its ledger at its first install
 * without a walk (it holds nothing this process did not count, but what
 * others add meanwhile, which they count); one that was there walks when
 * its ledger is missing. Seen through entries nobody counted: a walk would
 * evict them to the cap. */
static void test_new_cache_ledger_starts_without_a_walk(void)
{
    const uint64_t cap = LEDGER_CAP;
    char usage[1400], err[256];
    const char *dir = tdir("ledger-new");
    cache *made, *uncapped;
    if (!ledger_caches(dir, &made, &uncapped, usage, sizeof usage))
        return;
    cache_request r[6];
    ledger_requests("ledger-new", r, 6);
    build_in(uncapped, r, 0, 4);
    CHECK(access(usage, F_OK) != 0);
    build_in(made, r, 4, 5);
    cache_totals t;
    CHECK(cache_get_totals(made, &t, err, sizeof err) == OPJIT_OK && t.entries == 5);
    CHECK(usage_bytes(usage, NULL) == t.bytes / 5);

    /* Opened again (it exists), without a ledger: the build walks. */
    cache *again = open_at(dir, NULL, 0, cap, NULL);
    CHECK(unlink(usage) == 0);
    if (again) {
        build_in(again, r, 5, 6);
        CHECK(cache_get_totals(again, &t, err, sizeof err) == OPJIT_OK && t.entries == 3);
        CHECK(t.bytes <= cap && usage_bytes(usage, NULL) == t.bytes);
        cache_close(again);
    }
    cache_close(uncapped);
    cache_close(made);
}

static void test_usage_ledger(void)
{
    const uint64_t cap = LEDGER_CAP;
    char usage[1400], err[256];
    cache *c, *uncapped;
    if (!ledger_caches(tdir("ledger"), &c, &uncapped, usage, sizeof usage))
        return;
    cache_request r[9];
    ledger_requests("ledger", r, 9);
    build_in(c, r, 0, 2);
    cache_totals t;
    CHECK(cache_get_totals(c, &t, err, sizeof err) == OPJIT_OK && t.entries == 2);
    CHECK(usage_bytes(usage, NULL) == t.bytes);

    /* Two entries the ledger does not know of: the real total passes the
     * cap, the ledger's does not, and the next build walks nothing. */
    build_in(uncapped, r, 2, 4);
    build_in(c, r, 4, 5);
    CHECK(cache_get_totals(c, &t, err, sizeof err) == OPJIT_OK && t.entries == 5);

    /* A damaged ledger: the next build walks, evicts to the cap and
     * starts the ledger again from what it counted. */
    write_usage(usage, "opjit-cache-usage 1 12\n"); /* cut short */
    build_in(c, r, 5, 6);
    CHECK(cache_get_totals(c, &t, err, sizeof err) == OPJIT_OK && t.entries == 3);
    CHECK(t.bytes <= cap && usage_bytes(usage, NULL) == t.bytes);

    /* The 256th install walks even under the cap. */
    build_in(uncapped, r, 6, 7);
    write_usage(usage, "opjit-cache-usage 1 100 254\n");
    build_in(c, r, 7, 8); /* the 255th */
    CHECK(cache_get_totals(c, &t, err, sizeof err) == OPJIT_OK && t.entries == 5);
    build_in(c, r, 8, 9); /* the 256th */
    unsigned long long installs;
    CHECK(cache_get_totals(c, &t, err, sizeof err) == OPJIT_OK && t.entries == 3);
    CHECK(usage_bytes(usage, &installs) == t.bytes && installs == 256);

    /* Clearing the cache leaves a ledger of nothing. */
    cache_prune_result pr;
    CHECK(cache_clear(c, &pr, err, sizeof err) == OPJIT_OK && pr.removed == 3);
    CHECK(usage_bytes(usage, NULL) == 0);
    cache_close(uncapped);
    cache_close(c);
}

static void test_parse_size(void)
{
    uint64_t v;
    CHECK(cache_parse_size("100", &v) == 0 && v == 100);
    CHECK(cache_parse_size("4K", &v) == 0 && v == 4096);
    CHECK(cache_parse_size("512M", &v) == 0 && v == 512ull << 20);
    CHECK(cache_parse_size("2GiB", &v) == 0 && v == 2ull << 30);
    CHECK(cache_parse_size("1g", &v) == 0 && v == 1ull << 30);
    CHECK(cache_parse_size("", &v) != 0);
    CHECK(cache_parse_size("12Q", &v) != 0);
    CHECK(cache_parse_size("-5", &v) != 0);
    CHECK(cache_parse_size("99999999999T", &v) != 0);

    /* The cap as configured; 0: the default ($OPJIT_CACHE_MAX_SIZE:
     * tests/test_settings.c). */
    cache *c = open_at(tdir("size"), NULL, 0, 3ull << 20, NULL);
    CHECK(c && cache_max_size(c) == 3ull << 20);
    cache_close(c);
    c = open_at(tdir("size"), NULL, 0, 0, NULL);
    CHECK(c && cache_max_size(c) == 512ull << 20);
    cache_close(c);
}

/* ---- leftovers and processes -------------------------------------------- */

/* Wait until dir holds an entry, up to ~10 s. */
static int wait_nonempty(const char *dir)
{
    for (int i = 0; i < 2000; i++) {
        if (count_dir(dir) > 0)
            return 1;
        usleep(5000);
    }
    return 0;
}

static void test_tmp_cleanup(void)
{
    const char *dir = tdir("leftover");
    cache *c = open_at(dir, NULL, 0, 0, NULL);
    if (!c)
        return;
    cache_close(c);
    const char *tmp = tdir("leftover/v1/tmp");

    /* A build killed half-way leaves its directory; the next open removes it. */
    cache_request r = mkreq("nms", "killed");
    pid_t pid = fork();
    if (pid == 0) {
        cache *cc = open_at(dir, NULL, 0, 0, NULL);
        bctx b = {.sleep_ms = 100000};
        cache_entry *e;
        int hit;
        fetch(cc, &r, &b, &e, &hit);
        _exit(1);
    }
    CHECK(wait_nonempty(tmp));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    CHECK(count_dir(tmp) == 1);
    /* Also an entry discarded by a process killed before deleting it. */
    char p[1400];
    snprintf(p, sizeof p, "%s/%s.t.abcdef", tmp, r.key.hex);
    CHECK(mkdir(p, 0700) == 0);
    snprintf(p, sizeof p, "%s/%s.t.abcdef/host.so", tmp, r.key.hex);
    CHECK(write_file(p, "x", 1) == 0);
    CHECK(count_dir(tmp) == 2);
    c = open_at(dir, NULL, 0, 0, NULL);
    CHECK(count_dir(tmp) == 0);
    cache_close(c);

    /* A build in progress is left alone, and publishes fine. */
    pid = fork();
    if (pid == 0) {
        cache *cc = open_at(dir, NULL, 0, 0, NULL);
        bctx b = {.sleep_ms = 500};
        cache_entry *e;
        int hit;
        int rc = fetch(cc, &r, &b, &e, &hit);
        _exit(rc == OPJIT_OK && entry_ok(e, 20000, 0) ? 0 : 1);
    }
    CHECK(wait_nonempty(tmp));
    c = open_at(dir, NULL, 0, 0, NULL);
    cache_prune_result pr;
    char err[256];
    CHECK(cache_prune(c, 0, &pr, err, sizeof err) == OPJIT_OK);
    CHECK(pr.tmp_removed == 0);
    CHECK(count_dir(tmp) == 1);
    int st = -1;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(count_dir(tmp) == 0);
    bctx b = {0};
    cache_entry *e;
    int hit;
    CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK && hit == 1 && b.calls == 0);
    cache_entry_release(e);
    cache_close(c);
}

/* N processes miss the same key at once: one builds, all succeed. */
static void test_processes_race(void)
{
    enum { N = 8 };
    const char *dir = tdir("race");
    const char *counter = tdir("race-counter");
    cache_request r = mkreq("nms", "race");
    int go[2];
    CHECK(pipe(go) == 0);
    pid_t pids[N];
    for (int i = 0; i < N; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            close(go[1]);
            char ch;
            if (read(go[0], &ch, 1) < 0) { /* EOF is the start signal */ }
            cache *c = open_at(dir, NULL, 0, 0, NULL);
            bctx b = {.sleep_ms = 200, .counter = counter};
            cache_entry *e;
            int hit = -1;
            int rc = c ? fetch(c, &r, &b, &e, &hit) : -1;
            int ok = rc == OPJIT_OK && entry_ok(e, 20000, 0);
            _exit(!ok ? 1 : hit ? 0 : 3);
        }
    }
    close(go[0]);
    close(go[1]); /* everyone starts now */
    int hits = 0, built = 0, failed = 0;
    for (int i = 0; i < N; i++) {
        int st = -1;
        waitpid(pids[i], &st, 0);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
        hits += code == 0;
        built += code == 3;
        failed += code != 0 && code != 3;
    }
    CHECKF(failed == 0 && built == 1 && hits == N - 1, "failed %d built %d hits %d", failed,
           built, hits);
    CHECKF(count_lines(counter) == 1, "%d builds", count_lines(counter));
    cache *c = open_at(dir, NULL, 0, 0, NULL);
    CHECK(verify_count(c) == 0);
    cache_close(c);
}

typedef struct thread_arg {
    cache *c;
    cache_request *r;
    bctx *b;
    int ok;
} thread_arg;

static void *thread_main(void *p)
{
    thread_arg *a = p;
    cache_entry *e;
    int hit;
    a->ok = fetch(a->c, a->r, a->b, &e, &hit) == OPJIT_OK && entry_ok(e, 20000, 0);
    if (a->ok)
        cache_entry_release(e);
    return NULL;
}

/* Threads of one process sharing one cache object exclude each other too. */
static void test_threads_race(void)
{
    enum { N = 6 };
    cache *c = open_at(tdir("threads"), NULL, 0, 0, NULL);
    if (!c)
        return;
    cache_request r = mkreq("nms", "threads");
    bctx b = {.sleep_ms = 100};
    pthread_t th[N];
    thread_arg a[N];
    for (int i = 0; i < N; i++) {
        a[i] = (thread_arg){c, &r, &b, 0};
        CHECK(pthread_create(&th[i], NULL, thread_main, &a[i]) == 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        CHECK(a[i].ok);
    }
    CHECK(b.calls == 1);
    cache_close(c);
}

enum { KILL_KEYS = 16 };

static cache_request kill_req(int k)
{
    char tag[16];
    snprintf(tag, sizeof tag, "k%d", k);
    return mkreq("kill", tag);
}

/* Fetch random keys forever (until killed), with a cap small enough that
 * publishing keeps evicting. */
static void kill_child(const char *dir)
{
    unsigned seed = (unsigned)getpid();
    cache *c = open_at(dir, NULL, 0, 48 * 1024, NULL);
    if (!c)
        _exit(2);
    for (int i = 0; i < 100000; i++) {
        int k = (int)(rand_r(&seed) % KILL_KEYS);
        cache_request r = kill_req(k);
        bctx b = {.size = 3000 + 700 * (size_t)k, .seed = (unsigned)k};
        cache_entry *e;
        int hit;
        if (fetch(c, &r, &b, &e, &hit) != OPJIT_OK)
            _exit(2);
        if (!entry_ok(e, b.size, b.seed))
            _exit(3);
        cache_entry_release(e);
    }
    _exit(0);
}

static void test_kill9(void)
{
    const char *dir = tdir("kill9");
    const int trials = 60;
    unsigned seed = 12345;
    int bad = 0;
    for (int t = 0; t < trials; t++) {
        pid_t pid = fork();
        if (pid == 0)
            kill_child(dir);
        usleep(1000 + rand_r(&seed) % 25000);
        kill(pid, SIGKILL);
        int st = 0;
        waitpid(pid, &st, 0);
        if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            fprintf(stderr, "  trial %d: child status %#x\n", t, st);
            bad++;
        }
    }
    CHECK(bad == 0);
    /* Afterwards: nothing damaged, leftovers cleaned, every key loads with
     * the right bytes. */
    cache *c = open_at(dir, NULL, 0, 48 * 1024, NULL);
    if (!c)
        return;
    CHECK(verify_count(c) == 0);
    cache_totals tot;
    char err[256];
    CHECK(cache_get_totals(c, &tot, err, sizeof err) == OPJIT_OK);
    CHECKF(tot.tmp_dirs == 0, "%llu tmp dirs left", (unsigned long long)tot.tmp_dirs);
    CHECK(tot.entries > 0);
    for (int k = 0; k < KILL_KEYS; k++) {
        cache_request r = kill_req(k);
        bctx b = {.size = 3000 + 700 * (size_t)k, .seed = (unsigned)k};
        cache_entry *e;
        int hit;
        CHECKF(fetch(c, &r, &b, &e, &hit) == OPJIT_OK, "key %d", k);
        CHECKF(entry_ok(e, b.size, b.seed), "key %d", k);
        cache_entry_release(e);
    }
    CHECK(verify_count(c) == 0);
    cache_close(c);
}

/* A FIFO where the manifest or an artifact should be (a hostile or broken
 * cache) is damage, not a hang: opening it must not wait for a writer. Run
 * in a child with an alarm, so a regression fails instead of hanging. */
static void test_fifo_is_damage_not_a_hang(void)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(20);
        int bad = 0;
        for (int what = 0; what < 2; what++) {
            cache *c = open_at(tdir("fifo"), NULL, 0, 0, NULL);
            char tag[16];
            snprintf(tag, sizeof tag, "fifo%d", what);
            cache_request r = mkreq("mm", tag);
            bctx b = {0};
            cache_entry *e = NULL;
            int hit = -1;
            bad += fetch(c, &r, &b, &e, &hit) != OPJIT_OK;
            char p[1500];
            snprintf(p, sizeof p, "%s/%s", cache_entry_dir(e), what ? "host.so" : "manifest");
            cache_entry_release(e);
            bad += unlink(p) != 0 || mkfifo(p, 0600) != 0;
            /* verify sees it, fetch evicts and rebuilds it */
            bad += verify_count(c) != 1;
            bad += fetch(c, &r, &b, &e, &hit) != OPJIT_OK || hit != 0 || b.calls != 2;
            bad += !e || !entry_ok(e, 20000, 0);
            cache_entry_release(e);
            cache_close(c);
        }
        /* The same in a read-only layer: skipped, built in the writable cache. */
        cache *w = open_at(tdir("fifo-ro"), NULL, 0, 0, NULL);
        cache_request r = mkreq("mm", "fifo-ro");
        bctx b = {0};
        cache_entry *e = NULL;
        int hit = -1;
        bad += fetch(w, &r, &b, &e, &hit) != OPJIT_OK;
        char p[1500];
        snprintf(p, sizeof p, "%s/manifest", cache_entry_dir(e));
        cache_entry_release(e);
        cache_close(w);
        bad += unlink(p) != 0 || mkfifo(p, 0600) != 0;
        cache *c = open_at(tdir("fifo-2"), tdir("fifo-ro"), 0, 0, NULL);
        bad += fetch(c, &r, &b, &e, &hit) != OPJIT_OK || hit != 0 || b.calls != 2;
        cache_entry_release(e);
        cache_close(c);
        _exit(bad || t_failed_checks ? 1 : 0);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %s %d",
           WIFSIGNALED(st) ? "killed by signal" : "exited", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

/* Running out of file descriptors (like memory, or an I/O error) while
 * checking an entry says nothing about it: the fetch fails saying why (a
 * probe: not found), the entry is neither evicted nor rebuilt, and verify
 * (even --repair) reports an error, not damage. In a child whose
 * RLIMIT_NOFILE leaves k descriptors free, k = 0, 1, 2...: each open of a
 * fetch fails in turn until one succeeds. */
static void test_transient_is_not_damage(void)
{
    cache *c = open_at(tdir("emfile"), NULL, 0, 0, NULL);
    if (!c)
        return;
    cache_request r = mkreq("mm", "emfile");
    bctx b = {0};
    cache_entry *e = NULL;
    int hit;
    char man[1500];
    struct stat before, after;
    CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK);
    snprintf(man, sizeof man, "%s", manifest_of(cache_entry_dir(e)));
    cache_entry_release(e);
    CHECK(stat(man, &before) == 0);

    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int failed = t_failed_checks;
        alarm(60);
        logcap lc = {0};
        cache *cc = open_at(tdir("emfile"), NULL, 0, 0, &lc);
        bctx cb = {0};
        int lowest = dup(2), nfail = 0, ok = 0;
        close(lowest);
        struct rlimit orig, rl;
        CHECK(getrlimit(RLIMIT_NOFILE, &orig) == 0);
        for (int k = 0; k < 16 && !ok; k++) {
            for (int probe = 1; probe >= 0; probe--) {
                char err[1024] = "", verr[1024] = "";
                cache_entry *ce = NULL;
                int h = -1, nd = -1;
                rl = orig;
                rl.rlim_cur = (rlim_t)(lowest + k);
                CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
                int rc = cache_fetch(cc, &r, probe ? NULL : build_cb, &cb, &ce, &h, err, sizeof err);
                int vrc = cache_verify_all(cc, 1, NULL, NULL, &nd, verr, sizeof verr);
                CHECK(setrlimit(RLIMIT_NOFILE, &orig) == 0);
                if (rc == OPJIT_OK) {
                    CHECKF(ce && h == 1, "k %d probe %d: hit %d", k, probe, h);
                    ok += !probe;
                } else {
                    nfail++;
                    CHECKF(rc == (probe ? OPJIT_ENOTFOUND : OPJIT_EIO), "k %d probe %d: %d %s", k,
                           probe, rc, err);
                    CHECK_STR_CONTAINS(err, strerror(EMFILE));
                    CHECK_STR_CONTAINS(err, r.key.hex);
                }
                cache_entry_release(ce);
                CHECKF(nd == 0, "k %d: verify says %d damaged", k, nd);
                if (vrc != OPJIT_OK)
                    CHECK_STR_CONTAINS(verr, strerror(EMFILE));
            }
        }
        CHECK(ok == 1 && nfail > 0);
        CHECKF(cb.calls == 0, "rebuilt %d times", cb.calls);
        CHECKF(lc.nwarn == 0, "%d warnings, the last: %s", lc.nwarn, lc.last);
        cache_close(cc);
        _exit(t_failed_checks != failed);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %s %d",
           WIFSIGNALED(st) ? "killed by signal" : "exited", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    /* The very same entry is still there, and good. */
    CHECK(stat(man, &after) == 0 && after.st_ino == before.st_ino && after.st_dev == before.st_dev);
    CHECK(verify_count(c) == 0);
    CHECK(fetch(c, &r, &b, &e, &hit) == OPJIT_OK && hit == 1 && b.calls == 1);
    cache_entry_release(e);
    cache_close(c);
}

/* The names in dir starting with prefix; the first one in first. */
static int count_prefixed(const char *dir, const char *prefix, char *first, size_t firstlen)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, prefix, strlen(prefix)) != 0)
            continue;
        if (!n++ && first)
            snprintf(first, firstlen, "%s/%s", dir, de->d_name);
    }
    closedir(d);
    return n;
}

/* The private build directories of a cache that cannot be written are
 * removed by the next process that makes one when their owner was killed
 * (kill -9 leaves them), never while their owner lives. */
static void test_fallback_dirs_swept(void)
{
    char cdir[1400], tmp[1200], dead[1500] = "", live[1500] = "", mine[1500];
    snprintf(tmp, sizeof tmp, "%s", tdir("fb-tmp"));
    snprintf(cdir, sizeof cdir, "%s/cache", tdir("a-file"));
    CHECK(write_file(tdir("a-file"), "x", 1) == 0);
    rm_rf(tmp);
    mkdir(tmp, 0700);
    char *old = getenv("TMPDIR") ? strdup(getenv("TMPDIR")) : NULL;
    setenv("TMPDIR", tmp, 1);
    cache_request r = mkreq("nms", "fb-sweep");
    cache *c = open_at(cdir, NULL, 0, 0, NULL);
    bctx b = {0};
    cache_entry *e1 = NULL, *e2 = NULL, *e3 = NULL;
    int hit;

    /* A process alive holding its build. */
    int go[2];
    CHECK(pipe(go) == 0);
    pid_t alive = fork();
    if (alive == 0) {
        close(go[1]);
        int rc = fetch(c, &r, &b, &e1, &hit);
        char ch;
        if (read(go[0], &ch, 1) < 0) { /* EOF: the parent says go */ }
        _exit(rc == OPJIT_OK ? 0 : 1);
    }
    close(go[0]);
    for (int i = 0; i < 5000 && count_prefixed(tmp, "opjit-build-", NULL, 0) < 1; i++)
        usleep(1000);
    CHECK(count_prefixed(tmp, "opjit-build-", live, sizeof live) == 1);

    /* A process killed holding its build: it keeps the live one. */
    pid_t pid = fork();
    if (pid == 0) {
        _exit(fetch(c, &r, &b, &e1, &hit) == OPJIT_OK ? 0 : 1); /* e1 not released */
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(count_prefixed(tmp, "opjit-build-", NULL, 0) == 2);
    {
        DIR *d = opendir(tmp);
        struct dirent *de;
        while (d && (de = readdir(d)))
            if (!strncmp(de->d_name, "opjit-build-", 12) && !strstr(live, de->d_name))
                snprintf(dead, sizeof dead, "%s/%s", tmp, de->d_name);
        if (d)
            closedir(d);
    }
    CHECK(*dead && exists(live));

    /* This process: its first build sweeps the dead one only; a second
     * one (also alive, in this very process) keeps the first. */
    CHECK(fetch(c, &r, &b, &e2, &hit) == OPJIT_OK);
    CHECKF(!exists(dead), "%s is left", dead);
    CHECKF(*live && exists(live), "%s was removed under its owner", live);
    snprintf(mine, sizeof mine, "%s", e2 ? cache_entry_dir(e2) : "");
    CHECK(fetch(c, &r, &b, &e3, &hit) == OPJIT_OK);
    CHECK(exists(mine) && exists(live));
    CHECK(e2 && e3 && entry_ok(e2, 20000, 0) && entry_ok(e3, 20000, 0));

    /* Nothing that is not ours to remove goes: a symbolic link, a file, a
     * directory without a lock file (an older opjit's, or being made). */
    char p[1600];
    mkdir(tdir("fb-target"), 0700);
    CHECK(write_file(tdir("fb-target/lock"), "1\n", 2) == 0);
    snprintf(p, sizeof p, "%s/opjit-build-LINKxx", tmp);
    CHECK(symlink(tdir("fb-target"), p) == 0);
    snprintf(p, sizeof p, "%s/opjit-build-FILExx", tmp);
    CHECK(write_file(p, "x", 1) == 0);
    snprintf(p, sizeof p, "%s/opjit-build-NOLOCK", tmp);
    CHECK(mkdir(p, 0700) == 0);
    set_mtime(p, time(NULL) - 3600);

    /* The live process is killed (kill -9): the next build sweeps it. */
    kill(alive, SIGKILL);
    CHECK(waitpid(alive, &st, 0) == alive);
    close(go[1]);
    cache_entry_release(e3);
    CHECK(fetch(c, &r, &b, &e3, &hit) == OPJIT_OK);
    CHECKF(!exists(live), "%s is left", live);
    CHECK(exists(mine) && exists(tdir("fb-target/lock")) && exists(p));
    cache_entry_release(e2);
    cache_entry_release(e3);
    CHECK(!exists(mine));
    /* Left: the link, the file and the directory without a lock. */
    CHECKF(count_prefixed(tmp, "opjit-build-", NULL, 0) == 3, "%d left",
           count_prefixed(tmp, "opjit-build-", NULL, 0));
    cache_close(c);
    if (old) {
        setenv("TMPDIR", old, 1);
        free(old);
    } else {
        unsetenv("TMPDIR");
    }
}

/* ---- ELF artifacts are complete, or they are no entry ------------------------ */

typedef struct elf_build {
    unsigned char *elf;
    size_t len, write;
} elf_build;

/* Writes the first `write` bytes of a real ELF file as host.so, as a
 * compiler that hit a full disk without noticing would. */
static int build_elf(void *ud, const char *dir, char *err, size_t errlen)
{
    elf_build *b = ud;
    char path[1400];
    snprintf(path, sizeof path, "%s/host.so", dir);
    if (write_file(path, b->elf, b->write) != 0) {
        snprintf(err, errlen, "cannot write %s", path);
        return OPJIT_EIO;
    }
    return OPJIT_OK;
}

static void test_incomplete_elf_is_never_an_entry(void)
{
    elf_build b = {0};
    FILE *f = fopen("/proc/self/exe", "rb");
    b.elf = malloc(1 << 24);
    b.len = f && b.elf ? fread(b.elf, 1, 1 << 24, f) : 0;
    if (f)
        fclose(f);
    CHECK(b.len > 4096);
    logcap lc = {0};
    cache *c = open_at(tdir("elf"), NULL, 0, 0, &lc);
    if (!c || b.len <= 4096) {
        free(b.elf);
        return;
    }
    cache_request r = mkreq("nms", "elf-cut");
    cache_entry *e = NULL;
    char err[1024];
    int hit;
    b.write = b.len / 2;
    CHECK(cache_fetch(c, &r, build_elf, &b, &e, &hit, err, sizeof err) == OPJIT_EIO && !e);
    CHECK_STR_CONTAINS(err, "incomplete host.so");
    CHECK(count_dir(tdir("elf/v1/entries")) == 0);
    /* Whole, it is an entry. */
    b.write = b.len;
    CHECK(cache_fetch(c, &r, build_elf, &b, &e, &hit, err, sizeof err) == OPJIT_OK && !hit);
    char dir[1400];
    snprintf(dir, sizeof dir, "%s", cache_entry_dir(e));
    cache_entry_release(e);
    CHECK(verify_count(c) == 0);
    /* An entry cut short whose manifest agrees (what an older opjit could
     * publish) is damage: found by verify, rebuilt by a fetch. */
    char so[1500];
    snprintf(so, sizeof so, "%s/host.so", dir);
    CHECK(chmod(so, 0600) == 0 && truncate(so, (off_t)(b.len / 3)) == 0);
    CHECK(unlink(manifest_of(dir)) == 0);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    cache_artifact *a = NULL;
    int n = 0;
    CHECK(cache_scan_artifacts(dfd, &a, &n, err, sizeof err) == OPJIT_EIO);
    CHECK(write_file(so, b.elf, b.len) == 0 && cache_scan_artifacts(dfd, &a, &n, err, sizeof err) == OPJIT_OK);
    CHECK(truncate(so, (off_t)(b.len / 3)) == 0);
    for (int i = 0; i < n; i++) /* the sizes and sums of the cut file */
        if (!strcmp(a[i].name, "host.so")) {
            int fd = open(so, O_RDONLY);
            a[i].size = (uint64_t)(b.len / 3);
            unsigned char *buf = malloc(b.len / 3);
            CHECK(fd >= 0 && read(fd, buf, b.len / 3) == (ssize_t)(b.len / 3));
            a[i].sum = XXH3_64bits(buf, b.len / 3);
            free(buf);
            close(fd);
        }
    uint64_t size;
    CHECK(cache_manifest_write(dfd, &r, a, n, 1, &size, err, sizeof err) == OPJIT_OK);
    cache_artifacts_free(a, n);
    close(dfd);
    CHECK(verify_count(c) == 1);
    lc.nwarn = 0;
    CHECK(cache_fetch(c, &r, build_elf, &b, &e, &hit, err, sizeof err) == OPJIT_OK && !hit);
    CHECK(lc.nwarn == 1);
    CHECK_STR_CONTAINS(lc.last, "incomplete");
    cache_entry_release(e);
    CHECK(verify_count(c) == 0);
    cache_close(c);
    free(b.elf);
}

int main(void)
{
    const char *env = getenv("OPJIT_CACHE_DIR");
    if (env && *env)
        snprintf(base, sizeof base, "%s", env);
    else
        snprintf(base, sizeof base, "/tmp/opjit-test-cache-%ld", (long)getpid());
    rm_rf(base);
    mkdir(base, 0700);
    unsetenv("OPJIT_CACHE_READONLY");
    unsetenv("OPJIT_OFFLINE");
    unsetenv("OPJIT_CACHE_MAX_SIZE");
    signal(SIGPIPE, SIG_IGN);

    T_RUN(test_keys);
    T_RUN(test_hit_miss);
    T_RUN(test_manifest);
    T_RUN(test_corruption);
    T_RUN(test_verify_repair);
    T_RUN(test_probe);
    T_RUN(test_readonly_layer);
    T_RUN(test_readonly_fs);
    T_RUN(test_offline);
    T_RUN(test_unwritable_fallback);
    T_RUN(test_untrusted);
    T_RUN(test_lru_eviction);
    T_RUN(test_usage_ledger);
    T_RUN(test_new_cache_ledger_starts_without_a_walk);
    T_RUN(test_parse_size);
    T_RUN(test_tmp_cleanup);
    T_RUN(test_processes_race);
    T_RUN(test_threads_race);
    T_RUN(test_kill9);
    T_RUN(test_fifo_is_damage_not_a_hang);
    T_RUN(test_transient_is_not_damage);
    T_RUN(test_fallback_dirs_swept);
    T_RUN(test_incomplete_elf_is_never_an_entry);
    if (!t_failed_tests)
        rm_rf(base);
    return t_done();
}
