/* loader/index.c - which ops each source on the search path defines, so an
 * op is found by its name in any module: opjit_load_op(rt, "rmsnorm")
 * finds llama_ops.c when its OPJIT_MODULE registers rmsnorm.
 *
 * Knowing a source's ops means running its init, which discovery does in
 * child processes with a time limit, one per CPU at once
 * (loader/discover.c): an init that crashes, exits or never returns costs
 * that source only. The answers are kept in the cache, so each version of
 * a source is indexed once:
 *
 *  - per source, a note keyed by its digest (bytes, local headers, opjit's
 *    ABI) and its path: the ops it registers, or why they are unknown,
 *    with each op's schema and doc: the source's record (loader/record.c),
 *    which a listing (opjit_discover) reports too, running nothing;
 *  - per directory, a note keyed by the state of its files (name, inode,
 *    size, mtime, ctime of each): every source's entry with its state and
 *    its local headers with theirs (loader/index_note.c: sorted, searched
 *    in place, any size);
 *  - per directory, a pointer keyed by the directory's own state (inode,
 *    mtime, ctime: which files it holds) to its latest note, and one keyed
 *    by its inode alone to its first (a base to keep entries from).
 *
 * A lookup in a directory of up to INDEX_CHECK_EACH sources lists it and
 * stats every file: any edit is seen. A larger directory would cost
 * milliseconds per lookup that way, so there the pointer is trusted for
 * which files the directory holds, and the sources a lookup picks are
 * checked (their state and their headers'); a source edited in place to
 * register an op that another source already provides is seen when the
 * directory changes, or when a lookup finds nothing (which checks every
 * file before it fails). A changed file makes another key, and the
 * sources are looked at again: entries of unchanged files are kept, the
 * others come from their per-source notes, else discovery. Nothing is
 * noted while a file changed less than RACY_MS ago: a second edit within
 * the file system's timestamp granularity could leave the state as it was
 * ("racily clean").
 *
 * Everything here runs with the loader's lock held, but index_source,
 * which keeps nothing in memory (the watcher indexes without it). */
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "loader/index_int.h"
#include "loader/loader_int.h"
#include "runtime/cuda.h"

#define INDEX_CHECK_EACH 256

/* A directory's entries, as this runtime last saw them. */
typedef struct idx_dir {
    char *real;
    file_sig dsig;  /* the directory's own state then */
    int dsig_ok;    /* the note is known to be the one of dsig */
    cache_key key;  /* of its files' state */
    idx_note note;
    int checked;    /* every file was checked in this lookup */
    struct idx_dir *next;
} idx_dir;

struct op_index {
    idx_dir *dirs;
    /* A .cu skipped because CUDA cannot run here was logged: said once
     * (at info level), as every .cu of the path is skipped likewise. */
    atomic_int said_skipped;
};

/* ---- small pieces ------------------------------------------------------------ */

/* The state of the file at path now; 0, or -1 when it is gone. */
static int sig_now(const char *path, file_sig *g)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return -1;
    *g = file_sig_of(&st);
    return 0;
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

static int key_eq(const cache_key *a, const cache_key *b)
{
    return !memcmp(a->bytes, b->bytes, sizeof a->bytes);
}

static void dir_free(idx_dir *d)
{
    if (!d)
        return;
    note_close(&d->note);
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

/* Whether real lies in directory dir itself (its key covers it). */
static int in_dir(const char *real, const char *dir)
{
    size_t n = strlen(dir);
    return !strncmp(real, dir, n) && real[n] == '/' && !strchr(real + n + 1, '/');
}

/* Whether CUDA's being usable is as when the note was made. */
static int cuda_as_noted(const idx_note *n)
{
    return n->cuda < 0 || n->cuda == (cu_usable(NULL, 0) == OPJIT_OK);
}

/* Whether the headers the note names outside dir (every one: all) are
 * as they were. */
static int note_hdrs_valid(const idx_note *n, const char *dir, int all)
{
    for (long id = 0; id < n->nhdr; id++) {
        const char *r;
        size_t len;
        file_sig was, now;
        char real[PATH_MAX];
        if (!note_hdr(n, id, &r, &len, &was) || len >= sizeof real)
            return 0;
        memcpy(real, r, len);
        real[len] = '\0';
        if ((all || !in_dir(real, dir)) && (sig_now(real, &now) || !file_sig_eq(&now, &was)))
            return 0;
    }
    return 1;
}

/* ---- cache requests --------------------------------------------------------------- */

static const char *dir_name(const char *real)
{
    return strrchr(real, '/')[1] ? strrchr(real, '/') + 1 : "/";
}

/* The request of the pointer of the directory real in state dsig. */
static void pointer_request(cache_request *req, const char *real, const file_sig *dsig)
{
    index_request(req, "-", dir_name(real));
    cache_keygen *g = cache_keygen_new();
    cache_keygen_add_str(g, "what", "op-index-dir-pointer");
    cache_keygen_add_str(g, "format", INDEX_FORMAT);
    loader_add_op_header(g);
    cache_keygen_add_str(g, "target", jit_host_target());
    cache_keygen_add_str(g, "dir", real);
    cache_keygen_add(g, "state", dsig, sizeof *dsig);
    cache_keygen_finish(g, &req->key);
}

/* ---- one source ------------------------------------------------------------------ */

/* Sources waiting for discovery: their entries and per-source note keys. */
typedef struct pending {
    int *at;          /* index of the entry */
    char **path;
    record_key *key;
    int n, cap;
} pending;

static int pending_add(pending *q, int at, const char *path, const record_key *key)
{
    if (q->n == q->cap) {
        int cap = q->cap ? q->cap * 2 : 64;
        int *a = realloc(q->at, (size_t)cap * sizeof *a);
        if (a)
            q->at = a;
        char **p = a ? realloc(q->path, (size_t)cap * sizeof *p) : NULL;
        if (p)
            q->path = p;
        record_key *k = p ? realloc(q->key, (size_t)cap * sizeof *k) : NULL;
        if (!k)
            return -1;
        q->key = k;
        q->cap = cap;
    }
    if (!(q->path[q->n] = strdup(path)))
        return -1;
    q->at[q->n] = at;
    q->key[q->n++] = *key;
    return 0;
}

static void pending_free(pending *q)
{
    for (int i = 0; i < q->n; i++)
        free(q->path[i]);
    free(q->at);
    free(q->path);
    free(q->key);
    memset(q, 0, sizeof *q);
}

/* The entry of a source's record into e (file and state stay); *key
 * its key. 1 when there was one, 0 when not, -1 when no key could be made. */
static int from_source_note(loader *l, const source *s, record_key *key, idx_src *e)
{
    idx_src got;
    int rc = index_record_get(l, s, key, &got);
    if (rc == 1) {
        free(e->msg);
        e->msg = got.msg, got.msg = NULL;
        /* e takes the op names; a listing's schemas and docs are not its */
        for (int i = 0; i < got.nops; i++) {
            free(got.schemas ? got.schemas[i] : NULL);
            free(got.docs ? got.docs[i] : NULL);
        }
        free(got.schemas), got.schemas = NULL;
        free(got.docs), got.docs = NULL;
        e->ops = got.ops, got.ops = NULL;
        e->nops = got.nops, got.nops = 0;
        e->status = got.status;
    }
    src_free(&got);
    return rc;
}

/* A local header of source e (of directory dir_real), with its state. */
typedef struct hdr_walk {
    idx_src *e;
    idx_hdrs *h;
    long long t0;
} hdr_walk;

static void took_header(void *ud, const char *real)
{
    hdr_walk *w = ud;
    int id = hdrs_find(w->h, real);
    file_sig g;
    if (id < 0 && (sig_now(real, &g) || !one_field(real) || (id = hdrs_add(w->h, real, &g)) < 0)) {
        w->e->keep = 0;
        return;
    }
    if (src_add_hdr(w->e, id) || racy(&w->h->sig[id], w->t0))
        w->e->keep = 0;
}

/* Look at file of dir_real afresh: e from its per-source note, else it
 * joins q for discovery. 0, or OPJIT_ENOMEM. */
static int source_look(loader *l, const char *dir_real, idx_src *e, idx_hdrs *h, pending *q,
                       int at, long long t0)
{
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir_real, e->file) >= sizeof path) {
        e->status = OPJIT_EINVAL;
        return src_set_msg(e, "its path is too long") ? OPJIT_ENOMEM : OPJIT_OK;
    }
    source s;
    int rc = source_read(l, path, &s);
    if (rc) {
        e->status = rc;
        e->keep = rc == OPJIT_EINVAL; /* not a text file: it stays that way */
        return src_set_msg(e, opjit_errmsg(l->rt)) ? OPJIT_ENOMEM : OPJIT_OK;
    }
    hdr_walk w = {e, h, t0};
    source_each_header(&s, took_header, &w);
    record_key key;
    int got = from_source_note(l, &s, &key, e);
    if (got < 0 || (got == 0 && pending_add(q, at, path, &key)))
        rc = OPJIT_ENOMEM;
    source_free(&s);
    return rc;
}

/* The name of an op in its schema: "rmsnorm(Tensor x) -> Tensor". */
typedef struct took {
    loader *l;
    idx_src *v;
    const pending *q;
    int quiet;  /* the caller reports a failure itself (the watcher's event) */
    char **raw; /* quiet: the failure's message with its lines (heap) */
} took;

/* How loud a source's indexing is: a failure a warning (a broken source
 * on the path), but a .cu that CUDA cannot run here is no news: said once,
 * at info level (-v), not once per shipped .cu at every first lookup. */
static int took_level(const took *t, int status)
{
    if (!status || t->quiet)
        return OPJIT_LOG_DEBUG;
    if (status != OPJIT_EDEVICE)
        return OPJIT_LOG_WARN;
    struct op_index *x = t->l->index;
    return x && !atomic_exchange(&x->said_skipped, 1) ? OPJIT_LOG_INFO : OPJIT_LOG_DEBUG;
}

static void took_ops(void *ud, int i, const opjit_source_ops *src, long timed_out_ms)
{
    took *t = ud;
    idx_src *e = &t->v[t->q->at[i]];
    e->status = src->status;
    if (src_set_msg(e, src->error))
        e->keep = 0;
    if (t->raw && !*t->raw && src->status && src->error)
        *t->raw = strdup(src->error); /* the note's copy is on one line */
    for (int k = 0; k < src->nops; k++)
        if (src_add_def(e, src->schemas[k], src->docs[k], 0))
            e->keep = 0;
    rt_log(t->l->rt, took_level(t, e->status), "indexed %s: %s%s", src->path,
           e->status ? e->msg : "ok",
           e->status == OPJIT_EDEVICE ? " (every CUDA source is skipped likewise: said once)"
                                      : "");
    /* Noted at once: an index cut short is resumed, not redone. A .cu
     * skipped here: the directory's key says whether CUDA runs. */
    int lasting = index_record_put(t->l, t->q->path[i], &t->q->key[i], src, timed_out_ms);
    e->keep &= lasting || e->status == OPJIT_EDEVICE;
}

/* Discovery for every source in q, one child per CPU at once. */
static int discover_pending(loader *l, idx_src *v, const pending *q, char **raw)
{
    took t = {l, v, q, raw != NULL, raw};
    return loader_discover_many(l, (const char *const *)q->path, q->n, took_ops, &t);
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
        (*out)[*nout].sig = file_sig_of(&st);
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

/* The key of the directory's files' state; *fresh when a file changed
 * lately; *cuda: -1 (no .cu source), else whether CUDA is usable. */
static void dir_key(const char *real, const dir_file *v, int n, cache_key *key, int *fresh,
                    int *cuda)
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
        has_cu |= loader_source_stem(v[i].name) && loader_is_cuda_source(v[i].name);
    }
    /* Whether .cu sources could be looked at: it decides their entries. */
    *cuda = has_cu ? cu_usable(NULL, 0) == OPJIT_OK : -1;
    if (has_cu)
        cache_keygen_add_str(g, "cuda", *cuda ? "yes" : "no");
    cache_keygen_finish(g, key);
}

/* Keep the entry of an unchanged file from an older note of the
 * directory, when its headers are unchanged too. 1 when kept. */
static int src_reuse(const idx_note *old, const dir_file *f, idx_src *e, idx_hdrs *h,
                     long long t0)
{
    idx_ent ent;
    if (!old || !note_src(old, f->name, strlen(f->name), &ent) || !file_sig_eq(&ent.sig, &f->sig) ||
        ent_to_src(&ent, e))
        return 0;
    for (const char *p = ent.hdrs, *end = ent.hdrs + ent.hdrs_len; p < end;) {
        char *next, real[PATH_MAX];
        long id = strtol(p, &next, 10);
        const char *r;
        size_t len;
        file_sig was, now;
        if (next == p || !note_hdr(old, id, &r, &len, &was) || len >= sizeof real)
            return 0;
        memcpy(real, r, len);
        real[len] = '\0';
        int hid = hdrs_find(h, real);
        if (hid < 0 && (sig_now(real, &now) || (hid = hdrs_add(h, real, &now)) < 0))
            return 0;
        if (!file_sig_eq(&h->sig[hid], &was) || src_add_hdr(e, hid))
            return 0;
        e->keep &= !racy(&was, t0);
        p = *next == ',' ? next + 1 : end;
    }
    return 1;
}

/* The entries of the listed files v of directory real: kept from old
 * (may be NULL), else from per-source notes, else discovery. *keep: all
 * entries may go into the directory's note. */
static int dir_build(loader *l, const char *real, const dir_file *v, int n, const idx_note *old,
                     idx_src **out, int *nout, idx_hdrs *h, int *keep)
{
    long long t0 = now_ns();
    pending q = {0};
    idx_src *e = calloc((size_t)n + 1, sizeof *e);
    int k = 0, rc = e ? OPJIT_OK : OPJIT_ENOMEM;
    for (int i = 0; !rc && i < n; i++) {
        if (!loader_source_stem(v[i].name))
            continue;
        if (!src_reuse(old, &v[i], &e[k], h, t0)) {
            src_free(&e[k]);
            e[k].keep = 1;
            e[k].sig = v[i].sig;
            if (!(e[k].file = strdup(v[i].name)) || src_set_msg(&e[k], ""))
                rc = OPJIT_ENOMEM;
            else
                rc = source_look(l, real, &e[k], h, &q, k, t0);
        }
        k++;
    }
    if (!rc)
        rc = discover_pending(l, e, &q, NULL);
    pending_free(&q);
    *keep = 1;
    for (int i = 0; i < k; i++)
        *keep &= e[i].keep && one_field(e[i].file);
    *out = e;
    *nout = k;
    return rc;
}

/* ---- directories known, and their notes ------------------------------------------ */

static idx_dir *dir_known(loader *l, const char *real)
{
    for (idx_dir *d = l->index ? l->index->dirs : NULL; d; d = d->next)
        if (!strcmp(d->real, real))
            return d;
    return NULL;
}

/* Keep d as this runtime's view of its directory (an older one goes). */
static void dir_remember(loader *l, idx_dir *d)
{
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

static idx_dir *dir_new(const char *real, const file_sig *dsig, const cache_key *key,
                        idx_note *note)
{
    idx_dir *d = calloc(1, sizeof *d);
    if (!d || !(d->real = strdup(real))) {
        free(d);
        note_close(note);
        return NULL;
    }
    d->dsig = *dsig;
    d->key = *key;
    d->note = *note;
    memset(note, 0, sizeof *note);
    return d;
}

/* What a lookup of one directory has to go on. */
typedef struct dir_look {
    char dir[PATH_MAX];  /* as the search path names it: what loads are given */
    char real[PATH_MAX];
    file_sig dsig;
    int pointed;      /* a pointer for dsig exists */
    cache_key pkey;   /* the key it names */
    idx_note pnote;   /* that note, when it could be read */
} dir_look;

/* The request of the directory's base: the key of the first note made of
 * it (by its inode; first writer wins). A rebuild keeps the entries of the
 * files unchanged since, where it has no newer note to go on (a new
 * process after a file was added to a directory of 10,000 sources). */
static void base_request(cache_request *req, const char *real, const file_sig *dsig)
{
    file_sig inode = {dsig->dev, dsig->ino, 0, 0, 0};
    index_request(req, "-", dir_name(real));
    cache_keygen *g = cache_keygen_new();
    cache_keygen_add_str(g, "what", "op-index-dir-base");
    cache_keygen_add_str(g, "format", INDEX_FORMAT);
    cache_keygen_add_str(g, "target", jit_host_target());
    cache_keygen_add_str(g, "dir", real);
    cache_keygen_add(g, "inode", &inode, sizeof inode);
    cache_keygen_finish(g, &req->key);
}

/* Note the directory's entries under key, and name them its base when it
 * has none (*had_base 0). */
static void dir_note_put(loader *l, const dir_look *dl, const cache_key *key, const char *text,
                         int had_base)
{
    cache_request req;
    index_request(&req, "-", dir_name(dl->real));
    req.key = *key;
    if (cache_note_put(l->cache, &req, "ops", text) == OPJIT_OK && !had_base) {
        base_request(&req, dl->real, &dl->dsig);
        cache_index_put(l->cache, &req, key);
    }
}

/* Build the entries of real afresh and note them: *out (own: not
 * remembered, the caller frees it). */
static int dir_rebuild(loader *l, dir_look *dl, const dir_file *v, int n, const cache_key *key,
                       int cuda, int trusted, idx_dir **out, int *own)
{
    idx_dir *m = dir_known(l, dl->real);
    const idx_note *old = m ? &m->note : dl->pnote.text ? &dl->pnote : NULL;
    idx_note base = {0};
    int had_base = old != NULL;
    if (!old) {
        cache_request req;
        cache_key bkey;
        base_request(&req, dl->real, &dl->dsig);
        had_base = cache_index_get(l->cache, &req, &bkey) == OPJIT_OK;
        if (had_base && index_note_fetch(l, dl->real, &bkey, &base) == 0)
            old = &base;
    }
    idx_src *e = NULL;
    idx_hdrs h = {0};
    int ne = 0, keep;
    int rc = dir_build(l, dl->real, v, n, old, &e, &ne, &h, &keep);
    note_close(&base);
    char *text = rc ? NULL : note_text(e, ne, &h, cuda, 0);
    for (int i = 0; i < h.n; i++)
        keep &= one_field(h.real[i]);
    for (int i = 0; i < ne; i++)
        src_free(&e[i]);
    free(e);
    hdrs_free(&h);
    idx_note note;
    if (!text || note_open(&note, text, strlen(text)))
        return rt_error(l->rt, rc ? rc : OPJIT_ENOMEM, "out of memory");
    if (keep && trusted)
        dir_note_put(l, dl, key, note.text, had_base);
    idx_dir *d = dir_new(dl->real, &dl->dsig, key, &note);
    if (!d)
        return rt_error(l->rt, OPJIT_ENOMEM, "out of memory");
    d->checked = 1;
    d->dsig_ok = keep && trusted;
    *own = !d->dsig_ok;
    if (!*own)
        dir_remember(l, d);
    *out = d;
    return OPJIT_OK;
}

/* The note of key for the listed directory, from this runtime, the
 * pointer's note or the cache, when its headers elsewhere are unchanged. */
static idx_dir *dir_noted(loader *l, dir_look *dl, const cache_key *key)
{
    idx_dir *m = dir_known(l, dl->real);
    if (m && key_eq(&m->key, key) && note_hdrs_valid(&m->note, dl->real, 0))
        return m;
    idx_note n = {0};
    if (dl->pnote.text && key_eq(&dl->pkey, key))
        n = dl->pnote, memset(&dl->pnote, 0, sizeof dl->pnote);
    else if (index_note_fetch(l, dl->real, key, &n))
        return NULL;
    if (!note_hdrs_valid(&n, dl->real, 0)) {
        note_close(&n);
        return NULL;
    }
    idx_dir *d = dir_new(dl->real, &dl->dsig, key, &n);
    if (d)
        dir_remember(l, d);
    return d;
}

/* List the directory and stat its files: its entries for that state. */
static int dir_check_each(loader *l, dir_look *dl, idx_dir **out, int *own)
{
    dir_file *v = NULL;
    int n = 0, fresh, cuda, rc = dir_files(dl->real, &v, &n);
    if (rc) {
        files_free(v, n);
        return rc == OPJIT_ENOTFOUND ? rc : rt_error(l->rt, rc, "out of memory");
    }
    cache_key key;
    dir_key(dl->real, v, n, &key, &fresh, &cuda);
    /* The pointer may name this state's note only when the directory did
     * not change while it was listed, nor lately. */
    file_sig after;
    int trusted = !fresh && !racy(&dl->dsig, now_ns()) && sig_now(dl->real, &after) == 0 &&
                  file_sig_eq(&after, &dl->dsig);
    idx_dir *d = dir_noted(l, dl, &key);
    *own = 0;
    if (d) {
        d->checked = 1;
        d->dsig = dl->dsig;
        d->dsig_ok = trusted;
        *out = d;
    } else {
        rc = dir_rebuild(l, dl, v, n, &key, cuda, trusted, out, own);
    }
    files_free(v, n);
    if (!rc && trusted && !dl->pointed && (*out)->dsig_ok) {
        cache_request req;
        pointer_request(&req, dl->real, &dl->dsig);
        cache_index_put(l->cache, &req, &key);
    }
    return rc;
}

/* The entries of the directory dl->real: *out, owned by the index (*own
 * 0) or by the caller (*own 1: dir_free it). Large directories come from
 * the pointer of the directory's state unless check_each; then the
 * sources a lookup picks are still to be checked ((*out)->checked 0).
 * OPJIT_ENOTFOUND when the directory cannot be read. */
static int index_dir(loader *l, dir_look *dl, int check_each, idx_dir **out, int *own)
{
    *out = NULL;
    *own = 0;
    dl->pointed = 0;
    if (!l->index && !(l->index = calloc(1, sizeof *l->index)))
        return rt_error(l->rt, OPJIT_ENOMEM, "out of memory");
    idx_dir *m = dir_known(l, dl->real);
    if (!check_each && m && m->dsig_ok && file_sig_eq(&m->dsig, &dl->dsig) &&
        m->note.nsrc > INDEX_CHECK_EACH && cuda_as_noted(&m->note)) {
        m->checked = 0;
        *out = m;
        return OPJIT_OK;
    }
    if (!racy(&dl->dsig, now_ns())) {
        cache_request req;
        pointer_request(&req, dl->real, &dl->dsig);
        dl->pointed = cache_index_get(l->cache, &req, &dl->pkey) == OPJIT_OK;
        if (dl->pointed && index_note_fetch(l, dl->real, &dl->pkey, &dl->pnote))
            memset(&dl->pnote, 0, sizeof dl->pnote);
    }
    if (!check_each && dl->pnote.text && dl->pnote.nsrc > INDEX_CHECK_EACH &&
        cuda_as_noted(&dl->pnote)) {
        idx_dir *d = dir_new(dl->real, &dl->dsig, &dl->pkey, &dl->pnote);
        if (!d)
            return rt_error(l->rt, OPJIT_ENOMEM, "out of memory");
        d->dsig_ok = 1;
        dir_remember(l, *out = d);
        return OPJIT_OK;
    }
    return dir_check_each(l, dl, out, own);
}

/* ---- lookup ---------------------------------------------------------------------- */

/* The directories one lookup went through, in order. */
typedef struct idx_walk {
    loader *l;
    const char *op;
    idx_dir **dirs;
    int *own;
    int n, cap;
    int unchecked;     /* some directory was taken on its pointer's word */
    char bad[2048];    /* sources that could not be indexed, for the message */
    int nbad;
} idx_walk;

static int walk_push(idx_walk *w, idx_dir *d, int own)
{
    if (w->n == w->cap) {
        int cap = w->cap ? w->cap * 2 : 8;
        idx_dir **v = realloc(w->dirs, (size_t)cap * sizeof *v);
        if (v)
            w->dirs = v;
        int *o = v ? realloc(w->own, (size_t)cap * sizeof *o) : NULL;
        if (!o)
            return -1;
        w->own = o;
        w->cap = cap;
    }
    w->dirs[w->n] = d;
    w->own[w->n++] = own;
    return 0;
}

static void walk_end(idx_walk *w)
{
    for (int i = 0; i < w->n; i++)
        if (w->own[i])
            dir_free(w->dirs[i]);
    free(w->dirs);
    free(w->own);
    w->dirs = NULL;
    w->own = NULL;
    w->n = w->cap = 0;
}

/* Whether the module named by file's stem (len bytes) is an earlier
 * directory's (a load of that module takes the first). */
static int walk_shadowed(const idx_walk *w, int upto, const char *file, size_t len)
{
    char stem[NAME_MAX + 1], name[NAME_MAX + 4];
    if (len > NAME_MAX)
        return 0;
    memcpy(stem, file, len);
    stem[len] = '\0';
    stem[loader_source_stem(stem)] = '\0';
    for (int i = 0; i < upto; i++)
        for (int c = 0; c < 2; c++) {
            int k = snprintf(name, sizeof name, "%s%s", stem, c ? ".cu" : ".c");
            idx_ent e;
            if (k > 0 && (size_t)k < sizeof name && note_src(&w->dirs[i]->note, name, (size_t)k, &e))
                return 1;
        }
    return 0;
}

/* The sources of the directory that register the op. */
typedef struct definers {
    char file[2][NAME_MAX + 1]; /* the first two modules' sources */
    int n;
    const idx_walk *w;
    int at;
    int stale;                  /* a source picked changed since it was noted */
} definers;

/* Whether the source picked is as noted: its state and its headers'. */
static int ent_current(const idx_dir *d, const idx_ent *e, const char *file)
{
    char path[PATH_MAX];
    file_sig now;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", d->real, file) >= sizeof path ||
        sig_now(path, &now) || !file_sig_eq(&now, &e->sig))
        return 0;
    for (const char *p = e->hdrs, *end = e->hdrs + e->hdrs_len; p < end;) {
        char *next, real[PATH_MAX];
        long id = strtol(p, &next, 10);
        const char *r;
        size_t len;
        file_sig was;
        if (next == p || !note_hdr(&d->note, id, &r, &len, &was) || len >= sizeof real)
            return 0;
        memcpy(real, r, len);
        real[len] = '\0';
        if (sig_now(real, &now) || !file_sig_eq(&now, &was))
            return 0;
        p = *next == ',' ? next + 1 : end;
    }
    return 1;
}

static int took_definer(void *ud, const char *file, size_t len)
{
    definers *df = ud;
    const idx_dir *d = df->w->dirs[df->at];
    char name[NAME_MAX + 1];
    idx_ent e;
    if (len > NAME_MAX || walk_shadowed(df->w, df->at, file, len))
        return 0;
    memcpy(name, file, len);
    name[len] = '\0';
    if (!d->checked && (!note_src(&d->note, file, len, &e) || !ent_current(d, &e, name)))
        return df->stale = 1;
    size_t stem = loader_source_stem(name);
    if (df->n == 1 && loader_source_stem(df->file[0]) == stem && !strncmp(df->file[0], name, stem))
        return 0; /* the .cu of the same module */
    snprintf(df->file[df->n++], sizeof df->file[0], "%s", name);
    return df->n == 2;
}

/* Call fn for the sources of module file's stem in d (dir: as the search
 * path names it); 1 to stop. */
static int load_module_of(const idx_dir *d, const char *dir, const char *file,
                          int (*fn)(void *ud, const char *path), void *ud)
{
    size_t stem = loader_source_stem(file);
    for (int c = 0; c < 2; c++) {
        char name[NAME_MAX + 4], path[PATH_MAX];
        idx_ent e;
        int k = snprintf(name, sizeof name, "%.*s%s", (int)stem, file, c ? ".cu" : ".c");
        if (k > 0 && (size_t)k < sizeof name && note_src(&d->note, name, (size_t)k, &e) &&
            (size_t)snprintf(path, sizeof path, "%s/%s", dir, name) < sizeof path &&
            fn(ud, path))
            return 1;
    }
    return 0;
}

/* Look in the walk's last directory: 1 when it settled the lookup (*rc
 * its status), 0 when the op is not there, -1 when a source picked
 * changed (look again, checking every file). */
static int walk_dir(idx_walk *w, const char *dir, int (*fn)(void *ud, const char *path),
                    void *ud, int *rc)
{
    const idx_dir *d = w->dirs[w->n - 1];
    definers df = {.w = w, .at = w->n - 1};
    note_each_definer(&d->note, w->op, took_definer, &df);
    if (df.stale)
        return -1;
    if (df.n == 2) {
        int a = (int)loader_source_stem(df.file[0]), b = (int)loader_source_stem(df.file[1]);
        *rc = rt_error(w->l->rt, OPJIT_EINVAL,
                       "op '%s' is defined by two sources: %s/%s and %s/%s; name the one "
                       "you mean: %.*s::%s or %.*s::%s", w->op, d->real, df.file[0], d->real,
                       df.file[1], a, df.file[0], w->op, b, df.file[1], w->op);
        return 1;
    }
    if (!df.n)
        return 0;
    load_module_of(d, dir, df.file[0], fn, ud);
    *rc = OPJIT_OK;
    return 1;
}

/* The files of dir named after op (op.c, op.cu): fn for each; 1 when
 * there were any. */
static int named_sources(const char *dir, const char *op, int (*fn)(void *ud, const char *path),
                         void *ud)
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
        if (fn(ud, path))
            break;
    }
    return found;
}

/* The sources the walk's directories could not index, for the message. */
static void walk_note_bad(idx_walk *w)
{
    for (int i = 0; i < w->n; i++) {
        const idx_dir *d = w->dirs[i];
        const char *at = NULL;
        idx_ent e;
        while (note_next_src(&d->note, &at, &e)) {
            if (e.status == OPJIT_OK || e.status == OPJIT_EDEVICE ||
                walk_shadowed(w, i, e.file, e.file_len))
                continue;
            /* Discovery's messages start with the source's path; others may not. */
            char line[PATH_MAX + INDEX_MSG_MAX + 8];
            if (memmem(e.msg, e.msg_len, e.file, e.file_len))
                snprintf(line, sizeof line, "%.*s", (int)e.msg_len, e.msg);
            else
                snprintf(line, sizeof line, "%s/%.*s: %.*s", d->real, (int)e.file_len, e.file,
                         (int)e.msg_len, e.msg);
            rt_log(w->l->rt, OPJIT_LOG_INFO, "its ops are not known: %s", line);
            size_t k = strlen(w->bad), m = strlen(line);
            if (k + m + 4 < sizeof w->bad) {
                memcpy(w->bad + k, "\n  ", 3);
                memcpy(w->bad + k + 3, line, m + 1);
            }
            w->nbad++;
        }
    }
}

/* The directory of the search path in p into dl (its real path and
 * state); 0 when it is one to look in. */
static int walk_next_dir(idx_walk *w, const char *p, size_t n, dir_look *dl)
{
    struct stat st;
    memset(dl, 0, sizeof *dl);
    if (!n || n >= sizeof dl->dir)
        return -1;
    snprintf(dl->dir, sizeof dl->dir, "%.*s", (int)n, p);
    if (!realpath(dl->dir, dl->real) || stat(dl->real, &st) != 0 || !S_ISDIR(st.st_mode))
        return -1;
    dl->dsig = file_sig_of(&st);
    for (int i = 0; i < w->n; i++) /* a directory named twice: the first counts */
        if (!strcmp(w->dirs[i]->real, dl->real))
            return -1;
    return 0;
}

/* One walk of the search path (check_each: every directory file by file).
 * OPJIT_ENOTFOUND when no directory has the op. */
static int walk_path(idx_walk *w, int check_each, int (*fn)(void *ud, const char *path), void *ud)
{
    int rc = OPJIT_ENOTFOUND;
    for (const char *p = loader_ops_path(w->l); *p;) {
        size_t n = strcspn(p, ":");
        dir_look dl;
        int skip = walk_next_dir(w, p, n, &dl);
        p += n + (p[n] == ':');
        if (skip)
            continue;
        if (named_sources(dl.dir, w->op, fn, ud))
            return OPJIT_OK;
        for (int again = 0, done = 0; !done; again++) {
            idx_dir *d;
            int own, r = index_dir(w->l, &dl, check_each || again, &d, &own);
            note_close(&dl.pnote);
            if (r == OPJIT_ENOTFOUND)
                break;
            if (r || walk_push(w, d, own)) {
                if (!r && own)
                    dir_free(d);
                return r ? r : rt_error(w->l->rt, OPJIT_ENOMEM, "out of memory");
            }
            w->unchecked |= !d->checked;
            if ((done = walk_dir(w, dl.dir, fn, ud, &rc)) == 1)
                return rc;
            if (done < 0) { /* look again, that directory file by file */
                if (w->own[--w->n])
                    dir_free(d);
                done = 0;
            } else {
                done = 1;
            }
        }
    }
    return rc;
}

int index_each_source(loader *l, const char *op, int (*fn)(void *ud, const char *path),
                      void *ud)
{
    idx_walk w = {.l = l, .op = op};
    int rc = walk_path(&w, 0, fn, ud);
    if (rc == OPJIT_ENOTFOUND && w.unchecked) {
        /* Nothing found on the pointers' word: check every file first. */
        walk_end(&w);
        w = (idx_walk){.l = l, .op = op};
        rc = walk_path(&w, 1, fn, ud);
    }
    if (rc == OPJIT_ENOTFOUND) {
        walk_note_bad(&w);
        rt_error(l->rt, rc, "no source for op '%s' on the search path (%s)%s%s", op,
                 loader_ops_path(l), w.nbad ? "; these sources could not be indexed:" : "",
                 w.bad);
    }
    walk_end(&w);
    return rc;
}

int index_source(loader *l, const char *path)
{
    char real[PATH_MAX];
    struct stat st;
    if (!realpath(path, real) || stat(real, &st) != 0)
        return OPJIT_ENOTFOUND;
    char *slash = strrchr(real, '/');
    *slash = '\0';
    idx_src e = {.keep = 1, .sig = file_sig_of(&st)};
    idx_hdrs h = {0};
    pending q = {0};
    int rc = (e.file = strdup(slash + 1)) && !src_set_msg(&e, "") ? OPJIT_OK : OPJIT_ENOMEM;
    if (!rc)
        rc = source_look(l, real, &e, &h, &q, 0, now_ns());
    char *raw = NULL;
    if (!rc) /* a failure is the caller's to report */
        rc = discover_pending(l, &e, &q, &raw);
    if (rc == OPJIT_OK && e.status != OPJIT_OK)
        rc = rt_error(l->rt, e.status, "%s", raw ? raw : e.msg);
    free(raw);
    pending_free(&q);
    hdrs_free(&h);
    src_free(&e);
    return rc;
}
