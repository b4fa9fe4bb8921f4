/*
 * opjit_admin.h - what the opjit command does, a host can do: the second
 * tier of the API over opjit.h, as Lua's lauxlib.h is over lua.h. Dtypes
 * by name, the search path and what its sources register, warming the
 * cache ahead of time, and administering the cache (listing, why a load
 * misses, verifying, pruning, the remote layer). The `opjit` tool is built
 * on this header and opjit.h alone. None of these functions prints:
 * results come back as data (structs, callbacks) for the host to format.
 * A host that only loads and calls ops needs opjit.h only.
 *
 * The conventions are opjit.h's: every function returning int returns an
 * opjit_status with its message in opjit_errmsg(rt); structs a host hands
 * in start with `size_t size` (opjit.h, "Structs that grow").
 */
#ifndef OPJIT_ADMIN_H
#define OPJIT_ADMIN_H

#include "opjit.h"

#ifdef __cplusplus
extern "C" {
#endif
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* ---- dtypes ---- */

/* The dtypes opjit knows by name: float32, float64, float16, bfloat16,
 * int8..int64, uint8..uint64, bool (OPJIT_DL_BOOL, 8 bits). Schemas
 * (opjit_require's "float32|float64"), call errors and the opjit command's
 * .npy files all use these names. */

/* The i-th dtype (i from 0) into *dtype (may be NULL; lanes 1) and its name;
 * NULL when i is past the last. Static storage. */
const char *opjit_dtype_at(int i, DLDataType *dtype);
/* "float32" -> *dtype (may be NULL). OPJIT_OK, or OPJIT_EINVAL for a name
 * opjit does not know (no runtime: no message). */
int opjit_dtype_parse(const char *name, DLDataType *dtype);
/* The name of dtype ("float32"); NULL when opjit has none for it (lanes
 * other than 1 included). Static storage. */
const char *opjit_dtype_name(DLDataType dtype);

/* ---- the search path ---- */

/* The colon-separated directories searched for op sources, in order: the
 * config's ops_path, $OPJIT_OPS_PATH, then the ops installed with the
 * library. Owned by rt; "" for a NULL rt. */
const char *opjit_ops_path(opjit_runtime *rt);

/* Call fn with the path of every op source (*.c, *.cu files) on the search
 * path: directory by directory in search order (a directory listed twice
 * is read once), sorted by file name within one; name non-NULL: only the
 * sources of op name (name.c, name.cu). Sources an earlier directory
 * shadows are included (a load by name takes the first directory's).
 * Nothing is read or compiled; a directory that cannot be read has no
 * sources. Stops when fn returns non-zero. OPJIT_EINVAL for a NULL rt or
 * fn, or an empty name or one holding '/'; OPJIT_ENOMEM. */
int opjit_sources(opjit_runtime *rt, const char *name,
                  int (*fn)(void *ud, const char *path), void *ud);

/* ---- the sources on the search path and what they register ---- */

/* One op source on the search path and the ops its OPJIT_MODULE registers. */
typedef struct opjit_source_ops {
    const char *path;    /* the source file */
    int device;          /* OPJIT_CPU (.c) or OPJIT_CUDA (.cu) */
    int status;          /* OPJIT_OK, or why its ops are not known: a
                          * compile error, an init that failed, exited,
                          * crashed or ran past the time limit
                          * (OPJIT_EMODULE), not a regular file
                          * (OPJIT_EINVAL), CUDA not usable here
                          * (OPJIT_EDEVICE) */
    const char *error;   /* the message when status != OPJIT_OK, else "" */
    const char *tier;    /* what serves it when loaded: "tcc", "opt", "nvrtc" */
    int nops;
    const char *const *schemas; /* each registered op's schema, in order */
    const char *const *docs;    /* and its description */
} opjit_source_ops;

/* Find the op sources on the search path (every *.c and *.cu file of each
 * directory, by name; a name an earlier directory has is shadowed) and
 * what each registers, calling fn once per source in search order; stops
 * early if fn returns non-zero. Nothing is loaded into rt: a source never
 * seen (or edited since) is compiled (or taken from the cache) and its
 * init run in a child process with a time limit ($OPJIT_DISCOVER_TIMEOUT
 * seconds, default 60), so a source that does not compile, or whose init
 * crashes, exits or never returns, is reported in its status and the
 * others are still found. What the child reports is kept in the cache, and
 * a source listed before is reported from it: no process, no op code run
 * (a timeout is kept with its limit: a longer limit looks again).
 * Returns OPJIT_OK when every source was listed (a .cu skipped because
 * CUDA cannot run here counts as listed), else the status of the first
 * that was not; every source is still passed to fn. */
int opjit_discover(opjit_runtime *rt, int (*fn)(void *ud, const opjit_source_ops *src),
                   void *ud);

/* ---- warming: compile into the cache ahead of time ---- */

typedef struct opjit_warm_options {
    size_t size;         /* sizeof(opjit_warm_options), set by the caller */
    /* What to warm: op names (every source of each on the search path,
     * see opjit_sources) and source paths (anything with a '/' or a
     * source suffix); a source named twice is warmed once. ntargets 0:
     * every source on the search path. */
    const char *const *targets;
    int ntargets;
    /* 1: also build the optimizing tier, waiting for it (needs a C
     * compiler: cc, else $OPJIT_CC, else cc on PATH). */
    int opt;
    const char *cc;
    /* CUDA architectures to build .cu device code for ("sm_80,compute_90");
     * NULL: rt's config, else $OPJIT_CUDA_ARCHS, else this machine's GPUs,
     * else the default list. */
    const char *cuda_archs;
    /* 1: also store every entry warmed (built or found locally) in rt's
     * remote cache (OPJIT_EINVAL when it has none in use). */
    int remote;
} opjit_warm_options;

/* What became of one source. */
enum {
    OPJIT_WARM_HIT = 0,      /* every artifact a load would use (with opt,
                              * the optimized one too) was cached already */
    OPJIT_WARM_COMPILED = 1, /* some were built, and all are now stored */
    OPJIT_WARM_SKIPPED = 2,  /* a .cu without a CUDA compiler, when no
                              * architectures were asked for (cuda_archs,
                              * rt's config or $OPJIT_CUDA_ARCHS) */
    OPJIT_WARM_FAILED = 3,   /* an error; or the cache does not hold all it
                              * needs (full, read-only, or a size limit
                              * too small for every source warmed) */
    OPJIT_WARM_NOSOURCE = 4  /* an op name with no source on the path */
};

/* One step of opjit_warm, for a progress display. Strings live during the
 * callback only. */
typedef struct opjit_warm_event {
    int done;            /* 0: path is about to be warmed; 1: it was (or,
                          * for OPJIT_WARM_NOSOURCE, an op had no source) */
    int index, total;    /* path is source index (0-based) of total */
    const char *path;    /* the source; the op name for NOSOURCE */
    int result;          /* done: OPJIT_WARM_* */
    int status;          /* done: OPJIT_OK, or why it failed or was skipped */
    const char *message; /* done: "" or the reason; for COMPILED, the
                          * compilers whose code was built ("opt";
                          * "tcc, nvrtc"), "" when none was missing */
    double ms;           /* done: how long it took */
} opjit_warm_event;

typedef struct opjit_warm_result {
    size_t size;         /* sizeof(opjit_warm_result), set by the caller */
    int sources;   /* sources warmed (found) */
    int hits, compiled, failed, skipped;
    int nosource;  /* op names with no source */
    double seconds;
} opjit_warm_result;

/* Compile sources into rt's cache so that later loads (maybe offline, maybe
 * without a compiler) hit. Each source is loaded by a private runtime of
 * its own over rt's caches (cache_dir, readonly_caches, offline, no_cache)
 * with rt's log callback, so two sources of one op name do not collide and
 * nothing is loaded into rt. Op names with no source are reported first
 * (done 1, OPJIT_WARM_NOSOURCE), then each source before (done 0) and after
 * (done 1) it is warmed; fn may be NULL, and warming stops when it returns
 * non-zero. *res (may be NULL) receives the counts. A failure does not stop
 * the rest. Returns OPJIT_OK when nothing failed and every name had a
 * source, else the status of the first failure (OPJIT_ENOTFOUND for a name
 * without a source) with a summary in opjit_errmsg(rt). */
int opjit_warm(opjit_runtime *rt, const opjit_warm_options *opts,
               int (*fn)(void *ud, const opjit_warm_event *ev), void *ud,
               opjit_warm_result *res);

/* ---- the cache ---- */

/* One cache entry. Strings live during the callback only. */
typedef struct opjit_cache_entry {
    const char *key;       /* 32 hex digits; "-" for a read-only layer that
                            * is not trusted (never read; problem says why) */
    const char *dir;       /* the entry's directory (the layer's for "-") */
    int layer;             /* 0: the writable cache; i > 0: read-only layer
                            * i - 1 (opjit_cache_readonly_dir) */
    const char *layer_dir;
    /* From the manifest; NULL when it could not be read. */
    const char *op_name, *source_name, *compiler, *options, *target, *tier;
    uint64_t size;         /* artifacts + manifest, bytes */
    int64_t created;       /* Unix seconds */
    int64_t last_use;      /* Unix seconds, kept to the minute */
    int nartifacts;
    const char *problem;   /* NULL, or why the entry (or layer) is damaged */
} opjit_cache_entry;

/* Why a load hits or misses the cache: one report per artifact a load of
 * a source would use now. Strings live during the callback only. */
typedef struct opjit_cache_why_report {
    const char *source;   /* the source's path */
    const char *compiler; /* "tcc", "opt" (the optimizing C compiler), "nvrtc" */
    const char *target;   /* "x86_64-linux", "x86-64-v3", "sm_90" */
    const char *key;      /* what a load looks up (32 hex digits) */
    int cached;           /* 1: a cache layer holds it */
    /* What goes into the key, one "name value" line each: opjit's ABI and
     * op header, the source and each local header (name and XXH3-64),
     * the compiler's identity (its version and where it lives), options,
     * target. */
    const char *inputs;
    const char *note;     /* NULL, or what could not be known (no compiler here) */
    /* For a miss: the cached entry of this source and compiler whose
     * inputs differ least (NULL when there is none), and those that differ,
     * one "name: now VALUE, cached VALUE" line each. */
    const char *closest_key;
    int64_t closest_created;
    const char *differs;
} opjit_cache_why_report;

/* Report on every artifact a load of spec (a source path, or an op name on
 * the search path) would use now: the background compiler's (when tiering
 * is on), the one a load compiles with, and for a .cu the device code of
 * each architecture (arch: "sm_90,compute_90" instead of those in use,
 * or NULL). fn returns non-zero to stop. Runs no compile (it may run the
 * optimizing compiler's --version and load NVRTC to learn who they are).
 * OPJIT_ENOTFOUND when spec names no source. */
int opjit_cache_why(opjit_runtime *rt, const char *spec, const char *arch,
                    int (*fn)(void *ud, const opjit_cache_why_report *w), void *ud);

/* Call fn for every entry of rt's cache: read-only layers first (in search
 * order), then the writable cache; stops when fn returns non-zero. Reads
 * manifests only: problem is set for an unreadable manifest and for an
 * untrusted layer. OPJIT_EIO (or OPJIT_ENOMEM) when a layer cannot be read. */
int opjit_cache_list(opjit_runtime *rt, int (*fn)(void *ud, const opjit_cache_entry *e),
                     void *ud);

typedef struct opjit_cache_info {
    size_t size;         /* sizeof(opjit_cache_info), set by the caller */
    const char *dir;       /* the writable directory, even when unusable;
                            * "" when the cache is off. Owned by rt */
    int writable;          /* 1: dir is in use (created and trusted); 0:
                            * loads compile into temporary directories */
    int offline;           /* 1: a miss is an error (OPJIT_EOFFLINE) */
    uint64_t max_size;     /* the size cap in bytes; UINT64_MAX: none */
    int nreadonly;         /* read-only layers (opjit_cache_readonly_dir) */
    uint64_t entries, bytes;                   /* the writable cache */
    uint64_t readonly_entries, readonly_bytes; /* all read-only layers */
    uint64_t tmp_dirs;     /* builds in progress, or left by killed ones */
} opjit_cache_info;

/* Where rt's cache is and what it holds, into *info (info->size set by
 * the caller). OPJIT_EIO when it cannot be read. */
int opjit_cache_info_get(opjit_runtime *rt, opjit_cache_info *info);
/* Read-only layer i (0 <= i < nreadonly), owned by rt; NULL otherwise. */
const char *opjit_cache_readonly_dir(opjit_runtime *rt, int i);

/* Check every entry of every layer: manifests and checksums. fn (may be
 * NULL) is called for each entry checked, problem set on a damaged one (and
 * for an untrusted layer). repair: evict the damaged entries of the
 * writable cache (entries in use are skipped; read-only layers are never
 * changed). *ndamaged (may be NULL) receives the number damaged. Damage is
 * not a failure: OPJIT_OK; OPJIT_EIO when some entries could not be
 * checked at all (out of file descriptors, an I/O error). */
int opjit_cache_verify(opjit_runtime *rt, int repair,
                       int (*fn)(void *ud, const opjit_cache_entry *e), void *ud,
                       int *ndamaged);

typedef struct opjit_cache_prune_result {
    size_t size;         /* sizeof(opjit_cache_prune_result), set by the caller */
    uint64_t removed;       /* entries evicted */
    uint64_t removed_bytes;
    uint64_t busy;          /* entries skipped because a process uses them */
    uint64_t tmp_removed;   /* leftover temporary directories removed */
    uint64_t bytes_after;   /* size of the writable cache afterwards */
} opjit_cache_prune_result;

/* Evict the least recently used entries of the writable cache until it
 * holds at most max_bytes (0: the configured cap), skipping entries in use;
 * also remove what killed processes left behind. *r may be NULL.
 * OPJIT_ECACHE when the writable cache is off or unusable. */
int opjit_cache_prune(opjit_runtime *rt, uint64_t max_bytes, opjit_cache_prune_result *r);
/* Remove every entry of the writable cache that no process uses. */
int opjit_cache_clear(opjit_runtime *rt, opjit_cache_prune_result *r);

/* The remote cache layer (opjit_config.remote_cache), as the fleet sees
 * it. Strings are owned by rt (url, why) or live in the struct. */
typedef struct opjit_cache_remote_info {
    size_t size;         /* sizeof(opjit_cache_remote_info), set by the caller */
    const char *url;        /* "" when none is configured */
    int enabled;            /* 1: in use; 0: off (see the log for why) */
    int readonly;           /* $OPJIT_REMOTE_MODE=ro */
    int is_signed;          /* entries are signed and checked with a key */
    int reachable;          /* the server answered just now */
    uint64_t entries, bytes;         /* opjit entries it holds */
    uint64_t used_memory, maxmemory; /* the server's (0: no limit) */
    char policy[32];                 /* its maxmemory-policy */
} opjit_cache_remote_info;

/* Ask the remote layer what it holds. OPJIT_OK also when it is off or not
 * reachable (see enabled, reachable). */
int opjit_cache_remote_info_get(opjit_runtime *rt, opjit_cache_remote_info *info);
/* Call fn for every entry the remote holds (layer -1, dir the Redis key,
 * layer_dir the URL; fields from the value's manifest, not verified; last_use
 * 0). OPJIT_ENOTFOUND when no remote is in use, OPJIT_EIO when it cannot be
 * reached. */
int opjit_cache_remote_list(opjit_runtime *rt, int (*fn)(void *ud, const opjit_cache_entry *e),
                            void *ud);

/* "512M" -> bytes: digits with an optional K, M, G or T suffix (powers of
 * 1024; "B", "iB" allowed after), as $OPJIT_CACHE_MAX_SIZE takes.
 * OPJIT_OK, or OPJIT_EINVAL (no runtime: no message). */
int opjit_parse_size(const char *text, uint64_t *bytes);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#ifdef __cplusplus
}
#endif

#endif /* OPJIT_ADMIN_H */
