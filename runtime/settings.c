/* runtime/settings.c - opjit_config and the environment resolved into one
 * settings object, once per runtime: the only file of the library that
 * calls getenv. Each variable's default and its warning live here. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "runtime/env.h"
#include "runtime/settings.h"

#define DEFAULT_DISCOVER_TIMEOUT_MS 60000
#define DEFAULT_CC_TIMEOUT_MS 120000
#define MAX_CC_JOBS 4096

/* A warning through the host's log, as rt_log would (no runtime yet). */
static void warn(const settings *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(const settings *s, const char *fmt, ...)
{
    if (!s->log || s->verbosity < OPJIT_LOG_WARN)
        return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    s->log(s->log_ud, OPJIT_LOG_WARN, buf);
}

int settings_set_str(char **field, const char *value)
{
    char *copy = value ? strdup(value) : NULL;
    if (value && !copy)
        return 1;
    free(*field);
    *field = copy;
    return 0;
}

/* The config's value when it gives one, else the variable's (NULL: unset). */
static int take_str(char **field, const char *cfg_value, const char *var)
{
    return settings_set_str(field, cfg_value ? cfg_value : var ? getenv(var) : NULL);
}

/* A boolean: cfg_value 0/1 as given, -1 from var (dflt when unset or bad,
 * with a warning saying what stays). */
static int take_bool(const settings *s, int cfg_value, const char *prefix, const char *var,
                     int dflt, const char *bad)
{
    if (cfg_value >= 0)
        return cfg_value != 0;
    const char *e = getenv(var);
    int v = env_bool_parse(e, dflt);
    if (v < 0) {
        warn(s, "%s%s='%s' is not a boolean%s", prefix, var, e, bad);
        v = dflt;
    }
    return v;
}

/* A duration in ms: cfg_ms when positive, else var's seconds, else dflt
 * (a bad value warned of, prefix first). positive 0: 0 s means 1 ms. */
static long take_ms(const settings *s, long cfg_ms, const char *var, long dflt, int positive,
                    const char *prefix)
{
    if (cfg_ms > 0)
        return cfg_ms;
    const char *e = getenv(var);
    long v = env_seconds_parse(e, dflt);
    if (positive ? v > 0 : v >= 0 && v <= INT_MAX)
        return positive || v ? v : 1;
    if (positive)
        warn(s, "%s%s='%s' is not a positive number of seconds; using %ld", prefix, var, e,
             dflt / 1000);
    else
        warn(s, "%s%s='%s' is not a duration in seconds; using %.3g", prefix, var, e,
             dflt / 1000.0);
    return dflt;
}

/* A count from 1 to max: var's, else dflt (a bad value warned of). */
static long take_count(const settings *s, const char *var, long max, long dflt,
                       const char *bad)
{
    const char *e = getenv(var);
    if (!e || !*e)
        return dflt;
    char *end;
    errno = 0;
    long v = strtol(e, &end, 10);
    while (*end == ' ')
        end++;
    if (!errno && !*end && end != e && v >= 1 && v <= max)
        return v;
    warn(s, "%s='%s' %s", var, e, bad);
    return dflt;
}

/* A size: *out from var, 1 when it is one; 0 when unset or bad (warned). */
static int take_size(const settings *s, const char *prefix, const char *var, uint64_t *out,
                     const char *bad)
{
    const char *e = getenv(var);
    if (!e || !*e)
        return 0;
    if (env_size_parse(e, out) == 0)
        return 1;
    warn(s, "%s%s='%s' %s", prefix, var, e, bad);
    return 0;
}

static void resolve_runtime(const opjit_config *cfg, settings *s)
{
    s->num_threads = cfg->num_threads > 0 ? cfg->num_threads : 0;
    if (!s->num_threads)
        s->num_threads = (int)take_count(s, "OPJIT_NUM_THREADS", INT_MAX, 0,
                                         "is not a positive number; ignored");
    s->output_cache_set = take_size(s, "", "OPJIT_OUTPUT_CACHE", &s->output_cache,
                                    "is not a size; using the default");
}

/* $OPJIT_CPU_LEVEL: the highest instruction set the optimizing tier
 * builds for (avx512, avx2, portable), lower than the CPU's to run and
 * test the lower kernels on a CPU that has more; 0 (unset): the CPU's. */
static int take_cpu_level(const settings *s)
{
    static const char *const names[] = {"portable", "", "avx2", "avx512"};
    const char *e = getenv("OPJIT_CPU_LEVEL");
    if (!e || !*e)
        return 0;
    for (int i = 0; i < 4; i++)
        if (names[i][0] && strcasecmp(e, names[i]) == 0)
            return i + 1;
    warn(s, "OPJIT_CPU_LEVEL='%s' is not avx512, avx2 or portable; using what the CPU has", e);
    return 0;
}

static void resolve_loader(const opjit_config *cfg, settings *s)
{
    if (cfg->watch >= 0) {
        s->watch = cfg->watch != 0;
    } else {
        s->watch = take_bool(s, -1, "", "OPJIT_WATCH", 0, "; not watching");
        s->watch_from_env = 1;
    }
    s->discover_timeout_ms = take_ms(s, 0, "OPJIT_DISCOVER_TIMEOUT",
                                     DEFAULT_DISCOVER_TIMEOUT_MS, 1, "");
    s->cuda_archs_from = cfg->cuda_archs && *cfg->cuda_archs ? "config.cuda_archs"
                                                             : "OPJIT_CUDA_ARCHS";
    s->tiering = take_bool(s, cfg->tiering, "", "OPJIT_TIERING", 1,
                           " (1/0, true/false, yes/no, on/off); tiering stays on");
    s->tiering_asked = cfg->tiering == 1;
    s->cc_timeout_ms = take_ms(s, cfg->cc_timeout_ms, "OPJIT_CC_TIMEOUT",
                               DEFAULT_CC_TIMEOUT_MS, 1, "");
    /* 0: the CPUs online, counted by the tier when it is on (a file read
     * that a runtime without tiering does not pay for). */
    char bad[80];
    snprintf(bad, sizeof bad, "is not a number from 1 to %d; using the CPUs online",
             MAX_CC_JOBS);
    s->cc_jobs = (int)take_count(s, "OPJIT_CC_JOBS", MAX_CC_JOBS, 0, bad);
    s->cpu_level = take_cpu_level(s);
}

static void resolve_cache(const opjit_config *cfg, settings *s)
{
    s->offline = take_bool(s, cfg->offline, "cache: ", "OPJIT_OFFLINE", 0,
                           " (1/0, true/false, yes/no, on/off); compiling stays on");
    s->no_cache = cfg->no_cache == 1;
    uint64_t v;
    if (take_size(s, "cache: ", "OPJIT_CACHE_MAX_SIZE", &v, "is not a size (like 512M); using 512M"))
        s->cache_max_size = v ? v : UINT64_MAX; /* 0: no cap */
    const char *trust = getenv("OPJIT_REMOTE_TRUST"), *mode = getenv("OPJIT_REMOTE_MODE");
    s->remote_unsigned = trust && !strcmp(trust, "unsigned");
    s->remote_ro = mode && !strcmp(mode, "ro");
    const char *url = cfg->remote_cache ? cfg->remote_cache : getenv("OPJIT_REMOTE_CACHE");
    if (url && *url && mode && *mode && !s->remote_ro && strcmp(mode, "rw"))
        warn(s, "cache: OPJIT_REMOTE_MODE='%s' is not ro or rw; using rw", mode);
    s->remote_push = cfg->remote_push == 1;
    int on = url && *url; /* the remote's variables matter only with a remote */
    settings quiet = *s;
    if (!on)
        quiet.log = NULL;
    s->remote_connect_ms = (int)take_ms(&quiet, cfg->remote_connect_timeout_ms,
                                        "OPJIT_REMOTE_CONNECT_TIMEOUT", 50, 0, "cache: ");
    s->remote_timeout_ms = (int)take_ms(&quiet, cfg->remote_timeout_ms, "OPJIT_REMOTE_TIMEOUT",
                                        3000, 0, "cache: ");
    s->remote_lease_ms = (int)take_ms(&quiet, 0, "OPJIT_REMOTE_LEASE", 20000, 0, "cache: ");
    s->remote_backoff_ms = (int)take_ms(&quiet, 0, "OPJIT_REMOTE_BACKOFF", 30000, 0, "cache: ");
}

/* The strings: the config's when given, else the environment's. */
static int resolve_strings(const opjit_config *cfg, settings *s)
{
    const char *cache_dir = cfg->cache_dir;
    if (!cache_dir || !*cache_dir) {
        const char *e = getenv("OPJIT_CACHE_DIR");
        cache_dir = e && *e ? e : cache_dir;
    }
    int oom = take_str(&s->ops_path_cfg, cfg->ops_path, NULL);
    oom |= take_str(&s->ops_path_env, NULL, "OPJIT_OPS_PATH");
    oom |= take_str(&s->cuda_archs, cfg->cuda_archs && *cfg->cuda_archs ? cfg->cuda_archs : NULL,
                    "OPJIT_CUDA_ARCHS");
    oom |= take_str(&s->cc, cfg->cc, "OPJIT_CC");
    if (!oom && (!s->cc || !*s->cc))
        oom |= settings_set_str(&s->cc, "cc");
    oom |= take_str(&s->tmpdir, NULL, "TMPDIR");
    oom |= take_str(&s->path, NULL, "PATH");
    oom |= take_str(&s->cache_dir, cache_dir, NULL);
    oom |= take_str(&s->xdg_cache_home, NULL, "XDG_CACHE_HOME");
    oom |= take_str(&s->home, NULL, "HOME");
    oom |= take_str(&s->readonly_caches, cfg->readonly_caches, "OPJIT_CACHE_READONLY");
    oom |= take_str(&s->remote_url, cfg->remote_cache, "OPJIT_REMOTE_CACHE");
    oom |= take_str(&s->remote_key_file, cfg->remote_key_file, "OPJIT_REMOTE_KEY_FILE");
    return oom;
}

int settings_resolve(const opjit_config *cfg, settings *s)
{
    *s = (settings){
        .log = cfg->log, .log_ud = cfg->log_ud, .verbosity = cfg->verbosity,
        .alloc = cfg->alloc, .alloc_ud = cfg->alloc_ud,
        .pool = cfg->pool, .pool_ud = cfg->pool_ud,
        .watch_fn = cfg->watch_fn, .watch_ud = cfg->watch_ud,
    };
    if (resolve_strings(cfg, s)) {
        settings_free(s);
        return OPJIT_ENOMEM;
    }
    resolve_runtime(cfg, s);
    resolve_loader(cfg, s);
    resolve_cache(cfg, s);
    return OPJIT_OK;
}

/* Every string field of s, for copying and freeing. */
static char **strings_of(settings *s, int i)
{
    char **all[] = {&s->ops_path_cfg, &s->ops_path_env, &s->cuda_archs, &s->cc,
                    &s->tmpdir, &s->path, &s->cache_dir, &s->xdg_cache_home, &s->home,
                    &s->readonly_caches, &s->remote_url, &s->remote_key_file};
    return i < (int)(sizeof all / sizeof *all) ? all[i] : NULL;
}

int settings_copy(settings *dst, const settings *src)
{
    *dst = *src;
    char **f;
    for (int i = 0; (f = strings_of(dst, i)); i++)
        *f = NULL;
    int oom = 0;
    for (int i = 0; (f = strings_of(dst, i)); i++)
        oom |= settings_set_str(f, *strings_of((settings *)src, i));
    if (oom) {
        settings_free(dst);
        return OPJIT_ENOMEM;
    }
    return OPJIT_OK;
}

void settings_free(settings *s)
{
    char **f;
    for (int i = 0; (f = strings_of(s, i)); i++) {
        free(*f);
        *f = NULL;
    }
}

/* ---- the process's libraries ------------------------------------------------ */

static settings_libs libs;
static pthread_once_t libs_once = PTHREAD_ONCE_INIT;

/* Each variable's text, kept for the life of the process ("" unset: NULL). */
static const char *keep_env(const char *var)
{
    const char *e = getenv(var);
    return e && *e ? strdup(e) : NULL;
}

static void libs_read(void)
{
    libs.cuda_driver = keep_env("OPJIT_CUDA_DRIVER");
    libs.nvrtc = keep_env("OPJIT_NVRTC_LIBRARY");
    libs.cudnn = keep_env("OPJIT_CUDNN_LIBRARY");
    libs.cublas = keep_env("OPJIT_CUBLAS_LIBRARY");
    libs.cuda_home = keep_env("CUDA_HOME");
    libs.cuda_path = keep_env("CUDA_PATH");
    libs.ld_library_path = keep_env("LD_LIBRARY_PATH");
}

const settings_libs *settings_libs_get(void)
{
    pthread_once(&libs_once, libs_read);
    return &libs;
}

int settings_op_flag(const char *name, int dflt)
{
    int v = name ? env_bool_parse(getenv(name), dflt) : dflt;
    return v < 0 ? dflt : v;
}

int settings_half_kernel(const char **bad)
{
    static const char *const names[] = {"auto", "wide", "dot", "amx"};
    const char *e = getenv("OPJIT_HALF_KERNEL");
    int i;
    *bad = NULL;
    if (!e || !*e)
        return 0;
    for (i = 0; i < 4; i++)
        if (!strcmp(e, names[i]))
            return i; /* opjit_op.h's OPJIT_HALF_AUTO .. OPJIT_HALF_AMX, in this order */
    *bad = e;
    return -1;
}
