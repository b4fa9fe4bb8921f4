/* tests/t_files.h - scratch directories and files for the tests that write
 * op sources: directories made under $TMPDIR and removed at the end, paths
 * joined into rotating buffers, files written whole. */
#ifndef OPJIT_TEST_T_FILES_H
#define OPJIT_TEST_T_FILES_H
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "t.h"

#define T_MAX_TMP 64
static char *t_tmp_dirs[T_MAX_TMP];
static int t_ntmp;

/* A new empty directory named after tag; exits the test when it cannot. */
static inline const char *t_tmpdir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s/opjit-test-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    char *d = mkdtemp(tmpl);
    if (!d || t_ntmp == T_MAX_TMP) {
        fprintf(stderr, "mkdtemp: %s\n", d ? "too many temporary directories" : strerror(errno));
        exit(1);
    }
    return t_tmp_dirs[t_ntmp++] = strdup(d);
}

static inline int t_rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    remove(p);
    return 0;
}

/* Remove every directory t_tmpdir made. */
static inline void t_tmpdirs_remove(void)
{
    for (int i = 0; i < t_ntmp; i++) {
        nftw(t_tmp_dirs[i], t_rm_one, 16, FTW_DEPTH | FTW_PHYS);
        free(t_tmp_dirs[i]);
    }
    t_ntmp = 0;
}

/* dir/name in one of a few rotating buffers: copy it to keep it. */
static inline const char *t_path(const char *dir, const char *name)
{
    static char bufs[32][1024];
    static int i;
    char *b = bufs[i++ % 32];
    snprintf(b, 1024, "%s/%s", dir, name);
    return b;
}

/* Write len bytes to path, checking every step. */
static inline void t_write(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECKF(f != NULL, "fopen %s: %s", path, strerror(errno));
    if (!f)
        return;
    CHECK(fwrite(data, 1, len, f) == len);
    CHECK(fclose(f) == 0);
}

/* The whole of a file (NULL if unreadable), NUL-ended; its length in
 * *len. */
static inline char *t_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (f)
        fclose(f);
    if (buf)
        buf[n] = '\0', *len = (size_t)n;
    return buf;
}

#endif
