/* loader/admin.c - what the opjit command does, as public API: the search
 * path and its sources (opjit_ops_path, opjit_sources), warming the cache
 * (opjit_warm) and administering it (opjit_cache_*).
 *
 * Nothing here prints: results go back as structs and callbacks, errors as
 * a status and opjit_errmsg(rt). Warming loads every source in a private
 * runtime of its own (as discovery does in a child), so the host's runtime
 * never has anything loaded into it. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/loader_int.h"

/* Where this file reaches into the loader: its cache, its search path, and
 * the settings it was made with (admin_warm_settings). */
static cache *admin_cache(opjit_runtime *rt) { return rt->loader->cache; }

const char *opjit_ops_path(opjit_runtime *rt) { return rt ? loader_ops_path(rt->loader) : ""; }

/* ---- a list of unique strings ---------------------------------------------- */

typedef struct admin_strs {
    char **v;
    int n, cap;
} admin_strs;

static int admin_strs_has(const admin_strs *l, const char *s, size_t len)
{
    for (int i = 0; i < l->n; i++)
        if (strlen(l->v[i]) == len && !memcmp(l->v[i], s, len))
            return 1;
    return 0;
}

/* Add the first len bytes of s unless already there. 0, or -1 (no memory). */
static int admin_strs_add(admin_strs *l, const char *s, size_t len)
{
    if (admin_strs_has(l, s, len))
        return 0;
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        char **v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strndup(s, len)))
        return -1;
    l->n++;
    return 0;
}

static void admin_strs_free(admin_strs *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int admin_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* ---- sources on the search path ------------------------------------------- */

/* The source file names of dir (of op name when not NULL), sorted. */
static int admin_dir_sources(const char *dir, const char *name, admin_strs *files)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0; /* a directory that is not there has no sources */
    struct dirent *de;
    int rc = 0;
    while (!rc && (de = readdir(d))) {
        size_t stem = loader_source_stem(de->d_name);
        if (stem && (!name || (strlen(name) == stem && !strncmp(de->d_name, name, stem))))
            rc = admin_strs_add(files, de->d_name, strlen(de->d_name));
    }
    closedir(d);
    if (files->n > 1)
        qsort(files->v, (size_t)files->n, sizeof *files->v, admin_cmp);
    return rc;
}

int opjit_sources(opjit_runtime *rt, const char *name, int (*fn)(void *ud, const char *path),
                  void *ud)
{
    if (!rt || !fn || (name && (!*name || strchr(name, '/'))))
        return rt_error(rt, OPJIT_EINVAL, "opjit_sources: NULL argument or a bad op name");
    admin_strs dirs = {0};
    int stop = 0, rc = OPJIT_OK;
    for (const char *p = opjit_ops_path(rt); *p && !stop && !rc;) {
        size_t n = strcspn(p, ":");
        admin_strs files = {0};
        char dir[PATH_MAX], path[PATH_MAX + NAME_MAX + 2];
        snprintf(dir, sizeof dir, "%.*s", (int)n, p);
        if (n && !admin_strs_has(&dirs, p, n) &&
            (admin_strs_add(&dirs, p, n) || admin_dir_sources(dir, name, &files)))
            rc = rt_error(rt, OPJIT_ENOMEM, "opjit_sources: out of memory");
        for (int i = 0; i < files.n && !stop; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, files.v[i]);
            stop = fn(ud, path);
        }
        admin_strs_free(&files);
        p += n + (p[n] == ':');
    }
    admin_strs_free(&dirs);
    return rc;
}

/* ---- warming ----------------------------------------------------------------- */

typedef struct admin_warm {
    opjit_runtime *rt;
    const opjit_warm_options *opts;
    int (*fn)(void *ud, const opjit_warm_event *ev);
    void *ud;
    opjit_warm_result res;
    admin_strs files;
    int found;           /* sources the current name has */
    int oom;
    int cuda_wanted;     /* architectures asked for: a .cu without NVRTC fails */
    int first_status;    /* of the first failure */
    char first_msg[PATH_MAX + 1024];
    char msg[PATH_MAX + 1024]; /* the current event's message */
} admin_warm;

static int admin_warm_add(void *ud, const char *path)
{
    admin_warm *w = ud;
    w->found++;
    if (admin_strs_add(&w->files, path, strlen(path)) != 0)
        w->oom = 1;
    return w->oom;
}

static void admin_warm_fail(admin_warm *w, int status, const char *msg)
{
    if (!w->first_status) {
        w->first_status = status;
        snprintf(w->first_msg, sizeof w->first_msg, "%s", msg);
    }
}

/* An op name with no source: reported at once. 1 when fn says stop. */
static int admin_warm_nosource(admin_warm *w, const char *name)
{
    opjit_warm_event ev = {.done = 1, .index = -1, .path = name,
                           .result = OPJIT_WARM_NOSOURCE, .status = OPJIT_ENOTFOUND,
                           .message = w->msg};
    snprintf(w->msg, sizeof w->msg, "no source for op '%s' on the search path (%s)", name,
             opjit_ops_path(w->rt));
    w->res.nosource++;
    admin_warm_fail(w, OPJIT_ENOTFOUND, w->msg);
    return w->fn && w->fn(w->ud, &ev);
}

/* The sources the options name, into w->files. OPJIT_OK, an error
 * status, or -1 when fn asked to stop. */
static int admin_warm_targets(admin_warm *w)
{
    const opjit_warm_options *o = w->opts;
    int rc = OPJIT_OK;
    if (o->ntargets <= 0)
        rc = opjit_sources(w->rt, NULL, admin_warm_add, w);
    for (int i = 0; i < o->ntargets && !rc && !w->oom; i++) {
        const char *t = o->targets[i];
        w->found = 0;
        if (!t || !*t)
            rc = rt_error(w->rt, OPJIT_EINVAL, "opjit_warm: an empty target");
        else if (loader_is_path_spec(t))
            admin_warm_add(w, t);
        else
            rc = opjit_sources(w->rt, t, admin_warm_add, w);
        if (!rc && !w->oom && !w->found && admin_warm_nosource(w, t))
            rc = -1;
    }
    if (w->oom)
        rc = rt_error(w->rt, OPJIT_ENOMEM, "opjit_warm: out of memory");
    return rc;
}

/* The settings of the private runtime that warms one source: the host's,
 * with its log, and the options of this warm. OPJIT_OK or OPJIT_ENOMEM. */
static int admin_warm_settings(const admin_warm *w, settings *set)
{
    const opjit_runtime *rt = w->rt;
    if (loader_child_settings(rt->loader, set))
        return OPJIT_ENOMEM;
    set->log = rt->log;
    set->log_ud = rt->log_ud;
    set->verbosity = rt->verbosity;
    set->tiering = set->tiering_asked = w->opts->opt ? 1 : 0;
    const char *archs = w->opts->cuda_archs;
    int oom = w->opts->cc && *w->opts->cc && settings_set_str(&set->cc, w->opts->cc);
    if (archs && *archs && !oom) {
        oom = settings_set_str(&set->cuda_archs, archs);
        set->cuda_archs_from = "config.cuda_archs";
    }
    set->remote_push = w->opts->remote == 1;
    if (oom)
        settings_free(set);
    return oom ? OPJIT_ENOMEM : OPJIT_OK;
}

static int admin_is_cu(const char *path)
{
    size_t n = strlen(path);
    return n > 3 && !strcmp(path + n - 3, ".cu");
}

/* What warming a source must leave in the cache: every artifact a load
 * would use now (cache why's reports). Counts those no layer holds, and
 * names the first in msg. */
typedef struct admin_missing {
    int n;
    char first[256];
    char compilers[128]; /* of those missing, each once: "tcc, opt" */
} admin_missing;

static int admin_missing_one(void *ud, const opjit_cache_why_report *r)
{
    admin_missing *m = ud;
    if (r->cached)
        return 0;
    if (!m->n++)
        snprintf(m->first, sizeof m->first, "its %s code for %s (key %s)", r->compiler,
                 r->target, r->key);
    size_t k = strlen(m->compilers), c = strlen(r->compiler);
    int seen = 0;
    for (const char *p = m->compilers; (p = strstr(p, r->compiler)); p += c)
        seen |= (p == m->compilers || p[-1] == ' ') && (p[c] == ',' || !p[c]);
    if (!seen)
        snprintf(m->compilers + k, sizeof m->compilers - k, "%s%s", k ? ", " : "", r->compiler);
    return 0;
}

static int admin_missing_count(opjit_runtime *child, const char *path, admin_missing *m)
{
    memset(m, 0, sizeof *m);
    return opjit_cache_why(child, path, NULL, admin_missing_one, m) ? -1 : m->n;
}

/* Warm one source in a runtime of its own; fills ev. A source counts as
 * compiled when something it needs was missing before, and fails when
 * something is still missing after (a full or unwritable cache: the load
 * worked, but warming is for the next process). */
static void admin_warm_one(admin_warm *w, const char *path, opjit_warm_event *ev)
{
    settings set;
    opjit_load_info info = {.size = sizeof info};
    opjit_runtime *child = NULL;
    double t0 = loader_now_ms();
    admin_missing before = {0}, after = {0};
    int s = admin_warm_settings(w, &set);
    if (!s) {
        s = loader_runtime_new(&set, &child);
        settings_free(&set);
    }
    int missing = s ? 0 : admin_missing_count(child, path, &before);
    if (!s)
        s = opjit_load_file(child, path, NULL, &info);
    if (!s && w->opts->opt)
        s = opjit_wait(child);
    if (!s && admin_missing_count(child, path, &after) > 0) {
        s = rt_error(child, OPJIT_EIO, "%s: loaded, but the cache does not hold %s%s "
                     "(is it full or read-only? see the warnings)", path, after.first,
                     after.n > 1 ? " and more" : "");
    }
    ev->ms = loader_now_ms() - t0;
    ev->status = s;
    const char *msg = !s ? (missing > 0 ? before.compilers : "")
                      : child ? opjit_errmsg(child) : opjit_errstr(s);
    snprintf(w->msg, sizeof w->msg, "%s", msg);
    if (s == OPJIT_EDEVICE && !w->cuda_wanted && admin_is_cu(path))
        ev->result = OPJIT_WARM_SKIPPED;
    else if (s)
        ev->result = OPJIT_WARM_FAILED;
    else
        ev->result = missing || !info.cache_hit ? OPJIT_WARM_COMPILED : OPJIT_WARM_HIT;
    loader_runtime_free(child);
}

/* A source warmed earlier in this run whose artifacts a later one pushed
 * out (the cache's size limit) is a failure after all: reported again. */
static void admin_warm_recheck(admin_warm *w, const int *result)
{
    if (!w->res.hits && !w->res.compiled)
        return;
    settings set;
    opjit_runtime *child = NULL;
    if (admin_warm_settings(w, &set))
        return;
    int rc = loader_runtime_new(&set, &child);
    settings_free(&set);
    if (rc)
        return;
    for (int i = 0; i < w->files.n; i++) {
        admin_missing m;
        if ((result[i] != OPJIT_WARM_HIT && result[i] != OPJIT_WARM_COMPILED) ||
            admin_missing_count(child, w->files.v[i], &m) <= 0)
            continue;
        opjit_warm_event ev = {.done = 1, .index = i, .total = w->files.n,
                               .path = w->files.v[i], .result = OPJIT_WARM_FAILED,
                               .status = OPJIT_EIO, .message = w->msg};
        snprintf(w->msg, sizeof w->msg, "%s: warmed, then pushed out of the cache by the "
                 "sources after it: the cache's size limit is too small for them all", ev.path);
        int *was = result[i] == OPJIT_WARM_COMPILED ? &w->res.compiled : &w->res.hits;
        (*was)--;
        w->res.failed++;
        admin_warm_fail(w, OPJIT_EIO, w->msg);
        if (w->fn && w->fn(w->ud, &ev))
            break;
    }
    loader_runtime_free(child);
}

/* Warm every source in w->files, reporting each before and after. */
static void admin_warm_all(admin_warm *w)
{
    opjit_warm_event ev;
    /* each source's result, for the recheck (none without the memory) */
    int stop = 0, *result = calloc((size_t)w->files.n + 1, sizeof *result);
    for (int i = 0; i < w->files.n && !stop; i++) {
        memset(&ev, 0, sizeof ev);
        ev.index = i;
        ev.total = w->files.n;
        ev.path = w->files.v[i];
        ev.message = "";
        if (w->fn && w->fn(w->ud, &ev))
            break;
        admin_warm_one(w, ev.path, &ev);
        ev.done = 1;
        ev.message = w->msg;
        int *count[] = {&w->res.hits, &w->res.compiled, &w->res.skipped, &w->res.failed};
        (*count[ev.result])++;
        if (result)
            result[i] = (int)ev.result;
        w->res.sources++;
        if (ev.result == OPJIT_WARM_FAILED)
            admin_warm_fail(w, ev.status, w->msg);
        stop = w->fn && w->fn(w->ud, &ev);
    }
    if (!stop && result)
        admin_warm_recheck(w, result);
    free(result);
}

int opjit_warm(opjit_runtime *rt, const opjit_warm_options *opts,
               int (*fn)(void *ud, const opjit_warm_event *ev), void *ud, opjit_warm_result *res)
{
    int rc;
    opjit_warm_options mine = {.size = sizeof mine};
    char err[256];
    if (!rt)
        return OPJIT_EINVAL;
    if (res && (rc = abi_out_check_rt(rt, "opjit_warm", res, ABI_MIN_WARM_RESULT,
                                      "opjit_warm_result")))
        return rc;
    if (res)
        abi_out(res, &(opjit_warm_result){.size = sizeof(opjit_warm_result)},
                sizeof(opjit_warm_result));
    if (opts && (rc = abi_in(&mine, sizeof mine, opts, ABI_MIN_WARM_OPTIONS,
                             "opjit_warm_options", err, sizeof err)))
        return rt_error(rt, rc, "opjit_warm: %s", err);
    opts = &mine;
    admin_warm *w = calloc(1, sizeof *w);
    if (!w)
        return rt_error(rt, OPJIT_ENOMEM, "opjit_warm: out of memory");
    const char *own = rt->set.cuda_archs; /* config, else $OPJIT_CUDA_ARCHS */
    if (opts->remote && !cache_remote_enabled(admin_cache(rt))) {
        free(w);
        return rt_error(rt, OPJIT_EINVAL, "opjit_warm: no remote cache in use (set "
                        "OPJIT_REMOTE_CACHE and a fleet key; see the warnings)");
    }
    *w = (admin_warm){.rt = rt, .opts = opts, .fn = fn, .ud = ud};
    w->cuda_wanted = (opts->cuda_archs && *opts->cuda_archs) || (own && *own);
    w->res.size = sizeof w->res;
    double t0 = loader_now_ms();
    rc = admin_warm_targets(w);
    if (rc == OPJIT_OK)
        admin_warm_all(w);
    w->res.seconds = (loader_now_ms() - t0) / 1e3;
    /* rc > 0: the sources could not be listed; that status and message stand. */
    if (rc <= 0 && w->res.failed)
        rc = rt_error(rt, w->first_status, "%d of %d sources failed to warm; the first: %s",
                      w->res.failed, w->res.sources, w->first_msg);
    else if (rc <= 0)
        rc = w->first_status ? rt_error(rt, w->first_status, "%s", w->first_msg) : OPJIT_OK;
    if (res)
        abi_out(res, &w->res, sizeof w->res);
    admin_strs_free(&w->files);
    free(w);
    return rc;
}

/* ---- the cache ------------------------------------------------------------------ */

typedef struct admin_walk {
    int (*fn)(void *ud, const opjit_cache_entry *e);
    void *ud;
} admin_walk;

static int admin_entry(void *ud, const cache_entry_info *in)
{
    admin_walk *w = ud;
    opjit_cache_entry e = {
        .key = in->key, .dir = in->dir, .layer = in->layer, .layer_dir = in->layer_dir,
        .op_name = in->op_name, .source_name = in->source_name, .compiler = in->compiler,
        .options = in->options, .target = in->target, .tier = in->tier, .size = in->size,
        .created = in->created, .last_use = in->last_use, .nartifacts = in->nartifacts,
        .problem = in->problem,
    };
    return w->fn ? w->fn(w->ud, &e) : 0;
}

/* opjit_cache_list (walk: cache_foreach) and opjit_cache_remote_list. */
static int admin_list(opjit_runtime *rt, const char *name,
                      int (*walk)(cache *, cache_entry_fn, void *, char *, size_t),
                      int (*fn)(void *ud, const opjit_cache_entry *e), void *ud)
{
    if (!rt || !fn)
        return rt_error(rt, OPJIT_EINVAL, "%s: NULL argument", name);
    admin_walk w = {fn, ud};
    char err[1024];
    int rc = walk(admin_cache(rt), admin_entry, &w, err, sizeof err);
    return rc ? rt_error(rt, rc, "%s", err) : OPJIT_OK;
}

int opjit_cache_list(opjit_runtime *rt, int (*fn)(void *ud, const opjit_cache_entry *e),
                     void *ud)
{
    return admin_list(rt, "opjit_cache_list", cache_foreach, fn, ud);
}

int opjit_cache_info_get(opjit_runtime *rt, opjit_cache_info *host)
{
    opjit_cache_info *info = host;
    if (!rt || !info)
        return rt_error(rt, OPJIT_EINVAL, "opjit_cache_info_get: NULL argument");
    int rc = abi_out_check_rt(rt, "opjit_cache_info_get", info, ABI_MIN_CACHE_INFO,
                              "opjit_cache_info");
    if (rc)
        return rc;
    opjit_cache_info mine = {.size = sizeof mine};
    abi_out(info, &mine, sizeof mine);
    cache *c = admin_cache(rt);
    cache_totals t;
    char err[1024];
    if ((rc = cache_get_totals(c, &t, err, sizeof err)))
        return rt_error(rt, rc, "%s", err);
    info = &mine;
    info->dir = cache_root_dir(c);
    info->writable = cache_writable(c);
    info->offline = cache_offline(c);
    info->max_size = cache_max_size(c);
    info->nreadonly = cache_readonly_count(c);
    info->entries = t.entries;
    info->bytes = t.bytes;
    info->readonly_entries = t.ro_entries;
    info->readonly_bytes = t.ro_bytes;
    info->tmp_dirs = t.tmp_dirs;
    abi_out(host, &mine, sizeof mine);
    return OPJIT_OK;
}

int opjit_cache_remote_list(opjit_runtime *rt, int (*fn)(void *ud, const opjit_cache_entry *e),
                            void *ud)
{
    return admin_list(rt, "opjit_cache_remote_list", cache_remote_foreach, fn, ud);
}

int opjit_cache_remote_info_get(opjit_runtime *rt, opjit_cache_remote_info *host)
{
    if (!rt || !host)
        return rt_error(rt, OPJIT_EINVAL, "opjit_cache_remote_info_get: NULL argument");
    int rc = abi_out_check_rt(rt, "opjit_cache_remote_info_get", host, ABI_MIN_REMOTE_INFO,
                              "opjit_cache_remote_info");
    if (rc)
        return rc;
    cache_remote_info r;
    cache_remote_info_get(admin_cache(rt), &r);
    opjit_cache_remote_info mine, *info = &mine;
    *info = (opjit_cache_remote_info){
        .size = sizeof mine, .url = r.url, .enabled = r.enabled, .readonly = r.readonly, .is_signed = r.is_signed,
        .reachable = r.reachable, .entries = r.entries, .bytes = r.bytes,
        .used_memory = r.used_memory, .maxmemory = r.maxmemory,
    };
    snprintf(info->policy, sizeof info->policy, "%s", r.policy);
    abi_out(host, &mine, sizeof mine);
    return OPJIT_OK;
}

const char *opjit_cache_readonly_dir(opjit_runtime *rt, int i)
{
    if (!rt || i < 0 || i >= cache_readonly_count(admin_cache(rt)))
        return NULL;
    return cache_readonly_dir(admin_cache(rt), i);
}

int opjit_cache_verify(opjit_runtime *rt, int repair,
                       int (*fn)(void *ud, const opjit_cache_entry *e), void *ud, int *ndamaged)
{
    int nd = 0;
    if (ndamaged)
        *ndamaged = 0;
    if (!rt)
        return OPJIT_EINVAL;
    admin_walk w = {fn, ud};
    char err[1024];
    int rc = cache_verify_all(admin_cache(rt), repair, admin_entry, &w, &nd, err, sizeof err);
    if (ndamaged)
        *ndamaged = nd;
    return rc ? rt_error(rt, rc, "%s", err) : OPJIT_OK;
}

static int admin_prune(opjit_runtime *rt, int clear, uint64_t max_bytes,
                       opjit_cache_prune_result *out)
{
    cache_prune_result r;
    char err[1024];
    if (!rt)
        return OPJIT_EINVAL;
    int rc = out ? abi_out_check_rt(rt, clear ? "opjit_cache_clear" : "opjit_cache_prune", out,
                                    ABI_MIN_PRUNE_RESULT, "opjit_cache_prune_result")
                 : OPJIT_OK;
    if (rc)
        return rc;
    if (out)
        abi_out(out, &(opjit_cache_prune_result){.size = sizeof *out},
                sizeof(opjit_cache_prune_result));
    rc = clear ? cache_clear(admin_cache(rt), &r, err, sizeof err)
                   : cache_prune(admin_cache(rt), max_bytes, &r, err, sizeof err);
    if (rc)
        return rt_error(rt, rc, "%s", err);
    if (out)
        abi_out(out, &(opjit_cache_prune_result){.size = sizeof *out, .removed = r.removed,
                                                 .removed_bytes = r.removed_bytes,
                                                 .busy = r.busy, .tmp_removed = r.tmp_removed,
                                                 .bytes_after = r.bytes_after},
                sizeof(opjit_cache_prune_result));
    return OPJIT_OK;
}

int opjit_cache_prune(opjit_runtime *rt, uint64_t max_bytes, opjit_cache_prune_result *r)
{
    return admin_prune(rt, 0, max_bytes, r);
}

int opjit_cache_clear(opjit_runtime *rt, opjit_cache_prune_result *r)
{
    return admin_prune(rt, 1, 0, r);
}

int opjit_parse_size(const char *text, uint64_t *bytes)
{
    uint64_t v;
    if (!text || cache_parse_size(text, &v) != 0)
        return OPJIT_EINVAL;
    if (bytes)
        *bytes = v;
    return OPJIT_OK;
}
