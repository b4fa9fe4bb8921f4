/* loader/why.c - `opjit cache why`: what a load would look up now, and for
 * a miss the cached entry closest to it with the inputs that differ.
 *
 * Every artifact's manifest keeps the readable inputs of its key (source,
 * local headers, opjit's ABI and op header, compiler identity, options,
 * target: loader/pipeline.c), one "name value" line each. Two entries are
 * compared line by line, a line known by its name (and, for the source
 * and headers, the file's name).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/loader_int.h"

/* The name part of an input line: "target", "header nms_common.h". */
static size_t line_name(const char *line, size_t len)
{
    const char *sp = memchr(line, ' ', len);
    if (!sp)
        return len;
    size_t n = (size_t)(sp - line);
    if ((n == 6 && !memcmp(line, "header", 6)) || (n == 6 && !memcmp(line, "source", 6))) {
        const char *sp2 = memchr(sp + 1, ' ', len - n - 1);
        if (sp2)
            return (size_t)(sp2 - line);
    }
    return n;
}

/* The line of text whose name is name[0..n), or NULL; *len its length. */
static const char *find_line(const char *text, const char *name, size_t n, size_t *len)
{
    for (const char *p = text; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (line_name(p, l) == n && !memcmp(p, name, n)) {
            *len = l;
            return p;
        }
        p = e ? e + 1 : NULL;
    }
    return NULL;
}

/* The value part of a line whose name is nl bytes long. */
static const char *line_value(const char *line, size_t len, size_t nl, int *vlen)
{
    *vlen = nl < len ? (int)(len - nl - 1) : 0;
    return nl < len ? line + nl + 1 : "";
}

/* Lines of a whose name is not in b with the same value: counted, and
 * (out not NULL) described as "NAME: now X, cached Y" from now's side. */
static int diff_lines(const char *a, const char *b, int a_is_now, char *out, size_t n,
                      size_t *k)
{
    int count = 0;
    for (const char *p = a; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t l = e ? (size_t)(e - p) : strlen(p), nl = line_name(p, l), bl = 0;
        const char *q = find_line(b, p, nl, &bl);
        /* A name on both sides is counted from now's side only. */
        if ((a_is_now && !(q && bl == l && !memcmp(p, q, l))) || (!a_is_now && !q)) {
            int la, lb;
            const char *va = line_value(p, l, nl, &la);
            const char *vb = q ? line_value(q, bl, nl, &lb) : (lb = 8, "(absent)");
            if (!a_is_now) { /* p is the cached line, absent now */
                vb = va, lb = la;
                va = "(absent)", la = 8;
            }
            count++;
            if (out && *k < n)
                *k += (size_t)snprintf(out + *k, n - *k, "%.*s: now %.*s, cached %.*s\n",
                                       (int)nl, p, la, va, lb, vb);
        }
        p = e ? e + 1 : NULL;
    }
    return count;
}

/* How many input names differ between now and cached; the lines in out. */
static int inputs_diff(const char *now, const char *cached, char *out, size_t n)
{
    size_t k = 0;
    if (out && n)
        out[0] = '\0';
    return diff_lines(now, cached, 1, out, n, &k) + diff_lines(cached, now, 0, out, n, &k);
}

typedef struct closest {
    const char *source_name, *tier, *now;
    int best;          /* fewest differences so far; -1: none */
    int64_t created;
    char key[40];
    char *inputs;      /* the best entry's, malloc'd */
} closest;

static int consider(void *ud, const cache_entry_info *e)
{
    closest *c = ud;
    if (!e->inputs || !e->source_name || !e->tier || strcmp(e->source_name, c->source_name) ||
        strcmp(e->tier, c->tier))
        return 0;
    int d = inputs_diff(c->now, e->inputs, NULL, 0);
    if (c->best >= 0 && (d > c->best || (d == c->best && e->created <= c->created)))
        return 0;
    char *copy = strdup(e->inputs);
    if (!copy)
        return 0;
    free(c->inputs);
    c->inputs = copy;
    c->best = d;
    c->created = e->created;
    snprintf(c->key, sizeof c->key, "%s", e->key);
    return 0;
}

typedef struct why_run {
    opjit_runtime *rt;
    const char *arch;
    int (*fn)(void *ud, const opjit_cache_why_report *w);
    void *ud;
    int stopped;
    int sources; /* seen */
} why_run;

/* One artifact: describe it, find the closest entry on a miss, report. */
static int why_artifact(why_run *w, const source *s, const jit_compiler *jc, unsigned half,
                        const char *target)
{
    loader *l = w->rt->loader;
    pipeline_get_args a = {s, jc, half, target, 0};
    pipeline_request *r = malloc(sizeof *r);
    char note[1024], *differs = malloc(8192);
    int cached = 0, rc = r && differs ? pipeline_describe(&l->pipe, &a, r, &cached, note,
                                                           sizeof note) : OPJIT_ENOMEM;
    closest c = {.source_name = s->name, .tier = jc->name, .best = -1};
    if (!rc && !cached) {
        c.now = r->inputs;
        char err[256];
        cache_foreach(l->cache, consider, &c, err, sizeof err);
        if (c.inputs)
            inputs_diff(r->inputs, c.inputs, differs, 8192);
    }
    if (!rc) {
        opjit_cache_why_report out = {
            .source = s->path, .compiler = jc->name, .target = target, .key = r->req.key.hex,
            .cached = cached, .inputs = r->inputs, .note = note[0] ? note : NULL,
            .closest_key = c.inputs ? c.key : NULL, .closest_created = c.created,
            .differs = c.inputs ? differs : NULL,
        };
        w->stopped = w->fn(w->ud, &out) != 0;
    }
    free(c.inputs);
    free(differs);
    free(r);
    return rc ? rt_error(w->rt, rc, "out of memory") : OPJIT_OK;
}

/* Every artifact a load of the source at path would use. */
static int why_source(void *ud, const char *path)
{
    why_run *w = ud;
    loader *l = w->rt->loader;
    source s;
    w->sources++;
    int rc = source_read(l, path, &s);
    if (rc)
        return rc;
    unsigned host = s.device == OPJIT_CUDA ? JIT_CU_HOST : JIT_C;
    int defaulted;
    if (s.device == OPJIT_CUDA && !w->arch)
        rc = cu_resolve_archs(l, l->archs, sizeof l->archs, &defaulted);
    else if (w->arch)
        snprintf(l->archs, sizeof l->archs, "%s", w->arch);
    for (int i = 0; !rc && !w->stopped && jit_compilers[i]; i++) {
        const jit_compiler *jc = jit_compilers[i];
        unsigned half = jc->halves & (host | (s.device == OPJIT_CUDA ? JIT_CU_DEVICE : 0));
        if (!half || (jc->background && !l->rt->set.tiering))
            continue;
        char targets[1024], *save = NULL;
        jc->targets(&l->pipe.set, targets, sizeof targets);
        for (char *t = strtok_r(targets, ",", &save); t && !rc && !w->stopped;
             t = strtok_r(NULL, ",", &save)) {
            rc = why_artifact(w, &s, jc, half, t);
            if (half != JIT_CU_DEVICE)
                break; /* host code: the target a load builds */
        }
    }
    source_free(&s);
    return rc ? rc : w->stopped;
}

int opjit_cache_why(opjit_runtime *rt, const char *spec, const char *arch,
                    int (*fn)(void *ud, const opjit_cache_why_report *w), void *ud)
{
    if (!rt || !spec || !*spec || !fn)
        return rt_error(rt, OPJIT_EINVAL, "opjit_cache_why: NULL or empty argument");
    why_run w = {rt, arch && *arch ? arch : NULL, fn, ud, 0, 0};
    pthread_mutex_lock(&rt->loader->lock); /* l->archs */
    int rc = loader_is_path_spec(spec) ? why_source(&w, spec)
                                       : loader_each_source(rt, spec, why_source, &w);
    pthread_mutex_unlock(&rt->loader->lock);
    if (w.stopped)
        rc = OPJIT_OK;
    if (!rc && !w.sources)
        return rt_error(rt, OPJIT_ENOTFOUND, "no source for op '%s' on the search path", spec);
    return rc;
}
