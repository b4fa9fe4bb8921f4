/* loader/index_note.c - the op index's notes as text, and lookups in a note
 * without parsing it whole.
 *
 * A directory of 10,000 sources has a note of about a megabyte; a warm
 * lookup must cost well under a millisecond, so the note is sorted and
 * searched in place, by binary search over its lines:
 *
 *   opjit-op-index 2
 *   layout <hdr offset> <src offset> <op offset> <headers> <sources> <cuda>
 *   hdr <id> <dev> <ino> <size> <mtime> <ctime> <real path>     by id
 *   src <file> <dev> <ino> <size> <mtime> <ctime> <status> <header ids,>
 *       <ops, space separated> <message>                        by file
 *   op <name> <file>                                            by name, file
 *   def <schema> <doc>               a record's: each op, in order
 *   detail <message>                 a record's: the whole message
 *   limit <ms>                       a record's: the time limit run out of
 *
 * Fields are separated by tabs; no field holds a tab or a newline (in the
 * def section '\\', tab and newline are escaped). The offsets are
 * fixed-width, so the layout line is written before the sections are
 * placed. A per-source note (a source's record) is the same with one
 * source, and its def section: what a listing reports of that version of
 * the source, so that it need not run it again. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/index_int.h"
#include "opjit.h"

#define OFF_FMT "%010zu"

/* ---- entries being gathered --------------------------------------------------- */

void src_free(idx_src *s)
{
    free(s->file);
    free(s->msg);
    for (int i = 0; i < s->nops; i++)
        free(s->ops[i]);
    free(s->ops);
    free(s->hdrs);
    for (int i = 0; s->schemas && i < s->nops; i++)
        free(s->schemas[i]);
    for (int i = 0; s->docs && i < s->nops; i++)
        free(s->docs[i]);
    free(s->schemas);
    free(s->docs);
    free(s->detail);
    memset(s, 0, sizeof *s);
}

int one_field(const char *s)
{
    return !strpbrk(s, "\t\n");
}

int src_set_msg(idx_src *s, const char *msg)
{
    free(s->msg);
    if (!(s->msg = strndup(msg ? msg : "", INDEX_MSG_MAX)))
        return -1;
    for (char *p = s->msg; *p; p++)
        if (*p == '\t' || *p == '\n')
            *p = ' ';
    return 0;
}

int src_add_op(idx_src *s, const char *name, size_t len)
{
    char **v = realloc(s->ops, (size_t)(s->nops + 1) * sizeof *v);
    if (!v)
        return -1;
    s->ops = v;
    if (!(v[s->nops] = strndup(name, len)))
        return -1;
    s->nops++;
    return 0;
}

int src_add_def(idx_src *s, const char *schema, const char *doc, int record)
{
    size_t len = strcspn(schema, "( \t\n");
    if (!len)
        return 0; /* no name: nothing a lookup or a listing could use */
    if (record) {
        /* Grown first, filled after the op: nops counts the filled ones. */
        char **sv = realloc(s->schemas, (size_t)(s->nops + 1) * sizeof *sv);
        if (sv)
            s->schemas = sv;
        char **dv = sv ? realloc(s->docs, (size_t)(s->nops + 1) * sizeof *dv) : NULL;
        if (!dv)
            return -1;
        s->docs = dv;
        char *a = strdup(schema), *b = strdup(doc ? doc : "");
        if (!a || !b || src_add_op(s, schema, len)) {
            free(a);
            free(b);
            return -1;
        }
        sv[s->nops - 1] = a;
        dv[s->nops - 1] = b;
        return 0;
    }
    return src_add_op(s, schema, len);
}

int src_add_hdr(idx_src *s, int id)
{
    for (int i = 0; i < s->nhdrs; i++)
        if (s->hdrs[i] == id)
            return 0;
    int *v = realloc(s->hdrs, (size_t)(s->nhdrs + 1) * sizeof *v);
    if (!v)
        return -1;
    s->hdrs = v;
    v[s->nhdrs++] = id;
    return 0;
}

static size_t path_hash(const char *s)
{
    size_t h = 14695981039346656037ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

int hdrs_find(const idx_hdrs *h, const char *real)
{
    if (!h->nslot)
        return -1;
    for (size_t i = path_hash(real) % (size_t)h->nslot;; i = (i + 1) % (size_t)h->nslot) {
        int id = h->slot[i] - 1;
        if (id < 0)
            return -1;
        if (!strcmp(h->real[id], real))
            return id;
    }
}

/* Room for one more, the table at most half full. */
static int hdrs_grow(idx_hdrs *h)
{
    if (h->n == h->cap) {
        int cap = h->cap ? h->cap * 2 : 16;
        char **r = realloc(h->real, (size_t)cap * sizeof *r);
        if (r)
            h->real = r;
        file_sig *g = r ? realloc(h->sig, (size_t)cap * sizeof *g) : NULL;
        if (!g)
            return -1;
        h->sig = g;
        h->cap = cap;
    }
    if (2 * (h->n + 1) <= h->nslot)
        return 0;
    int nslot = h->nslot ? h->nslot * 2 : 64;
    int *slot = calloc((size_t)nslot, sizeof *slot);
    if (!slot)
        return -1;
    for (int id = 0; id < h->n; id++) {
        size_t i = path_hash(h->real[id]) % (size_t)nslot;
        while (slot[i])
            i = (i + 1) % (size_t)nslot;
        slot[i] = id + 1;
    }
    free(h->slot);
    h->slot = slot;
    h->nslot = nslot;
    return 0;
}

int hdrs_add(idx_hdrs *h, const char *real, const file_sig *sig)
{
    if (hdrs_grow(h) || !(h->real[h->n] = strdup(real)))
        return -1;
    h->sig[h->n] = *sig;
    size_t i = path_hash(real) % (size_t)h->nslot;
    while (h->slot[i])
        i = (i + 1) % (size_t)h->nslot;
    h->slot[i] = h->n + 1;
    return h->n++;
}

void hdrs_free(idx_hdrs *h)
{
    for (int i = 0; i < h->n; i++)
        free(h->real[i]);
    free(h->real);
    free(h->sig);
    free(h->slot);
    memset(h, 0, sizeof *h);
}

/* ---- writing a note ------------------------------------------------------------- */

static void sig_write(FILE *f, const file_sig *g)
{
    fprintf(f, "\t%llu\t%llu\t%llu\t%lld\t%lld", g->dev, g->ino, g->size, g->mtime, g->ctime);
}

static void src_write(FILE *f, const idx_src *s)
{
    fprintf(f, "src\t%s", s->file);
    sig_write(f, &s->sig);
    fprintf(f, "\t%d\t", s->status);
    for (int i = 0; i < s->nhdrs; i++)
        fprintf(f, "%s%d", i ? "," : "", s->hdrs[i]);
    fputc('\t', f);
    for (int i = 0; i < s->nops; i++)
        fprintf(f, "%s%s", i ? " " : "", s->ops[i]);
    fprintf(f, "\t%s\n", s->msg ? s->msg : "");
}

typedef struct op_line {
    const char *name, *file;
} op_line;

static int op_line_cmp(const void *a, const void *b)
{
    const op_line *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : strcmp(x->file, y->file);
}

/* The op section: every (op, source) pair, sorted. */
static int ops_write(FILE *f, const idx_src *v, int n)
{
    size_t k = 0, cap = 0;
    op_line *ol = NULL;
    for (int i = 0; i < n; i++)
        for (int j = 0; v[i].status == OPJIT_OK && j < v[i].nops; j++) {
            if (k == cap) {
                cap = cap ? cap * 2 : 64;
                op_line *nl = realloc(ol, cap * sizeof *nl);
                if (!nl) {
                    free(ol);
                    return -1;
                }
                ol = nl;
            }
            ol[k++] = (op_line){v[i].ops[j], v[i].file};
        }
    if (k > 1)
        qsort(ol, k, sizeof *ol, op_line_cmp);
    for (size_t i = 0; i < k; i++)
        fprintf(f, "op\t%s\t%s\n", ol[i].name, ol[i].file);
    free(ol);
    return 0;
}

void note_put_escaped(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '\\' || *s == '\t' || *s == '\n')
            fputc('\\', f), fputc(*s == '\t' ? 't' : *s == '\n' ? 'n' : '\\', f);
        else
            fputc(*s, f);
    }
}

/* A record's section: each op's schema and doc, the whole message, the
 * time limit discovery ran out of. */
static void defs_write(FILE *f, const idx_src *s)
{
    for (int i = 0; s->schemas && s->docs && i < s->nops; i++) {
        fputs("def\t", f);
        note_put_escaped(f, s->schemas[i]);
        fputc('\t', f);
        note_put_escaped(f, s->docs[i]);
        fputc('\n', f);
    }
    if (s->detail && *s->detail) {
        fputs("detail\t", f);
        note_put_escaped(f, s->detail);
        fputc('\n', f);
    }
    if (s->limit_ms > 0)
        fprintf(f, "limit\t%ld\n", s->limit_ms);
}

/* One section into a buffer of its own: 0 or -1. */
static int section(char **buf, size_t *len, const idx_src *v, int n, const idx_hdrs *h,
                   int which, int record)
{
    FILE *f = open_memstream(buf, len);
    if (!f)
        return -1;
    int rc = 0;
    if (which == 0) {
        for (int i = 0; h && i < h->n; i++) {
            fprintf(f, "hdr\t%d", i);
            sig_write(f, &h->sig[i]);
            fprintf(f, "\t%s\n", h->real[i]);
        }
    } else if (which == 1) {
        for (int i = 0; i < n; i++)
            src_write(f, &v[i]);
    } else if (which == 2) {
        rc = ops_write(f, v, n);
    } else if (record && n == 1) {
        defs_write(f, v);
    }
    if (fclose(f) != 0 || rc) {
        free(*buf);
        *buf = NULL;
        return -1;
    }
    return 0;
}

#define LAYOUT_FMT "%s\nlayout\t" OFF_FMT "\t" OFF_FMT "\t" OFF_FMT "\t" OFF_FMT "\t%d\t%d\t%d\n"

char *note_text(const idx_src *v, int n, const idx_hdrs *h, int cuda, int record)
{
    char *sec[4] = {NULL, NULL, NULL, NULL}, *out = NULL;
    size_t len[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; i++)
        if (section(&sec[i], &len[i], v, n, h, i, record))
            goto done;
    char head[256];
    int nh = h ? h->n : 0;
    /* The layout line's length does not depend on the offsets' values. */
    int hl = snprintf(head, sizeof head, LAYOUT_FMT, INDEX_FORMAT, (size_t)0, (size_t)0,
                      (size_t)0, (size_t)0, nh, n, cuda);
    size_t off[4] = {(size_t)hl};
    for (int i = 1; i < 4; i++)
        off[i] = off[i - 1] + len[i - 1];
    snprintf(head, sizeof head, LAYOUT_FMT, INDEX_FORMAT, off[0], off[1], off[2], off[3], nh, n,
             cuda);
    if (!(out = malloc(off[3] + len[3] + 1)))
        goto done;
    memcpy(out, head, (size_t)hl);
    for (int i = 0; i < 4; i++)
        memcpy(out + off[i], sec[i], len[i]);
    out[off[3] + len[3]] = '\0';
done:
    for (int i = 0; i < 4; i++)
        free(sec[i]);
    return out;
}

/* ---- reading fields ------------------------------------------------------------- */

/* The field at *p (up to a tab or the end of its line), *p moved past
 * it; NULL at the end of the line. */
static const char *field(const char **p, const char *end, size_t *len)
{
    const char *s = *p;
    if (!s || s >= end || *s == '\n')
        return NULL;
    const char *e = s;
    while (e < end && *e != '\t' && *e != '\n')
        e++;
    *len = (size_t)(e - s);
    *p = e < end && *e == '\t' ? e + 1 : NULL;
    return s;
}

static int field_num(const char **p, const char *end, long long *v)
{
    size_t len;
    const char *s = field(p, end, &len);
    char buf[32];
    if (!s || !len || len >= sizeof buf)
        return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *e;
    errno = 0;
    *v = strtoll(buf, &e, 10);
    if (*e || errno) {
        unsigned long long u = strtoull(buf, &e, 10); /* dev and ino may be past LLONG_MAX */
        if (*e || errno)
            return -1;
        memcpy(v, &u, sizeof u);
    }
    return 0;
}

static int sig_read(const char **p, const char *end, file_sig *g)
{
    long long v[5];
    for (int i = 0; i < 5; i++)
        if (field_num(p, end, &v[i]))
            return -1;
    memcpy(&g->dev, &v[0], sizeof g->dev);
    memcpy(&g->ino, &v[1], sizeof g->ino);
    memcpy(&g->size, &v[2], sizeof g->size);
    g->mtime = v[3];
    g->ctime = v[4];
    return 0;
}

/* Compare the field at s (ended by a tab or newline) with key[0..n). */
static int field_cmp(const char *s, const char *end, const char *key, size_t n)
{
    for (size_t i = 0;; i++) {
        int a = s + i < end && s[i] != '\t' && s[i] != '\n' ? (unsigned char)s[i] : -1;
        int b = i < n ? (unsigned char)key[i] : -1;
        if (a != b || a < 0)
            return a < b ? -1 : a > b;
    }
}

/* The first line of [a, b) (sorted, each "tag\tkey...") whose key is not
 * below key; b when none. */
static const char *lower_bound(const char *a, const char *b, size_t tag, const char *key,
                               size_t n)
{
    while (a < b) {
        const char *ls = a + (b - a) / 2;
        while (ls > a && ls[-1] != '\n')
            ls--;
        const char *le = memchr(ls, '\n', (size_t)(b - ls));
        le = le ? le + 1 : b;
        if ((size_t)(le - ls) > tag && field_cmp(ls + tag, b, key, n) < 0)
            a = le;
        else
            b = ls;
    }
    return a;
}

/* ---- a note, read ----------------------------------------------------------------- */

int note_open(idx_note *n, char *text, size_t len)
{
    memset(n, 0, sizeof *n);
    size_t fl = strlen(INDEX_FORMAT);
    size_t off[4];
    int nh, ns, cuda, used = 0;
    if (len < fl + 1 || strncmp(text, INDEX_FORMAT, fl) || text[fl] != '\n' ||
        sscanf(text + fl + 1, "layout\t%zu\t%zu\t%zu\t%zu\t%d\t%d\t%d\n%n", &off[0], &off[1],
               &off[2], &off[3], &nh, &ns, &cuda, &used) != 7 || !used ||
        off[0] != fl + 1 + (size_t)used || off[0] > off[1] || off[1] > off[2] ||
        off[2] > off[3] || off[3] > len || text[off[1] - 1] != '\n' ||
        text[off[2] - 1] != '\n' || text[off[3] - 1] != '\n' ||
        (len && text[len - 1] != '\n') || nh < 0 || ns < 0) {
        free(text);
        return -1;
    }
    *n = (idx_note){text, len, text + off[0], text + off[1], text + off[2], text + off[3],
                    text + off[3], text + len, nh, ns, cuda};
    return 0;
}

void note_close(idx_note *n)
{
    free(n->text);
    memset(n, 0, sizeof *n);
}

/* The source line at p (its end at most end) into e. 0 or -1. */
static int ent_parse(const char *p, const char *end, idx_ent *e)
{
    const char *q = p + 4; /* "src\t" */
    long long status;
    memset(e, 0, sizeof *e);
    if (strncmp(p, "src\t", 4) || !(e->file = field(&q, end, &e->file_len)) ||
        sig_read(&q, end, &e->sig) || field_num(&q, end, &status))
        return -1;
    e->status = (int)status;
    e->hdrs = field(&q, end, &e->hdrs_len);
    e->ops = field(&q, end, &e->ops_len);
    e->msg = field(&q, end, &e->msg_len);
    if (!e->msg) /* an empty message ends the line */
        e->msg = "", e->msg_len = 0;
    if (!e->hdrs)
        e->hdrs = "", e->hdrs_len = 0;
    if (!e->ops)
        e->ops = "", e->ops_len = 0;
    return 0;
}

int note_src(const idx_note *n, const char *file, size_t len, idx_ent *e)
{
    const char *ls = lower_bound(n->src, n->op, 4, file, len);
    return ls < n->op && field_cmp(ls + 4, n->op, file, len) == 0 &&
           ent_parse(ls, n->op, e) == 0;
}

int note_next_src(const idx_note *n, const char **at, idx_ent *e)
{
    const char *p = *at ? *at : n->src;
    while (p < n->op) {
        const char *le = memchr(p, '\n', (size_t)(n->op - p));
        const char *next = le ? le + 1 : n->op;
        int ok = ent_parse(p, n->op, e) == 0;
        p = next;
        if (ok) {
            *at = p;
            return 1;
        }
    }
    *at = p;
    return 0;
}

int note_each_definer(const idx_note *n, const char *op,
                      int (*fn)(void *ud, const char *file, size_t len), void *ud)
{
    size_t on = strlen(op);
    for (const char *ls = lower_bound(n->op, n->end, 3, op, on); ls < n->end;) {
        const char *le = memchr(ls, '\n', (size_t)(n->end - ls));
        if (!le || strncmp(ls, "op\t", 3) || field_cmp(ls + 3, n->end, op, on) != 0)
            break;
        const char *q = ls + 3 + on + 1;
        size_t fl;
        const char *file = q <= le ? field(&q, n->end, &fl) : NULL;
        int r = file ? fn(ud, file, fl) : 0;
        if (r)
            return r;
        ls = le + 1;
    }
    return 0;
}

int note_hdr(const idx_note *n, long id, const char **real, size_t *len, file_sig *sig)
{
    /* Ids are 0.. in order, so a binary search on the number's text does
     * not work; on the value it does. */
    const char *a = n->hdr, *b = n->src;
    while (a < b) {
        const char *ls = a + (b - a) / 2;
        while (ls > a && ls[-1] != '\n')
            ls--;
        const char *le = memchr(ls, '\n', (size_t)(b - ls));
        le = le ? le + 1 : b;
        const char *q = ls + 4;
        long long v;
        if (strncmp(ls, "hdr\t", 4) || field_num(&q, b, &v))
            return 0;
        if (v < id) {
            a = le;
        } else if (v > id) {
            b = ls;
        } else {
            return sig_read(&q, b, sig) == 0 && (*real = field(&q, b, len)) != NULL;
        }
    }
    return 0;
}

int ent_to_src(const idx_ent *e, idx_src *out)
{
    memset(out, 0, sizeof *out);
    out->keep = 1;
    out->sig = e->sig;
    out->status = e->status;
    if (!(out->file = strndup(e->file, e->file_len)) || !(out->msg = strndup(e->msg, e->msg_len)))
        return -1;
    for (const char *p = e->ops, *end = e->ops + e->ops_len; p < end;) {
        const char *sp = memchr(p, ' ', (size_t)(end - p));
        size_t l = sp ? (size_t)(sp - p) : (size_t)(end - p);
        if (l && src_add_op(out, p, l))
            return -1;
        p += l + 1;
    }
    return 0;
}

int ent_defines(const idx_ent *e, const char *op)
{
    size_t on = strlen(op);
    if (e->status != OPJIT_OK)
        return 0;
    for (const char *p = e->ops, *end = e->ops + e->ops_len; p < end;) {
        const char *sp = memchr(p, ' ', (size_t)(end - p));
        size_t l = sp ? (size_t)(sp - p) : (size_t)(end - p);
        if (l == on && !memcmp(p, op, on))
            return 1;
        p += l + 1;
    }
    return 0;
}

/* The escaped field s (len bytes) as a string of its own, or NULL. */
static char *unescaped(const char *s, size_t len)
{
    char *out = malloc(len + 1), *w = out;
    for (size_t i = 0; out && i < len; i++) {
        if (s[i] == '\\' && i + 1 < len) {
            i++;
            *w++ = s[i] == 't' ? '\t' : s[i] == 'n' ? '\n' : s[i];
        } else {
            *w++ = s[i];
        }
    }
    if (out)
        *w = '\0';
    return out;
}

int note_record(const idx_note *n, idx_src *out)
{
    const char *at = NULL;
    idx_ent e;
    memset(out, 0, sizeof *out);
    if (n->nsrc != 1 || !note_next_src(n, &at, &e))
        return -1;
    /* The ops come from the def lines, with their schemas and docs. */
    const char *ops = e.ops;
    size_t ops_len = e.ops_len;
    e.ops = "", e.ops_len = 0;
    if (ent_to_src(&e, out))
        goto bad;
    for (const char *p = n->def; p < n->fin;) {
        const char *le = memchr(p, '\n', (size_t)(n->fin - p)), *q;
        if (!le)
            goto bad;
        if (!strncmp(p, "def\t", 4)) {
            const char *t = memchr(p + 4, '\t', (size_t)(le - p - 4));
            if (!t)
                goto bad;
            char *schema = unescaped(p + 4, (size_t)(t - p - 4));
            char *doc = unescaped(t + 1, (size_t)(le - t - 1));
            int rc = schema && doc ? src_add_def(out, schema, doc, 1) : -1;
            free(schema);
            free(doc);
            if (rc)
                goto bad;
        } else if (!strncmp(p, "detail\t", 7)) {
            free(out->detail);
            if (!(out->detail = unescaped(p + 7, (size_t)(le - p - 7))))
                goto bad;
        } else if (!strncmp(p, "limit\t", 6)) {
            q = p + 6;
            long long v;
            if (field_num(&q, le, &v) || v <= 0)
                goto bad;
            out->limit_ms = (long)v;
        }
        p = le + 1;
    }
    /* The entry's ops are the def lines' names, in the same order. */
    const char *p = ops, *end = ops + ops_len;
    for (int i = 0; i < out->nops; i++) {
        size_t l = strlen(out->ops[i]);
        if ((size_t)(end - p) < l || memcmp(p, out->ops[i], l) ||
            (p + l < end && p[l] != ' '))
            goto bad;
        p += l + (p + l < end);
    }
    if (p != end)
        goto bad;
    return 0;
bad:
    src_free(out);
    return -1;
}
