/* tests/test_settings.c - a runtime's settings (runtime/settings.h):
 * opjit_config and the environment resolved once at opjit_create, read by
 * every layer and never re-read; a bad variable is warned of and replaced
 * by its default; the runtimes a runtime makes for itself copy its
 * settings instead of reading the environment again. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cache/cache.h"
#include "loader/loader_int.h"
#include "opjit.h"
#include "t.h"

static const char *const vars[] = {
    "OPJIT_OFFLINE", "OPJIT_CACHE_MAX_SIZE", "OPJIT_CACHE_READONLY", "OPJIT_NUM_THREADS",
    "OPJIT_TIERING", "OPJIT_CUDA_ARCHS", "OPJIT_DISCOVER_TIMEOUT", "OPJIT_CC_TIMEOUT",
    "OPJIT_REMOTE_CACHE", "OPJIT_WATCH", NULL};

static void env_clear(void)
{
    for (int i = 0; vars[i]; i++)
        unsetenv(vars[i]);
}

typedef struct logcap {
    int nwarn;
    char all[4096];
} logcap;

static void logcb(void *ud, int level, const char *msg)
{
    logcap *lc = ud;
    if (level == OPJIT_LOG_WARN)
        lc->nwarn++;
    size_t n = strlen(lc->all);
    snprintf(lc->all + n, sizeof lc->all - n, "%s\n", msg);
}

static opjit_runtime *make(opjit_config *cfg, logcap *lc)
{
    cfg->tiering = cfg->tiering == -1 ? 0 : cfg->tiering;
    cfg->log = logcb;
    cfg->log_ud = lc;
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(cfg, &rt) == OPJIT_OK && rt);
    return rt;
}

/* What the environment says at opjit_create reaches every layer. */
static void test_environment_resolved(void)
{
    env_clear();
    char ro[PATH_MAX];
    snprintf(ro, sizeof ro, "%s/settings-ro", getenv("OPJIT_CACHE_DIR"));
    mkdir(getenv("OPJIT_CACHE_DIR"), 0700);
    mkdir(ro, 0700);
    setenv("OPJIT_OFFLINE", "yes", 1);
    setenv("OPJIT_CACHE_MAX_SIZE", "3M", 1);
    setenv("OPJIT_CACHE_READONLY", ro, 1);
    setenv("OPJIT_NUM_THREADS", "3", 1);
    setenv("OPJIT_CUDA_ARCHS", "sm_80", 1);
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    logcap lc = {0};
    opjit_runtime *rt = make(&cfg, &lc);
    if (!rt)
        return;
    cache *c = rt->loader->cache;
    CHECK(cache_offline(c) == 1);
    CHECK(cache_max_size(c) == 3ull << 20);
    CHECK(cache_readonly_count(c) == 1);
    int n = 0;
    CHECK(opjit_num_threads_get(rt, &n) == OPJIT_OK && n == 3);
    char archs[256];
    int dflt = 0;
    CHECK(cu_resolve_archs(rt->loader, archs, sizeof archs, &dflt) == OPJIT_OK);
    CHECK(!strcmp(archs, "sm_80") && dflt == 0);
    CHECKF(lc.nwarn == 0, "warnings: %s", lc.all);
    opjit_destroy(rt);
    env_clear();
}

/* The config wins over the environment. */
static void test_config_wins(void)
{
    env_clear();
    setenv("OPJIT_OFFLINE", "1", 1);
    setenv("OPJIT_NUM_THREADS", "3", 1);
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.offline = 0;
    cfg.num_threads = 2;
    logcap lc = {0};
    opjit_runtime *rt = make(&cfg, &lc);
    if (!rt)
        return;
    CHECK(cache_offline(rt->loader->cache) == 0);
    int n = 0;
    CHECK(opjit_num_threads_get(rt, &n) == OPJIT_OK && n == 2);
    opjit_destroy(rt);
    env_clear();
}

/* A bad variable: one warning naming it, and its default. */
static void test_bad_values_warned(void)
{
    env_clear();
    setenv("OPJIT_CACHE_MAX_SIZE", "lots", 1);
    setenv("OPJIT_TIERING", "maybe", 1);
    setenv("OPJIT_DISCOVER_TIMEOUT", "soon", 1);
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    logcap lc = {0};
    opjit_runtime *rt = make(&cfg, &lc);
    if (!rt)
        return;
    CHECK(cache_max_size(rt->loader->cache) == 512ull << 20);
    CHECK(rt->set.tiering == 0); /* make() asked for none */
    CHECK(rt->set.discover_timeout_ms == 60000);
    CHECKF(lc.nwarn == 2, "warnings: %s", lc.all);
    CHECK_STR_CONTAINS(lc.all, "OPJIT_CACHE_MAX_SIZE='lots'");
    CHECK_STR_CONTAINS(lc.all, "OPJIT_DISCOVER_TIMEOUT='soon'");
    opjit_destroy(rt);

    cfg.tiering = -1; /* now from the environment: on, warned */
    cfg.log = logcb;
    memset(&lc, 0, sizeof lc);
    rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    CHECK(rt && rt->set.tiering == 1);
    CHECK_STR_CONTAINS(lc.all, "OPJIT_TIERING='maybe' is not a boolean");
    opjit_destroy(rt);
    env_clear();
}

/* Read once: the environment changed after opjit_create changes nothing
 * the runtime does (the architectures of a .cu, discovery's time limit). */
static void test_never_reread(void)
{
    env_clear();
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    logcap lc = {0};
    opjit_runtime *rt = make(&cfg, &lc);
    if (!rt)
        return;
    char before[256], after[256];
    int dflt;
    CHECK(cu_resolve_archs(rt->loader, before, sizeof before, &dflt) == OPJIT_OK);
    setenv("OPJIT_CUDA_ARCHS", "sm_1", 1); /* not an architecture */
    setenv("OPJIT_CACHE_READONLY", "/nonexistent", 1);
    CHECKF(cu_resolve_archs(rt->loader, after, sizeof after, &dflt) == OPJIT_OK,
           "%s", opjit_errmsg(rt));
    CHECK(!strcmp(before, after));
    /* A runtime of its own (discovery's child, warming) copies the
     * settings: the same caches, whatever the environment says now. */
    settings child;
    CHECK(loader_child_settings(rt->loader, &child) == OPJIT_OK);
    CHECK(child.log == NULL && child.watch == 0);
    CHECK(child.readonly_caches == NULL || strcmp(child.readonly_caches, "/nonexistent"));
    CHECK(child.cuda_archs == NULL);
    CHECK(child.cache_dir && rt->set.cache_dir && !strcmp(child.cache_dir, rt->set.cache_dir) &&
          child.cache_dir != rt->set.cache_dir);
    settings_free(&child);
    opjit_destroy(rt);
    env_clear();
}

int main(void)
{
    T_RUN(test_environment_resolved);
    T_RUN(test_config_wins);
    T_RUN(test_bad_values_warned);
    T_RUN(test_never_reread);
    return t_done();
}
