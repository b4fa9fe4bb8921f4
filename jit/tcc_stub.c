/* jit/tcc_stub.c - small stand-ins for the shared libraries an op links
 * with, so that libtcc does not read their whole symbol tables.
 *
 * To link against a shared library libtcc adds every dynamic symbol of it,
 * and of each library it needs in turn, to a table of its own: about 3,500
 * for libm, libc and ld.so (a fifth of a small op's cold load), 15,000
 * more for OpenBLAS. From those it takes only the versions of the symbols
 * the op refers to (memcpy@GLIBC_2.14). So the op is first compiled to an
 * object (jit/tcc.c); then each library the link would reach gets a stub:
 * an ELF file with the library's soname, DT_NEEDED list, version
 * definitions and needs as they are, and of its dynamic symbols only those
 * named by something the link adds (the op's object, crti.o, crtn.o, the
 * archives) that is undefined there. libtcc then walks the stubs exactly
 * as it would the libraries (each DT_NEEDED is found in the stubs'
 * directory first) and sees, for each such name, every entry the library
 * has, in the same order: it writes the same bytes. A library of few
 * symbols (ld.so's 40) costs libtcc less than its stub would and is left
 * as it is. Anything unexpected (no GNU hash table, a library that is not
 * a 64-bit ELF shared object) returns -1, and the caller links against the
 * real libraries.
 *
 * The libraries are mapped once per process and kept (they are read a few
 * pages at a time: the hash table, a chain, a name); callers hold libtcc's
 * lock, which serialises everything here. */
#include <elf.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jit/jit.h"

/* ---- names ---------------------------------------------------------------- */

void jit_names_free(jit_names *n)
{
    for (int i = 0; i < n->n; i++)
        free(n->v[i]);
    free(n->v);
    *n = (jit_names){0};
}

static int names_has(const jit_names *n, const char *name)
{
    for (int i = 0; i < n->n; i++)
        if (!strcmp(n->v[i], name))
            return 1;
    return 0;
}

int jit_names_add(jit_names *n, const char *name, size_t len)
{
    for (int i = 0; i < n->n; i++)
        if (!strncmp(n->v[i], name, len) && !n->v[i][len])
            return 0;
    if (n->n == n->cap) {
        int cap = n->cap ? 2 * n->cap : 32;
        char **v = realloc(n->v, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        n->v = v, n->cap = cap;
    }
    if (!(n->v[n->n] = strndup(name, len)))
        return -1;
    n->n++;
    return 0;
}

/* ---- bounds-checked ELF reading -------------------------------------------- */

/* The section headers of a whole 64-bit little-endian x86-64 ELF file of
 * the given type in [p, p + size); NULL when it is not one or they do not
 * fit. */
static const Elf64_Shdr *elf_sections(const unsigned char *p, size_t size, int type, int *count)
{
    const Elf64_Ehdr *eh = (const void *)p;
    if (size < sizeof *eh || memcmp(p, ELFMAG, SELFMAG) || p[EI_CLASS] != ELFCLASS64 ||
        p[EI_DATA] != ELFDATA2LSB || eh->e_machine != EM_X86_64 || eh->e_type != type ||
        eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shoff > size ||
        (size - eh->e_shoff) / sizeof(Elf64_Shdr) < eh->e_shnum || eh->e_shoff % 8)
        return NULL;
    *count = eh->e_shnum;
    return (const Elf64_Shdr *)(p + eh->e_shoff);
}

/* Section sh's bytes, when they lie in the file and are aligned for
 * elements of align bytes. */
static const void *section_at(const unsigned char *p, size_t size, const Elf64_Shdr *sh,
                              size_t align)
{
    if (sh->sh_offset > size || sh->sh_size > size - sh->sh_offset || sh->sh_offset % align)
        return NULL;
    return p + sh->sh_offset;
}

/* The NUL-terminated string at off of a string table of len bytes. */
static const char *string_at(const char *tab, size_t len, uint64_t off)
{
    return off < len && memchr(tab + off, '\0', len - off) ? tab + off : NULL;
}

/* Section header i of the object [p, p + size), copied out (libtcc
 * aligns the table to 4 bytes only). */
static Elf64_Shdr object_section(const unsigned char *p, const Elf64_Ehdr *eh, int i)
{
    Elf64_Shdr sh;
    memcpy(&sh, p + eh->e_shoff + (size_t)i * sizeof sh, sizeof sh);
    return sh;
}

/* The names that the relocatable object [p, p + size) uses and does not
 * define, added to out. -1 when it is not a whole object this can read. */
static int object_undefined(const unsigned char *p, size_t size, jit_names *out)
{
    Elf64_Ehdr eh;
    if (size < sizeof eh)
        return -1;
    memcpy(&eh, p, sizeof eh);
    if (memcmp(p, ELFMAG, SELFMAG) || p[EI_CLASS] != ELFCLASS64 || p[EI_DATA] != ELFDATA2LSB ||
        eh.e_machine != EM_X86_64 || eh.e_type != ET_REL || eh.e_shentsize != sizeof(Elf64_Shdr) ||
        eh.e_shoff > size || (size - eh.e_shoff) / sizeof(Elf64_Shdr) < eh.e_shnum)
        return -1;
    /* libtcc reads every section of an object it links, unchecked: a
     * short one (a full disk, a file-size limit) must not reach it. */
    for (int i = 1; i < eh.e_shnum; i++) {
        Elf64_Shdr sh = object_section(p, &eh, i);
        if (sh.sh_type != SHT_NOBITS &&
            (sh.sh_offset > size || sh.sh_size > size - sh.sh_offset))
            return -1;
    }
    for (int i = 1; i < eh.e_shnum; i++) {
        Elf64_Shdr sym = object_section(p, &eh, i), str;
        if (sym.sh_type != SHT_SYMTAB)
            continue;
        if (sym.sh_link >= eh.e_shnum || (str = object_section(p, &eh, (int)sym.sh_link),
                                           str.sh_type != SHT_STRTAB))
            return -1;
        const char *tab = (const char *)p + str.sh_offset;
        for (size_t k = 1; k < sym.sh_size / sizeof(Elf64_Sym); k++) {
            Elf64_Sym e;
            memcpy(&e, p + sym.sh_offset + k * sizeof e, sizeof e);
            const char *name = string_at(tab, str.sh_size, e.st_name);
            if (!name)
                return -1;
            if (e.st_shndx == SHN_UNDEF && ELF64_ST_BIND(e.st_info) != STB_LOCAL && *name &&
                jit_names_add(out, name, strlen(name)) < 0)
                return -1;
        }
    }
    return 0;
}

/* The whole of a small file, read into the heap; NULL on failure. */
static unsigned char *read_file(const char *path, size_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    unsigned char *p = NULL;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
        st.st_size < (64 << 20) && (p = malloc((size_t)st.st_size)) &&
        read(fd, p, (size_t)st.st_size) != st.st_size) {
        free(p);
        p = NULL;
    }
    if (fd >= 0)
        close(fd);
    if (p)
        *size = (size_t)st.st_size;
    return p;
}

int jit_object_undefined(const char *path, jit_names *out)
{
    size_t size;
    unsigned char *p = read_file(path, &size);
    int rc = p ? object_undefined(p, size, out) : -1;
    free(p);
    return rc;
}

int jit_is_archive(const char *path)
{
    char magic[8];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int yes = fd >= 0 && read(fd, magic, 8) == 8 && !memcmp(magic, "!<arch>\n", 8);
    if (fd >= 0)
        close(fd);
    return yes;
}

/* The undefined names of each object in an ar archive (what any of its
 * members could bring into the link). */
int jit_archive_undefined(const char *path, jit_names *out)
{
    size_t size;
    unsigned char *p = read_file(path, &size);
    if (!p)
        return -1;
    int rc = size >= 8 && !memcmp(p, "!<arch>\n", 8) ? 0 : -1;
    for (size_t at = 8; rc == 0 && at + 60 <= size;) {
        char len[11];
        memcpy(len, p + at + 48, 10);
        len[10] = '\0';
        char *end;
        unsigned long long n = strtoull(len, &end, 10);
        if (end == len || p[at + 58] != '`' || n > size - at - 60) {
            rc = -1;
            break;
        }
        const unsigned char *m = p + at + 60;
        if (n >= SELFMAG && !memcmp(m, ELFMAG, SELFMAG))
            rc = object_undefined(m, (size_t)n, out);
        at += 60 + n + (n & 1);
    }
    free(p);
    return rc;
}

/* ---- shared libraries ------------------------------------------------------ */

typedef struct dso {
    dev_t dev;
    ino_t ino;
    const unsigned char *p;
    size_t size;
    const Elf64_Sym *sym;
    size_t nsym;
    const char *str;
    size_t strsz;
    const Elf64_Dyn *dyn;
    size_t ndyn;
    const Elf64_Half *versym; /* NULL when the library has none */
    const Elf64_Shdr *verdef, *verneed;
    const uint32_t *gnu_hash;
    size_t gnu_hash_words;
    const char *soname;
} dso;

#define DSO_MAX 32
static dso dsos[DSO_MAX];
static int ndsos;

/* The library at path, parsed (once per file: libtcc may reach one under
 * two names); NULL when it is not one this can stub. */
static const dso *dso_open(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return NULL;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        close(fd);
        return NULL;
    }
    for (int i = 0; i < ndsos; i++)
        if (dsos[i].dev == st.st_dev && dsos[i].ino == st.st_ino) {
            close(fd);
            return &dsos[i];
        }
    void *map = ndsos < DSO_MAX ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0)
                                : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED)
        return NULL;
    dso d = {.dev = st.st_dev, .ino = st.st_ino, .size = (size_t)st.st_size};
    const unsigned char *p = map;
    d.p = p;
    int nsec;
    const Elf64_Shdr *sh = elf_sections(p, d.size, ET_DYN, &nsec);
    const Elf64_Shdr *dynsym = NULL, *dynamic = NULL, *versym = NULL, *hash = NULL;
    for (int i = 0; sh && i < nsec; i++) {
        switch (sh[i].sh_type) {
        case SHT_DYNSYM: dynsym = &sh[i]; break;
        case SHT_DYNAMIC: dynamic = &sh[i]; break;
        case SHT_GNU_versym: versym = &sh[i]; break;
        case SHT_GNU_verdef: d.verdef = &sh[i]; break;
        case SHT_GNU_verneed: d.verneed = &sh[i]; break;
        case SHT_GNU_HASH: hash = &sh[i]; break;
        }
    }
    /* libtcc takes the first section of each kind too. */
    int ok = sh && dynsym && dynamic && hash && dynsym->sh_link < (unsigned)nsec &&
             (d.sym = section_at(p, d.size, dynsym, 8)) &&
             (d.str = section_at(p, d.size, &sh[dynsym->sh_link], 1)) &&
             (d.dyn = section_at(p, d.size, dynamic, 8)) &&
             (d.gnu_hash = section_at(p, d.size, hash, 8)) &&
             (!versym || (d.versym = section_at(p, d.size, versym, 2))) &&
             (!d.verdef || section_at(p, d.size, d.verdef, 4)) &&
             (!d.verneed || section_at(p, d.size, d.verneed, 4));
    if (ok) {
        d.nsym = dynsym->sh_size / sizeof *d.sym;
        d.strsz = sh[dynsym->sh_link].sh_size;
        d.ndyn = dynamic->sh_size / sizeof *d.dyn;
        d.gnu_hash_words = hash->sh_size / 4;
        /* libtcc drops the versions when the counts differ: so does the stub. */
        if (d.versym && versym->sh_size / 2 != d.nsym)
            d.versym = NULL;
        const char *base = strrchr(path, '/');
        d.soname = base ? base + 1 : path;
        for (size_t i = 0; i < d.ndyn && d.dyn[i].d_tag != DT_NULL; i++)
            if (d.dyn[i].d_tag == DT_SONAME &&
                !(d.soname = string_at(d.str, d.strsz, d.dyn[i].d_un.d_val)))
                ok = 0;
        ok = ok && d.gnu_hash_words >= 4 && d.strsz > 0;
    }
    if (!ok) {
        munmap(map, d.size);
        return NULL;
    }
    dsos[ndsos] = d;
    return &dsos[ndsos++];
}

static uint32_t gnu_hash(const char *s)
{
    uint32_t h = 5381;
    for (; *s; s++)
        h = h * 33 + (unsigned char)*s;
    return h;
}

/* Add to idx (n so far, at most max) the indices of the non-local dynamic
 * symbols of d named name, ascending. -1 when d's tables are not sound. */
static int dso_entries(const dso *d, const char *name, uint32_t *idx, int *n, int max)
{
    const uint32_t *h = d->gnu_hash;
    uint32_t nbuckets = h[0], symoffset = h[1], bloom = h[2];
    size_t head = 4 + (size_t)bloom * 2; /* 64-bit bloom words */
    if (!nbuckets || head + nbuckets > d->gnu_hash_words || symoffset > d->nsym)
        return -1;
    /* Undefined entries (imports) come before symoffset, outside the
     * hash table: libtcc reads those too. */
    for (uint32_t i = 1; i < symoffset; i++) {
        const char *s = string_at(d->str, d->strsz, d->sym[i].st_name);
        if (!s)
            return -1;
        if (ELF64_ST_BIND(d->sym[i].st_info) != STB_LOCAL && !strcmp(s, name)) {
            if (*n == max)
                return -1;
            idx[(*n)++] = i;
        }
    }
    uint32_t hv = gnu_hash(name);
    const uint32_t *chain = h + head + nbuckets;
    size_t nchain = d->gnu_hash_words - head - nbuckets;
    for (uint32_t i = h[head + hv % nbuckets]; i; i++) {
        if (i < symoffset || i >= d->nsym || i - symoffset >= nchain)
            return -1;
        uint32_t c = chain[i - symoffset];
        const char *s = (c | 1) == (hv | 1) ? string_at(d->str, d->strsz, d->sym[i].st_name)
                                             : "";
        if (!s)
            return -1;
        if ((c | 1) == (hv | 1) && ELF64_ST_BIND(d->sym[i].st_info) != STB_LOCAL &&
            !strcmp(s, name)) {
            if (*n == max)
                return -1;
            idx[(*n)++] = i;
        }
        if (c & 1)
            break;
    }
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* A string table in the making. */
typedef struct strtab {
    char *buf;
    size_t len, cap;
    int failed;
} strtab;

/* The offset of s (a string at off of d's table) in t; 0 on failure. */
static uint32_t str_put(strtab *t, const dso *d, uint64_t off)
{
    const char *s = string_at(d->str, d->strsz, off);
    size_t n = s ? strlen(s) + 1 : 0;
    if (!s || t->len + n > UINT32_MAX) {
        t->failed = 1;
        return 0;
    }
    if (t->len + n > t->cap) {
        size_t cap = (t->len + n) * 2 + 256;
        char *b = realloc(t->buf, cap);
        if (!b) {
            t->failed = 1;
            return 0;
        }
        t->buf = b, t->cap = cap;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    return (uint32_t)(t->len - n);
}

/* The version definitions (verneed 0) or needs (1) of d, copied to out
 * (size bytes) with their names moved to t. -1 when they do not walk
 * soundly within their section. */
static int versions_copy(const dso *d, int verneed, unsigned char *out, size_t size, strtab *t)
{
    const Elf64_Shdr *sh = verneed ? d->verneed : d->verdef;
    memcpy(out, d->p + sh->sh_offset, size);
    size_t off = 0;
    for (size_t guard = 0; guard < size; guard++) {
        size_t aux, count;
        if (verneed) {
            Elf64_Verneed *vn = (void *)(out + off);
            if (off % 4 || size - off < sizeof *vn)
                return -1;
            vn->vn_file = str_put(t, d, vn->vn_file);
            aux = off + vn->vn_aux, count = vn->vn_cnt;
        } else {
            Elf64_Verdef *vd = (void *)(out + off);
            if (off % 4 || size - off < sizeof *vd)
                return -1;
            aux = off + vd->vd_aux, count = vd->vd_cnt;
        }
        for (size_t j = 0; j < count; j++) {
            size_t need = verneed ? sizeof(Elf64_Vernaux) : sizeof(Elf64_Verdaux);
            if (aux % 4 || aux > size || size - aux < need)
                return -1;
            uint32_t *name = (uint32_t *)(out + aux + (verneed ? 8 : 0));
            uint32_t next = ((uint32_t *)(out + aux))[verneed ? 3 : 1];
            *name = str_put(t, d, *name);
            if (!next)
                break;
            aux += next;
        }
        uint32_t next = verneed ? ((Elf64_Verneed *)(out + off))->vn_next
                                : ((Elf64_Verdef *)(out + off))->vd_next;
        if (!next)
            return t->failed ? -1 : 0;
        off += next;
    }
    return -1;
}

/* n bytes of src appended to buf at *len, 8-aligned; their offset. */
static size_t put(unsigned char *buf, size_t *len, const void *src, size_t n)
{
    size_t at = (*len + 7) & ~(size_t)7;
    memset(buf + *len, 0, at - *len);
    memcpy(buf + at, src, n);
    *len = at + n;
    return at;
}

enum { S_NULL, S_DYNSYM, S_DYNSTR, S_DYNAMIC, S_VERSYM, S_VERDEF, S_VERNEED, S_COUNT };

/* The stub of d, with the entries of the names in want, in a heap buffer
 * (its length in *len); NULL on failure. */
static unsigned char *stub_image(const dso *d, const jit_names *want, size_t *len)
{
    enum { PER_NAME = 16 };
    size_t maxidx = (size_t)want->n * PER_NAME + 1, ndyn = 0;
    while (ndyn < d->ndyn && d->dyn[ndyn].d_tag != DT_NULL)
        ndyn++;
    size_t vd = d->verdef ? d->verdef->sh_size : 0, vn = d->verneed ? d->verneed->sh_size : 0;
    uint32_t *idx = malloc(maxidx * sizeof *idx);
    Elf64_Sym *sym = calloc(maxidx, sizeof *sym);
    Elf64_Half *ver = calloc(maxidx, sizeof *ver);
    Elf64_Dyn *dyn = calloc(ndyn + 1, sizeof *dyn);
    unsigned char *verdef = malloc(vd + 1), *verneed = malloc(vn + 1), *buf = NULL;
    strtab t = {0};
    int n = 0, ok = idx && sym && ver && dyn && verdef && verneed;
    for (int i = 0; ok && i < want->n; i++)
        ok = dso_entries(d, want->v[i], idx, &n, (int)maxidx - 1) == 0;
    if (ok) {
        qsort(idx, (size_t)n, sizeof *idx, cmp_u32);
        str_put(&t, d, 0); /* "" at 0, as in every string table */
        for (int i = 0; i < n; i++) {
            sym[i + 1] = d->sym[idx[i]];
            sym[i + 1].st_name = str_put(&t, d, d->sym[idx[i]].st_name);
            ver[i + 1] = d->versym ? d->versym[idx[i]] : 0;
        }
    }
    /* SONAME and NEEDED are all libtcc reads of it. */
    size_t k = 0;
    for (size_t i = 0; ok && i < ndyn; i++)
        if (d->dyn[i].d_tag == DT_SONAME || d->dyn[i].d_tag == DT_NEEDED) {
            dyn[k] = d->dyn[i];
            dyn[k++].d_un.d_val = str_put(&t, d, d->dyn[i].d_un.d_val);
        }
    ok = ok && (!vd || versions_copy(d, 0, verdef, vd, &t) == 0) &&
         (!vn || versions_copy(d, 1, verneed, vn, &t) == 0) && !t.failed;
    size_t cap = sizeof(Elf64_Ehdr) + t.len + (size_t)(n + 1) * (sizeof *sym + 2) +
                 (k + 1) * sizeof *dyn + vd + vn + S_COUNT * (sizeof(Elf64_Shdr) + 8);
    if (ok && (buf = calloc(1, cap))) {
        Elf64_Shdr sh[S_COUNT] = {{0}};
        size_t at = sizeof(Elf64_Ehdr), nsym = (size_t)n + 1;
        sh[S_DYNSTR] = (Elf64_Shdr){.sh_type = SHT_STRTAB, .sh_size = t.len,
                                    .sh_offset = put(buf, &at, t.buf, t.len)};
        sh[S_DYNSYM] = (Elf64_Shdr){.sh_type = SHT_DYNSYM, .sh_link = S_DYNSTR, .sh_info = 1,
                                    .sh_entsize = sizeof *sym, .sh_size = nsym * sizeof *sym,
                                    .sh_offset = put(buf, &at, sym, nsym * sizeof *sym)};
        sh[S_DYNAMIC] = (Elf64_Shdr){.sh_type = SHT_DYNAMIC, .sh_link = S_DYNSTR,
                                     .sh_entsize = sizeof *dyn, .sh_size = (k + 1) * sizeof *dyn,
                                     .sh_offset = put(buf, &at, dyn, (k + 1) * sizeof *dyn)};
        int nsec = S_DYNAMIC + 1;
        if (d->versym)
            sh[nsec++] = (Elf64_Shdr){.sh_type = SHT_GNU_versym, .sh_link = S_DYNSYM,
                                      .sh_entsize = 2, .sh_size = nsym * 2,
                                      .sh_offset = put(buf, &at, ver, nsym * 2)};
        if (vd)
            sh[nsec++] = (Elf64_Shdr){.sh_type = SHT_GNU_verdef, .sh_link = S_DYNSTR,
                                      .sh_info = d->verdef->sh_info, .sh_size = vd,
                                      .sh_offset = put(buf, &at, verdef, vd)};
        if (vn)
            sh[nsec++] = (Elf64_Shdr){.sh_type = SHT_GNU_verneed, .sh_link = S_DYNSTR,
                                      .sh_info = d->verneed->sh_info, .sh_size = vn,
                                      .sh_offset = put(buf, &at, verneed, vn)};
        size_t shoff = put(buf, &at, sh, (size_t)nsec * sizeof *sh);
        Elf64_Ehdr eh = {.e_type = ET_DYN, .e_machine = EM_X86_64, .e_version = EV_CURRENT,
                         .e_shoff = shoff, .e_ehsize = sizeof eh,
                         .e_shentsize = sizeof(Elf64_Shdr), .e_shnum = (Elf64_Half)nsec};
        memcpy(eh.e_ident, ELFMAG, SELFMAG);
        eh.e_ident[EI_CLASS] = ELFCLASS64;
        eh.e_ident[EI_DATA] = ELFDATA2LSB;
        eh.e_ident[EI_VERSION] = EV_CURRENT;
        memcpy(buf, &eh, sizeof eh);
        *len = at;
    }
    free(t.buf);
    free(idx);
    free(sym);
    free(ver);
    free(dyn);
    free(verdef);
    free(verneed);
    return buf;
}

/* Write the stub of d, with the entries of the names in want, to path. */
static int write_stub(const dso *d, const jit_names *want, const char *path)
{
    size_t len = 0;
    unsigned char *buf = stub_image(d, want, &len);
    if (!buf)
        return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    int rc = fd >= 0 && write(fd, buf, len) == (ssize_t)len ? 0 : -1;
    if (fd >= 0 && close(fd))
        rc = -1;
    if (rc && fd >= 0)
        unlink(path);
    free(buf);
    return rc;
}

int jit_find_in(const char *dirs, const char *name, char *out, size_t n)
{
    for (const char *p = dirs; *p;) {
        size_t len = strcspn(p, ":");
        struct stat st;
        if (len && (size_t)snprintf(out, n, "%.*s/%s", (int)len, p, name) < n &&
            stat(out, &st) == 0 && S_ISREG(st.st_mode))
            return 1;
        p += len + (p[len] == ':');
    }
    return 0;
}

/* A library of few symbols (ld.so has 40) costs libtcc less than its stub
 * would: it is left for libtcc to find where it is. */
#define STUB_MIN_SYMBOLS 256

static int worth_a_stub(const dso *d) { return d->nsym > STUB_MIN_SYMBOLS; }

/* d's stub, named name, in dir (when worth one), then those of the
 * libraries it needs (found on search, as libtcc finds them), each once:
 * the names stubbed in written, those left in skipped. */
static int stub_tree(const dso *d, const char *name, const jit_names *want, const char *dir,
                     const char *search, jit_names *written, jit_names *skipped)
{
    char path[PATH_MAX];
    if (names_has(written, name) || names_has(skipped, name))
        return 0;
    if (strchr(name, '/') || (size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return -1;
    if (worth_a_stub(d) && write_stub(d, want, path) < 0)
        return -1;
    if (jit_names_add(worth_a_stub(d) ? written : skipped, name, strlen(name)) < 0)
        return -1;
    for (size_t i = 0; i < d->ndyn && d->dyn[i].d_tag != DT_NULL; i++) {
        if (d->dyn[i].d_tag != DT_NEEDED)
            continue;
        const char *need = string_at(d->str, d->strsz, d->dyn[i].d_un.d_val);
        char real[PATH_MAX];
        const dso *nd;
        if (!need)
            return -1;
        if (names_has(written, need) || names_has(skipped, need))
            continue; /* not looked for again */
        if (!jit_find_in(search, need, real, sizeof real) || !(nd = dso_open(real)) ||
            stub_tree(nd, need, want, dir, search, written, skipped) < 0)
            return -1;
    }
    return 0;
}

int jit_tcc_stubs_write(const char *dir, const char *const *libs, int nlibs, const char *search,
                        const jit_names *want, jit_names *written, char (*stub)[PATH_MAX])
{
    jit_names skipped = {0};
    int rc = 0;
    for (int i = 0; rc == 0 && i < nlibs; i++) {
        const dso *d = dso_open(libs[i]);
        if (!d || stub_tree(d, d->soname, want, dir, search, written, &skipped) < 0)
            rc = -1;
        else if (!worth_a_stub(d))
            snprintf(stub[i], PATH_MAX, "%s", libs[i]);
        else if ((size_t)snprintf(stub[i], PATH_MAX, "%s/%s", dir, d->soname) >= PATH_MAX)
            rc = -1;
    }
    jit_names_free(&skipped);
    return rc;
}
