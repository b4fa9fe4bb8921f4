/* loader/source.c - one op source: its name, its text, the local headers
 * it includes, and the digest of everything its artifacts depend on. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "loader/loader_int.h"
#include "opjit_build_config.h"

/* ---- reading sources ------------------------------------------------------ */

char *loader_read_file(const char *path, size_t *len)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is then
     * refused as not a regular file. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    int bad = fstat(fd, &st) != 0 ? errno : !S_ISREG(st.st_mode) ? EINVAL : 0;
    if (bad) {
        close(fd);
        errno = bad;
        return NULL;
    }
    size_t cap = st.st_size > 0 ? (size_t)st.st_size + 1 : 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r < 0) {
                free(buf);
                buf = NULL;
                errno = EIO;
            }
            break;
        }
        n += (size_t)r;
        /* All the size fstat saw: no read more to learn of the end (a
         * file that grows meanwhile is read as it was; its digest and its
         * compile take these bytes). A size of 0 (/proc) reads to the end. */
        if (st.st_size > 0 && n == (size_t)st.st_size)
            break;
        if (n == cap - 1) { /* it grew while we read */
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    int e = errno;
    close(fd);
    if (!buf) {
        errno = e == EIO ? EIO : ENOMEM;
        return NULL;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

/* Local headers: every `#include "x"` resolved against the including
 * file's directory, transitively, as the compiler finds them. Each goes
 * into the key as (name relative to the source's directory, contents).
 * Every one counts, however many and however deep (each is visited once,
 * which ends include cycles): one left out would make its edits stale
 * cache hits. The buffers live on the heap, as the recursion may be deep. */
#define MAX_INCLUDE_DEPTH 1024

typedef struct header_set {
    char **real; /* realpaths already hashed */
    int n, cap;
    /* Every path looked up and what it named (NULL: nothing): a name
     * included from several files (opjit_op.h, <string.h>, a shared
     * header) costs one lstat, not one per include. */
    struct header_looked {
        char *path, *real;
    } *looked;
    int nlooked, caplooked;
    int oom;
    char *bad;   /* the first local header that is not a regular file */
    readable *inputs; /* "header NAME HASH" lines, or NULL: not wanted */
    const source_confine *confine; /* NULL, or the inline source's rule */
    source_refusal *refused;       /* where a confine rule was broken */
} header_set;

/* realpath(path) for path = dir/name, dir a real path, malloc'd: a name
 * of one component that is not a symbolic link names itself (one lstat,
 * where realpath reads every component's link); anything else is
 * resolved. NULL when path names nothing (or out of memory: *oom). */
static char *header_real(const char *path, const char *name, int *oom)
{
    struct stat st;
    char *r;
    if (!strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..")) {
        if (lstat(path, &st) != 0)
            return NULL;
        if (!S_ISLNK(st.st_mode))
            return (r = strdup(path)) ? r : (*oom = 1, NULL);
    }
    r = realpath(path, NULL);
    if (!r && errno == ENOMEM)
        *oom = 1;
    return r;
}

/* header_real through the lookups already made (hs->looked): a copy of
 * what path named, or NULL. */
static char *header_lookup(header_set *hs, const char *path, const char *name)
{
    for (int i = 0; i < hs->nlooked; i++)
        if (!strcmp(hs->looked[i].path, path)) {
            const char *real = hs->looked[i].real;
            char *r = real ? strdup(real) : NULL;
            if (real && !r)
                hs->oom = 1;
            return r;
        }
    char *r = header_real(path, name, &hs->oom);
    if (hs->nlooked == hs->caplooked) {
        int cap = hs->caplooked ? hs->caplooked * 2 : 16;
        struct header_looked *p = realloc(hs->looked, (size_t)cap * sizeof *p);
        if (!p)
            return r; /* not remembered: looked up again next time */
        hs->looked = p;
        hs->caplooked = cap;
    }
    char *pc = strdup(path), *rc = r ? strdup(r) : NULL;
    if (!pc || (r && !rc)) {
        free(pc);
        free(rc);
        return r;
    }
    hs->looked[hs->nlooked++] = (struct header_looked){pc, rc};
    return r;
}

static void header_set_free(header_set *hs)
{
    for (int i = 0; i < hs->n; i++)
        free(hs->real[i]);
    free(hs->real);
    for (int i = 0; i < hs->nlooked; i++) {
        free(hs->looked[i].path);
        free(hs->looked[i].real);
    }
    free(hs->looked);
}

/* a + b + c, malloc'd; NULL (and *oom) when out of memory. The strings
 * of a header's lookup are small and freed at once: they share a few
 * heap pages, where buffers of PATH_MAX each would touch a page apiece. */
static char *join3(const char *a, const char *b, const char *c, int *oom)
{
    size_t na = strlen(a), nb = strlen(b), nc = strlen(c);
    char *r = malloc(na + nb + nc + 1);
    if (!r) {
        *oom = 1;
        return NULL;
    }
    memcpy(r, a, na);
    memcpy(r + na, b, nb);
    memcpy(r + na + nb, c, nc + 1);
    return r;
}

static int header_seen(header_set *hs, const char *real)
{
    for (int i = 0; i < hs->n; i++)
        if (!strcmp(hs->real[i], real))
            return 1;
    if (hs->n == hs->cap) {
        int cap = hs->cap ? hs->cap * 2 : 16;
        char **p = realloc(hs->real, (size_t)cap * sizeof *p);
        if (!p)
            return hs->oom = 1;
        hs->real = p;
        hs->cap = cap;
    }
    if (!(hs->real[hs->n] = strdup(real)))
        return hs->oom = 1;
    hs->n++;
    return 0;
}

/* One file's bytes into the key and its readable line, hashed once: the
 * key takes the file's XXH3-128, the line its first 64 bits. g NULL: no
 * hashing at all (source_each_header). */
static void digest_add(cache_keygen *g, readable *inputs, const char *field, const char *value,
                       const void *data, size_t len)
{
    if (!g)
        return;
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(data, len));
    cache_keygen_add(g, field, c.digest, sizeof c.digest);
    readable_add_sum(inputs, field, value, c.digest);
}

static void add_local_headers(cache_keygen *g, const char *src_dir, const char *dir,
                              const char *text, const char *rel_prefix, header_set *hs,
                              int depth);

/* The include directive at p (a '#' in text), if one: *quoted, and its
 * name into name (less than 512 bytes). */
static int include_at(const char *text, const char *p, int *quoted, char name[512])
{
    const char *q = p + 1;
    /* must be at the start of a line, maybe indented */
    const char *bl = p;
    while (bl > text && (bl[-1] == ' ' || bl[-1] == '\t'))
        bl--;
    if (bl > text && bl[-1] != '\n')
        return 0;
    while (*q == ' ' || *q == '\t')
        q++;
    if (strncmp(q, "include", 7))
        return 0;
    q += 7;
    while (*q == ' ' || *q == '\t')
        q++;
    if (*q != '"' && *q != '<')
        return 0;
    *quoted = *q == '"';
    const char *e = strchr(q + 1, *quoted ? '"' : '>');
    const char *nl = strchr(q + 1, '\n');
    if (!e || (nl && nl < e) || e - q - 1 >= 512)
        return 0;
    memcpy(name, q + 1, (size_t)(e - q - 1));
    name[e - q - 1] = '\0';
    return 1;
}

/* Where the compiler finds name first: "x.h" next to the including file
 * (dir), then (like <x.h>) in the source's directory. *real and *rel
 * (malloc'd) when found there, else both NULL. */
static void header_find(header_set *hs, const char *src_dir, const char *dir, const char *name,
                        int quoted, const char *rel_prefix, char **real, char **rel)
{
    int *oom = &hs->oom;
    char *path = quoted ? join3(dir, "/", name, oom) : NULL;
    *rel = NULL;
    *real = path ? header_lookup(hs, path, name) : NULL;
    if (*real) {
        *rel = join3(rel_prefix, "", name, oom);
    } else {
        free(path);
        path = join3(src_dir, "/", name, oom);
        *real = path ? header_lookup(hs, path, name) : NULL;
        if (*real)
            *rel = join3("", "", name, oom);
    }
    free(path);
    if (*real && !*rel) {
        free(*real);
        *real = NULL;
    }
}

/* A local header found at real (rel from the source's directory): into
 * the key, then its own includes. */
static void add_header(cache_keygen *g, const char *src_dir, const char *real, const char *rel,
                       header_set *hs, int depth)
{
    size_t len;
    char *h = loader_read_file(real, &len);
    if (!h && errno == EINVAL && !hs->bad) /* a FIFO or device: the compiler would hang */
        hs->bad = strdup(real);
    if (!h)
        return;
    cache_keygen_add_str(g, "header-name", rel);
    digest_add(g, hs->inputs, "header", rel, h, len);
    const char *slash = strrchr(real, '/'), *rslash = strrchr(rel, '/');
    char *hdir = strndup(real, slash ? (size_t)(slash - real) : strlen(real));
    char *hprefix = strndup(rel, rslash ? (size_t)(rslash - rel + 1) : 0);
    if (hdir && hprefix)
        add_local_headers(g, src_dir, hdir, h, hprefix, hs, depth + 1);
    else
        hs->oom = 1;
    free(hdir);
    free(hprefix);
    free(h);
}

/* dir: the including file's directory; src_dir: the source's, which the
 * compilers also search first (-I) for "x.h" and <x.h> alike. */
static void add_local_headers(cache_keygen *g, const char *src_dir, const char *dir,
                              const char *text, const char *rel_prefix, header_set *hs,
                              int depth)
{
    if (depth > MAX_INCLUDE_DEPTH) {
        hs->oom = 1; /* never a key that silently lacks headers */
        return;
    }
    char name[512];
    int quoted;
    for (const char *p = text; (p = strchr(p, '#')) && !hs->oom; p++) {
        if (!include_at(text, p, &quoted, name))
            continue;
        char *real, *rel;
        header_find(hs, src_dir, dir, name, quoted, rel_prefix, &real, &rel);
        if (hs->confine && hs->confine->dir &&
            source_confine_check(hs->confine, hs->refused, text, p, depth, quoted, real != NULL,
                                 name, real)) {
            free(real);
            free(rel);
            break; /* refused: the load fails with why */
        }
        /* Not found: not local (a system header), or the compiler will fail. */
        if (real && !header_seen(hs, real))
            add_header(g, src_dir, real, rel, hs, depth);
        free(real);
        free(rel);
        if (hs->refused && hs->refused->kind)
            break;
    }
}

/* ---- one source file ------------------------------------------------------ */

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static void source_digest(const source *s, cache_key *out, char **bad_header, readable *inputs,
                          source_refusal *refused);

int source_read(loader *l, const char *path, source *s)
{
    opjit_runtime *rt = l->rt;
    /* Field by field, not a memset of all 8 KiB (pages a fresh process
     * has not touched): the path buffers are filled below, up to their
     * strings. (A field added to source is cleared here too.) */
    s->path = path;
    s->real[0] = s->dir[0] = s->stem[0] = '\0';
    s->name = NULL;
    s->text = NULL;
    s->len = 0;
    s->device = 0;
    s->uses_blas = 0;
    memset(&s->digest, 0, sizeof s->digest);
    s->inputs = (readable){0};
    s->confine = (source_confine){0};
    if (has_suffix(path, ".c"))
        s->device = OPJIT_CPU;
    else if (has_suffix(path, ".cu"))
        s->device = OPJIT_CUDA; /* host half by libtcc, device half by NVRTC */
    else
        return rt_error(rt, OPJIT_EINVAL, "%s: not an op source (expected a .c or .cu file)",
                        path);
    if (!realpath(path, s->real))
        return rt_error(rt, errno == ENOENT ? OPJIT_ENOTFOUND : OPJIT_EIO, "%s: %s", path,
                        strerror(errno));
    s->text = loader_read_file(s->real, &s->len);
    if (!s->text && errno == EINVAL)
        return rt_error(rt, OPJIT_EINVAL, "%s: not a regular file", path);
    if (!s->text)
        return rt_error(rt, OPJIT_EIO, "%s: cannot read: %s", path, strerror(errno));
    if (strlen(s->text) != s->len) {
        source_free(s);
        return rt_error(rt, OPJIT_EINVAL, "%s: not a text file (it holds a NUL byte)", path);
    }
    snprintf(s->dir, sizeof s->dir, "%s", s->real);
    *strrchr(s->dir, '/') = '\0';
    return source_finish(l, s);
}

int source_finish(loader *l, source *s)
{
    s->name = base_name(s->path);
    /* Once: every key of the source asks (a .cu's, per architecture, too). */
    s->uses_blas = strstr(s->text, "cblas") != NULL;
    snprintf(s->stem, sizeof s->stem, "%.*s", (int)(strrchr(s->name, '.') - s->name), s->name);
    char *bad = NULL;
    source_refusal refused;
    refused.kind = 0; /* msg is written only with a kind */
    source_digest(s, &s->digest, &bad, &s->inputs, &refused);
    if (refused.kind) {
        rt_error(l->rt, OPJIT_EINVAL, "%s", refused.msg);
        free(bad);
        source_free(s);
        return OPJIT_EINVAL;
    }
    if (bad) {
        rt_error(l->rt, OPJIT_EINVAL, "%s: the local header %s is not a regular file", s->path,
                 bad);
        free(bad);
        source_free(s);
        return OPJIT_EINVAL;
    }
    return OPJIT_OK;
}

void source_free(source *s)
{
    free(s->text);
    s->text = NULL;
    readable_free(&s->inputs);
}

/* ---- readable key inputs ---------------------------------------------------- */

void readable_add(readable *r, const char *name, const char *value, const void *data,
                  size_t len)
{
    unsigned char sum[8];
    uint64_t h = data ? XXH3_64bits(data, len) : 0;
    for (int i = 0; i < 8; i++)
        sum[i] = (unsigned char)(h >> (56 - 8 * i));
    readable_add_sum(r, name, value, data ? sum : NULL);
}

void readable_add_sum(readable *r, const char *name, const char *value,
                      const unsigned char *sum)
{
    if (!r || r->oom)
        return;
    char hash[24] = "";
    if (sum) {
        static const char hexd[] = "0123456789abcdef";
        char *o = hash;
        if (value[0])
            *o++ = ' ';
        for (int i = 0; i < 8; i++) {
            *o++ = hexd[sum[i] >> 4];
            *o++ = hexd[sum[i] & 15];
        }
        *o = '\0';
    }
    size_t need = strlen(name) + strlen(value) + strlen(hash) + 3;
    if (r->len + need > r->cap) {
        size_t cap = (r->cap ? r->cap * 2 : 256) + need;
        char *t = realloc(r->text, cap);
        if (!t) {
            r->oom = 1;
            return;
        }
        r->text = t;
        r->cap = cap;
    }
    /* One line each: values never hold a newline (escaped by the manifest
     * anyway, but a line is what `cache why` compares). Copied, not
     * printed: a load adds several. */
    char *o = r->text + r->len, *line = o;
    size_t nn = strlen(name), nv = strlen(value), nh = strlen(hash);
    memcpy(o, name, nn);
    o += nn;
    *o++ = ' ';
    memcpy(o, value, nv);
    o += nv;
    memcpy(o, hash, nh);
    o += nh;
    for (char *q = line; q < o; q++)
        if (*q == '\n')
            *q = ' ';
    *o++ = '\n';
    *o = '\0';
    r->len += (size_t)(o - line);
}

void readable_free(readable *r)
{
    free(r->text);
    memset(r, 0, sizeof *r);
}

/* opjit_op.h's SHA-256 as raw bytes: the header is this library's, hashed
 * when it was built (a hit never reads the header's text). */
static const unsigned char op_header_digest[32] = {OPJIT_OP_H_SHA256_BYTES};

static const unsigned char *op_header_sum(void)
{
    return op_header_digest;
}

/* What every artifact of s depends on, hashed: opjit's ABI and op header,
 * the source's name and bytes, its local headers as they are on disk.
 * *bad_header (NULL: not wanted) receives a local header that is not a
 * regular file (malloc'd), which no compile may be asked to open. */
static void source_digest(const source *s, cache_key *out, char **bad_header, readable *inputs,
                          source_refusal *refused)
{
    cache_keygen *g = cache_keygen_new();
    if (!g) {
        memset(out, 0, sizeof *out); /* the cache refuses an all-zero key */
        return;
    }
    char abi[32];
    snprintf(abi, sizeof abi, "%d", OPJIT_ABI_VERSION);
    cache_keygen_add_str(g, "opjit-abi", abi);
    readable_add(inputs, "opjit-abi", abi, NULL, 0);
    loader_add_op_header(g);
    readable_add_sum(inputs, "opjit_op.h", "", op_header_sum());
    cache_keygen_add_str(g, "source-name", s->name);
    digest_add(g, inputs, "source", s->name, s->text, s->len);
    source_refusal ignored;
    ignored.kind = 0;
    header_set hs = {.inputs = inputs, .confine = s->confine.dir ? &s->confine : NULL,
                     .refused = refused ? refused : &ignored};
    add_local_headers(g, s->dir, s->dir, s->text, "", &hs, 0);
    header_set_free(&hs);
    if (bad_header)
        *bad_header = hs.bad;
    else
        free(hs.bad);
    if (hs.oom || hs.bad || hs.refused->kind || (inputs && inputs->oom)) {
        /* Never a key that silently lacks headers: the all-zero key, which
         * the cache refuses (out of memory). */
        cache_keygen_finish(g, out);
        memset(out, 0, sizeof *out);
        return;
    }
    cache_keygen_finish(g, out);
}

void loader_add_op_header(cache_keygen *g)
{
    cache_keygen_add(g, "opjit_op.h-sha256", op_header_sum(), 32);
}

void source_each_header(const source *s, void (*fn)(void *ud, const char *real), void *ud)
{
    source_refusal ignored;
    ignored.kind = 0;
    header_set hs = {.confine = s->confine.dir ? &s->confine : NULL, .refused = &ignored};
    add_local_headers(NULL, s->dir, s->dir, s->text, "", &hs, 0); /* NULL: no hashing */
    for (int i = 0; i < hs.n; i++)
        fn(ud, hs.real[i]);
    header_set_free(&hs);
    free(hs.bad);
}

cache_keygen *source_keygen(const source *s)
{
    static const unsigned char zero[sizeof s->digest.bytes];
    /* An all-zero digest is one that could not be computed (out of
     * memory): no key may be made of it, or every such source would share
     * one. */
    if (!memcmp(s->digest.bytes, zero, sizeof zero))
        return NULL;
    cache_keygen *g = cache_keygen_new();
    if (g)
        cache_keygen_add(g, "source-digest", s->digest.bytes, sizeof s->digest.bytes);
    return g;
}

/* What a file is now (loader_int.h). */
file_sig file_sig_of(const struct stat *st)
{
    return (file_sig){(unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
                      (unsigned long long)st->st_size,
                      (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec,
                      (long long)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec};
}

int file_sig_eq(const file_sig *a, const file_sig *b)
{
    return !memcmp(a, b, sizeof *a);
}

int source_unchanged(const source *s)
{
    cache_key now;
    source_digest(s, &now, NULL, NULL, NULL);
    return !memcmp(now.bytes, s->digest.bytes, sizeof now.bytes);
}

/* Linking OpenBLAS costs its initialisation (2 to 15 ms of thread-pool
 * start-up) at every dlopen, so only sources that use it get it. */
int source_uses_blas(const source *s) { return s->uses_blas; }

int loader_is_path_spec(const char *spec)
{
    return strchr(spec, '/') || has_suffix(spec, ".c") || has_suffix(spec, ".cu");
}

size_t loader_source_stem(const char *file)
{
    size_t n = strlen(file);
    if (file[0] == '.')
        return 0;
    if (n > 2 && has_suffix(file, ".c"))
        return n - 2;
    if (n > 3 && has_suffix(file, ".cu"))
        return n - 3;
    return 0;
}

int loader_is_cuda_source(const char *path) { return has_suffix(path, ".cu"); }

int loader_each_source(opjit_runtime *rt, const char *name,
                       int (*fn)(void *ud, const char *path), void *ud)
{
    loader *l = rt->loader;
    const char *p = loader_ops_path(l);
    while (*p) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n) {
            char path[PATH_MAX];
            static const char *const suffixes[] = {".c", ".cu"};
            for (int i = 0; i < 2; i++) {
                /* A truncated path is another file (".cu" cut to ".c"). */
                if ((size_t)snprintf(path, sizeof path, "%.*s/%s%s", (int)n, p, name,
                                     suffixes[i]) < sizeof path &&
                    access(path, R_OK) == 0) {
                    int rc = fn(ud, path);
                    if (rc)
                        return rc;
                }
            }
        }
        p += n + (e ? 1 : 0);
    }
    return 0;
}
