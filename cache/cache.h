/*
 * cache/cache.h - the on-disk artifact cache (private to libopjit).
 *
 * Content-addressed: an entry is a directory named by the hex of its key,
 * holding artifacts (files) and a manifest. The cache knows nothing of
 * compilers: the loader hashes the key inputs with cache_key_*, asks
 * cache_fetch() for the entry, and supplies a build callback that writes the
 * artifacts into a directory when the entry is missing.
 *
 * Every function that can fail returns an opjit_status (OPJIT_OK,
 * OPJIT_ECACHE, OPJIT_EIO, OPJIT_EOFFLINE, OPJIT_ENOMEM, or whatever the
 * build callback returned) and writes a message into err on failure (or
 * leaves errno saying which, where it says so): the one return
 * convention of cache/ (cache_layer.h). The layers (read-only, writable,
 * remote) are instances of one interface, cache_layer_ops.
 */
#ifndef OPJIT_CACHE_H
#define OPJIT_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct cache cache;
typedef struct cache_entry cache_entry;

/* Internal log sink: level is OPJIT_LOG_*. */
typedef void (*cache_log_fn)(void *ud, int level, const char *msg);

/* Every value is resolved already (runtime/settings.h: config, else the
 * environment): the cache reads no environment variable. */
typedef struct cache_config {
    /* Writable cache directory; NULL: xdg_cache_home/opjit, else
     * home/.cache/opjit (home NULL: the password database's). */
    const char *dir;
    const char *xdg_cache_home, *home;
    /* Colon-separated read-only cache directories searched first. */
    const char *readonly;
    /* Where private builds go (NULL: /tmp). */
    const char *tmpdir;
    /* 1: never build, a miss is OPJIT_EOFFLINE; 0: build. */
    int offline;
    /* 1: no persistent cache: build into a private temporary directory
     * (read-only layers are not searched either). */
    int disabled;
    /* Size cap in bytes; 0: 512 MiB; UINT64_MAX: no cap. Publishing past it
     * evicts the least recently used entries that no process is using. */
    uint64_t max_size;
    cache_log_fn log;
    void *log_ud;
    int log_level; /* the most verbose OPJIT_LOG_* log takes: no other is formatted */
    /* The remote layer (cache_remote.c): "redis://HOST[:PORT][/DB]" or
     * "redis+unix:///PATH"; NULL or "": none. */
    const char *remote_url;
    /* The fleet key signing remote entries; NULL: none (then the remote
     * is used only with remote_unsigned). */
    const char *remote_key_file;
    int remote_unsigned;
    /* 1: read-only (never write to the remote). */
    int remote_ro;
    /* Time limits in ms; 0: 50 ms, 3 s, 20 s and 30 s. */
    int remote_connect_timeout_ms, remote_timeout_ms, remote_lease_ms, remote_backoff_ms;
    /* 1: also store entries found locally in the remote (warming). */
    int remote_push;
} cache_config;

/* Open a cache (cfg NULL: everything from the environment). A writable
 * directory that cannot be created or is not trusted (not ours, or
 * writable by group/others) is not an error: the cache then builds into
 * private temporary directories, with one warning (one that exists but
 * cannot be written, on a read-only file system say, still serves its
 * entries as the last read-only layer). Also removes what killed processes
 * left behind. Fails only for lack of memory. A cache is safe to use from
 * several threads at once. */
int cache_open(const cache_config *cfg, cache **out, char *err, size_t errlen);
void cache_close(cache *c);
/* The writable directory in use ("" when disabled or unusable). */
const char *cache_dir(const cache *c);

/* Keys: a strong hash over a length-prefixed serialization of named fields. */
typedef struct cache_key {
    unsigned char bytes[16];
    char hex[33];
} cache_key;

typedef struct cache_keygen cache_keygen;
/* NULL when out of memory. The functions below accept NULL; finishing it
 * gives the all-zero key, which cache_fetch refuses with OPJIT_ENOMEM. */
cache_keygen *cache_keygen_new(void);
/* Add one field: its name and bytes, both length-prefixed. */
void cache_keygen_add(cache_keygen *g, const char *field, const void *data, size_t len);
void cache_keygen_add_str(cache_keygen *g, const char *field, const char *s);
void cache_keygen_finish(cache_keygen *g, cache_key *out); /* frees g */

/* What an entry is, in readable form for the manifest and `opjit cache ls`. */
typedef struct cache_request {
    cache_key key;
    const char *op_name;     /* "nms" */
    const char *source_name; /* "nms.c" (a name, not an absolute path) */
    const char *compiler;    /* "libtcc 0.9.27" */
    const char *options;     /* compile options and defines */
    const char *target;      /* "x86_64-linux", "sm_90" */
    const char *tier;        /* "tcc", "opt" */
    /* What went into the key, readable ("name value" lines); may be NULL.
     * Kept in the manifest: `opjit cache why` compares entries by it. */
    const char *inputs;
    int note;                /* a note or index entry (cache_note.c): its
                              * fetches are logged at debug level only */
} cache_request;

/* Where cache_fetch found an entry (*hit, cache_entry_origin). */
enum { CACHE_BUILT = 0, CACHE_HIT_LOCAL = 1, CACHE_HIT_REMOTE = 2 };

/* Writes the artifacts of the entry into dir (an empty directory). Returns
 * an opjit_status and fills err on failure. */
typedef int (*cache_build_fn)(void *ud, const char *dir, char *err, size_t errlen);

/* Find the entry for req->key in the read-only layers, then the writable
 * cache; verify it (manifest and checksums: a damaged one is evicted and
 * rebuilt, with a warning; one that cannot be checked for a reason that
 * says nothing about it, like EMFILE, ENOMEM or EIO, is left as is and the
 * fetch fails with OPJIT_EIO saying why); on a miss take the key's cross-process lock,
 * look again, then call build and publish atomically. When the cache cannot
 * be written, builds into a private temporary directory instead (one
 * warning). A miss of the writable cache asks the layers behind it (the
 * remote, if any: cache_layer.h) before building; a build is published
 * there too. *hit
 * (may be NULL) receives where the entry came from: CACHE_BUILT,
 * CACHE_HIT_LOCAL (a read-only layer or the writable cache) or
 * CACHE_HIT_REMOTE (non-zero: build was skipped). The entry stays protected
 * from eviction until released. build == NULL makes it a probe: an entry
 * that exists and verifies is returned, anything else is OPJIT_ENOTFOUND
 * (never built, never an offline error). */
int cache_fetch(cache *c, const cache_request *req, cache_build_fn build,
                void *ud, cache_entry **out, int *hit, char *err, size_t errlen);

/* Path of artifact name inside the entry (e.g. "host.so"); NULL when the
 * entry has no such artifact. Owned by e: valid until its release. */
const char *cache_entry_path(cache_entry *e, const char *artifact);
/* CACHE_BUILT, CACHE_HIT_LOCAL or CACHE_HIT_REMOTE; CACHE_BUILT for NULL. */
int cache_entry_origin(const cache_entry *e);
/* How long cache_fetch waited for another process building the entry
 * (milliseconds; 0 when it did not wait). */
double cache_entry_waited_ms(const cache_entry *e);
/* The entry's directory, owned by e. */
const char *cache_entry_dir(const cache_entry *e);
/* Drop the entry's use lock (eviction may remove it from now on) and, for a
 * private temporary build, remove its directory. An entry does not refer
 * to its cache: it may be released after cache_close. NULL is fine. */
void cache_entry_release(cache_entry *e);

/* A private directory base/<prefix>XXXXXX (mode 0700) that outlives no
 * process: it holds the file "lock", locked (OFD, exclusive) for as long as
 * *lockfd stays open. First removes the directories of this prefix in base
 * that are ours and whose owner died (a process killed with kill -9): only
 * the names in files (NULL-terminated; one ending in '/' is a directory,
 * removed with everything below it) and the lock file, then the directory;
 * never following a symbolic link. Cheap: one readdir of base. path
 * receives the directory. OPJIT_OK, or OPJIT_EIO/OPJIT_ENOMEM with errno
 * saying why. */
int cache_private_mkdir(const char *base, const char *prefix, const char *const *files,
                        char *path, size_t pathlen, int *lockfd);
/* Remove such a directory (files as given to cache_private_mkdir); the
 * caller closes its lockfd afterwards. */
void cache_private_rmdir(const char *path, const char *const *files);

/* Slots bound how many background compiles run at once on a machine, per
 * writable cache: nslots lock files locks/slot.<i>, each taken with an
 * exclusive OFD lock without waiting. OPJIT_OK with *fd holding a free
 * one (the lock lives as long as any copy of fd: a child forked with it
 * keeps the slot until it exits), else OPJIT_EIO with errno EAGAIN when
 * every slot is taken, ENOENT when there is no writable cache, or
 * another. */
int cache_slot_take(const cache *c, int nslots, int *fd);

/* ---- notes and index entries (cache_note.c) ---------------------------- */

#define CACHE_NOTE_MAX (64u << 20)
/* A text value (at most CACHE_NOTE_MAX bytes, no NUL) kept as the one
 * artifact name of the entry of req: put publishes it (first writer wins,
 * like any entry), get gives a malloc'd copy or OPJIT_ENOTFOUND. Never
 * builds anything else. */
int cache_note_put(cache *c, const cache_request *req, const char *name, const char *text);
int cache_note_get(cache *c, const cache_request *req, const char *name, char **text);
/* Index entries: the entry of index names target's key, so an entry can be
 * found by a key that leaves out what a machine cannot know cheaply (a
 * compiler's identity where there is no compiler); the caller then
 * fetches the entry of that key. */
int cache_index_put(cache *c, const cache_request *index, const cache_key *target);
/* The key the entry of index names, into *target: OPJIT_OK or
 * OPJIT_ENOTFOUND. */
int cache_index_get(cache *c, const cache_request *index, cache_key *target);

/* ---- administration (the `opjit cache` command) ----------------------- */

/* The resolved writable directory, even when it could not be used; ""
 * when the cache is disabled. */
const char *cache_root_dir(const cache *c);
/* 1 when the writable directory is in use (created and trusted). */
int cache_writable(const cache *c);
/* Read-only layers, in search order; i in [0, cache_readonly_count). */
int cache_readonly_count(const cache *c);
const char *cache_readonly_dir(const cache *c, int i);
/* The size cap in bytes; UINT64_MAX when there is none. */
uint64_t cache_max_size(const cache *c);
int cache_offline(const cache *c);

/* One entry, as listed. Strings live during the callback only. */
typedef struct cache_entry_info {
    const char *key;      /* hex */
    const char *dir;      /* the entry's directory */
    int layer;            /* 0: the writable cache; i > 0: read-only layer i-1 */
    const char *layer_dir;
    const char *op_name, *source_name, *compiler, *options, *target, *tier;
    const char *inputs;   /* NULL when the entry has none */
    uint64_t size;        /* artifacts + manifest, bytes */
    int64_t created;      /* Unix seconds */
    int64_t last_use;     /* Unix seconds, kept to the minute */
    int nartifacts;
    const char *problem;  /* NULL, or why the entry does not verify */
} cache_entry_info;

/* Return non-zero to stop the walk. */
typedef int (*cache_entry_fn)(void *ud, const cache_entry_info *info);

/* Call fn for every entry of every layer (read-only layers first, then the
 * writable cache), reading manifests only: cheap, and problem is set only
 * when a manifest is unreadable. */
int cache_foreach(cache *c, cache_entry_fn fn, void *ud, char *err, size_t errlen);

typedef struct cache_totals {
    uint64_t entries, bytes;       /* the writable cache */
    uint64_t ro_entries, ro_bytes; /* all read-only layers */
    uint64_t tmp_dirs;             /* builds in progress or left over */
} cache_totals;
int cache_get_totals(cache *c, cache_totals *t, char *err, size_t errlen);

/* Verify every entry of every layer (manifests and checksums). fn (may be
 * NULL) is called for each entry, problem set for damaged ones. repair:
 * evict damaged entries of the writable cache (read-only layers are never
 * touched). *ndamaged receives the number of damaged entries. Entries that
 * could not be checked (EMFILE, EIO...) are not damaged: fn is not called
 * for them and the walk goes on, then returns OPJIT_EIO saying why. */
int cache_verify_all(cache *c, int repair, cache_entry_fn fn, void *ud, int *ndamaged,
                     char *err, size_t errlen);

typedef struct cache_prune_result {
    uint64_t removed;       /* entries evicted */
    uint64_t removed_bytes;
    uint64_t busy;          /* entries skipped because a process uses them */
    uint64_t tmp_removed;   /* leftover temporary directories removed */
    uint64_t bytes_after;   /* size of the writable cache afterwards */
} cache_prune_result;

/* Evict least recently used entries of the writable cache until it holds at
 * most max_bytes (0: the configured cap), skipping entries in use; also
 * remove leftover temporary directories and unused lock files. */
int cache_prune(cache *c, uint64_t max_bytes, cache_prune_result *r, char *err, size_t errlen);
/* Remove every entry of the writable cache not in use. */
int cache_clear(cache *c, cache_prune_result *r, char *err, size_t errlen);

/* ---- the remote layer, for administration (cache_remote_admin.c) ----- */

typedef struct cache_remote_info {
    const char *url;    /* configured URL, "" when none; owned by the cache */
    int enabled, readonly, is_signed, reachable;
    uint64_t entries, bytes, used_memory, maxmemory;
    char policy[32];
} cache_remote_info;
/* What the remote holds. OPJIT_OK also when it is off or unreachable. */
int cache_remote_info_get(cache *c, cache_remote_info *info);
/* fn for every entry of the remote (layer -1; fields from its manifest,
 * unverified). OPJIT_ENOTFOUND: no remote in use; OPJIT_EIO: unreachable. */
int cache_remote_foreach(cache *c, cache_entry_fn fn, void *ud, char *err, size_t errlen);
/* 1 when the remote layer is in use. */
int cache_remote_enabled(const cache *c);
/* The remote's URL and key file as configured (NULL when none), so a
 * runtime made for warming can open the same remote. */
const char *cache_remote_url(const cache *c);
const char *cache_remote_key_file(const cache *c);

/* Parse a size: digits with an optional K, M, G or T suffix (powers of
 * 1024, optional "B"/"iB"). OPJIT_OK and *out, or OPJIT_EINVAL. */
int cache_parse_size(const char *s, uint64_t *out);
/* Whose files a layer may hold: the writable cache only ours, a read-only
 * layer ours or root's. */
enum { CACHE_OWNER_SELF = 1, CACHE_OWNER_TRUSTED = 2 };
struct stat;
/* NULL when st is trustworthy (owner rule, not writable by group or
 * others), else why not. */
const char *cache_untrusted(const struct stat *st, int owner, uid_t euid);
/* OPJIT_OK when path (absolute) and every directory above it, as spelled
 * and as resolved, are ours or root's and writable by nobody else (a
 * sticky directory may be); else OPJIT_ECACHE and why. These two are the
 * cache's rules for its own files and directories, which the loader
 * applies to the headers it compiles from. */
int cache_trusted_path(const char *path, uid_t euid, char *why, size_t whylen);

#endif
