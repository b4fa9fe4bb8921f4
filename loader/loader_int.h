/* loader/loader_int.h - what the loader's files share (loader.c, tier.c). */
#ifndef OPJIT_LOADER_INT_H
#define OPJIT_LOADER_INT_H

#include <limits.h>
#include <pthread.h>

#include "cache/cache.h"
#include "runtime/runtime.h"

/* A source loaded before, so an unchanged one is not loaded twice. */
typedef struct loaded {
    char *path;      /* realpath */
    cache_key key;   /* of the tcc artifact: the source's state */
    char *op_name;
    char tier[8];    /* tier serving now */
    struct loaded *next;
} loaded;

typedef struct tier_state tier_state;

typedef struct loader {
    opjit_runtime *rt;
    pthread_mutex_t lock; /* loads on this runtime */
    char *ops_path;       /* colon-separated: config, $OPJIT_OPS_PATH, installed */
    cache *cache;
    char scratch[PATH_MAX]; /* private temp dir holding opjit_op.h */
    int scratch_lock;       /* its lock (cache_private_mkdir), while scratch[0] */
    loaded *loaded;
    tier_state *tier;
    char *cuda_archs;     /* config.cuda_archs, or NULL */
    /* What a discovery child needs to open the same caches. */
    char *cfg_cache_dir, *cfg_readonly;
    int cfg_offline, cfg_no_cache;
    struct op_index *index; /* which ops each source defines (loader/index.c) */
    struct watcher *watch;  /* cfg.watch: the search path watched (loader/watch.c) */
} loader;

/* A source file read into memory. */
typedef struct source {
    const char *path; /* as given */
    char real[PATH_MAX];
    char dir[PATH_MAX];
    const char *name; /* file name */
    char stem[256];
    char *text;
    size_t len;
    int device;
    cache_key digest; /* of everything the artifacts depend on, read once */
} source;

/* Read a whole file, NUL-terminated; NULL with errno on failure (EINVAL:
 * not a regular file). */
char *loader_read_file(const char *path, size_t *len);

/* The loader of rt, built from cfg (opjit_create), and its end. */
int loader_create(opjit_runtime *rt, const opjit_config *cfg, struct loader **out);
void loader_destroy(struct loader *l);

int source_read(loader *l, const char *path, source *s);
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
/* Write opjit_op.h into the loader's private directory (once). */
int loader_scratch(loader *l);
loaded *loader_find_loaded(loader *l, const char *real);
/* Forget the source at real (its kernels unpublished): the next load of it
 * compiles or hits the cache again. Loader lock held. */
void loader_forget(loader *l, const char *real);
/* A config for a runtime of its own over the same caches as l (discovery's
 * children, warming): the defaults plus l's cache directories, offline and
 * no_cache settings and CUDA architectures. */
void loader_same_caches(const loader *l, opjit_config *cfg);
/* Whether spec names a file (a '/', or a .c/.cu suffix) rather than an op. */
int loader_is_path_spec(const char *spec);
/* The op name's length in a source file name ("nms.cu" -> 3); 0 when it is
 * not a source (no .c/.cu suffix, or a hidden file). */
size_t loader_source_stem(const char *file);
const char *loader_target(void);
double loader_now_ms(void);

/* ---- discovery (loader/discover.c) --------------------------------------- */

/* What the one source at path registers, found as opjit_discover finds it
 * (in a child process with a time limit): fn is called once with it.
 * Returns OPJIT_OK when it was listed (or skipped: a .cu CUDA cannot run
 * here), else its status. */
int loader_discover_one(loader *l, const char *path,
                        int (*fn)(void *ud, const opjit_source_ops *src), void *ud);

/* ---- the op index (loader/index.c) ---------------------------------------- */

/* Call fn for each source of the module that registers op (an op no file
 * is named after), found through the index of the search path: the first
 * directory with a module registering op decides. OPJIT_ENOTFOUND when no
 * module does, OPJIT_EINVAL when two of one directory do (the message
 * names both), each with a message. */
int index_each_source(loader *l, const char *op, int (*fn)(void *ud, const char *path),
                      void *ud);
/* Index the source at path now (a new or edited source the watcher saw). */
int index_source(loader *l, const char *path);
/* Forget what the index keeps in memory (opjit_destroy). */
void index_free(loader *l);

/* ---- the watcher (loader/watch.c) ----------------------------------------- */

/* cfg->watch (-1: $OPJIT_WATCH): start the thread watching the sources. */
int watch_start(loader *l, const opjit_config *cfg);
/* Stop it and wait for it (opjit_destroy, before anything else goes). */
void watch_stop(loader *l);

/* ---- the optimizing tier (loader/tier.c) -------------------------------- */

/* cfg->tiering: -1 from $OPJIT_TIERING (default on when a C compiler is
 * found: $OPJIT_CC, else cc on PATH), 0 off, 1 on. */
int tier_create(loader *l, const opjit_config *cfg);
/* Finish the queued background compiles, then stop. */
void tier_destroy(loader *l);
/* An optimized artifact of s in the cache, found without running a
 * compiler; OPJIT_ENOTFOUND when none. */
int tier_lookup(loader *l, const source *s, cache_entry **out);
/* Compile s optimized in the background, then swap its kernels in. */
void tier_schedule(loader *l, const source *s, const cache_key *tcc_key);
/* Never build optimized code (a discovery child: it only looks). */
void tier_never_build(loader *l);
/* The tier a load of s would be served by now: "opt" when an optimized
 * artifact is in a cache, else "tcc". */
const char *tier_would_serve(loader *l, const source *s);
/* Wait until no background compile is pending; the status of the first
 * that failed since the last wait, and its message in msg. */
int tier_wait(loader *l, char *msg, size_t n);

/* ---- CUDA sources (loader/cuda_load.c) ---------------------------------- */

struct cuda_module;
/* libtcc defines for the host half of a .cu, NULL-terminated. */
extern const char *const cu_host_defines[];
/* The CUDA toolkit's include directory for host halves, or NULL. */
const char *cu_toolkit_include(void);
/* cuDNN's include directory when apart from the toolkit's, else NULL. */
const char *cu_cudnn_include(void);
/* Add to a .cu host key: its defines and the toolkit headers' versions. */
void cu_host_key(cache_keygen *g);
/* The device code of s for every architecture in use (config, else
 * $OPJIT_CUDA_ARCHS, else this machine's GPUs, else the default), from
 * the cache or NVRTC; *all_hit when nothing was compiled. */
int cu_device_code(loader *l, const source *s, struct cuda_module **out, int *all_hit);
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
