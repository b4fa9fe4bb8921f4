/* loader/tier.c - the optimizing tier.
 *
 * libtcc makes an op callable within milliseconds but its code runs about
 * as fast as gcc -O0. When a system C compiler is found, each source loaded
 * through libtcc is compiled again in the background with -O2 into the
 * cache, and its kernels are swapped in atomically when ready (calls in
 * flight finish on the libtcc code, which stays mapped).
 *
 * Keys. The optimized artifact's key holds the source inputs, the compiler
 * identity (its --version output and path) and the CPU level it targets
 * (-march=x86-64-v3/v2/x86-64), so it is never loaded on a CPU that lacks
 * those features: a machine only looks for levels it supports. Running
 * `cc --version` costs milliseconds, too much for a load, so loads find
 * the artifact through small index entries whose artifact names the full
 * key: on a machine with a compiler, one keyed by that compiler's file
 * (path, inode, size, modification time: another compiler or an upgrade is
 * a miss, and the background compile then checks the full key); on a
 * machine without one, one keyed without any compiler, which is how a
 * deployment uses the optimized code shipped in a read-only cache
 * (`opjit warm --opt`).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jit/jit.h"
#include "loader/loader_int.h"
#include "opjit_build_config.h"
#include "runtime/env.h"

#define OPT_OPTIONS "-O2 -ffp-contract=off -fPIC -shared -std=gnu99 -DFORCE_OPENBLAS_COMPLEX_STRUCT -DOPJIT_TIER_OPT -lm"

typedef struct tier_job {
    char *path; /* as given: diagnostics and module source name */
    source src; /* text owned by the job */
    cache_key tcc_key;
    struct tier_job *next;
} tier_job;

struct tier_state {
    int wanted;  /* optimized code may serve (found in a cache or built) */
    int enabled; /* ... and may be built here: wanted and a compiler found */
    char cc[PATH_MAX];  /* resolved compiler path, "" when none */
    char identity[64];  /* hash of `cc --version` + path, "" until known */
    char file_id[64];   /* hash of the compiler's file: path, inode, size, mtime */
    long timeout_ms;    /* of one compile */
    const char *levels[4]; /* CPU levels this machine runs, best first */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    tier_job *jobs, *jobs_tail;
    int busy; /* a job is running */
    int stop;
    int started;
    int first_error;
    char first_msg[1024]; /* its message, for opjit_wait */
    pthread_t worker;
};

/* ---- the machine: compiler and CPU level ---------------------------------- */

static void cpu_levels(tier_state *t)
{
    int i = 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("bmi2"))
        t->levels[i++] = "x86-64-v3";
    if (__builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("popcnt"))
        t->levels[i++] = "x86-64-v2";
    t->levels[i++] = "x86-64";
#else
    t->levels[i++] = "native-baseline";
#endif
    t->levels[i] = NULL;
}

#define TIER_DEFAULT_TIMEOUT_MS 120000

/* The compiler's identity: a hash of what `cc --version` says and where it
 * lives. Computed once, in the worker (it forks). */
static int compiler_identity(loader *l, tier_state *t)
{
    if (t->identity[0])
        return OPJIT_OK;
    int rc = loader_scratch(l);
    if (rc)
        return rc;
    size_t len;
    char *out = jit_cc_version(t->cc, l->scratch, t->timeout_ms, &len);
    if (!out)
        return rt_error(l->rt, OPJIT_ECOMPILE, "%s --version failed", t->cc);
    cache_keygen *g = cache_keygen_new();
    if (!g) {
        free(out);
        return rt_error(l->rt, OPJIT_ENOMEM, "out of memory");
    }
    cache_keygen_add_str(g, "cc-path", t->cc);
    cache_keygen_add(g, "cc-version", out, len);
    free(out);
    cache_key k;
    cache_keygen_finish(g, &k);
    snprintf(t->identity, sizeof t->identity, "cc:%.32s", k.hex);
    return OPJIT_OK;
}

/* ---- keys ------------------------------------------------------------------ */

/* The request of s's optimized artifact at level: kind "opt" with the
 * compiler's identity, or "opt-index" keyed by compiler (a file id, or
 * NULL for the index of machines without one). */
static int opt_request(const source *s, const char *level, const char *kind,
                       const char *compiler, cache_request *req, char *compiler_buf, size_t n)
{
    cache_keygen *g = source_keygen(s);
    if (!g)
        return OPJIT_ENOMEM;
    cache_keygen_add_str(g, "tier", kind);
    cache_keygen_add_str(g, "options", OPT_OPTIONS);
    cache_keygen_add_str(g, "link-blas", source_uses_blas(s) ? "yes" : "no");
    cache_keygen_add_str(g, "target", loader_target());
    cache_keygen_add_str(g, "cpu", level);
    if (compiler)
        cache_keygen_add_str(g, "compiler", compiler);
    snprintf(compiler_buf, n, "%s", compiler ? compiler : "any C compiler");
    *req = (cache_request){
        .op_name = s->stem,
        .source_name = s->name,
        .compiler = compiler_buf,
        .options = OPT_OPTIONS,
        .target = level,
        .tier = kind,
    };
    cache_keygen_finish(g, &req->key);
    return OPJIT_OK;
}

/* Who the compiler's file is, cheaply (no process): where it resolves to
 * and that file's inode, size and modification time. */
static void compiler_file_id(tier_state *t)
{
    char real[PATH_MAX], buf[128];
    struct stat st;
    t->file_id[0] = '\0';
    if (!t->cc[0] || !realpath(t->cc, real) || stat(real, &st) != 0)
        return;
    cache_keygen *g = cache_keygen_new();
    if (!g)
        return;
    snprintf(buf, sizeof buf, "%llu %llu %lld %lld.%09ld", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino, (long long)st.st_size,
             (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    cache_keygen_add_str(g, "cc-path", t->cc);
    cache_keygen_add_str(g, "cc-real", real);
    cache_keygen_add_str(g, "cc-stat", buf);
    cache_key k;
    cache_keygen_finish(g, &k);
    snprintf(t->file_id, sizeof t->file_id, "cc-file:%.32s", k.hex);
}

int tier_lookup(loader *l, const source *s, cache_entry **out)
{
    tier_state *t = l->tier;
    *out = NULL;
    if (!t->wanted || s->device != OPJIT_CPU)
        return OPJIT_ENOTFOUND;
    /* With a compiler here, only what that compiler built serves. */
    const char *by = t->cc[0] ? t->file_id : NULL;
    if (by && !by[0])
        return OPJIT_ENOTFOUND; /* its file could not be read: compile */
    for (int i = 0; t->levels[i]; i++) {
        cache_request req;
        char comp[96];
        if (opt_request(s, t->levels[i], "opt-index", by, &req, comp, sizeof comp))
            return OPJIT_ENOMEM;
        cache_request full = req;
        full.tier = "opt";
        if (cache_index_fetch(l->cache, &req, &full, out) == OPJIT_OK)
            return OPJIT_OK;
    }
    return OPJIT_ENOTFOUND;
}

/* ---- building -------------------------------------------------------------- */

typedef struct opt_build {
    loader *l;
    const source *src;
    const char *level;
    char diag[4096];
} opt_build;

static int build_opt(void *ud, const char *dir, char *err, size_t errlen)
{
    opt_build *b = ud;
    tier_state *t = b->l->tier;
    char blas[PATH_MAX];
    snprintf(blas, sizeof blas, "%s", OPJIT_OPENBLAS_LIBRARY);
    char *slash = strrchr(blas, '/');
    if (slash)
        *slash = '\0';
    const char *defines[] = {"-DFORCE_OPENBLAS_COMPLEX_STRUCT", "-DOPJIT_TIER_OPT", NULL};
    const char *includes[] = {b->src->dir, b->l->scratch, OPJIT_DLPACK_INCLUDE_DIR,
                              OPJIT_CBLAS_INCLUDE_DIR, NULL};
    jit_cc_job job = {
        .cc = t->cc,
        .source_name = b->src->path,
        .text = b->src->text,
        .len = b->src->len,
        .march = strncmp(b->level, "x86-64", 6) ? NULL : b->level,
        .defines = defines,
        .include_dirs = includes,
        .blas_dir = source_uses_blas(b->src) ? blas : NULL,
        .dir = dir,
        .out_name = "host.so",
        .timeout_ms = t->timeout_ms,
    };
    int rc = jit_cc_compile(&job, err, errlen);
    if (!rc && !source_unchanged(b->src)) {
        snprintf(err, errlen, "a local header of %s changed since it was loaded", b->src->path);
        rc = OPJIT_ECOMPILE;
    }
    return rc;
}

static int run_job(loader *l, tier_job *job)
{
    tier_state *t = l->tier;
    opjit_runtime *rt = l->rt;
    int rc = compiler_identity(l, t);
    if (rc)
        return rc;
    const char *level = t->levels[0];
    cache_request req;
    char comp[96];
    if (opt_request(&job->src, level, "opt", t->identity, &req, comp, sizeof comp))
        return rt_error(rt, OPJIT_ENOMEM, "out of memory");
    opt_build b = {.l = l, .src = &job->src, .level = level};
    cache_entry *entry = NULL;
    int hit;
    char err[3500];
    rc = cache_fetch(l->cache, &req, build_opt, &b, &entry, &hit, err, sizeof err);
    if (rc)
        return rt_error(rt, rc, "%s: optimizing compile: %s", job->path, err);

    /* Make it findable without running the compiler, and without one. */
    const char *index_by[] = {t->file_id[0] ? t->file_id : NULL, NULL};
    for (int i = index_by[0] ? 0 : 1; i < 2; i++) {
        cache_request ireq;
        char icomp[96];
        if (!opt_request(&job->src, level, "opt-index", index_by[i], &ireq, icomp, sizeof icomp))
            cache_index_put(l->cache, &ireq, &req.key);
    }

    /* Swap in, unless the source changed since this job was queued. */
    pthread_mutex_lock(&l->lock);
    loaded *cur = loader_find_loaded(l, job->src.real);
    if (cur && !memcmp(cur->key.bytes, job->tcc_key.bytes, sizeof cur->key.bytes) &&
        strcmp(cur->tier, "opt")) {
        module *m;
        rc = load_module(l, &job->src, cache_entry_path(entry, "host.so"), "opt", &m);
        if (!rc && (rc = module_publish(rt, m)))
            module_discard(m);
        if (!rc) {
            snprintf(cur->tier, sizeof cur->tier, "opt");
            rt_log(rt, OPJIT_LOG_INFO, "%s: optimized tier (%s -O2 %s) now serves calls",
                   job->path, t->cc, level);
        }
    }
    pthread_mutex_unlock(&l->lock);
    cache_entry_release(entry);
    return rc;
}

static void job_free(tier_job *job)
{
    free(job->path);
    source_free(&job->src);
    free(job);
}

static void *worker_main(void *arg)
{
    loader *l = arg;
    tier_state *t = l->tier;
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (!t->jobs && !t->stop)
            pthread_cond_wait(&t->cond, &t->lock);
        /* On stop, queued jobs still run: a short-lived process leaves the
         * optimized code in the cache for the next one. */
        if (!t->jobs)
            break;
        tier_job *job = t->jobs;
        t->jobs = job->next;
        if (!t->jobs)
            t->jobs_tail = NULL;
        t->busy = 1;
        pthread_mutex_unlock(&t->lock);
        int rc = run_job(l, job);
        if (rc)
            rt_log(l->rt, OPJIT_LOG_WARN, "%s; libtcc code keeps serving it", opjit_errmsg(l->rt));
        job_free(job);
        pthread_mutex_lock(&t->lock);
        if (rc && !t->first_error) {
            t->first_error = rc;
            snprintf(t->first_msg, sizeof t->first_msg, "%s", opjit_errmsg(l->rt));
        }
        t->busy = 0;
        pthread_cond_broadcast(&t->cond);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

void tier_schedule(loader *l, const source *s, const cache_key *tcc_key)
{
    tier_state *t = l->tier;
    if (!t->enabled || s->device != OPJIT_CPU || cache_offline(l->cache))
        return;
    tier_job *job = calloc(1, sizeof *job);
    if (!job)
        return;
    job->src = *s;
    job->path = strdup(s->path);
    job->src.text = malloc(s->len + 1);
    if (!job->path || !job->src.text) {
        job_free(job);
        return;
    }
    memcpy(job->src.text, s->text, s->len + 1);
    job->src.path = job->path;
    job->src.name = strrchr(job->path, '/') ? strrchr(job->path, '/') + 1 : job->path;
    job->tcc_key = *tcc_key;
    pthread_mutex_lock(&t->lock);
    if (!t->started) {
        if (pthread_create(&t->worker, NULL, worker_main, l)) {
            pthread_mutex_unlock(&t->lock);
            job_free(job);
            return;
        }
        t->started = 1;
    }
    if (t->jobs_tail)
        t->jobs_tail->next = job;
    else
        t->jobs = job;
    t->jobs_tail = job;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
}

void tier_never_build(loader *l) { l->tier->enabled = 0; }

const char *tier_would_serve(loader *l, const source *s)
{
    cache_entry *e = NULL;
    if (tier_lookup(l, s, &e) != OPJIT_OK)
        return "tcc";
    cache_entry_release(e);
    return "opt";
}

int tier_wait(loader *l, char *msg, size_t n)
{
    tier_state *t = l->tier;
    pthread_mutex_lock(&t->lock);
    while (t->jobs || t->busy)
        pthread_cond_wait(&t->cond, &t->lock);
    int rc = t->first_error;
    if (n)
        snprintf(msg, n, "%s", rc ? t->first_msg : "");
    t->first_error = 0;
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int tier_create(loader *l, const opjit_config *cfg)
{
    tier_state *t = calloc(1, sizeof *t);
    if (!t)
        return OPJIT_ENOMEM;
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->cond, NULL);
    cpu_levels(t);
    int want = cfg->tiering;
    if (want < 0) {
        const char *e = getenv("OPJIT_TIERING");
        want = env_bool_parse(e, 1);
        if (want < 0) {
            rt_log(l->rt, OPJIT_LOG_WARN, "OPJIT_TIERING='%s' is not a boolean (1/0, true/false, "
                   "yes/no, on/off); tiering stays on", e);
            want = 1;
        }
    }
    const char *cc = cfg->cc ? cfg->cc : getenv("OPJIT_CC");
    if (!cc || !*cc)
        cc = "cc";
    int found = jit_cc_find(cc, t->cc, sizeof t->cc);
    if (!found)
        t->cc[0] = '\0';
    compiler_file_id(t);
    t->timeout_ms = cfg->cc_timeout_ms > 0 ? cfg->cc_timeout_ms : TIER_DEFAULT_TIMEOUT_MS;
    if (cfg->cc_timeout_ms <= 0) {
        const char *e = getenv("OPJIT_CC_TIMEOUT");
        long ms = env_seconds_parse(e, TIER_DEFAULT_TIMEOUT_MS);
        if (ms <= 0)
            rt_log(l->rt, OPJIT_LOG_WARN, "OPJIT_CC_TIMEOUT='%s' is not a positive number of "
                   "seconds; using %d", e, TIER_DEFAULT_TIMEOUT_MS / 1000);
        else
            t->timeout_ms = ms;
    }
    t->wanted = want;
    t->enabled = want && found;
    if (want && !found && cfg->tiering == 1)
        rt_log(l->rt, OPJIT_LOG_WARN, "tiering: no C compiler '%s' found; libtcc code only", cc);
    l->tier = t;
    return OPJIT_OK;
}

void tier_destroy(loader *l)
{
    tier_state *t = l->tier;
    if (!t)
        return;
    pthread_mutex_lock(&t->lock);
    t->stop = 1;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
    if (t->started)
        pthread_join(t->worker, NULL);
    while (t->jobs) {
        tier_job *j = t->jobs;
        t->jobs = j->next;
        job_free(j);
    }
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->cond);
    free(t);
    l->tier = NULL;
}

