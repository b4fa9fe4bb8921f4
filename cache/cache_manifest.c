/*
 * cache/cache_manifest.c - the manifest of an entry: writing it at publish,
 * and checking an entry against it (format, ownership, sizes, checksums,
 * every artifact a complete ELF file): the one verifier of an entry.
 *
 * The manifest is a small text file:
 *
 *   opjit-cache-manifest 1
 *   key 0123...cdef
 *   op nms
 *   source nms.c
 *   compiler libtcc 0.9.27
 *   options -O1
 *   target x86_64-linux
 *   tier tcc
 *   inputs source nms.c 89ab...%0Aheader nms_common.h ...%0A...   (optional)
 *   created 1732000000
 *   artifact 20480 89ab...(16 hex) host.so
 *   end 0123456789abcdef
 *
 * Values are the rest of the line, with bytes below 0x20, 0x7f and '%'
 * written as %XX. The end line carries the XXH3-64 of every byte before
 * it, so any damage to the manifest itself is detected.
 */
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "opjit.h"
#include "cache/cache_int.h"

/* ---- is an ELF artifact complete? -------------------------------------
 *
 * A compiler that hits a full disk or a file-size limit may leave a
 * truncated shared object and still report success (libtcc's
 * tcc_output_file does not check its writes). Checksummed and published,
 * such a file would crash every process that dlopens it (SIGBUS on the
 * missing pages). So every artifact that starts like an ELF file must have
 * every byte its headers point at: program headers, section headers and
 * the contents of both. And a shared object must not ask for an
 * executable stack (see CACHE_ELF_STACK). */

#define CACHE_ELF_INCOMPLETE (-1)
#define CACHE_ELF_UNSAFE (-2)

/* end = off + n * size, or UINT64_MAX on overflow. */
static uint64_t cache_elf_end(uint64_t off, uint64_t n, uint64_t size)
{
    if (size && n > UINT64_MAX / size)
        return UINT64_MAX;
    uint64_t len = n * size;
    return off > UINT64_MAX - len ? UINT64_MAX : off + len;
}

/* Where the checks read the artifact: a file (pread) or its bytes in
 * memory (a mapping the fetch hashed). */
typedef struct cache_elf_src {
    int fd;
    const unsigned char *mem; /* NULL: read fd */
    uint64_t size;
} cache_elf_src;

int cache_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? errno : EIO;
        got += (size_t)r;
    }
    return 0;
}

static int cache_pread_all(const cache_elf_src *src, void *buf, size_t n, uint64_t off)
{
    if (src->mem) {
        if (off > src->size || n > src->size - off)
            return EIO; /* as a short read */
        memcpy(buf, src->mem + off, n);
        return 0;
    }
    return cache_pread_full(src->fd, buf, n, off);
}

/* A shared object must carry PT_GNU_STACK without PF_X: glibc takes one
 * with none as needing an executable stack and makes the whole process's
 * stack executable when it is dlopened. 0 when it does; -1 none; 1 exec. */
#define CACHE_ELF_STACK(NAME, Phdr)                                                        \
    static int NAME(const Phdr *ph, size_t n)                                              \
    {                                                                                      \
        for (size_t i = 0; i < n; i++)                                                     \
            if (ph[i].p_type == PT_GNU_STACK)                                              \
                return (ph[i].p_flags & PF_X) ? 1 : 0;                                     \
        return -1;                                                                         \
    }
CACHE_ELF_STACK(cache_elf64_stack, Elf64_Phdr)
CACHE_ELF_STACK(cache_elf32_stack, Elf32_Phdr)

/* The checks, for one ELF class. Returns 0, an errno (could not read), or
 * -1 with why filled (incomplete). */
#define CACHE_ELF_CHECKER(NAME, Ehdr, Phdr, Shdr, cache_elf_stack)                                          \
    static int NAME(const cache_elf_src *fd, uint64_t size, char *why, size_t whylen)     \
    {                                                                                      \
        Ehdr eh;                                                                           \
        int e = cache_pread_all(fd, &eh, sizeof eh, 0);                                    \
        if (e)                                                                             \
            return e;                                                                      \
        uint64_t ph_end = cache_elf_end(eh.e_phoff, eh.e_phnum, eh.e_phentsize);           \
        uint64_t sh_end = cache_elf_end(eh.e_shoff, eh.e_shnum, eh.e_shentsize);           \
        if ((eh.e_phnum && eh.e_phentsize != sizeof(Phdr)) ||                              \
            (eh.e_shnum && eh.e_shentsize != sizeof(Shdr))) {                              \
            snprintf(why, whylen, "ELF header has bad table entry sizes");                 \
            return CACHE_ELF_INCOMPLETE;                                                   \
        }                                                                                  \
        if (ph_end > size || sh_end > size) {                                              \
            snprintf(why, whylen, "ELF headers reach byte %llu of a %llu-byte file",       \
                     (unsigned long long)(ph_end > sh_end ? ph_end : sh_end),              \
                     (unsigned long long)size);                                            \
            return CACHE_ELF_INCOMPLETE;                                                   \
        }                                                                                  \
        size_t nph = eh.e_phnum, nsh = eh.e_shnum;                                         \
        Phdr *ph = calloc(nph + 1, sizeof *ph);                                            \
        Shdr *sh = calloc(nsh + 1, sizeof *sh);                                            \
        e = !ph || !sh ? ENOMEM : 0;                                                       \
        if (!e && nph)                                                                     \
            e = cache_pread_all(fd, ph, nph * sizeof *ph, eh.e_phoff);                     \
        if (!e && nsh)                                                                     \
            e = cache_pread_all(fd, sh, nsh * sizeof *sh, eh.e_shoff);                     \
        int stack = !e && eh.e_type == ET_DYN ? cache_elf_stack(ph, nph) : 0;             \
        uint64_t need = 0;                                                                 \
        for (size_t i = 0; !e && i < nph; i++) {                                           \
            uint64_t end = cache_elf_end(ph[i].p_offset, 1, ph[i].p_filesz);               \
            need = end > need ? end : need;                                                \
        }                                                                                  \
        for (size_t i = 0; !e && i < nsh; i++) {                                           \
            uint64_t end = sh[i].sh_type == SHT_NOBITS                                     \
                               ? 0                                                         \
                               : cache_elf_end(sh[i].sh_offset, 1, sh[i].sh_size);         \
            need = end > need ? end : need;                                                \
        }                                                                                  \
        free(ph);                                                                          \
        free(sh);                                                                          \
        if (e)                                                                             \
            return e;                                                                      \
        if (need > size) {                                                                 \
            snprintf(why, whylen, "ELF contents reach byte %llu of a %llu-byte file",      \
                     (unsigned long long)need, (unsigned long long)size);                  \
            return CACHE_ELF_INCOMPLETE;                                                   \
        }                                                                                  \
        if (stack) {                                                                       \
            snprintf(why, whylen, "%s (dlopen would make the host's stack executable)",    \
                     stack < 0 ? "it has no PT_GNU_STACK header"                           \
                               : "its PT_GNU_STACK header asks for an executable stack");  \
            return CACHE_ELF_UNSAFE;                                                       \
        }                                                                                  \
        return 0;                                                                          \
    }

CACHE_ELF_CHECKER(cache_elf64_check, Elf64_Ehdr, Elf64_Phdr, Elf64_Shdr, cache_elf64_stack)
CACHE_ELF_CHECKER(cache_elf32_check, Elf32_Ehdr, Elf32_Phdr, Elf32_Shdr, cache_elf32_stack)

/* cache_elf_check, returning 0, CACHE_ELF_INCOMPLETE, CACHE_ELF_UNSAFE
 * or an errno. */
static int elf_check(const cache_elf_src *fd, uint64_t size, char *why, size_t whylen)
{
    unsigned char ident[EI_NIDENT];
    if (size < 4)
        return 0;
    int e = cache_pread_all(fd, ident, size < EI_NIDENT ? 4 : EI_NIDENT, 0);
    if (e)
        return e;
    if (memcmp(ident, ELFMAG, SELFMAG) != 0)
        return 0; /* not ELF (PTX text, a key): nothing to check here */
    if (size < sizeof(Elf64_Ehdr) && !(size >= sizeof(Elf32_Ehdr) && ident[EI_CLASS] == ELFCLASS32)) {
        snprintf(why, whylen, "ELF file of %llu bytes is shorter than its header",
                 (unsigned long long)size);
        return CACHE_ELF_INCOMPLETE;
    }
    if (ident[EI_CLASS] == ELFCLASS64)
        return cache_elf64_check(fd, size, why, whylen);
    if (ident[EI_CLASS] == ELFCLASS32)
        return cache_elf32_check(fd, size, why, whylen);
    snprintf(why, whylen, "ELF file of unknown class %u", ident[EI_CLASS]);
    return CACHE_ELF_INCOMPLETE;
}

static int elf_check_status(int rc, int *unsafe)
{
    *unsafe = rc == CACHE_ELF_UNSAFE;
    if (rc < 0)
        return OPJIT_ECACHE;
    return cache_status_errno(rc);
}

/* An artifact that starts like ELF must hold every byte its headers point
 * at (a truncated write is caught here), and a shared object must carry a
 * non-executable PT_GNU_STACK. OPJIT_OK: fine, or not ELF; OPJIT_ECACHE,
 * why filled and *unsafe 1 for an executable stack (0: incomplete); else
 * a status with errno from reading it. */
static int cache_elf_check(int fd, uint64_t size, int *unsafe, char *why, size_t whylen)
{
    cache_elf_src src = {.fd = fd, .size = size};
    return elf_check_status(elf_check(&src, size, why, whylen), unsafe);
}

/* The same for an artifact's size bytes at mem (mapped), errno EIO for
 * headers that point past them. */
static int cache_elf_check_mem(const void *mem, uint64_t size, int *unsafe, char *why,
                               size_t whylen)
{
    cache_elf_src src = {.fd = -1, .mem = mem, .size = size};
    return elf_check_status(elf_check(&src, size, why, whylen), unsafe);
}

#define CACHE_MAX_ARTIFACTS 4096

typedef struct cache_buf {
    char *p;
    size_t len, cap;
    int oom;
} cache_buf;

static void cache_buf_put(cache_buf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 512;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void cache_buf_printf(cache_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void cache_buf_printf(cache_buf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) {
        b->oom = 1; /* only used for short fixed formats */
        return;
    }
    cache_buf_put(b, tmp, (size_t)n);
}

/* "name value\n" with value escaped. */
static void cache_buf_field(cache_buf *b, const char *name, const char *value)
{
    static const char hexd[] = "0123456789abcdef";
    cache_buf_put(b, name, strlen(name));
    cache_buf_put(b, " ", 1);
    for (const unsigned char *s = (const unsigned char *)(value ? value : ""); *s; s++) {
        if (*s < 0x20 || *s == 0x7f || *s == '%') {
            char e[3] = {'%', hexd[*s >> 4], hexd[*s & 15]};
            cache_buf_put(b, e, 3);
        } else {
            cache_buf_put(b, (const char *)s, 1);
        }
    }
    cache_buf_put(b, "\n", 1);
}

static int cache_hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* Undo the %XX escapes in place. Returns -1 on a bad escape. */
static int cache_unescape(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (*r != '%') {
            *w++ = *r;
            continue;
        }
        int hi = cache_hexval(r[1]), lo = hi < 0 ? -1 : cache_hexval(r[2]);
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
            return -1;
        *w++ = (char)(hi << 4 | lo);
        r += 2;
    }
    *w = '\0';
    return 0;
}

static int cache_parse_u64(const char *s, int base, uint64_t *out)
{
    if (!*s || *s == '-' || *s == '+' || *s == ' ')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

/* A name the build may use for an artifact: a plain file name. */
static int cache_artifact_name_ok(const char *n)
{
    return *n && !strchr(n, '/') && strcmp(n, ".") && strcmp(n, "..") &&
           strcmp(n, "manifest");
}

void cache_artifacts_free(cache_artifact *a, int n)
{
    for (int i = 0; i < n; i++)
        free(a[i].name);
    free(a);
}

void cache_manifest_free(cache_manifest *m)
{
    free(m->buf);
    free(m->art); /* names point into buf */
    memset(m, 0, sizeof *m);
}

static int cache_hash_fd(int fd, uint64_t *sum, uint64_t *len)
{
    /* Small: every page of a fresh process's heap costs a fault. */
    enum { BUFSZ = 1 << 14 };
    XXH3_state_t *st = XXH3_createState();
    char *buf = malloc(BUFSZ);
    int rc = 0;
    uint64_t total = 0;
    if (!st || !buf) {
        rc = ENOMEM;
        goto out;
    }
    XXH3_64bits_reset(st);
    for (;;) {
        ssize_t n = read(fd, buf, BUFSZ);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = errno;
            goto out;
        }
        if (n == 0)
            break;
        XXH3_64bits_update(st, buf, (size_t)n);
        total += (uint64_t)n;
    }
    *sum = XXH3_64bits_digest(st);
    *len = total;
out:
    free(buf);
    XXH3_freeState(st);
    return rc;
}

static const char cache_manifest_oom[] = "out of memory reading the manifest";

/* buf (len bytes, NUL-terminated) must be whole: text whose last line,
 * "end <XXH3 of everything before it>", checks out. Cuts that line off.
 * Returns NULL or what is wrong. */
static const char *cache_manifest_unseal(char *buf, size_t len)
{
    if (len == 0 || buf[len - 1] != '\n' || strlen(buf) != len)
        return "manifest is truncated or not text";
    /* The end line is the last one; it covers everything before it. */
    char *end = NULL;
    for (char *p = buf + len - 1; p > buf; p--) {
        if (p[-1] == '\n') {
            end = p;
            break;
        }
    }
    uint64_t want;
    if (!end || strncmp(end, "end ", 4) != 0)
        return "manifest has no end line";
    buf[len - 1] = '\0';
    if (cache_parse_u64(end + 4, 16, &want) != 0 || strlen(end + 4) != 16)
        return "manifest end line is malformed";
    if (XXH3_64bits(buf, (size_t)(end - buf)) != want)
        return "manifest checksum mismatch";
    end[-1] = '\0'; /* cut the end line off */
    return NULL;
}

/* "artifact SIZE SUM NAME" (val: what follows the word), appended to
 * m->art, which has room for *cap. */
static const char *cache_manifest_artifact(cache_manifest *m, char *val, int *cap)
{
    char *s1 = strchr(val, ' '), *s2 = s1 ? strchr(s1 + 1, ' ') : NULL;
    if (!s2)
        return "manifest has a malformed artifact line";
    *s1 = *s2 = '\0';
    cache_artifact a = {s2 + 1, 0, 0};
    if (cache_parse_u64(val, 10, &a.size) != 0 || strlen(s1 + 1) != 16 ||
        cache_parse_u64(s1 + 1, 16, &a.sum) != 0 || !cache_artifact_name_ok(a.name))
        return "manifest has a malformed artifact line";
    if (m->nart == *cap) {
        if (*cap >= CACHE_MAX_ARTIFACTS)
            return "manifest lists too many artifacts";
        *cap = *cap ? *cap * 2 : 4;
        cache_artifact *na = realloc(m->art, (size_t)*cap * sizeof *na);
        if (!na)
            return cache_manifest_oom;
        m->art = na;
    }
    m->art[m->nart++] = a;
    return NULL;
}

/* Where the text field called name goes in m; NULL for no such field. */
static const char **cache_manifest_field(cache_manifest *m, const char *name)
{
    const char **slot[] = {&m->op,     &m->source, &m->compiler, &m->options,
                           &m->target, &m->tier,   &m->inputs};
    static const char *const names[] = {"op",     "source", "compiler", "options",
                                        "target", "tier",   "inputs"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i]))
            return slot[i];
    return NULL;
}

/* One "name value" line after the first. */
static const char *cache_manifest_line(cache_manifest *m, const char *name, char *val, int *cap,
                                       int *have_created)
{
    if (cache_unescape(val) != 0)
        return "manifest has a bad escape";
    if (!strcmp(name, "key")) {
        m->key = val;
        return NULL;
    }
    if (!strcmp(name, "created")) {
        uint64_t v;
        if (cache_parse_u64(val, 10, &v) != 0)
            return "manifest has a bad created time";
        m->created = (int64_t)v;
        *have_created = 1;
        return NULL;
    }
    if (!strcmp(name, "artifact"))
        return cache_manifest_artifact(m, val, cap);
    const char **field = cache_manifest_field(m, name);
    if (!field)
        return "manifest has an unknown line";
    *field = val;
    return NULL;
}

/* Parse m->buf (NUL-terminated, len bytes). Returns NULL or what is wrong
 * (cache_manifest_oom: nothing is, memory ran out). */
static const char *cache_manifest_parse(cache_manifest *m, size_t len)
{
    const char *bad = cache_manifest_unseal(m->buf, len);
    if (bad)
        return bad;
    int cap = 0, lineno = 0, have_created = 0;
    char *next;
    for (char *line = m->buf; line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        lineno++;
        char *sp = strchr(line, ' ');
        char *val = sp ? sp + 1 : line + strlen(line);
        if (sp)
            *sp = '\0';
        if (lineno > 1) {
            if ((bad = cache_manifest_line(m, line, val, &cap, &have_created)))
                return bad;
            continue;
        }
        if (strcmp(line, CACHE_MAGIC) != 0)
            return "not an opjit cache manifest";
        uint64_t v;
        if (cache_parse_u64(val, 10, &v) != 0 || v != CACHE_FORMAT)
            return "manifest has an unknown format version";
    }
    if (!m->op || !m->source || !m->compiler || !m->options || !m->target || !m->tier ||
        !m->key || !have_created)
        return "manifest lacks a field";
    return NULL;
}

static int cache_damaged(char *why, size_t whylen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int cache_damaged(char *why, size_t whylen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
    return OPJIT_ECACHE;
}

/* Errors that say nothing about the entry: out of file descriptors or
 * memory, interrupted, or an I/O error of the disk (the data may well be
 * good; deleting it would not help and might lose it). */
int cache_transient_errno(int e)
{
    return e == EMFILE || e == ENFILE || e == ENOMEM || e == ENOBUFS || e == EINTR ||
           e == EAGAIN || e == EIO;
}

/* why = "<what>: strerror(e)"; OPJIT_EIO when e is transient, else
 * OPJIT_ECACHE. */
static int cache_failed(char *why, size_t whylen, int e, const char *what)
{
    snprintf(why, whylen, "%s: %s", what, strerror(e));
    return cache_transient_errno(e) ? OPJIT_EIO : OPJIT_ECACHE;
}

/* One artifact of the entry open as dfd against its manifest line a: a
 * regular file, trusted, of the size it says, and with CACHE_CHK_SUMS its
 * checksum and (ELF) completeness. OPJIT_OK or why not. */
static int cache_check_artifact(const cache *c, int dfd, const cache_artifact *a, int owner,
                                int flags, char *why, size_t whylen)
{
    char what[320], elf[160];
    const char *bad;
    struct stat st;
    int afd = openat(dfd, a->name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (afd < 0) {
        snprintf(what, sizeof what, "artifact %s", a->name);
        return cache_failed(why, whylen, errno, what);
    }
    uint64_t sum = 0, n = 0;
    int e = 0, rc = OPJIT_OK, unsafe = 0;
    void *map = MAP_FAILED;
    /* A few bytes (an index entry's key, a record) are read: no mapping
     * to make and take down again. */
    unsigned char small[4096];
    const void *mem = MAP_FAILED;
    if (fstat(afd, &st) != 0) {
        e = errno;
        snprintf(what, sizeof what, "cannot stat artifact %s", a->name);
        rc = cache_failed(why, whylen, e, what);
    } else if (!S_ISREG(st.st_mode))
        rc = cache_damaged(why, whylen, "artifact %s is not a regular file", a->name);
    else if ((bad = cache_untrusted(&st, owner, c->euid)))
        rc = cache_damaged(why, whylen, "artifact %s is %s", a->name, bad);
    else if ((uint64_t)st.st_size != a->size)
        rc = cache_damaged(why, whylen, "artifact %s has %lld bytes, the manifest says %" PRIu64,
                           a->name, (long long)st.st_size, a->size);
    else if ((flags & CACHE_CHK_SUMS) &&
             (mem = a->size <= sizeof small
                        ? (cache_pread_full(afd, small, (size_t)a->size, 0) ? MAP_FAILED : small)
                    : a->size <= SIZE_MAX
                        ? (map = mmap(NULL, (size_t)a->size, PROT_READ, MAP_PRIVATE, afd, 0))
                        : MAP_FAILED) != MAP_FAILED) {
        /* Mapped, the bytes are hashed and ELF-checked where the page cache
         * holds them: no copies into fresh heap pages, no read per 16 KiB
         * and no pread per header. Entries are never rewritten in place
         * (published by rename, removed whole), and the dlopen that
         * follows maps the same file anyway. */
        if (XXH3_64bits(mem, (size_t)a->size) != a->sum)
            rc = cache_damaged(why, whylen, "artifact %s: checksum mismatch", a->name);
        else if ((e = cache_elf_check_mem(mem, a->size, &unsafe, elf, sizeof elf)))
            rc = e == OPJIT_ECACHE ? cache_damaged(why, whylen, "artifact %s is %s: %s", a->name,
                                                   unsafe ? "unsafe" : "incomplete", elf)
                                   : (snprintf(what, sizeof what, "cannot read artifact %s", a->name),
                                      cache_failed(why, whylen, EIO, what));
        if (map != MAP_FAILED)
            munmap(map, (size_t)a->size);
    } else if ((flags & CACHE_CHK_SUMS) && (e = cache_hash_fd(afd, &sum, &n)) != 0) {
        snprintf(what, sizeof what, "cannot read artifact %s", a->name);
        rc = cache_failed(why, whylen, e, what);
    } else if ((flags & CACHE_CHK_SUMS) && (n != a->size || sum != a->sum))
        rc = cache_damaged(why, whylen, "artifact %s: checksum mismatch", a->name);
    else if ((flags & CACHE_CHK_SUMS) &&
             (e = cache_elf_check(afd, a->size, &unsafe, elf, sizeof elf))) {
        int en = errno;
        snprintf(what, sizeof what, "cannot read artifact %s", a->name);
        rc = e == OPJIT_ECACHE ? cache_damaged(why, whylen, "artifact %s is %s: %s", a->name,
                                               unsafe ? "unsafe" : "incomplete", elf)
                               : cache_failed(why, whylen, en, what);
    }
    close(afd);
    return rc;
}

/* The entry's directory (open as dfd) and the one holding it are
 * trusted. OPJIT_OK or why not. */
static int cache_check_dirs(const cache *c, int dfd, int owner, char *why, size_t whylen)
{
    const char *bad;
    struct stat st;
    if (fstat(dfd, &st) != 0)
        return cache_failed(why, whylen, errno, "cannot stat the entry");
    if ((bad = cache_untrusted(&st, owner, c->euid)))
        return cache_damaged(why, whylen, "entry directory is %s", bad);
    if (fstatat(dfd, "..", &st, 0) != 0)
        return cache_failed(why, whylen, errno, "cannot stat the directory holding the entry");
    if ((bad = cache_untrusted(&st, owner, c->euid)))
        return cache_damaged(why, whylen, "the directory holding the entry is %s", bad);
    return OPJIT_OK;
}

/* Open the entry's manifest: *mfd, and its stat in *st. A trusted regular
 * file of a sane size, or why not (*mfd may then be open: the caller
 * closes it). */
static int cache_open_manifest(const cache *c, int dfd, int owner, int *mfd, struct stat *st,
                               char *why, size_t whylen)
{
    const char *bad;
    /* O_NONBLOCK: a FIFO put where a file should be must not hang us (it
     * fails the regular-file check below); reads of files ignore it. */
    *mfd = openat(dfd, "manifest", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (*mfd < 0)
        return cache_failed(why, whylen, errno, "manifest");
    if (fstat(*mfd, st) != 0)
        return cache_failed(why, whylen, errno, "cannot stat the manifest");
    if (!S_ISREG(st->st_mode))
        return cache_damaged(why, whylen, "manifest is not a regular file");
    if ((bad = cache_untrusted(st, owner, c->euid)))
        return cache_damaged(why, whylen, "manifest is %s", bad);
    if (st->st_size <= 0 || st->st_size > CACHE_MANIFEST_MAX)
        return cache_damaged(why, whylen, "manifest has a bad size (%lld bytes)",
                             (long long)st->st_size);
    return OPJIT_OK;
}

/* Read len bytes of manifest from mfd into m->buf and parse them; the
 * manifest must be for key hex. OPJIT_OK or why not. */
static int cache_read_manifest(int mfd, size_t len, const char *hex, cache_manifest *m,
                               char *why, size_t whylen)
{
    size_t got = 0;
    m->buf = malloc(len + 1);
    if (!m->buf)
        return cache_failed(why, whylen, ENOMEM, "reading the manifest");
    while (got < len) {
        ssize_t n = read(mfd, m->buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return cache_failed(why, whylen, errno, "cannot read the manifest");
        if (n == 0)
            break;
        got += (size_t)n;
    }
    m->buf[got] = '\0';
    if (got != len)
        return cache_damaged(why, whylen, "manifest: short read");
    const char *bad = cache_manifest_parse(m, len);
    if (bad)
        return bad == cache_manifest_oom ? cache_failed(why, whylen, ENOMEM, "reading the manifest")
                                         : cache_damaged(why, whylen, "%s", bad);
    if (strcmp(m->key, hex) != 0)
        return cache_damaged(why, whylen, "manifest is for another key (%.40s)", m->key);
    return OPJIT_OK;
}

/* Last use is the manifest's mtime, updated at most once a minute so a
 * hit stays a read-only operation almost always. */
static void cache_touch(int mfd, cache_manifest *m)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (now.tv_sec - (time_t)m->last_use >= CACHE_TOUCH_SECONDS) {
        if (futimens(mfd, NULL) == 0)
            m->last_use = (int64_t)now.tv_sec;
    }
}

static int cache_name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The manifest names each artifact once, and the directory (dfd) holds
 * the manifest and its artifacts, nothing else: a file it does not list
 * would be installed and served unchecked. OPJIT_OK or why not. */
static int cache_check_listing(int dfd, const cache_manifest *m, char *why, size_t whylen)
{
    char esc[600];
    const char **names = malloc(((size_t)m->nart + 1) * sizeof *names);
    if (!names)
        return cache_failed(why, whylen, ENOMEM, "checking the entry's files");
    for (int i = 0; i < m->nart; i++)
        names[i] = m->art[i].name;
    qsort(names, (size_t)m->nart, sizeof *names, cache_name_cmp);
    for (int i = 1; i < m->nart; i++)
        if (!strcmp(names[i - 1], names[i])) {
            cache_printable(names[i], esc, sizeof esc);
            free(names);
            return cache_damaged(why, whylen, "manifest lists artifact %s twice", esc);
        }
    /* getdents64 into a small buffer: a DIR would malloc 32 KiB (pages a
     * fresh process faults in) to list an entry of a few files. dfd
     * itself, not opened anew: cache_check opened it and lists it once,
     * from its start. */
    int rc = OPJIT_OK;
    union {
        char b[2048];
        struct dirent64 align;
    } buf;
    for (ssize_t got = 1; rc == OPJIT_OK && got > 0;) {
        got = getdents64(dfd, buf.b, sizeof buf.b);
        if (got < 0)
            rc = cache_failed(why, whylen, errno, "cannot list the entry");
        for (ssize_t off = 0; rc == OPJIT_OK && off < got;) {
            const struct dirent64 *de = (const struct dirent64 *)(buf.b + off);
            const char *n = de->d_name, *key = n;
            off += de->d_reclen;
            if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, "manifest") ||
                bsearch(&key, names, (size_t)m->nart, sizeof *names, cache_name_cmp))
                continue;
            cache_printable(n, esc, sizeof esc);
            rc = cache_damaged(why, whylen, "holds %s, a file its manifest does not list", esc);
        }
    }
    free(names);
    return rc;
}

/* Check the entry in dir against its manifest. Returns OPJIT_OK (m filled:
 * free it with cache_manifest_free), OPJIT_ENOTFOUND, OPJIT_ECACHE or
 * OPJIT_EIO (why says what). */
int cache_check(const cache *c, const char *dir, const char *hex, int flags,
                cache_manifest *m, char *why, size_t whylen)
{
    int owner = flags & CACHE_CHK_OWNER ? CACHE_OWNER_SELF : CACHE_OWNER_TRUSTED;
    int mfd = -1;
    struct stat st;
    memset(m, 0, sizeof *m);
    /* Never through a symbolic link: what is checked is what is used. */
    char bad[PATH_MAX + 128];
    bad[0] = '\0'; /* not = "": zeroing all of it would touch pages a hit never uses */
    int dfd = cache_open_below(c, dir, bad, sizeof bad);
    if (dfd < 0) {
        if (errno == ENOENT)
            return OPJIT_ENOTFOUND;
        if (errno == ENOTDIR && *bad)
            return cache_damaged(why, whylen, "%s", bad);
        return cache_failed(why, whylen, errno, "cannot open the entry");
    }
    int rc = cache_check_dirs(c, dfd, owner, why, whylen);
    if (rc == OPJIT_OK)
        rc = cache_open_manifest(c, dfd, owner, &mfd, &st, why, whylen);
    if (rc == OPJIT_OK)
        rc = cache_read_manifest(mfd, (size_t)st.st_size, hex, m, why, whylen);
    if (rc == OPJIT_OK) {
        m->last_use = (int64_t)st.st_mtim.tv_sec;
        m->size = (uint64_t)st.st_size;
    }
    for (int i = 0; i < m->nart && rc == OPJIT_OK; i++) {
        rc = cache_check_artifact(c, dfd, &m->art[i], owner, flags, why, whylen);
        m->size += m->art[i].size;
    }
    if (rc == OPJIT_OK)
        rc = cache_check_listing(dfd, m, why, whylen);
    if (rc == OPJIT_OK && (flags & CACHE_CHK_TOUCH))
        cache_touch(mfd, m);
    if (mfd >= 0)
        close(mfd);
    close(dfd);
    if (rc != OPJIT_OK) {
        /* Keep why, drop the rest. */
        free(m->buf);
        free(m->art);
        memset(m, 0, sizeof *m);
    }
    return rc;
}

static int cache_artifact_cmp(const void *a, const void *b)
{
    return strcmp(((const cache_artifact *)a)->name, ((const cache_artifact *)b)->name);
}

/* Artifact name in dirfd, after a build: readable by us and not writable
 * by group or others, hashed into x, ELF-complete. Not synced to disk:
 * every load checks it against its manifest, which catches what a crash
 * of the machine could tear. */
static int cache_seal_artifact(int dirfd, const char *name, mode_t mode, cache_artifact *x,
                               char *err, size_t errlen)
{
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    int e = fd < 0 ? errno : 0;
    if (!e && (mode & (S_IWGRP | S_IWOTH | S_IRUSR)) != S_IRUSR)
        e = fchmod(fd, (mode & 07755 & ~(mode_t)022) | S_IRUSR) == 0 ? 0 : errno;
    if (!e)
        e = cache_hash_fd(fd, &x->sum, &x->size);
    char elf[160];
    int unsafe = 0, problem = e ? OPJIT_OK : cache_elf_check(fd, x->size, &unsafe, elf, sizeof elf);
    if (problem != OPJIT_OK && problem != OPJIT_ECACHE)
        e = errno;
    if (fd >= 0)
        close(fd);
    if (problem == OPJIT_ECACHE) {
        /* A short write the compiler did not notice (a full disk, a
         * file-size limit), or code that would make the host's stack
         * executable: never an entry. */
        return cache_errf(err, errlen, OPJIT_EIO, "cache: the build wrote an %s %s (%s); not cached",
                          unsafe ? "unsafe" : "incomplete", name, elf);
    }
    if (e)
        return cache_errf(err, errlen, e == ENOMEM ? OPJIT_ENOMEM : OPJIT_EIO,
                          "cache: artifact %s: %s", name, strerror(e));
    return OPJIT_OK;
}

/* Add the build output name (in dirfd) to the n artifacts of *a (room
 * for *cap), sealed. */
static int cache_add_artifact(int dirfd, const char *name, cache_artifact **a, int *n, int *cap,
                              char *err, size_t errlen)
{
    if (!cache_artifact_name_ok(name))
        return cache_errf(err, errlen, OPJIT_ECACHE,
                          "cache: the build wrote '%s', a name the cache reserves", name);
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
        return cache_errf(err, errlen, OPJIT_ECACHE,
                          "cache: build output '%s' is not a regular file", name);
    if (*n == *cap) {
        if (*cap >= CACHE_MAX_ARTIFACTS)
            return cache_errf(err, errlen, OPJIT_ECACHE, "cache: the build wrote too many files");
        int more = *cap ? *cap * 2 : 4;
        cache_artifact *na = realloc(*a, (size_t)more * sizeof *na);
        if (!na)
            return cache_errf(err, errlen, OPJIT_ENOMEM, "cache: out of memory");
        *a = na;
        *cap = more;
    }
    cache_artifact *x = &(*a)[*n];
    x->name = strdup(name);
    if (!x->name)
        return cache_errf(err, errlen, OPJIT_ENOMEM, "cache: out of memory");
    (*n)++;
    return cache_seal_artifact(dirfd, name, st.st_mode, x, err, errlen);
}

/* After a build: every file in dirfd is an artifact. Hash it and make it
 * not writable by group/others. */
int cache_scan_artifacts(int dirfd, cache_artifact **out, int *nout, char *err, size_t errlen)
{
    *out = NULL;
    *nout = 0;
    int dfd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
    DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
    if (!d) {
        if (dfd >= 0)
            close(dfd);
        return cache_errf(err, errlen, OPJIT_EIO, "cache: cannot read the build directory: %s",
                          strerror(errno));
    }
    rewinddir(d);
    cache_artifact *a = NULL;
    int n = 0, cap = 0, rc = OPJIT_OK;
    struct dirent *de;
    while (rc == OPJIT_OK && (de = readdir(d))) {
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            rc = cache_add_artifact(dirfd, de->d_name, &a, &n, &cap, err, errlen);
    }
    closedir(d);
    if (rc != OPJIT_OK) {
        cache_artifacts_free(a, n);
        return rc;
    }
    if (n > 1)
        qsort(a, (size_t)n, sizeof *a, cache_artifact_cmp);
    *out = a;
    *nout = n;
    return OPJIT_OK;
}

int cache_manifest_write(int dirfd, const cache_request *req, const cache_artifact *a,
                         int n, int64_t created, uint64_t *size, char *err, size_t errlen)
{
    cache_buf b = {0};
    cache_buf_printf(&b, "%s %d\n", CACHE_MAGIC, CACHE_FORMAT);
    cache_buf_field(&b, "key", req->key.hex);
    cache_buf_field(&b, "op", req->op_name);
    cache_buf_field(&b, "source", req->source_name);
    cache_buf_field(&b, "compiler", req->compiler);
    cache_buf_field(&b, "options", req->options);
    cache_buf_field(&b, "target", req->target);
    cache_buf_field(&b, "tier", req->tier);
    if (req->inputs && req->inputs[0])
        cache_buf_field(&b, "inputs", req->inputs);
    cache_buf_printf(&b, "created %lld\n", (long long)created);
    for (int i = 0; i < n; i++) {
        char head[64];
        snprintf(head, sizeof head, "artifact %" PRIu64 " %016" PRIx64, a[i].size, a[i].sum);
        cache_buf_field(&b, head, a[i].name);
    }
    if (!b.oom)
        cache_buf_printf(&b, "end %016" PRIx64 "\n", (uint64_t)XXH3_64bits(b.p, b.len));
    if (b.oom) {
        free(b.p);
        return cache_errf(err, errlen, OPJIT_ENOMEM, "cache: out of memory writing a manifest");
    }
    int rc = OPJIT_OK;
    int fd = openat(dirfd, "manifest", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = cache_errf(err, errlen, OPJIT_EIO, "cache: cannot write the manifest: %s", strerror(errno));
        goto out;
    }
    for (size_t off = 0; off < b.len;) {
        ssize_t w = write(fd, b.p + off, b.len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            rc = cache_errf(err, errlen, OPJIT_EIO, "cache: cannot write the manifest: %s",
                            w < 0 ? strerror(errno) : "short write");
            goto out;
        }
        off += (size_t)w;
    }
    /* No fsync (see cache_publish); a close that reports a failed write
     * still makes this no entry. */
    if (close(fd) != 0)
        rc = cache_errf(err, errlen, OPJIT_EIO, "cache: cannot write the manifest: %s",
                        strerror(errno));
    fd = -1;
    *size = b.len;
out:
    if (fd >= 0)
        close(fd);
    free(b.p);
    return rc;
}
