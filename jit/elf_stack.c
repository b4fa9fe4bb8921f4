/*
 * jit/elf_stack.c - give a shared object a non-executable stack.
 *
 * glibc reads a shared object without a PT_GNU_STACK program header as
 * one that needs an executable stack: dlopen then makes every thread's
 * stack in the host executable (glibc 2.41 and later refuse to load it).
 * libtcc writes no such header. Its program headers sit right after the
 * ELF header with the sections packed behind them, so there is no room to
 * add one in place: the table, with PT_GNU_STACK (read and write, no
 * execute) added, is written again at the end of the file and the ELF
 * header pointed at it. glibc reads the program headers wherever e_phoff
 * says, and keeps its own copy when they lie outside the loaded segments.
 */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jit/jit.h"
#include "opjit.h"

static int read_at(int fd, void *buf, size_t n, off_t off)
{
    return pread(fd, buf, n, off) == (ssize_t)n ? 0 : -1;
}

/* A short write is a full disk or a file-size limit (errno says which
 * when the write failed outright). */
static int write_at(int fd, const void *buf, size_t n, off_t off)
{
    ssize_t r = pwrite(fd, buf, n, off);
    if (r >= 0 && r < (ssize_t)n)
        errno = EFBIG;
    return r == (ssize_t)n ? 0 : -1;
}

/* The new table, old headers plus PT_GNU_STACK, at the 8-aligned end of
 * the file; then the ELF header that points at it. */
static int append_table(int fd, Elf64_Ehdr *eh, const Elf64_Phdr *ph)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || eh->e_phnum >= PN_XNUM - 1)
        return -1;
    size_t n = eh->e_phnum;
    Elf64_Phdr *table = calloc(n + 1, sizeof *table);
    if (!table)
        return -1;
    memcpy(table, ph, n * sizeof *table);
    table[n] = (Elf64_Phdr){.p_type = PT_GNU_STACK, .p_flags = PF_R | PF_W, .p_align = 16};
    off_t at = (st.st_size + 7) & ~(off_t)7;
    int rc = write_at(fd, table, (n + 1) * sizeof *table, at);
    free(table);
    if (rc)
        return -1;
    eh->e_phoff = (Elf64_Off)at;
    eh->e_phnum = (Elf64_Half)(n + 1);
    return write_at(fd, eh, sizeof *eh, 0);
}

/* A PT_GNU_STACK header that asks for an executable stack, or none at all:
 * the index of the first, -1 for none. *exec: it asks for one. */
static int find_stack(const Elf64_Phdr *ph, size_t n, int *exec)
{
    for (size_t i = 0; i < n; i++)
        if (ph[i].p_type == PT_GNU_STACK) {
            *exec = (ph[i].p_flags & PF_X) != 0;
            return (int)i;
        }
    return -1;
}

int jit_elf_stack_noexec(const char *path, char *diag, size_t n)
{
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        snprintf(diag, n, "cannot open %s: %s", path, strerror(errno));
        return OPJIT_EIO;
    }
    Elf64_Ehdr eh;
    Elf64_Phdr *ph = NULL;
    const char *bad = NULL;
    if (read_at(fd, &eh, sizeof eh, 0) || memcmp(eh.e_ident, ELFMAG, SELFMAG))
        bad = "was not written whole (disk full or a file-size limit?)";
    else if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_type != ET_DYN ||
             eh.e_phentsize != sizeof(Elf64_Phdr) || !eh.e_phnum)
        bad = "is not a 64-bit ELF shared object";
    else if (!(ph = calloc(eh.e_phnum, sizeof *ph)) ||
             read_at(fd, ph, eh.e_phnum * sizeof *ph, (off_t)eh.e_phoff))
        bad = "has program headers that cannot be read";
    int exec = 0, at = bad ? -1 : find_stack(ph, eh.e_phnum, &exec);
    if (!bad && at < 0 && append_table(fd, &eh, ph))
        bad = errno == EFBIG || errno == ENOSPC || errno == EDQUOT
                  ? "was not written whole (disk full or a file-size limit?)"
                  : "could not be given a PT_GNU_STACK header";
    if (!bad && at >= 0 && exec)
        bad = "asks for an executable stack";
    free(ph);
    close(fd);
    if (bad) {
        snprintf(diag, n, "%s %s", path, bad);
        return OPJIT_EIO;
    }
    return OPJIT_OK;
}
