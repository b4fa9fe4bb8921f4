/*
 * cache/cache_int.h - what the files of cache/ share; not for other modules.
 *
 * On-disk layout of a writable cache <root>:
 *   <root>/v1/entries/<2 hex>/<32 hex>/   one entry: artifacts + "manifest"
 *   <root>/v1/tmp/<hex>.b<pid>.XXXXXX     a build in progress (or abandoned)
 *   <root>/v1/tmp/<hex>.t.XXXXXX          an evicted entry being deleted
 *   <root>/v1/locks/<hex>                 the key's lock file
 * A read-only layer has the same v1/entries tree and nothing else is used.
 *
 * Locks are OFD byte-range locks on locks/<hex> (they die with the open
 * file, so with the process): byte 0 is the build lock (exclusive while a
 * process builds the key), byte 1 the use lock (shared while an entry is in
 * use, exclusive to delete it). The two bytes are separate so a process
 * holding an entry can still rebuild it after it was found damaged.
 */
#ifndef OPJIT_CACHE_INT_H
#define OPJIT_CACHE_INT_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "opjit.h"
#include "cache/cache.h"
#include "cache/cache_layer.h"

#define CACHE_FORMAT 1
#define CACHE_MAGIC "opjit-cache-manifest"
#define CACHE_DEFAULT_MAX_SIZE (512ull << 20)
#define CACHE_TOUCH_SECONDS 60 /* last-use time is kept to this precision */
#define CACHE_MANIFEST_MAX (1u << 20)

enum { CACHE_LOCK_BUILD = 0, CACHE_LOCK_USE = 1, CACHE_LOCK_FILE = -1 };

struct cache {
    char *root;      /* resolved writable directory; "" when disabled */
    char *entries;   /* root/v1/entries, root/v1/tmp, root/v1/locks */
    char *tmp;
    char *locks;
    int writable;    /* root is usable (created, trusted) */
    int tmp_dirty;   /* tmp/ held directories when opened: swept then */
    int entries_new; /* entries/ was made by this process's cache_open */
    char **ro;       /* read-only layer roots */
    char **ro_why;   /* per layer: NULL, or why it is not used (untrusted) */
    char *ro_absent; /* per layer: it has no entries directory (also not used) */
    int nro;
    int offline;
    int disabled;
    uint64_t max_size; /* UINT64_MAX: no cap */
    uid_t euid;
    cache_log_fn log;
    void *log_ud;
    int log_level;
    atomic_int warned_fallback; /* the one "cache unusable" warning */
    struct cache_remote *remote; /* the remote layer's state, or NULL */
    char *remote_url;            /* as configured (even when off), or NULL */
    /* The layers in the order a fetch walks them: the read-only ones in
     * use, the writable cache (at writable_layer; -1: none), then those
     * behind it (the remote; at most CACHE_MAX_BEHIND). */
    cache_layer *layers;
    int nlayers;
    int writable_layer;
    char *tmpdir;                /* cache_config.tmpdir, or NULL */
};

#define CACHE_MAX_BEHIND 4

/* The writable cache's layer; only when c->writable_layer >= 0. */
static inline cache_layer *cache_writable_of(cache *c)
{
    return &c->layers[c->writable_layer];
}

struct cache_entry {
    char *dir;
    int lockfd;   /* holds the shared use lock (a private build: its
                   * directory's lock); -1 when none */
    char *owned;  /* a private temporary build: the directory holding dir,
                   * removed on release; else NULL */
    int nart;
    char **names; /* artifact names and their paths, parallel */
    char **paths;
    int origin;   /* CACHE_BUILT, CACHE_HIT_LOCAL, CACHE_HIT_REMOTE */
    double waited_ms; /* for another process's build of it (cache_fetch) */
};

typedef struct cache_artifact {
    char *name;
    uint64_t size;
    uint64_t sum; /* XXH3-64 */
} cache_artifact;

/* A parsed manifest. The strings point into buf. */
typedef struct cache_manifest {
    char *buf;
    const char *key, *op, *source, *compiler, *options, *target, *tier;
    const char *inputs; /* NULL when the manifest has none */
    int64_t created;
    int64_t last_use; /* the manifest's mtime */
    cache_artifact *art;
    int nart;
    uint64_t size; /* manifest + artifacts, bytes */
} cache_manifest;

/* cache_check returns the statuses of an entry (cache_layer.h): OPJIT_OK,
 * OPJIT_ENOTFOUND, OPJIT_ECACHE (damaged), OPJIT_EIO (not checked for a
 * reason that says nothing about it: never evicted for that). */
/* cache_check flags */
enum {
    CACHE_CHK_SUMS = 1,  /* hash every artifact */
    CACHE_CHK_OWNER = 2, /* owned by the euid (writable cache); else by
                          * the euid or root (read-only layers) */
    CACHE_CHK_TOUCH = 4, /* update the last-use time */
};

/* cache_fs.c: e (an errno; 0: none) as a status: OPJIT_OK, else
 * OPJIT_ENOMEM or OPJIT_EIO with errno = e for a caller that acts on
 * which. */
int cache_status_errno(int e);

/* cache_fs.c: messages and paths */
void cache_logf(const cache *c, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int cache_errf(char *err, size_t errlen, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
char *cache_path(const char *a, const char *b, const char *c);
void cache_entry_dir_of(const char *entries, const char *hex, char *out, size_t outlen);
int cache_is_hex(const char *s, size_t n);
/* s into out with control bytes and backslashes escaped C-style (\n, \x1b,
 * \\): a name from disk, safe to print. */
const char *cache_printable(const char *s, char *out, size_t n);
/* Open the directory path below one of c's layer roots (the writable
 * cache's or a read-only layer's), walking down from that root with
 * O_NOFOLLOW: a symbolic link (or a file) on the way fails with ENOTDIR,
 * why (may be NULL) saying which. A path below no root: opened with
 * O_NOFOLLOW alone. The descriptor, or -1 and errno. */
int cache_open_below(const cache *c, const char *path, char *why, size_t whylen);
/* Rename the checked directory tmp (in tmp/) to the entry dir of hex,
 * making its shard directory (cache_layer_dir.c). OPJIT_OK, or a status
 * with errno (EEXIST, ENOTEMPTY: the entry
 * is there already; EPERM: the shard is not trusted). */
int cache_install_dir(cache *c, const char *hex, const char *tmp, const char *dir);

/* cache_fs.c: the file system */
/* OPJIT_OK, or a status with errno and why. */
int cache_mkdir_p(const char *path, char *why, size_t whylen);
int cache_rm_rf(const char *path);
/* OPJIT_OK with *fd holding the lock, or a status with errno (EAGAIN:
 * busy). */
int cache_lock(const cache *c, const char *hex, int which, int exclusive, int wait, int *fd);
int cache_relock(int fd, int which, int exclusive, int wait);

/* cache_manifest.c */
/* 1 for an errno that says nothing about the file it came from (EMFILE,
 * ENOMEM, EIO...): see CACHE_TRANSIENT. */
int cache_transient_errno(int e);
int cache_check(const cache *c, const char *dir, const char *hex, int flags,
                cache_manifest *m, char *why, size_t whylen);
void cache_manifest_free(cache_manifest *m);
/* Hash, check and tighten the mode of every file in dirfd. */
int cache_scan_artifacts(int dirfd, cache_artifact **out, int *n, char *err, size_t errlen);
void cache_artifacts_free(cache_artifact *a, int n);
/* The manifest of a..n written into dirfd; *size: its bytes. */
int cache_manifest_write(int dirfd, const cache_request *req, const cache_artifact *a,
                         int n, int64_t created, uint64_t *size, char *err, size_t errlen);

/* n bytes at off of fd into buf: 0, errno, or EIO for a short file. */
int cache_pread_full(int fd, void *buf, size_t n, uint64_t off);

/* cache_evict.c */
/* The keys under an entries/ directory of c (a layer's), sorted, never
 * through a symbolic link; bad: the shards that are not directories (a
 * symbolic link, a file), never entered. */
typedef struct cache_keylist {
    char (*hex)[33];
    size_t n, cap;
    char (*bad)[3];
    size_t nbad, capbad;
} cache_keylist;
int cache_list_keys(const cache *c, const char *entries, cache_keylist *kl);
void cache_keylist_free(cache_keylist *kl);
/* Bytes of the regular files in an entry's directory, and its last use. */
void cache_dir_usage(const cache *c, const char *dir, uint64_t *size, int64_t *mtime,
                     int *has_manifest);
/* OPJIT_OK, or OPJIT_ECACHE with err when there is no writable cache. */
int cache_need_writable(const cache *c, char *err, size_t errlen);
void cache_clean_tmp(cache *c, uint64_t *removed);
void cache_clean_locks(cache *c);
/* Move an entry out of entries/ (atomically) into tmp/ and delete it
 * there: at once when the caller holds the exclusive use lock (have_use),
 * else later, once nobody uses the key. Reached from entries/ by
 * descriptors: a symbolic link (or file) as its shard or entry is
 * unlinked itself, and nothing outside the cache is ever touched. 0 (also
 * when it was gone), or a status with errno saying why. */
int cache_discard_entry(cache *c, const char *dir, const char *hex, int have_use);
/* Unlink the shard entries/<shard> of the writable cache when it is not a
 * directory (a symbolic link itself: never what it points at). OPJIT_OK
 * or a status with errno. */
int cache_discard_shard(cache *c, const char *shard);
int cache_evict_to(cache *c, uint64_t cap, int all, cache_prune_result *r,
                   char *err, size_t errlen);
/* An entry of bytes installed: counted in the usage ledger (v1/usage).
 * 1 when the cache should be walked (cache_evict_to, which starts the
 * ledger again from what it counts). */
int cache_usage_add(cache *c, uint64_t bytes);

#endif
