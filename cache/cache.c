/*
 * cache/cache.c - opening a cache, keys, and cache_fetch: find, verify,
 * lock, build, publish.
 *
 * See cache_int.h for the on-disk layout and the lock protocol.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "opjit.h"
#include "cache/cache_int.h"
#include "cache/cache_remote.h"
#include "runtime/env.h"

/* ---- small helpers ------------------------------------------------------ */

static const char *cache_str(const char *s)
{
    return s && *s ? s : "?";
}

int cache_parse_size(const char *s, uint64_t *out)
{
    return env_size_parse(s, out) == 0 ? OPJIT_OK : OPJIT_EINVAL;
}

/* ---- opening ------------------------------------------------------------ */

/* The default cache directory, or NULL with why. Under the home directory
 * only when it exists: daemon users have HOME=/nonexistent, and opjit
 * never creates a home. */
static char *cache_default_dir(const cache_config *cfg, char *why, size_t whylen)
{
    const char *e = cfg->xdg_cache_home;
    if (e && *e == '/') /* the XDG spec says to ignore a relative path */
        return cache_path(e, "opjit", NULL);
    e = cfg->home;
    if (!e || !*e) {
        struct passwd *pw = getpwuid(geteuid());
        e = pw ? pw->pw_dir : NULL;
    }
    struct stat st;
    if (!e || !*e) {
        snprintf(why, whylen, "no cache directory (set OPJIT_CACHE_DIR or HOME)");
        return NULL;
    }
    if (stat(e, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(why, whylen, "no cache directory: the home directory %s does not exist "
                 "(set OPJIT_CACHE_DIR)", e);
        return NULL;
    }
    return cache_path(e, ".cache", "opjit");
}

/* Make a relative directory absolute, so a later chdir does not move it. */
static char *cache_absolute(char *dir)
{
    if (!dir || dir[0] == '/')
        return dir;
    char cwd[PATH_MAX];
    char *abs = getcwd(cwd, sizeof cwd) ? cache_path(cwd, dir, NULL) : NULL;
    if (!abs)
        return dir;
    free(dir);
    return abs;
}

/* Stat dirs[i] (the root as spelled may be a link: stat; nothing under it
 * may: lstat), creating it first when it is missing (*made set). 0, or -1
 * and why. A cache that exists costs one stat per directory, no mkdir. */
static int cache_stat_or_make(const char *dir, int i, struct stat *st, int *made, char *why,
                              size_t whylen)
{
    *made = 0;
    if ((i ? lstat : stat)(dir, st) == 0)
        return 0;
    if (errno != ENOENT) {
        snprintf(why, whylen, "cannot stat %s: %s", dir, strerror(errno));
        return -1;
    }
    if (cache_mkdir_p(dir, why, whylen) != 0)
        return -1;
    *made = 1;
    if ((i ? lstat : stat)(dir, st) != 0) {
        snprintf(why, whylen, "cannot stat %s: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* Create root/v1/{entries,tmp,locks} and check that we alone control them.
 * Returns NULL when usable, else why not (in why); *untrusted tells that
 * others could have written it (so not even reading it is safe). */
static const char *cache_setup_dir(cache *c, char *why, size_t whylen, int *untrusted)
{
    *untrusted = 0;
    char *v1 = cache_path(c->root, "v1", NULL);
    c->entries = cache_path(c->root, "v1", "entries");
    c->tmp = cache_path(c->root, "v1", "tmp");
    c->locks = cache_path(c->root, "v1", "locks");
    const char *dirs[] = {c->root, v1, c->entries, c->tmp, c->locks};
    const char *res = NULL;
    if (!v1 || !c->entries || !c->tmp || !c->locks) {
        snprintf(why, whylen, "out of memory");
        res = why;
        goto out;
    }
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        struct stat st;
        const char *bad;
        int made;
        if (cache_stat_or_make(dirs[i], (int)i, &st, &made, why, whylen) != 0) {
            res = why;
            goto out;
        }
        if (dirs[i] == c->entries)
            c->entries_new = made;
        if (!S_ISDIR(st.st_mode)) {
            snprintf(why, whylen, "%s is %s", dirs[i], S_ISLNK(st.st_mode) ?
                     "a symbolic link (the cache never follows one below its root)" :
                     "not a directory");
            *untrusted = 1;
            res = why;
            goto out;
        }
        if ((bad = cache_untrusted(&st, CACHE_OWNER_SELF, c->euid))) {
            snprintf(why, whylen, "%s is %s", dirs[i], bad);
            *untrusted = 1;
            res = why;
            goto out;
        }
        /* What we write into: a read-only file system says so here. */
        if (i >= 2 && access(dirs[i], W_OK | X_OK) != 0) {
            snprintf(why, whylen, "%s is not writable: %s", dirs[i], strerror(errno));
            res = why;
            goto out;
        }
        /* tmp/ holds only directories: with none (a link count of 2), a
         * killed process left nothing to sweep. */
        if (dirs[i] == c->tmp)
            c->tmp_dirty = st.st_nlink != 2;
    }
    /* And nobody else can move or replace it from above. */
    if (cache_trusted_path(c->root, c->euid, why, whylen) != 0) {
        *untrusted = 1;
        res = why;
    }
out:
    free(v1);
    return res;
}

/* root/v1 and root/v1/entries are directories, not links: 0, else -1
 * and why. */
static int cache_no_link_below(const char *root, char *why, size_t whylen)
{
    static const char *const below[] = {"v1", "v1/entries"};
    for (int i = 0; i < 2; i++) {
        char p[PATH_MAX];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", root, below[i]);
        if (lstat(p, &st) == 0 && !S_ISDIR(st.st_mode)) {
            snprintf(why, whylen, "%s is %s", p, S_ISLNK(st.st_mode) ?
                     "a symbolic link (the cache never follows one below its root)" :
                     "not a directory");
            return -1;
        }
    }
    return 0;
}

/* Whether a read-only layer may serve: its entries directory and every
 * directory above it are ours or root's and writable by nobody else.
 * NULL, or why not (malloc'd; "" when out of memory); *absent when it has
 * no entries directory (nothing to warn about, and nothing served). */
static char *cache_layer_distrust(const cache *c, const char *root, char *absent)
{
    char entries[PATH_MAX], why[PATH_MAX + 128];
    struct stat st;
    snprintf(entries, sizeof entries, "%s/v1/entries", root);
    *absent = stat(entries, &st) != 0 && errno == ENOENT;
    if (*absent)
        snprintf(why, sizeof why, "%s does not exist", entries);
    else if (cache_no_link_below(root, why, sizeof why) == 0 &&
             cache_trusted_path(entries, c->euid, why, sizeof why) == 0)
        return NULL;
    char *r = strdup(why);
    return r ? r : strdup("");
}

static int cache_add_readonly(cache *c, const char *dir, size_t n)
{
    char **ro = realloc(c->ro, (size_t)(c->nro + 1) * sizeof *ro);
    if (!ro)
        return -1;
    c->ro = ro;
    char **why = realloc(c->ro_why, (size_t)(c->nro + 1) * sizeof *why);
    if (!why)
        return -1;
    c->ro_why = why;
    char *absent = realloc(c->ro_absent, (size_t)(c->nro + 1));
    if (!absent)
        return -1;
    c->ro_absent = absent;
    char *d = cache_absolute(strndup(dir, n));
    if (!d)
        return -1;
    /* Trailing slashes would make two spellings of one layer. */
    while (strlen(d) > 1 && d[strlen(d) - 1] == '/')
        d[strlen(d) - 1] = '\0';
    c->ro_why[c->nro] = cache_layer_distrust(c, d, &c->ro_absent[c->nro]);
    c->ro[c->nro++] = d;
    return 0;
}

/* One warning per layer that exists but is not trusted. */
static void cache_warn_layers(const cache *c)
{
    for (int i = 0; i < c->nro; i++)
        if (c->ro_why[i] && !c->ro_absent[i])
            cache_logf(c, OPJIT_LOG_WARN,
                       "cache: read-only layer %s is not used: %s (only directories that "
                       "you or root own and nobody else can write are trusted)",
                       c->ro[i], *c->ro_why[i] ? c->ro_why[i] : "out of memory");
}

static int cache_split_readonly(cache *c, const char *list)
{
    if (!list)
        return 0;
    for (const char *s = list; *s;) {
        const char *e = strchr(s, ':');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n && cache_add_readonly(c, s, n) != 0)
            return -1;
        s += n;
        if (*s == ':')
            s++;
    }
    return 0;
}

static void cache_warn_fallback(cache *c, const char *why)
{
    if (!strncmp(why, "cache: ", 7))
        why += 7;
    if (atomic_exchange(&c->warned_fallback, 1) == 0)
        cache_logf(c, OPJIT_LOG_WARN,
                   "cache: %s; compiling into private temporary directories (nothing new is cached)",
                   why);
}

/* cfg->offline; cfg->max_size, else the default. */
static void cache_settings(cache *c, const cache_config *cfg)
{
    c->offline = cfg->offline == 1;
    c->max_size = cfg->max_size ? cfg->max_size : CACHE_DEFAULT_MAX_SIZE;
}

/* The writable directory: made and checked, else a warning and private
 * temporary builds. c->root is NULL only when out of memory. */
static void cache_open_writable(cache *c, const cache_config *cfg)
{
    const char *dir = cfg->dir;
    /* One buffer for both messages: a fresh process touches fewer stack
     * pages below it (cache_setup_dir walks up the path). */
    char why[PATH_MAX + 128] = "out of memory";
    c->root = cache_absolute(dir && *dir ? strdup(dir)
                                         : cache_default_dir(cfg, why, sizeof why));
    if (!c->root) {
        c->root = strdup("");
        cache_warn_fallback(c, why);
        return;
    }
    while (strlen(c->root) > 1 && c->root[strlen(c->root) - 1] == '/')
        c->root[strlen(c->root) - 1] = '\0';
    int untrusted;
    const char *bad = cache_setup_dir(c, why, sizeof why, &untrusted);
    if (!bad) {
        c->writable = 1;
        return;
    }
    /* Not writable (a read-only file system, say) but ours: what it holds
     * still serves, as the last read-only layer. */
    int as_ro = 0;
    struct stat st;
    if (!untrusted && c->entries && stat(c->entries, &st) == 0 && S_ISDIR(st.st_mode) &&
        !cache_untrusted(&st, CACHE_OWNER_SELF, c->euid))
        as_ro = cache_add_readonly(c, c->root, strlen(c->root)) == 0;
    char msg[1400];
    snprintf(msg, sizeof msg, "cache directory %s is unusable (%s)%s", c->root, bad,
             as_ro ? "; its entries are still used, read-only" : "");
    cache_warn_fallback(c, msg);
}

/* The layers in the order a fetch walks them (struct cache, layers). */
static int cache_make_layers(cache *c)
{
    c->writable_layer = -1;
    if (!(c->layers = calloc((size_t)c->nro + 2, sizeof *c->layers)))
        return OPJIT_ENOMEM;
    for (int i = 0; i < c->nro; i++)
        if (!c->ro_why[i])
            c->layers[c->nlayers++] = (cache_layer){.ops = &cache_readonly_layer, .c = c,
                                                    .root = c->ro[i]};
    if (!c->writable || c->disabled)
        return OPJIT_OK;
    c->writable_layer = c->nlayers;
    c->layers[c->nlayers++] = (cache_layer){.ops = &cache_writable_layer, .c = c,
                                            .root = c->root, .writable = 1};
    if (c->remote)
        c->layers[c->nlayers++] = (cache_layer){.ops = &cache_remote_layer, .c = c,
                                                .root = c->remote_url,
                                                .push = cache_remote_push_hits(c)};
    return OPJIT_OK;
}

int cache_open(const cache_config *cfg, cache **out, char *err, size_t errlen)
{
    static const cache_config defaults = {0};
    if (!cfg)
        cfg = &defaults;
    *out = NULL;
    cache *c = calloc(1, sizeof *c);
    if (!c)
        return cache_errf(err, errlen, OPJIT_ENOMEM, "cache: out of memory");
    c->euid = geteuid();
    c->log = cfg->log;
    c->log_ud = cfg->log_ud;
    c->log_level = cfg->log_level;
    c->disabled = cfg->disabled == 1;
    atomic_init(&c->warned_fallback, 0);
    cache_settings(c, cfg);
    int oom = cache_split_readonly(c, cfg->readonly) != 0;
    oom |= cfg->tmpdir && *cfg->tmpdir && !(c->tmpdir = strdup(cfg->tmpdir));
    if (!oom && c->disabled)
        c->root = strdup("");
    else if (!oom)
        cache_open_writable(c, cfg);
    if (oom || !c->root || cache_remote_open(c, cfg, &c->remote) != OPJIT_OK ||
        cache_make_layers(c) != OPJIT_OK) {
        cache_close(c);
        return cache_errf(err, errlen, OPJIT_ENOMEM, "cache: out of memory");
    }
    if (c->writable && c->tmp_dirty)
        cache_clean_tmp(c, NULL);
    cache_warn_layers(c);
    *out = c;
    return OPJIT_OK;
}

void cache_close(cache *c)
{
    if (!c)
        return;
    cache_remote_close(c->remote);
    free(c->layers);
    free(c->remote_url);
    free(c->tmpdir);
    for (int i = 0; i < c->nro; i++) {
        free(c->ro[i]);
        free(c->ro_why[i]);
    }
    free(c->ro);
    free(c->ro_why);
    free(c->ro_absent);
    free(c->root);
    free(c->entries);
    free(c->tmp);
    free(c->locks);
    free(c);
}

const char *cache_dir(const cache *c)
{
    return c->writable ? c->root : "";
}
const char *cache_root_dir(const cache *c) { return c->root; }
int cache_writable(const cache *c) { return c->writable; }
int cache_readonly_count(const cache *c) { return c->disabled ? 0 : c->nro; }
const char *cache_readonly_dir(const cache *c, int i)
{
    return i >= 0 && i < c->nro ? c->ro[i] : NULL;
}
uint64_t cache_max_size(const cache *c) { return c->max_size; }
int cache_offline(const cache *c) { return c->offline; }

/* ---- keys --------------------------------------------------------------- */

struct cache_keygen {
    XXH3_state_t *st;
};

cache_keygen *cache_keygen_new(void)
{
    cache_keygen *g = malloc(sizeof *g);
    if (!g)
        return NULL;
    g->st = XXH3_createState();
    if (!g->st) {
        free(g);
        return NULL;
    }
    XXH3_128bits_reset(g->st);
    /* A domain tag, so a key never equals some other hash of the same bytes. */
    cache_keygen_add_str(g, "opjit-cache-key", "1");
    return g;
}

static void cache_keygen_len(cache_keygen *g, uint64_t n)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(n >> (8 * i));
    XXH3_128bits_update(g->st, b, sizeof b);
}

void cache_keygen_add(cache_keygen *g, const char *field, const void *data, size_t len)
{
    if (!g)
        return;
    size_t fl = field ? strlen(field) : 0;
    cache_keygen_len(g, fl);
    if (fl)
        XXH3_128bits_update(g->st, field, fl);
    cache_keygen_len(g, len);
    if (len)
        XXH3_128bits_update(g->st, data, len);
}

void cache_keygen_add_str(cache_keygen *g, const char *field, const char *s)
{
    cache_keygen_add(g, field, s ? s : "", s ? strlen(s) : 0);
}

void cache_keygen_finish(cache_keygen *g, cache_key *out)
{
    static const char hexd[] = "0123456789abcdef";
    memset(out, 0, sizeof *out);
    if (g) {
        XXH128_canonical_t canon;
        XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(g->st));
        memcpy(out->bytes, canon.digest, sizeof out->bytes);
        XXH3_freeState(g->st);
        free(g);
    }
    for (int i = 0; i < 16; i++) {
        out->hex[2 * i] = hexd[out->bytes[i] >> 4];
        out->hex[2 * i + 1] = hexd[out->bytes[i] & 15];
    }
    out->hex[32] = '\0';
}

/* ---- entries ------------------------------------------------------------ */

/* What a private build directory holds besides its lock file. */
static const char *const cache_private_files[] = {"out/", NULL};

static cache_entry *cache_entry_new(const char *dir, int nart)
{
    cache_entry *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->lockfd = -1;
    e->dir = strdup(dir);
    e->names = calloc((size_t)nart + 1, sizeof *e->names);
    e->paths = calloc((size_t)nart + 1, sizeof *e->paths);
    if (!e->dir || !e->names || !e->paths) {
        cache_entry_release(e);
        return NULL;
    }
    return e;
}

static int cache_entry_add(cache_entry *e, const char *name)
{
    e->names[e->nart] = strdup(name);
    e->paths[e->nart] = cache_path(e->dir, name, NULL);
    if (!e->names[e->nart] || !e->paths[e->nart]) {
        free(e->names[e->nart]);
        free(e->paths[e->nart]);
        e->names[e->nart] = e->paths[e->nart] = NULL;
        return -1;
    }
    e->nart++;
    return 0;
}

static cache_entry *cache_entry_from(const char *dir, const cache_artifact *a, int n)
{
    cache_entry *e = cache_entry_new(dir, n);
    for (int i = 0; e && i < n; i++) {
        if (cache_entry_add(e, a[i].name) != 0) {
            cache_entry_release(e);
            e = NULL;
        }
    }
    return e;
}

const char *cache_entry_path(cache_entry *e, const char *artifact)
{
    if (!e || !artifact)
        return NULL;
    for (int i = 0; i < e->nart; i++)
        if (!strcmp(e->names[i], artifact))
            return e->paths[i];
    return NULL;
}

int cache_entry_origin(const cache_entry *e)
{
    return e ? e->origin : CACHE_BUILT;
}

double cache_entry_waited_ms(const cache_entry *e)
{
    return e ? e->waited_ms : 0;
}

const char *cache_entry_dir(const cache_entry *e)
{
    return e ? e->dir : NULL;
}

void cache_entry_release(cache_entry *e)
{
    if (!e)
        return;
    if (e->owned)
        cache_private_rmdir(e->owned, cache_private_files);
    /* Closing (not unlocking) drops our use lock: a child forked while we
     * held it shares the lock and must not release it for us. */
    if (e->lockfd >= 0)
        close(e->lockfd);
    for (int i = 0; i < e->nart; i++) {
        free(e->names[i]);
        free(e->paths[i]);
    }
    free(e->names);
    free(e->paths);
    free(e->dir);
    free(e->owned);
    free(e);
}

/* ---- fetch -------------------------------------------------------------- */

/* Build into a private temporary directory, owned by the entry:
 * $TMPDIR/opjit-build-XXXXXX/out (cfg->tmpdir), the directory above swept
 * once we are dead (see cache_private_mkdir). */
static int cache_build_private(const cache *c, cache_build_fn build, void *ud, cache_entry **out,
                               char *err, size_t errlen)
{
    const char *t = c->tmpdir;
    char root[PATH_MAX], tmpl[PATH_MAX + 8];
    int lockfd = -1;
    int e = cache_private_mkdir(t && *t ? t : "/tmp", "opjit-build-", cache_private_files, root,
                                sizeof root, &lockfd) ? errno : 0;
    if (e && t && *t && strcmp(t, "/tmp") != 0)
        e = cache_private_mkdir("/tmp", "opjit-build-", cache_private_files, root, sizeof root,
                                &lockfd) ? errno : 0;
    if (e)
        return cache_errf(err, errlen, OPJIT_EIO,
                          "cache: cannot create a temporary build directory: %s", strerror(e));
    snprintf(tmpl, sizeof tmpl, "%s/out", root);
    if (mkdir(tmpl, 0700) != 0) {
        e = errno;
        cache_private_rmdir(root, cache_private_files);
        close(lockfd);
        return cache_errf(err, errlen, OPJIT_EIO, "cache: cannot create %s: %s", tmpl, strerror(e));
    }
    int rc = build(ud, tmpl, err, errlen);
    cache_artifact *a = NULL;
    int n = 0;
    if (rc == OPJIT_OK) {
        int dfd = open(tmpl, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        rc = dfd < 0 ? cache_errf(err, errlen, OPJIT_EIO, "cache: %s: %s", tmpl, strerror(errno))
                     : cache_scan_artifacts(dfd, &a, &n, err, errlen);
        if (dfd >= 0)
            close(dfd);
    }
    if (rc == OPJIT_OK) {
        *out = cache_entry_from(tmpl, a, n);
        if (*out && ((*out)->owned = strdup(root))) {
            (*out)->lockfd = lockfd;
            lockfd = -1;
        } else {
            cache_entry_release(*out);
            *out = NULL;
            rc = cache_errf(err, errlen, OPJIT_ENOMEM, "cache: out of memory");
        }
    }
    cache_artifacts_free(a, n);
    if (rc != OPJIT_OK) {
        cache_private_rmdir(root, cache_private_files);
        close(lockfd);
    }
    return rc;
}

static int cache_offline_miss(const cache_request *req, char *err, size_t errlen)
{
    return cache_errf(err, errlen, OPJIT_EOFFLINE,
                      "offline: op '%s' (source %s, target %s) is not in the cache and "
                      "compiling is off (key %s)",
                      cache_str(req->op_name), cache_str(req->source_name),
                      cache_str(req->target), req->key.hex);
}

static int cache_probe_miss(const cache_request *req, char *err, size_t errlen)
{
    return cache_errf(err, errlen, OPJIT_ENOTFOUND, "cache: op '%s' (source %s, key %s) is not cached",
                      cache_str(req->op_name), cache_str(req->source_name), req->key.hex);
}

static void cache_warn_damaged(cache *c, const cache_request *req, const char *where,
                               const char *why, const char *action)
{
    cache_logf(c, OPJIT_LOG_WARN, "cache: entry %s (op %s, source %s) in %s is damaged: %s; %s",
               req->key.hex, cache_str(req->op_name), cache_str(req->source_name), where, why,
               action);
}

/* An entry that could not be checked for a transient reason (see
 * OPJIT_EIO) is left as is: an error, or for a probe not found. */
static int cache_unchecked(const cache_request *req, const char *where, const char *why,
                           int probe, char *err, size_t errlen)
{
    return cache_errf(err, errlen, probe ? OPJIT_ENOTFOUND : OPJIT_EIO,
                      "cache: cannot check entry %s (op %s, source %s) in %s: %s "
                      "(not damage: the entry is left as is; try again)",
                      req->key.hex, cache_str(req->op_name), cache_str(req->source_name), where,
                      why);
}

/* Look in the layers before the writable cache (the read-only ones).
 * Returns 1 and *out on a hit, -1 (err filled, as cache_unchecked) when an
 * entry could not be checked. */
static int cache_fetch_readonly(cache *c, const cache_request *req, int probe, cache_entry **out,
                                char *err, size_t errlen)
{
    char dir[PATH_MAX], why[512];
    for (int i = 0; i < c->nlayers && !c->layers[i].writable; i++) {
        cache_layer *l = &c->layers[i];
        cache_manifest m;
        if (!l->ops->lookup)
            continue;
        int r = l->ops->lookup(l, req, 0, dir, sizeof dir, &m, why, sizeof why);
        if (r == OPJIT_ECACHE)
            cache_warn_damaged(c, req, l->root, why, "skipping it (read-only layer, left as is)");
        if (r == OPJIT_EIO) {
            cache_unchecked(req, l->root, why, probe, err, errlen);
            return -1;
        }
        if (r != OPJIT_OK)
            continue;
        *out = cache_entry_from(dir, m.art, m.nart);
        cache_manifest_free(&m);
        if (*out)
            return 1;
    }
    return 0;
}

/* After installing an entry (built, of size bytes; or fetched from
 * behind, size 0: measured here): count it, and keep the cache under its
 * cap. */
static void cache_after_install(cache *c, const cache_request *req, const char *dir,
                                uint64_t size)
{
    if (size)
        cache_logf(c, OPJIT_LOG_DEBUG, "cache: built and published %s (op %s)", req->key.hex,
                   cache_str(req->op_name));
    if (c->max_size == UINT64_MAX)
        return;
    int64_t mtime;
    int hasm;
    if (!size)
        cache_dir_usage(c, dir, &size, &mtime, &hasm);
    /* A note is small: it is counted, and the next build's walk evicts
     * (an index of 10,000 sources writes 10,000 notes). */
    if (cache_usage_add(c, size) && !req->note) {
        char eerr[256];
        if (cache_evict_to(c, c->max_size, 0, NULL, eerr, sizeof eerr) != OPJIT_OK)
            cache_logf(c, OPJIT_LOG_WARN, "%s", eerr);
    }
}

/* Make the built directory tmp the entry dir: hash and check the
 * artifacts (*a, *n), write the manifest, rename; *size: the entry's
 * bytes. *fault is set when the build wrote something that cannot be an
 * artifact (its bug, not the cache's).
 *
 * Nothing is fsynced. The rename makes the entry appear whole to every
 * process at once, whenever this one is killed; what only a crash of the
 * machine could leave torn (a file cut short or zeroed after reboot) fails
 * the checks every load makes (manifest checksum, artifact sizes and
 * checksums, ELF completeness) and is rebuilt, never loaded. */
static int cache_publish(cache *c, const cache_request *req, const char *tmp, const char *dir,
                         cache_artifact **a, int *n, uint64_t *size, int *fault, char *err,
                         size_t errlen)
{
    *fault = 0;
    int dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return cache_errf(err, errlen, OPJIT_EIO, "cache: %s: %s", tmp, strerror(errno));
    int rc = cache_scan_artifacts(dfd, a, n, err, errlen);
    if (rc == OPJIT_ECACHE)
        *fault = 1;
    if (rc == OPJIT_OK)
        rc = cache_manifest_write(dfd, req, *a, *n, (int64_t)time(NULL), size, err, errlen);
    for (int i = 0; rc == OPJIT_OK && i < *n; i++)
        *size += (*a)[i].size;
    close(dfd);
    if (rc != OPJIT_OK)
        return rc;

    cache_layer *w = cache_writable_of(c);
    if (w->ops->publish(w, req, tmp, dir, NULL) == OPJIT_OK)
        return OPJIT_OK;
    int e = errno;
    if (e == EPERM)
        return cache_errf(err, errlen, OPJIT_ECACHE, "cache: the shard of %s is not trusted", dir);
    return cache_errf(err, errlen, OPJIT_EIO, "cache: cannot publish %s: %s", dir, strerror(e));
}

/* ---- fetch from the writable cache ---------------------------------------
 *
 * The steps hold the key's use lock (nobody evicts the entry under us), then
 * for a build its build lock (one builder per key), and end in one of:
 * a hit, a build published, a fallback to a private build (the cache cannot
 * be used for this key), an entry that could not be checked, or an error. */

typedef struct fetch {
    cache *c;
    const cache_request *req;
    cache_build_fn build; /* NULL: a probe */
    void *ud;
    int usefd, buildfd;
    int damaged; /* warned about already */
    int origin;  /* of a hit: CACHE_HIT_LOCAL or CACHE_HIT_REMOTE */
    double waited_ms; /* on another process's build lock */
    uint64_t built_size; /* of the entry this fetch built */
    /* The build locks of the layers behind the writable cache (the
     * remote's fleet lock), when held. */
    cache_layer_lock behind[CACHE_MAX_BEHIND];
    cache_manifest m;
    /* Last: a hit writes only their first bytes (fewer pages touched). */
    char dir[PATH_MAX];
    char why[PATH_MAX + 512];
} fetch;

enum { FETCH_HIT, FETCH_BUILT, FETCH_FALLBACK, FETCH_UNCHECKED, FETCH_ERROR };

static double fetch_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Take the key's lock which, waiting: the build lock through the
 * writable layer's lock, the use lock (which keeps eviction away from an
 * entry served) directly. FETCH_* on failure (why set), else -1. The
 * build lock held by another process means it is building this key: the
 * time spent waiting for it is kept, so a load can say it waited. */
static int fetch_lock(fetch *f, int which, int exclusive, int *fd)
{
    cache_layer *w = cache_writable_of(f->c);
    cache_layer_lock lk = cache_layer_nolock();
    int build = which == CACHE_LOCK_BUILD && exclusive, rc;
    if (!build) {
        rc = cache_lock(f->c, f->req->key.hex, which, exclusive, 1, &lk.fd);
    } else if ((rc = cache_lock(f->c, f->req->key.hex, which, 1, 0, &lk.fd)) != OPJIT_OK &&
               (errno == EAGAIN || errno == EACCES)) {
        double t0 = fetch_now_ms();
        rc = w->ops->lock(w, f->req, &lk);
        f->waited_ms = fetch_now_ms() - t0;
    }
    if (rc == OPJIT_OK) {
        *fd = lk.fd;
        return -1;
    }
    int e = errno;
    snprintf(f->why, sizeof f->why, "cannot lock %s/%s: %s", f->c->locks, f->req->key.hex,
             strerror(e));
    return cache_transient_errno(e) ? FETCH_UNCHECKED : FETCH_FALLBACK;
}

/* Check the entry: OPJIT_OK (f->m filled) or another cache_check result;
 * damage is warned about once per fetch. */
static int fetch_check(fetch *f, int touch)
{
    cache_layer *w = cache_writable_of(f->c);
    int r = w->ops->lookup(w, f->req, touch, f->dir, sizeof f->dir, &f->m, f->why, sizeof f->why);
    if (r == OPJIT_ECACHE && !f->damaged) {
        cache_warn_damaged(f->c, f->req, f->c->root, f->why,
                           f->c->offline || !f->build ? "evicting it" : "evicting and rebuilding it");
        f->damaged = 1;
    }
    return r;
}

/* A probe never waits for a builder: it evicts a damaged entry only when
 * nobody is building the key right now. */
static int fetch_probe(fetch *f, char *err, size_t errlen)
{
    if (f->damaged && cache_lock(f->c, f->req->key.hex, CACHE_LOCK_BUILD, 1, 0, &f->buildfd) == 0) {
        int r = fetch_check(f, 0);
        if (r == OPJIT_OK)
            return FETCH_HIT;
        if (r == OPJIT_EIO)
            return FETCH_UNCHECKED;
        if (r == OPJIT_ECACHE)
            cache_discard_entry(f->c, f->dir, f->req->key.hex, 0);
    }
    cache_probe_miss(f->req, err, errlen);
    return FETCH_ERROR;
}

/* Build into tmp/ and publish. FETCH_BUILT (*a, *n: the artifacts),
 * FETCH_HIT when another process published it meanwhile, else why not. */
static int fetch_build(fetch *f, cache_artifact **a, int *n, int *rc, char *err, size_t errlen)
{
    cache *c = f->c;
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/%s.b%ld.XXXXXX", c->tmp, f->req->key.hex, (long)getpid());
    if (!mkdtemp(tmp)) {
        snprintf(f->why, sizeof f->why, "cannot create a build directory in %s: %s", c->tmp,
                 strerror(errno));
        return FETCH_FALLBACK;
    }
    if ((*rc = f->build(f->ud, tmp, err, errlen)) != OPJIT_OK) {
        cache_rm_rf(tmp);
        /* An I/O error because the cache's file system is full or
         * read-only: try once more away from it. */
        struct statvfs fs;
        if (*rc != OPJIT_EIO || statvfs(c->tmp, &fs) != 0 ||
            !(fs.f_bavail == 0 || (fs.f_flag & ST_RDONLY)))
            return FETCH_ERROR;
        snprintf(f->why, sizeof f->why, "building in %s failed (%s): %s", c->tmp,
                 fs.f_bavail == 0 ? "file system full" : "read-only file system",
                 err && *err ? err : "I/O error");
        return FETCH_FALLBACK;
    }
    int fault = 0;
    if ((*rc = cache_publish(c, f->req, tmp, f->dir, a, n, &f->built_size, &fault, err,
                             errlen)) == OPJIT_OK)
        return FETCH_BUILT;
    cache_rm_rf(tmp);
    cache_artifacts_free(*a, *n);
    *a = NULL;
    *n = 0;
    if (fault)
        return FETCH_ERROR;
    /* Someone else won (a process that published without our lock)? Then
     * theirs is as good as ours. */
    cache_layer *w = cache_writable_of(c);
    if (w->ops->lookup(w, f->req, 0, f->dir, sizeof f->dir, &f->m, f->why, sizeof f->why) ==
        OPJIT_OK) {
        *rc = OPJIT_OK;
        if (err && errlen)
            err[0] = '\0';
        return FETCH_HIT;
    }
    snprintf(f->why, sizeof f->why, "%s", err && *err ? err : "cannot publish");
    return FETCH_FALLBACK;
}

/* A local miss: ask the layers behind the writable cache in order to
 * install the entry at f->dir (claim: take their build locks on a miss).
 * OPJIT_OK when one did (*keep, may be NULL, as their fetch says), else
 * OPJIT_ENOTFOUND. */
static int fetch_behind(fetch *f, int claim, cache_manifest *keep)
{
    cache *c = f->c;
    for (int i = c->writable_layer + 1, j = 0; i < c->nlayers; i++, j++) {
        cache_layer *l = &c->layers[i];
        if (l->ops->fetch &&
            l->ops->fetch(l, f->req, f->dir, claim, keep, &f->behind[j]) == OPJIT_OK)
            return OPJIT_OK;
    }
    return OPJIT_ENOTFOUND;
}

/* A probe's local miss: ask the remote, holding the key's build lock (or
 * not asking when a builder holds it), so that a process opening the
 * cache meanwhile does not sweep the directory being installed. */
static void fetch_probe_remote(fetch *f)
{
    int fd;
    if (f->c->nlayers == f->c->writable_layer + 1 ||
        cache_lock(f->c, f->req->key.hex, CACHE_LOCK_BUILD, 1, 0, &fd) != OPJIT_OK)
        return;
    if (fetch_behind(f, 0, NULL) == OPJIT_OK)
        f->origin = CACHE_HIT_REMOTE;
    close(fd);
}

/* The steps up to a result: FETCH_* (*rc set for FETCH_ERROR). */
static int fetch_steps(fetch *f, cache_artifact **a, int *n, int *rc, char *err, size_t errlen)
{
    int step, r;
    if ((step = fetch_lock(f, CACHE_LOCK_USE, 0, &f->usefd)) >= 0)
        return step;
    if ((r = fetch_check(f, 1)) == OPJIT_OK)
        return FETCH_HIT;
    if (r == OPJIT_EIO)
        return FETCH_UNCHECKED;
    if (!f->build) {
        *rc = OPJIT_ENOTFOUND;
        return fetch_probe(f, err, errlen);
    }
    /* A miss: look again once we hold the build lock, as the previous
     * holder may have built it. */
    if ((step = fetch_lock(f, CACHE_LOCK_BUILD, 1, &f->buildfd)) >= 0)
        return step;
    if ((r = fetch_check(f, 1)) == OPJIT_OK)
        return FETCH_HIT;
    if (r == OPJIT_EIO)
        return FETCH_UNCHECKED;
    if (r == OPJIT_ECACHE && cache_discard_entry(f->c, f->dir, f->req->key.hex, 0)) {
        int e = errno;
        snprintf(f->why, sizeof f->why, "cannot evict the damaged entry %s: %s", f->dir,
                 strerror(e));
        return FETCH_FALLBACK;
    }
    /* A note is small and its builder knows it already: no fleet lock. */
    int fleet = !f->c->offline && !f->req->note;
    if (fetch_behind(f, fleet, &f->m) == OPJIT_OK &&
        (f->m.buf || (r = fetch_check(f, 0)) == OPJIT_OK)) {
        f->origin = CACHE_HIT_REMOTE;
        return FETCH_HIT;
    }
    if (f->c->offline) {
        *rc = cache_offline_miss(f->req, err, errlen);
        return FETCH_ERROR;
    }
    return fetch_build(f, a, n, rc, err, errlen);
}

/* Say where an entry came from: per artifact, for `opjit load -v`. */
static void cache_log_origin(const cache *c, const cache_request *req, int origin)
{
    static const char *const what[] = {"compiled", "local hit", "remote hit"};
    cache_logf(c, req->note ? OPJIT_LOG_DEBUG : OPJIT_LOG_INFO, "cache: %s %s (%s, %s): %s",
               cache_str(req->source_name), cache_str(req->tier), cache_str(req->target),
               req->key.hex, what[origin]);
}

/* The share of the layers behind the writable cache (the remote) in a
 * result: a build is published there (and their build locks released), a
 * local hit too when warming pushes. */
static void fetch_remote_end(fetch *f, int step)
{
    cache *c = f->c;
    for (int i = c->writable_layer + 1, j = 0; c->writable_layer >= 0 && i < c->nlayers; i++, j++) {
        cache_layer *l = &c->layers[i];
        if (step == FETCH_BUILT && l->ops->publish)
            l->ops->publish(l, f->req, NULL, f->dir, &f->behind[j]);
        else if (step == FETCH_HIT && f->origin != CACHE_HIT_REMOTE && l->push && l->ops->publish)
            l->ops->publish(l, f->req, NULL, f->dir, NULL);
        if (step != FETCH_BUILT && l->ops->unlock)
            l->ops->unlock(l, f->req, &f->behind[j]);
    }
}

/* Turn a result into the entry handed back, releasing the locks (the use
 * lock goes with the entry). */
static int fetch_end(fetch *f, int step, int rc, cache_artifact *a, int n, cache_entry **out,
                     int *hit, char *err, size_t errlen)
{
    fetch_remote_end(f, step);
    if (f->buildfd >= 0)
        close(f->buildfd);
    if (step == FETCH_HIT || step == FETCH_BUILT) {
        *out = step == FETCH_HIT ? cache_entry_from(f->dir, f->m.art, f->m.nart)
                                 : cache_entry_from(f->dir, a, n);
        cache_manifest_free(&f->m);
        cache_artifacts_free(a, n);
        if (*out) {
            (*out)->lockfd = f->usefd;
            (*out)->origin = step == FETCH_HIT ? (f->origin ? f->origin : CACHE_HIT_LOCAL)
                                               : CACHE_BUILT;
            (*out)->waited_ms = f->waited_ms;
            if (hit)
                *hit = (*out)->origin;
            cache_log_origin(f->c, f->req, (*out)->origin);
            if (step == FETCH_BUILT || (*out)->origin == CACHE_HIT_REMOTE)
                cache_after_install(f->c, f->req, f->dir,
                                    step == FETCH_BUILT ? f->built_size : 0);
            return OPJIT_OK;
        }
        rc = cache_errf(err, errlen, OPJIT_ENOMEM, "cache: out of memory");
    }
    if (f->usefd >= 0)
        close(f->usefd);
    if (step == FETCH_UNCHECKED)
        return cache_unchecked(f->req, f->c->root, f->why, !f->build, err, errlen);
    if (step != FETCH_FALLBACK)
        return rc;
    if (!f->build)
        return cache_probe_miss(f->req, err, errlen);
    if (f->c->offline)
        return cache_offline_miss(f->req, err, errlen);
    cache_warn_fallback(f->c, f->why);
    if (err && errlen)
        err[0] = '\0';
    return cache_build_private(f->c, f->build, f->ud, out, err, errlen);
}

int cache_fetch(cache *c, const cache_request *req, cache_build_fn build, void *ud,
                cache_entry **out, int *hit, char *err, size_t errlen)
{
    *out = NULL;
    if (hit)
        *hit = 0;
    if (err && errlen)
        err[0] = '\0';
    if (!c || !req || !cache_is_hex(req->key.hex, 32) || strlen(req->key.hex) != 32)
        return cache_errf(err, errlen, OPJIT_ECACHE, "cache: bad request (no key)");
    /* An all-zero key is what cache_keygen_finish gives when
     * cache_keygen_new ran out of memory: never a real one. */
    if (strspn(req->key.hex, "0") == 32)
        return cache_errf(err, errlen, OPJIT_ENOMEM, "cache: no key (out of memory while hashing)");
    int r = c->disabled ? 0 : cache_fetch_readonly(c, req, !build, out, err, errlen);
    if (r < 0)
        return build ? OPJIT_EIO : OPJIT_ENOTFOUND;
    if (r > 0) {
        (*out)->origin = CACHE_HIT_LOCAL;
        if (hit)
            *hit = CACHE_HIT_LOCAL;
        cache_log_origin(c, req, CACHE_HIT_LOCAL);
        return OPJIT_OK;
    }
    if (c->disabled || !c->writable) {
        if (!build)
            return cache_probe_miss(req, err, errlen);
        if (c->offline)
            return cache_offline_miss(req, err, errlen);
        return cache_build_private(c, build, ud, out, err, errlen);
    }
    fetch *f = malloc(sizeof *f);
    if (!f)
        return cache_errf(err, errlen, OPJIT_ENOMEM, "cache: out of memory");
    /* Not zeroed whole: dir and why are strings, written before use. */
    memset(f, 0, offsetof(fetch, dir));
    f->c = c;
    f->req = req;
    f->build = build;
    f->ud = ud;
    f->usefd = f->buildfd = -1;
    for (int i = 0; i < CACHE_MAX_BEHIND; i++)
        f->behind[i] = cache_layer_nolock();
    f->why[0] = '\0';
    cache_entry_dir_of(c->entries, req->key.hex, f->dir, sizeof f->dir);
    struct stat st;
    int rc = OPJIT_OK, n = 0, step;
    cache_artifact *a = NULL;
    /* A probe miss creates no lock file (unless it asks the remote, and
     * then looks again for what that installed). */
    int absent = !build && lstat(f->dir, &st) != 0;
    if (absent) {
        fetch_probe_remote(f);
        absent = !f->origin && lstat(f->dir, &st) != 0;
    }
    if (absent)
        step = (rc = cache_probe_miss(req, err, errlen), FETCH_ERROR);
    else
        step = fetch_steps(f, &a, &n, &rc, err, errlen);
    rc = fetch_end(f, step, rc, a, n, out, hit, err, errlen);
    free(f);
    return rc;
}
