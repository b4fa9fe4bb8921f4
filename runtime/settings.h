/* runtime/settings.h - a runtime's settings: opjit_config and the
 * environment, resolved once when the runtime is made (opjit_create) and
 * read, never re-read, by every layer. runtime/settings.c is the one file
 * of the library that reads the environment.
 *
 * Two scopes. What a runtime may set differently from another lives in
 * `settings` (rt->set): made by settings_resolve, copied whole into the
 * runtimes and helpers a runtime makes for itself (discovery's children,
 * warming, the optimizing tier's helper), which never look at the
 * environment again. Where the NVIDIA libraries are is a property of the
 * process (each is dlopened once): settings_libs, read once at its first
 * use. */
#ifndef OPJIT_RUNTIME_SETTINGS_H
#define OPJIT_RUNTIME_SETTINGS_H

#include <stdint.h>

#include "opjit.h"

typedef struct settings {
    /* The host's callbacks, as given in opjit_config. */
    opjit_log_fn log;
    void *log_ud;
    int verbosity;
    opjit_alloc_fn alloc;
    void *alloc_ud;
    opjit_pool_fn pool;
    void *pool_ud;
    opjit_watch_fn watch_fn;
    void *watch_ud;

    /* runtime/ */
    int num_threads;        /* config, else $OPJIT_NUM_THREADS; 0: the CPUs usable */
    int output_cache_set;   /* $OPJIT_OUTPUT_CACHE was a size: */
    uint64_t output_cache;  /* the default allocator's cap in bytes */

    /* loader/ */
    char *ops_path_cfg;     /* config.ops_path (NULL: none) */
    char *ops_path_env;     /* $OPJIT_OPS_PATH (NULL: unset) */
    int watch;              /* 1: watch the sources */
    int watch_from_env;     /* ... because $OPJIT_WATCH said so (no inotify: a warning) */
    long discover_timeout_ms;
    char *cuda_archs;       /* config, else $OPJIT_CUDA_ARCHS; NULL: this machine's GPUs */
    const char *cuda_archs_from; /* "config.cuda_archs" or "OPJIT_CUDA_ARCHS" */
    int tiering;            /* 1: background compilers' code may serve and be built */
    int tiering_asked;      /* config.tiering was 1 (a missing compiler is worth a warning) */
    char *cc;               /* the optimizing C compiler's name or path */
    long cc_timeout_ms;
    int cc_jobs;            /* helpers at once per cache; 0: the CPUs online */
    int cpu_level;          /* $OPJIT_CPU_LEVEL: the highest x86-64 level (1-4) the
                             * optimizing tier builds for; 0: what the CPU has */
    char *tmpdir;           /* $TMPDIR (NULL: unset) */
    char *path;             /* $PATH (NULL: unset) */

    /* cache/ (loader/ hands them to cache_open) */
    char *cache_dir;        /* config, else $OPJIT_CACHE_DIR; NULL: the default */
    char *xdg_cache_home, *home; /* where the default is */
    char *readonly_caches;  /* config, else $OPJIT_CACHE_READONLY */
    int offline, no_cache;  /* 0 or 1 */
    uint64_t cache_max_size; /* 0: the cache's default; UINT64_MAX: no cap */
    char *remote_url;       /* config, else $OPJIT_REMOTE_CACHE; NULL or "": none */
    char *remote_key_file;  /* config, else $OPJIT_REMOTE_KEY_FILE */
    int remote_unsigned;    /* $OPJIT_REMOTE_TRUST=unsigned */
    int remote_ro;          /* $OPJIT_REMOTE_MODE=ro */
    int remote_push;
    int remote_connect_ms, remote_timeout_ms, remote_lease_ms, remote_backoff_ms;
} settings;

/* s from cfg and the environment; each setting the environment gets wrong
 * is warned of through cfg's log and replaced by its default. OPJIT_OK or
 * OPJIT_ENOMEM (then s holds nothing to free). */
int settings_resolve(const opjit_config *cfg, settings *s);
/* *dst = a copy of src that owns its strings. OPJIT_OK or OPJIT_ENOMEM. */
int settings_copy(settings *dst, const settings *src);
/* Replace *field (a string of s) by a copy of value; non-zero when out of
 * memory (then *field is unchanged). */
int settings_set_str(char **field, const char *value);
void settings_free(settings *s);

/* Where the process finds the NVIDIA libraries and the CUDA toolkit, as
 * the environment said at its first use. */
typedef struct settings_libs {
    const char *cuda_driver;   /* $OPJIT_CUDA_DRIVER, else NULL */
    const char *nvrtc;         /* $OPJIT_NVRTC_LIBRARY */
    const char *cudnn;         /* $OPJIT_CUDNN_LIBRARY */
    const char *cublas;        /* $OPJIT_CUBLAS_LIBRARY */
    const char *cuda_home;     /* $CUDA_HOME */
    const char *cuda_path;     /* $CUDA_PATH */
    const char *ld_library_path; /* $LD_LIBRARY_PATH: where dlopen looks first */
} settings_libs;
const settings_libs *settings_libs_get(void);

/* The op API's env_flag: a boolean variable an op reads for itself (its
 * own switches, not the library's settings), read at each call. */
int settings_op_flag(const char *name, int dflt);

/* $OPJIT_HALF_KERNEL, read at each call (the op API's half_kernel):
 * 0 auto (unset or empty too), 1 wide, 2 dot, 3 amx (opjit_op.h's
 * OPJIT_HALF_*); -1 for another value, which *bad then points to. */
int settings_half_kernel(const char **bad);

#endif
