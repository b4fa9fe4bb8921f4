/* loader/index.c - which ops each source on the search path defines, so an
 * op is found by its name in any module: opjit_load_op(rt, "rmsnorm")
 * finds llama_ops.c when its OPJIT_MODULE registers rmsnorm.
 *
 * Knowing a source's ops means running its init, which discovery does in a
 * child process with a time limit (loader/discover.c): an init that
 * crashes, exits or never returns costs that source only. The answers are
 * kept in the cache, so each version of a source is indexed once:
 *
 *  - per source, a note keyed by its digest (bytes, local headers, opjit's
 *    ABI): the ops it registers, or why they are unknown;
 *  - per directory, a note keyed by the state of its files (name, inode,
 *    size, mtime, ctime of each): every source's entry, plus the local
 *    headers its sources include from other directories, with their state.
 *
 * A warm lookup reads each directory, stats its files and reads one note:
 * no source is read, nothing is compiled. A changed file makes another
 * directory key, and the sources are looked at again (their per-source
 * notes, else discovery). A directory note is not written while a file
 * changed less than RACY_MS ago: a second edit within the file system's
 * timestamp granularity could leave the state as it was ("racily clean").
 *
 * Everything here runs with the loader's lock held, but index_source,
 * which keeps nothing in memory (the watcher indexes without it). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "loader/loader_int.h"
#include "runtime/cuda.h"

#define RACY_MS 2000
#define INDEX_MSG_MAX 300
#define INDEX_FORMAT "opjit-op-index 1"

typedef struct file_sig {
    unsigned long long dev, ino, size;
    long long mtime, ctime; /* nanoseconds */
} file_sig;

typedef struct idx_hdr {
    char *real;
    file_sig sig;
} idx_hdr;

/* One source of a directory and what it defines. */
typedef struct idx_src {
    char *file;       /* name in the directory */
    int status;       /* OPJIT_OK, or why its ops are unknown */
    char *msg;        /* "" or the reason */
    char **ops;
    int nops;
    idx_hdr *hdrs;    /* its local headers in other directories */
    int nhdrs;
    int keep;         /* the entry may be kept in the cache */
} idx_src;

typedef struct idx_dir {
    char *real;
    cache_key key;
    idx_src *srcs;
    int n;
    struct idx_dir *next;
} idx_dir;

/* The directories known in this runtime, each by its latest key. */
struct op_index {
    idx_dir *dirs;
};

/* ---- small pieces ------------------------------------------------------------ */

static file_sig sig_of(const struct stat *st)
{
    return (file_sig){(unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
                      (unsigned long long)st->st_size,
                      (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec,
                      (long long)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec};
}

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int racy(const file_sig *s, long long t0)
{
    return s->ctime >= t0 - RACY_MS * 1000000LL || s->mtime >= t0 - RACY_MS * 1000000LL;
}

static int strv_add(char ***v, int *n, const char *s, size_t len)
{
    char **nv = realloc(*v, (size_t)(*n + 1) * sizeof *nv);
    if (!nv)
        return -1;
    *v = nv;
    if (!(nv[*n] = strndup(s, len)))
        return -1;
    (*n)++;
    return 0;
}

static void src_free(idx_src *s)
{
    free(s->file);
    free(s->msg);
    for (int i = 0; i < s->nops; i++)
        free(s->ops[i]);
    free(s->ops);
    for (int i = 0; i < s->nhdrs; i++)
        free(s->hdrs[i].real);
    free(s->hdrs);
    memset(s, 0, sizeof *s);
}

static void dir_free(idx_dir *d)
{
    if (!d)
        return;
    for (int i = 0; i < d->n; i++)
        src_free(&d->srcs[i]);
    free(d->srcs);
    free(d->real);
    free(d);
}

void index_free(loader *l)
{
    if (!l->index)
        return;
    for (idx_dir *d = l->index->dirs, *next; d; d = next) {
        next = d->next;
        dir_free(d);
    }
    free(l->index);
    l->index = NULL;
}

/* A string that fits one field of a line: no tab, no newline. */
static int one_field(const char *s)
{
    return !strpbrk(s, "\t\n");
}

static int src_set_msg(idx_src *s, const char *msg)
{
    free(s->msg);
    if (!(s->msg = strndup(msg ? msg : "", INDEX_MSG_MAX)))
        return -1;
    for (char *p = s->msg; *p; p++)
        if (*p == '\t' || *p == '\n')
            *p = ' ';
    return 0;
}

static int src_add_hdr(idx_src *s, const char *real, const file_sig *sig)
{
    idx_hdr *h = realloc(s->hdrs, (size_t)(s->nhdrs + 1) * sizeof *h);
    if (!h)
        return -1;
    s->hdrs = h;
    if (!(h[s->nhdrs].real = strdup(real)))
        return -1;
    h[s->nhdrs++].sig = *sig;
    return 0;
}

/* Whether the headers of s from other directories are as they were. */
static int hdrs_valid(const idx_src *s)
{
    struct stat st;
    for (int i = 0; i < s->nhdrs; i++) {
        if (stat(s->hdrs[i].real, &st) != 0)
            return 0;
        file_sig now = sig_of(&st);
        if (memcmp(&now, &s->hdrs[i].sig, sizeof now))
            return 0;
    }
    return 1;
}

/* ---- entries as text ------------------------------------------------------------ *
 *   src <file> <status> <message>
 *   op <name>                              one per op it defines
 *   hdr <real> <dev> <ino> <size> <mtime> <ctime>
 */

static void entry_write(FILE *f, const idx_src *s)
{
    fprintf(f, "src\t%s\t%d\t%s\n", s->file, s->status, s->msg ? s->msg : "");
    for (int i = 0; i < s->nops; i++)
        fprintf(f, "op\t%s\n", s->ops[i]);
    for (int i = 0; i < s->nhdrs; i++) {
        const file_sig *g = &s->hdrs[i].sig;
        fprintf(f, "hdr\t%s\t%llu\t%llu\t%llu\t%lld\t%lld\n", s->hdrs[i].real, g->dev, g->ino,
                g->size, g->mtime, g->ctime);
    }
}

/* The text of n entries (malloc'd), or NULL. */
static char *entries_text(const idx_src *v, int n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    fprintf(f, "%s\n", INDEX_FORMAT);
    for (int i = 0; i < n; i++)
        entry_write(f, &v[i]);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* One line into the entries *v (the last one is the current source). */
static int entry_line(char *line, idx_src **v, int *n)
{
    char *f[8];
    int nf = 0;
    for (char *p = line; nf < 8; p++) {
        f[nf++] = p;
        if (!(p = strchr(p, '\t')))
            break;
        *p = '\0';
    }
    if (!strcmp(f[0], "src") && nf == 4) {
        idx_src *nv = realloc(*v, (size_t)(*n + 1) * sizeof *nv);
        if (!nv)
            return -1;
        *v = nv;
        memset(&nv[*n], 0, sizeof nv[*n]);
        nv[*n].keep = 1;
        nv[*n].status = atoi(f[2]);
        (*n)++;
        return (nv[*n - 1].file = strdup(f[1])) && !src_set_msg(&nv[*n - 1], f[3]) ? 0 : -1;
    }
    if (!*n)
        return -1;
    idx_src *s = &(*v)[*n - 1];
    if (!strcmp(f[0], "op") && nf == 2)
        return strv_add(&s->ops, &s->nops, f[1], strlen(f[1]));
    if (!strcmp(f[0], "hdr") && nf == 7) {
        file_sig g;
        g.dev = strtoull(f[2], NULL, 10), g.ino = strtoull(f[3], NULL, 10);
        g.size = strtoull(f[4], NULL, 10);
        g.mtime = strtoll(f[5], NULL, 10), g.ctime = strtoll(f[6], NULL, 10);
        return src_add_hdr(s, f[1], &g);
    }
    return -1;
}

/* Parse a note; 0, or -1 (and nothing in *v) when it is not one of ours. */
static int entries_parse(char *text, idx_src **v, int *n)
{
    *v = NULL;
    *n = 0;
    size_t fl = strlen(INDEX_FORMAT);
    if (strncmp(text, INDEX_FORMAT, fl) || text[fl] != '\n')
        return -1;
    char *next;
    for (char *line = text + fl + 1; *line; line = next) {
        if (!(next = strchr(line, '\n')))
            break;
        *next++ = '\0';
        if (entry_line(line, v, n))
            goto bad;
    }
    return 0;
bad:
    for (int i = 0; i < *n; i++)
        src_free(&(*v)[i]);
    free(*v);
    *v = NULL;
    *n = 0;
    return -1;
}

/* ---- one source ------------------------------------------------------------------ */

static void index_request(cache_request *req, const char *name, const char *src_name)
{
    *req = (cache_request){.op_name = name, .source_name = src_name,
                           .compiler = "opjit discovery", .options = "",
                           .target = jit_host_target(), .tier = "index"};
}

/* Failures worth remembering for this version of a source: it will fail
 * the same way again. */
static int lasting_status(int status)
{
    return status == OPJIT_OK || status == OPJIT_ECOMPILE || status == OPJIT_EMODULE ||
           status == OPJIT_ESCHEMA || status == OPJIT_EEXIST;
}

/* The name of an op in its schema: "rmsnorm(Tensor x) -> Tensor". */
static int took_ops(void *ud, const opjit_source_ops *src)
{
    idx_src *s = ud;
    s->status = src->status;
    if (src_set_msg(s, src->error))
        return s->keep = 0;
    for (int i = 0; i < src->nops; i++) {
        const char *sch = src->schemas[i];
        size_t len = strcspn(sch, "( \t");
        if (len && strv_add(&s->ops, &s->nops, sch, len))
            s->keep = 0;
    }
    return 0;
}

typedef struct hdr_walk {
    idx_src *s;
    const char *dir_real;
} hdr_walk;

/* A local header of another directory: kept with its state. */
static void took_header(void *ud, const char *real)
{
    hdr_walk *w = ud;
    size_t n = strlen(w->dir_real);
    if (!strncmp(real, w->dir_real, n) && real[n] == '/' && !strchr(real + n + 1, '/'))
        return; /* the directory's key covers it */
    struct stat st;
    file_sig g;
    if (stat(real, &st) != 0 || !one_field(real) ||
        (g = sig_of(&st), src_add_hdr(w->s, real, &g)))
        w->s->keep = 0;
}

/* The ops of source s from its note, else from discovery (then noted). */
static void source_ops(loader *l, source *s, idx_src *out)
{
    cache_request req;
    index_request(&req, s->stem, s->name);
    cache_keygen *g = source_keygen(s);
    cache_keygen_add_str(g, "what", "op-index");
    cache_keygen_add_str(g, "format", INDEX_FORMAT);
    cache_keygen_add_str(g, "target", jit_host_target());
    cache_keygen_finish(g, &req.key);
    char *text = NULL;
    idx_src *v = NULL;
    int n = 0;
    if (cache_note_get(l->cache, &req, "ops", &text) == OPJIT_OK &&
        entries_parse(text, &v, &n) == 0 && n == 1) {
        out->status = v[0].status;
        out->msg = v[0].msg, v[0].msg = NULL;
        out->ops = v[0].ops, v[0].ops = NULL;
        out->nops = v[0].nops, v[0].nops = 0;
    } else {
        loader_discover_one(l, s->path, took_ops, out);
        rt_log(l->rt, out->status ? OPJIT_LOG_WARN : OPJIT_LOG_DEBUG, "indexed %s: %s",
               s->path, out->status ? out->msg : "ok");
        int lasting = lasting_status(out->status) && source_unchanged(s);
        /* A .cu skipped here: the directory's key says whether CUDA runs. */
        out->keep &= lasting || out->status == OPJIT_EDEVICE;
        idx_src one = *out;
        one.nhdrs = 0; /* headers are the directory note's business */
        char *t = out->keep && lasting ? entries_text(&one, 1) : NULL;
        if (t && strlen(t) <= CACHE_NOTE_MAX)
            cache_note_put(l->cache, &req, "ops", t);
        free(t);
    }
    for (int i = 0; i < n; i++)
        src_free(&v[i]);
    free(v);
    free(text);
}

/* What the source file of directory dir_real defines, looked at afresh. */
static int source_index(loader *l, const char *dir_real, const char *file, idx_src *out)
{
    char path[PATH_MAX];
    memset(out, 0, sizeof *out);
    out->keep = 1;
    if (!(out->file = strdup(file)) ||
        (size_t)snprintf(path, sizeof path, "%s/%s", dir_real, file) >= sizeof path)
        return OPJIT_ENOMEM;
    source s;
    int rc = source_read(l, path, &s);
    if (rc) {
        out->status = rc;
        out->keep = rc == OPJIT_EINVAL; /* not a text file: it stays that way */
        return src_set_msg(out, opjit_errmsg(l->rt)) ? OPJIT_ENOMEM : OPJIT_OK;
    }
    source_ops(l, &s, out);
    hdr_walk w = {out, dir_real};
    source_each_header(&s, took_header, &w);
    source_free(&s);
    return OPJIT_OK;
}

/* ---- one directory ------------------------------------------------------------- */

typedef struct dir_file {
    char *name;
    file_sig sig;
} dir_file;

static int dir_file_cmp(const void *a, const void *b)
{
    return strcmp(((const dir_file *)a)->name, ((const dir_file *)b)->name);
}

static void files_free(dir_file *v, int n)
{
    for (int i = 0; i < n; i++)
        free(v[i].name);
    free(v);
}

/* The regular files of dir (hidden ones aside), sorted, with their state. */
static int dir_files(const char *dir, dir_file **out, int *nout)
{
    DIR *d = opendir(dir);
    *out = NULL;
    *nout = 0;
    if (!d)
        return OPJIT_ENOTFOUND;
    struct dirent *de;
    struct stat st;
    int rc = OPJIT_OK, cap = 0;
    while (!rc && (de = readdir(d))) {
        if (de->d_name[0] == '.' || fstatat(dirfd(d), de->d_name, &st, 0) != 0 ||
            !S_ISREG(st.st_mode))
            continue;
        if (*nout == cap) {
            cap = cap ? cap * 2 : 64;
            dir_file *v = realloc(*out, (size_t)cap * sizeof *v);
            if (!v) {
                rc = OPJIT_ENOMEM;
                break;
            }
            *out = v;
        }
        (*out)[*nout].sig = sig_of(&st);
        if (!((*out)[*nout].name = strdup(de->d_name)))
            rc = OPJIT_ENOMEM;
        else
            (*nout)++;
    }
    closedir(d);
    if (*nout > 1)
        qsort(*out, (size_t)*nout, sizeof **out, dir_file_cmp);
    return rc;
}

/* The key of the directory's state; *fresh when a file changed lately. */
static void dir_key(const char *real, const dir_file *v, int n, cache_key *key, int *fresh)
{
    long long t0 = now_ns();
    int has_cu = 0;
    cache_keygen *g = cache_keygen_new();
    cache_keygen_add_str(g, "what", "op-index-dir");
    cache_keygen_add_str(g, "format", INDEX_FORMAT);
    loader_add_op_header(g);
    cache_keygen_add_str(g, "target", jit_host_target());
    cache_keygen_add_str(g, "dir", real);
    *fresh = 0;
    for (int i = 0; i < n; i++) {
        cache_keygen_add_str(g, "file", v[i].name);
        cache_keygen_add(g, "state", &v[i].sig, sizeof v[i].sig);
        *fresh |= racy(&v[i].sig, t0);
        size_t stem = loader_source_stem(v[i].name);
        has_cu |= stem && v[i].name[stem + 1] == 'c' && v[i].name[stem + 2] == 'u';
    }
    /* Whether .cu sources could be looked at: it decides their entries. */
    if (has_cu)
        cache_keygen_add_str(g, "cuda", cu_usable(NULL, 0) == OPJIT_OK ? "yes" : "no");
    cache_keygen_finish(g, key);
}

/* Every source of the directory looked at again (each from its note when
 * it has one). *keep: all entries may go into the directory's note. */
static int dir_build(loader *l, idx_dir *d, const dir_file *v, int n, int *keep)
{
    long long t0 = now_ns();
    *keep = 1;
    for (int i = 0; i < n; i++) {
        if (!loader_source_stem(v[i].name))
            continue;
        idx_src *nv = realloc(d->srcs, (size_t)(d->n + 1) * sizeof *nv);
        if (!nv)
            return OPJIT_ENOMEM;
        d->srcs = nv;
        int rc = source_index(l, d->real, v[i].name, &nv[d->n]);
        d->n++;
        if (rc)
            return rc;
        idx_src *s = &nv[d->n - 1];
        for (int h = 0; h < s->nhdrs; h++)
            s->keep &= !racy(&s->hdrs[h].sig, t0);
        *keep &= s->keep && one_field(v[i].name);
    }
    return OPJIT_OK;
}

/* The directory's entries from the note of its state, when they are valid. */
static int dir_from_note(loader *l, idx_dir *d, const cache_request *req)
{
    char *text = NULL;
    if (cache_note_get(l->cache, req, "ops", &text) != OPJIT_OK)
        return -1;
    int rc = entries_parse(text, &d->srcs, &d->n);
    free(text);
    for (int i = 0; !rc && i < d->n; i++)
        if (!hdrs_valid(&d->srcs[i]))
            rc = -1;
    return rc;
}

static void dir_remember(loader *l, idx_dir *d)
{
    if (!l->index && !(l->index = calloc(1, sizeof *l->index)))
        return;
    for (idx_dir **p = &l->index->dirs; *p; p = &(*p)->next)
        if (!strcmp((*p)->real, d->real)) {
            idx_dir *old = *p;
            *p = old->next;
            dir_free(old);
            break;
        }
    d->next = l->index->dirs;
    l->index->dirs = d;
}

/* This runtime's entries of the directory at real, when its key is still key. */
static idx_dir *dir_known(loader *l, const char *real, const cache_key *key)
{
    for (idx_dir *d = l->index ? l->index->dirs : NULL; d; d = d->next)
        if (!strcmp(d->real, real) && !memcmp(d->key.bytes, key->bytes, sizeof key->bytes)) {
            for (int i = 0; i < d->n; i++)
                if (!hdrs_valid(&d->srcs[i]))
                    return NULL;
            return d;
        }
    return NULL;
}

/* The entries of dir: *out, owned by the index (*own 0) or by the caller
 * (*own 1: dir_free it). OPJIT_ENOTFOUND when dir cannot be read. */
static int index_dir(loader *l, const char *dir, idx_dir **out, int *own)
{
    char real[PATH_MAX];
    dir_file *v = NULL;
    int n = 0, fresh, keep, rc;
    *out = NULL;
    *own = 0;
    if (!realpath(dir, real) || (rc = dir_files(real, &v, &n)) == OPJIT_ENOTFOUND)
        return OPJIT_ENOTFOUND;
    idx_dir *d = calloc(1, sizeof *d);
    if (rc || !d || !(d->real = strdup(real))) {
        files_free(v, n);
        dir_free(d);
        return rt_error(l->rt, OPJIT_ENOMEM, "out of memory");
    }
    dir_key(real, v, n, &d->key, &fresh);
    cache_request req;
    index_request(&req, "-", strrchr(real, '/')[1] ? strrchr(real, '/') + 1 : "/");
    req.key = d->key;
    if ((*out = dir_known(l, real, &d->key))) {
        dir_free(d);
    } else if (dir_from_note(l, d, &req) == 0) {
        dir_remember(l, *out = d);
    } else {
        for (int i = 0; i < d->n; i++)
            src_free(&d->srcs[i]);
        d->n = 0;
        if ((rc = dir_build(l, d, v, n, &keep))) {
            dir_free(d);
            files_free(v, n);
            return rt_error(l->rt, rc, "out of memory");
        }
        char *t = keep && !fresh ? entries_text(d->srcs, d->n) : NULL;
        if (t && strlen(t) <= CACHE_NOTE_MAX)
            cache_note_put(l->cache, &req, "ops", t);
        if (t)
            dir_remember(l, d);
        else
            *own = 1;
        *out = d;
        free(t);
    }
    files_free(v, n);
    return OPJIT_OK;
}

/* ---- lookup ---------------------------------------------------------------------- */

static int src_defines(const idx_src *s, const char *op)
{
    for (int i = 0; s->status == OPJIT_OK && i < s->nops; i++)
        if (!strcmp(s->ops[i], op))
            return 1;
    return 0;
}

static int stem_is(const char *file, const char *stem, size_t n)
{
    return loader_source_stem(file) == n && !strncmp(file, stem, n);
}

/* What one lookup gathers across directories. */
typedef struct idx_walk {
    loader *l;
    const char *op;
    char **stems;      /* op names taken by earlier directories */
    int nstems;
    char bad[2048];    /* sources that could not be indexed, for the message */
    int nbad;
} idx_walk;

static int walk_shadowed(const idx_walk *w, const char *file)
{
    size_t n = loader_source_stem(file);
    for (int i = 0; i < w->nstems; i++)
        if (strlen(w->stems[i]) == n && !strncmp(w->stems[i], file, n))
            return 1;
    return 0;
}

static void walk_note_bad(idx_walk *w, const idx_dir *d, const idx_src *s)
{
    if (s->status == OPJIT_OK || s->status == OPJIT_EDEVICE)
        return;
    /* Discovery's messages start with the source's path; others may not. */
    int named = strstr(s->msg, s->file) != NULL;
    char line[PATH_MAX + INDEX_MSG_MAX + 8];
    if (named)
        snprintf(line, sizeof line, "%s", s->msg);
    else
        snprintf(line, sizeof line, "%s/%s: %s", d->real, s->file, s->msg);
    rt_log(w->l->rt, OPJIT_LOG_INFO, "its ops are not known: %s", line);
    size_t k = strlen(w->bad), m = strlen(line);
    if (k + m + 4 < sizeof w->bad) {
        memcpy(w->bad + k, "\n  ", 3);
        memcpy(w->bad + k + 3, line, m + 1);
    }
    w->nbad++;
}

/* Look in one directory: 1 when it settled the lookup (*rc its status). */
static int walk_dir(idx_walk *w, const idx_dir *d, int (*fn)(void *ud, const char *path),
                    void *ud, int *rc)
{
    const idx_src *first = NULL, *second = NULL;
    for (int i = 0; i < d->n; i++) {
        const idx_src *s = &d->srcs[i];
        int shadowed = walk_shadowed(w, s->file);
        if (!shadowed)
            walk_note_bad(w, d, s);
        if (shadowed || !src_defines(s, w->op))
            continue;
        if (!first)
            first = s;
        else if (!second && !stem_is(s->file, first->file, loader_source_stem(first->file)))
            second = s;
    }
    if (second) {
        int a = (int)loader_source_stem(first->file), b = (int)loader_source_stem(second->file);
        *rc = rt_error(w->l->rt, OPJIT_EINVAL,
                       "op '%s' is defined by two sources: %s/%s and %s/%s; name the one "
                       "you mean: %.*s::%s or %.*s::%s", w->op, d->real, first->file, d->real,
                       second->file, a, first->file, w->op, b, second->file, w->op);
        return 1;
    }
    for (int i = 0; first && i < d->n; i++) {
        char path[PATH_MAX];
        if (stem_is(d->srcs[i].file, first->file, loader_source_stem(first->file)) &&
            (size_t)snprintf(path, sizeof path, "%s/%s", d->real, d->srcs[i].file) <
                sizeof path && fn(ud, path))
            break;
    }
    if (first)
        *rc = OPJIT_OK;
    return first != NULL;
}

static int walk_add_stems(idx_walk *w, const idx_dir *d)
{
    for (int i = 0; i < d->n; i++)
        if (!walk_shadowed(w, d->srcs[i].file) &&
            strv_add(&w->stems, &w->nstems, d->srcs[i].file,
                     loader_source_stem(d->srcs[i].file)))
            return -1;
    return 0;
}

/* The files of dir named after op (op.c, op.cu): fn for each; 1 when
 * there were any (*rc: OPJIT_OK). */
static int named_sources(const char *dir, const char *op, int (*fn)(void *ud, const char *path),
                         void *ud, int *rc)
{
    static const char *const suffixes[] = {".c", ".cu"};
    int found = 0;
    for (int i = 0; i < 2; i++) {
        char path[PATH_MAX];
        /* A truncated path is another file (".cu" cut to ".c"). */
        if ((size_t)snprintf(path, sizeof path, "%s/%s%s", dir, op, suffixes[i]) >= sizeof path ||
            access(path, R_OK) != 0)
            continue;
        found = 1;
        *rc = OPJIT_OK;
        if (fn(ud, path))
            break;
    }
    return found;
}

int index_each_source(loader *l, const char *op, int (*fn)(void *ud, const char *path),
                      void *ud)
{
    idx_walk w = {.l = l, .op = op};
    int rc = OPJIT_ENOTFOUND, done = 0;
    for (const char *p = l->ops_path; *p && !done;) {
        size_t n = strcspn(p, ":");
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%.*s", (int)n, p);
        p += n + (p[n] == ':');
        if (n && (done = named_sources(dir, op, fn, ud, &rc)))
            break;
        idx_dir *d;
        int own, r = n ? index_dir(l, dir, &d, &own) : OPJIT_ENOTFOUND;
        if (r == OPJIT_ENOTFOUND)
            continue;
        if (r) {
            rc = r;
            break;
        }
        done = walk_dir(&w, d, fn, ud, &rc);
        if (!done && walk_add_stems(&w, d))
            done = 1, rc = rt_error(l->rt, OPJIT_ENOMEM, "out of memory");
        if (own)
            dir_free(d);
    }
    if (rc == OPJIT_ENOTFOUND)
        rt_error(l->rt, rc, "no source for op '%s' on the search path (%s)%s%s", op,
                 l->ops_path, w.nbad ? "; these sources could not be indexed:" : "", w.bad);
    for (int i = 0; i < w.nstems; i++)
        free(w.stems[i]);
    free(w.stems);
    return rc;
}

int index_source(loader *l, const char *path)
{
    char real[PATH_MAX];
    if (!realpath(path, real))
        return OPJIT_ENOTFOUND;
    char *slash = strrchr(real, '/');
    *slash = '\0';
    idx_src s;
    int rc = source_index(l, real, slash + 1, &s);
    if (rc == OPJIT_OK && s.status != OPJIT_OK)
        rc = rt_error(l->rt, s.status, "%s", s.msg);
    src_free(&s);
    return rc;
}
