/*
 * cache/cache_elf.c - is an ELF artifact complete?
 *
 * A compiler that hits a full disk or a file-size limit may leave a
 * truncated shared object and still report success (libtcc's
 * tcc_output_file does not check its writes). Checksummed and published,
 * such a file would crash every process that dlopens it (SIGBUS on the
 * missing pages). So every artifact that starts like an ELF file must have
 * every byte its headers point at: program headers, section headers and
 * the contents of both. And a shared object must not ask for an
 * executable stack (see CACHE_ELF_STACK).
 */
#include <elf.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache_int.h"

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

int cache_elf_check(int fd, uint64_t size, int *unsafe, char *why, size_t whylen)
{
    cache_elf_src src = {.fd = fd, .size = size};
    return elf_check_status(elf_check(&src, size, why, whylen), unsafe);
}

int cache_elf_check_mem(const void *mem, uint64_t size, int *unsafe, char *why, size_t whylen)
{
    cache_elf_src src = {.fd = -1, .mem = mem, .size = size};
    return elf_check_status(elf_check(&src, size, why, whylen), unsafe);
}
