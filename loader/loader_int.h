/* loader/loader_int.h - what the loader's files share. */
#ifndef OPJIT_LOADER_INT_H
#define OPJIT_LOADER_INT_H

#include <limits.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>

#include "cache/cache.h"
#include "jit/jit.h"
#include "runtime/abi.h"
#include "runtime/runtime.h"

/* A source loaded before, so an unchanged one is not loaded twice. */
typedef struct loaded {
    char *path;      /* realpath */
    cache_key digest; /* the source's state (source_read) */
    char *op_name;
    char tier[8];    /* tier serving now */
    int below_best;  /* its code is for a lower CPU level than this one's best */
    struct loaded *next;
} loaded;

typedef struct tier_state tier_state;

/* What the pipeline learnt of one compiler, once per runtime. */
typedef struct pipeline_compiler {
    int file_known, file_found;
    char file_id[96];
    int id_known, id_rc;
    char *id;     /* malloc'd once known: a runtime holds one per compiler */
    char *id_err;
} pipeline_compiler;

#define PIPELINE_MAX_COMPILERS 8

/* The way from sources to artifacts (loader/pipeline.c). */
typedef struct pipeline {
    cache *cache;
    jit_settings set;
    pthread_mutex_t lock;   /* what follows */
    char scratch[PATH_MAX]; /* private temp dir for the optimizing compiler's version log */
    int scratch_lock;       /* its lock (cache_private_mkdir), while scratch[0] */
    pipeline_compiler comp[PIPELINE_MAX_COMPILERS]; /* as jit_compilers */
} pipeline;

typedef struct loader {
    opjit_runtime *rt;
    pthread_mutex_t lock; /* loads on this runtime */
    char *ops_path;       /* colon-separated: config, $OPJIT_OPS_PATH, installed; made
                           * at first use: read it with loader_ops_path */
    char *ops_head;       /* config and $OPJIT_OPS_PATH (the settings') */
    pthread_mutex_t ops_lock; /* ops_path */
    cache *cache;
    loaded *loaded;
    tier_state *tier;
    char archs[1024];     /* the architectures in use (cu_device_code) */
    struct op_index *index; /* which ops each source defines (loader/index.c) */
    struct watcher *watch;  /* cfg.watch: the search path watched (loader/watch.c) */
    int discover_cancel_fd; /* readable: discovery's children are killed at once
                             * (opjit_destroy stopping the watcher); -1: none */
    /* Last: loader_create zeroes what comes before it, pipeline_init sets
     * its fields (9 KiB of path buffers a fresh process need not touch). */
    pipeline pipe;
} loader;

/* What went into a key, readable: "name value" lines (a file's value is
 * its XXH3-64), kept in manifests for `opjit cache why`. */
typedef struct readable {
    char *text;
    size_t len, cap;
    int oom;
} readable;

/* Add "name value" (data: then " HASH" of its len bytes follows value). */
void readable_add(readable *r, const char *name, const char *value, const void *data,
                  size_t len);
/* The same with the value's hash given: " HASH" is the first 8 bytes of
 * sum, in hex. */
void readable_add_sum(readable *r, const char *name, const char *value,
                      const unsigned char *sum);
void readable_free(readable *r);

/* The rule an inline source's local headers follow (loader/inline.c):
 * every one resolves inside dir, and the source's own "x.h" includes are
 * found there. dir NULL: no rule (a file); "": no directory was named,
 * so there are no local headers. */
typedef struct source_confine {
    const char *dir;  /* realpath */
    const char *name; /* the source's name, for messages */
} source_confine;

/* Why a source's includes break its rule: kind 0 when they do not. */
typedef struct source_refusal {
    int kind;
    char msg[PATH_MAX + 1024];
} source_refusal;

/* A source file read into memory. (source_read clears it field by
 * field: a new field is cleared there too.) */
typedef struct source {
    const char *path; /* as given */
    char real[PATH_MAX];
    char dir[PATH_MAX];
    const char *name; /* file name */
    char stem[256];
    char *text;
    size_t len;
    int device;
    int uses_blas;    /* it names cblas (source_finish): asked once, not per key */
    cache_key digest; /* of everything the artifacts depend on, read once */
    readable inputs;  /* the digest's inputs, readable */
    source_confine confine; /* an inline source's rule for its headers */
} source;

/* Read a whole file, NUL-terminated; NULL with errno on failure (EINVAL:
 * not a regular file). */
char *loader_read_file(const char *path, size_t *len);

/* Load the source at path (the loader's lock held): read it, pick the
 * compilers, publish the module. */
int loader_load_locked(loader *l, const char *path, opjit_op **op, opjit_load_info *info);
/* The same for a path that named the loaded source at replaces and now
 * names another file (a symlink retargeted): the new file's module takes
 * over the old one's ops, which stays serving when it fails. */
int loader_load_replacing(loader *l, const char *path, const char *replaces);
/* Warn of each directory cfg.ops_path or $OPJIT_OPS_PATH names that is not
 * one (opjit_create; not the runtimes the library makes for itself). */
void loader_warn_missing_dirs(loader *l);
/* The search path, colon-separated (made at its first use; loader/ops_path.c). */
const char *loader_ops_path(loader *l);
/* Its head, from the settings (loader_create). OPJIT_OK or OPJIT_ENOMEM. */
int ops_path_init(loader *l);
/* What a file is now: a change of any field is an edit. */
typedef struct file_sig {
    unsigned long long dev, ino, size;
    long long mtime, ctime; /* nanoseconds */
} file_sig;
/* st's signature, and whether two are the same (loader/source.c). */
file_sig file_sig_of(const struct stat *st);
int file_sig_eq(const file_sig *a, const file_sig *b);

/* The directory (n bytes) of the file this copy of the library is in:
 * libopjit.so (*shared 1), or the executable libopjit.a is linked into
 * (*shared 0). 0, or -1 when it cannot be told. */
int loader_library_dir(char *dir, size_t n, int *shared);
/* 1 when dir/opjit_op.h is this library's, byte for byte, and only its
 * owner (us or root) can change it, dir or a directory above; *st: the
 * file as read
 * (loader/pipeline.c, where builds use such a copy). */
int loader_op_header_copy(const char *dir, struct stat *st);
/* 1 when dir/opjit_op.h is still the file st describes, unchanged. */
int loader_op_header_unchanged(const char *dir, const struct stat *st);
/* A runtime with a loader and nothing else (no watcher): what discovery's
 * children and warming load by path with. */
int loader_runtime_new(const settings *set, opjit_runtime **out);
void loader_runtime_free(opjit_runtime *rt);
/* The loader of rt, built from rt's settings, and its end. */
int loader_create(opjit_runtime *rt, struct loader **out);
void loader_destroy(struct loader *l);

int source_read(loader *l, const char *path, source *s);
/* The rest of reading a source whose path, real, dir, text, len, device
 * (and for an inline source confine) are set: its name, stem and digest.
 * On failure s is freed and the message is on l's runtime. */
int source_finish(loader *l, source *s);
/* Whether the include of name (quoted or <>) at `at` in text, found or
 * not at real by the loader (depth 0: in the source itself), breaks the
 * inline rule c: then 1, with why in r (loader/inline.c). */
int source_confine_check(const source_confine *c, source_refusal *r, const char *text,
                         const char *at, int depth, int quoted, int found, const char *name,
                         const char *real);
/* Load the source s (read by source_read or made from text), the loader's
 * lock held; t0 is when reading it began. s stays the caller's. */
int loader_load_read_locked(loader *l, source *s, double t0, opjit_op **op,
                            opjit_load_info *info);
/* Whether the source calls OpenBLAS (then its artifact links it). */
int source_uses_blas(const source *s);
void source_free(source *s);
/* A keygen holding s->digest: what every artifact of s depends on (opjit's
 * ABI and op header, the source's name and bytes, its local headers), as
 * read when the load began. The caller adds compiler, options and target,
 * then finishes it. NULL when out of memory. */
cache_keygen *source_keygen(const source *s);
/* Add the op header this library was built with to a key. */
void loader_add_op_header(cache_keygen *g);
/* fn(ud, realpath) for each local header of s as on disk now (the ones
 * its digest hashes), each once. */
void source_each_header(const source *s, void (*fn)(void *ud, const char *real), void *ud);
/* Whether the local headers on disk still hash to s->digest. Build
 * callbacks check it after compiling, so an artifact is never published
 * under the key of headers it was not built from. */
int source_unchanged(const source *s);
/* dlopen so, run the module init, validate; the module is not published. */
int load_module(loader *l, const source *s, const char *so, const char *tier, module **out);
/* Load the module in so, publish its kernels and remember s's state: the
 * tier serving, and below_best (its code is for a lower CPU level than
 * this machine's best). opname receives the op to hand back (named after
 * the file, else the first). On failure cm (a .cu's device code, may be
 * NULL) is freed; else the module owns it. replaces (or NULL): the loaded
 * source s takes over (its kernels leave, it is forgotten). */
int loader_publish_module(loader *l, const source *s, const char *so, const char *tier,
                          int below_best, char *opname, size_t opname_len,
                          struct cuda_module *cm, const char *replaces);
loaded *loader_find_loaded(loader *l, const char *real);
/* Forget the source at real (its kernels unpublished): the next load of it
 * compiles or hits the cache again. Loader lock held. */
void loader_forget(loader *l, const char *real);
/* The settings of a runtime of its own over the same caches as l
 * (discovery's children, warming): a copy of l's runtime's, without the
 * host's callbacks (log, allocator, pool, watcher). The caller frees it. */
int loader_child_settings(const loader *l, settings *set);
/* fn for each source named name ("nms.c", "nms.cu") on the search path,
 * directory by directory; stops when fn returns non-zero (its value). */
int loader_each_source(opjit_runtime *rt, const char *name,
                       int (*fn)(void *ud, const char *path), void *ud);
/* Whether path names a .cu source. */
int loader_is_cuda_source(const char *path);
/* Whether spec names a file (a '/', or a .c/.cu suffix) rather than an op. */
int loader_is_path_spec(const char *spec);
/* The op name's length in a source file name ("nms.cu" -> 3); 0 when it is
 * not a source (no .c/.cu suffix, or a hidden file). */
size_t loader_source_stem(const char *file);
/* The monotonic clock in milliseconds (inline: every file of loader/ may
 * time something without a call into another). */
static inline double loader_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- discovery (loader/discover.c) --------------------------------------- */

/* What the one source at path registers, found as opjit_discover finds it
 * (in a child process with a time limit): fn is called once with it.
 * Returns OPJIT_OK when it was listed (or skipped: a .cu CUDA cannot run
 * here), else its status. */
int loader_discover_one(loader *l, const char *path,
                        int (*fn)(void *ud, const opjit_source_ops *src), void *ud);
/* What each of the n sources at paths registers, found the same way, with
 * up to one child per CPU at once: fn(ud, i, src, timed_out_ms) once per
 * source, in order (timed_out_ms: the time limit its child ran out of, or
 * 0). OPJIT_OK, or OPJIT_ENOMEM with a message. */
int loader_discover_many(loader *l, const char *const *paths, int n,
                         void (*fn)(void *ud, int i, const opjit_source_ops *src,
                                    long timed_out_ms),
                         void *ud);

/* This thread discovers holding no loader lock (the watcher's indexer):
 * its discovery forks take the lock for the instant of the fork, as the
 * tier's helper does, so that loads are not in the allocator then. */
void discover_outside_lock(void);

/* ---- the op index (loader/index.c) ---------------------------------------- */

/* Call fn for the sources of op on the search path, directory by
 * directory as PATH is searched: the files named after op (op.c, op.cu),
 * else the module that registers op (through the index); the first
 * directory with either decides. OPJIT_ENOTFOUND when none does,
 * OPJIT_EINVAL when two modules of the deciding directory register op
 * (the message names both), each with a message. */
int index_each_source(loader *l, const char *op, int (*fn)(void *ud, const char *path),
                      void *ud);
/* Index the source at path now (a new or edited source the watcher saw):
 * OPJIT_OK, or why its ops are not known (then with a message; OPJIT_EDEVICE
 * for a .cu CUDA cannot run here). Needs no lock: it touches only the
 * caches, and runs discovery's child without holding up loads. */
int index_source(loader *l, const char *path);
/* Forget what the index keeps in memory (opjit_destroy). */
void index_free(loader *l);
/* A source's record (what discovery found for this version of it; see
 * loader/index_int.h) is read and written by index_record_get and
 * index_record_put, declared there. */

/* ---- the watcher (loader/watch.c) ----------------------------------------- */

/* cfg->watch (-1: $OPJIT_WATCH): start the thread watching the sources. */
int watch_start(loader *l);
/* Stop it and wait for it (opjit_destroy, before anything else goes). */
void watch_stop(loader *l);

/* ---- the pipeline (loader/pipeline.c) ---------------------------------- */

int pipeline_init(pipeline *p, cache *c, const jit_settings *set);
/* The configuration caches are opened with from set (no log): the
 * loader's, the tier helper's. */
void pipeline_cache_config(const settings *set, cache_config *cc);
void pipeline_fini(pipeline *p);

/* One artifact wanted: of src, by jc (for the half of src it compiles),
 * for target. build 0: only look in the caches. */
typedef struct pipeline_get_args {
    const source *src;
    const jit_compiler *jc;
    unsigned half;
    const char *target;
    int build;
} pipeline_get_args;

typedef struct pipeline_request {
    cache_request req;
    char tier[32];
    char compiler[PATH_MAX + 128];
    char inputs[8192]; /* req.inputs: the source's, then the compiler's */
} pipeline_request;

typedef struct pipeline_artifact {
    cache_entry *entry; /* the caller releases it */
    const char *path;   /* the artifact's file in entry; NULL when it lacks it */
    char name[64];      /* "host.so", "sm_90.cubin" */
    cache_key key;      /* the entry's key (zero when found through an index) */
    int hit;            /* CACHE_BUILT, CACHE_HIT_LOCAL or CACHE_HIT_REMOTE */
    /* pipeline_get_host: the target it was built for, and whether that is
     * the best this machine runs (the first of the compiler's targets) */
    char target[32];
    int best;
} pipeline_artifact;

/* Find the artifact in the caches (through an index when the compiler's
 * identity is costly), else build it (a.build). On failure diag says why
 * (a compile error: the diagnostics), and the status is the compiler's or
 * the cache's; OPJIT_ENOTFOUND when only looking. */
int pipeline_get(pipeline *p, const pipeline_get_args *a, pipeline_artifact *out, char *diag,
                 size_t diaglen);

/* jc's host code of s: the first of jc's targets (this machine's, best
 * first) whose artifact a cache holds; with build, the first target's is
 * built when the first is not cached (a build error ends the search).
 * out->target and out->best say which served. As pipeline_get otherwise. */
int pipeline_get_host(pipeline *p, const source *s, const jit_compiler *jc, unsigned half,
                      int build, pipeline_artifact *out, char *diag, size_t diaglen);
/* A background compiler jc that rejected s (OPJIT_ECOMPILE from its
 * build): the failure kept for the hour, msg its diagnostics; and looked
 * up (*msg malloc'ed), OPJIT_OK when kept this hour. */
void pipeline_failure_put(pipeline *p, const source *s, const jit_compiler *jc,
                          const char *msg);
int pipeline_failure_get(pipeline *p, const source *s, const jit_compiler *jc, char **msg);
/* The request of the artifact a.jc would make of a.src for a.target, with
 * its full key (its identity, learnt); or, when the compiler is not here,
 * the index entry's request, with why in note. *cached: some layer holds
 * it. */
int pipeline_describe(pipeline *p, const pipeline_get_args *a, pipeline_request *r,
                      int *cached, char *note, size_t n);

/* ---- background compilers (loader/tier.c) ------------------------------- */

/* The settings' tiering (config, else $OPJIT_TIERING: default on). */
int tier_create(loader *l);
/* Hand what is queued to a helper process and stop at once. */
void tier_destroy(loader *l);
/* Build s with the background compiler jc in a helper process that
 * outlives this one; when it lands, swap its kernels in. */
void tier_schedule(loader *l, const jit_compiler *jc, const source *s);
/* Never build in the background (a discovery child: it only looks). */
void tier_never_build(loader *l);
/* The tier a load of s would be served by now, from the caches alone. */
const char *tier_would_serve(loader *l, const source *s);
/* Wait until no background compile is pending; the status of the first
 * that failed since the last wait, and its message in msg. */
int tier_wait(loader *l, char *msg, size_t n);

/* ---- CUDA sources (loader/cuda_load.c) ---------------------------------- */

struct cuda_module;
/* The architectures in use, validated and deduplicated into out
 * ("sm_80,sm_90"): config, else $OPJIT_CUDA_ARCHS, else this machine's
 * GPUs (*defaulted), else the default. */
int cu_resolve_archs(loader *l, char *out, size_t n, int *defaulted);
/* The device code of s for every architecture in use (config, else
 * $OPJIT_CUDA_ARCHS, else this machine's GPUs, else the default), from
 * the cache or the device compiler; *all_hit when nothing was compiled,
 * *waited_ms grown by the time spent waiting for other processes' builds,
 * *by the compiler. */
int cu_device_code(loader *l, const source *s, struct cuda_module **out, int *all_hit,
                   double *waited_ms, const jit_compiler **by);
/* Before dlopening s's host half, where CUDA can run: each NVIDIA library
 * its text mentions (cudnn: libcudnn.so.9; cublas: libcublas.so.13) made
 * RTLD_GLOBAL when available (tried once per process). */
void cu_preload(loader *l, const source *s);
/* After a host half failed to load with msg (an undefined symbol): the
 * libraries msg names made global if not tried yet; 1 when one was
 * loaded now (then a second dlopen may succeed). */
int cu_preload_missing(loader *l, const char *msg);
/* After a host half failed to load with msg: " (cuDNN: why it could not
 * be loaded)" into out for each library msg mentions that is missing;
 * "" when none. */
void cu_preload_explain(const char *msg, char *out, size_t n);
/* OPJIT_OK when .cu sources can run here (a driver and a device); else
 * why not. */
int cu_usable(char *why, size_t n);

#endif
