/* jit/tcc_prelude.c - when the build's preprocessed <opjit_op.h> may stand
 * in for the include (jit/tcc_prelude.h). */

#include "jit/tcc_prelude.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* Past blanks and comments. */
static const char *skip_blank(const char *p)
{
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\f' || *p == '\v')
            p++;
        if (p[0] == '/' && p[1] == '*') {
            const char *e = strstr(p + 2, "*/");
            if (!e)
                return p;
            p = e + 2;
        } else if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n')
                p++;
        } else {
            return p;
        }
    }
}

/* text's first directive is #include <opjit_op.h>, alone on its line. */
static int starts_with_op_header(const char *text)
{
    const char *p = skip_blank(text);
    if (*p++ != '#')
        return 0;
    while (*p == ' ' || *p == '\t')
        p++;
    if (strncmp(p, "include", 7))
        return 0;
    p += 7;
    while (*p == ' ' || *p == '\t')
        p++;
    if (strncmp(p, "<opjit_op.h>", 12))
        return 0;
    p += 12;
    while (*p == ' ' || *p == '\t' || *p == '\r')
        p++;
    return *p == '\n' || (p[0] == '/' && (p[1] == '/' || p[1] == '*'));
}

int jit_prelude_headers_unchanged(const jit_prelude_header *h)
{
    for (; h->path; h++) {
        struct stat st;
        if (stat(h->path, &st) != 0 || (long long)st.st_size != h->size ||
            (long long)st.st_mtim.tv_sec != h->mtime_sec ||
            (long long)st.st_mtim.tv_nsec != h->mtime_nsec)
            return 0;
    }
    return 1;
}

int jit_prelude_paths_absent(const char *const *paths)
{
    struct stat st;
    for (; *paths; paths++)
        if (lstat(*paths, &st) == 0)
            return 0;
    return 1;
}

/* The system headers are checked once a process: an upgrade of them
 * under a running process is the cache key's concern as much as this. */
static pthread_once_t headers_once = PTHREAD_ONCE_INIT;
static int headers_ok;
static void check_headers(void)
{
    headers_ok = jit_tcc_prelude_len > 0 &&
                 jit_prelude_headers_unchanged(jit_tcc_prelude_headers) &&
                 jit_prelude_paths_absent(jit_tcc_prelude_absent);
}

/* dir holds none of the names the prelude's headers were included by
 * (opjit_op.h itself allowed where it is the library's). */
static int shadows_none(const char *dir, int op_header_dir)
{
    char path[PATH_MAX];
    struct stat st;
    for (const char *const *n = jit_tcc_prelude_names; *n; n++) {
        if (op_header_dir && !strcmp(*n, "opjit_op.h"))
            continue;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, *n) >= sizeof path ||
            lstat(path, &st) == 0)
            return 0;
    }
    return 1;
}

const char *jit_tcc_prelude(const char *text, const char *const *dirs,
                            const char *op_header_dir, size_t *len)
{
    *len = 0;
    if (!starts_with_op_header(text))
        return NULL;
    pthread_once(&headers_once, check_headers);
    if (!headers_ok)
        return NULL;
    for (const char *const *d = dirs; d && *d; d++) {
        int own = op_header_dir && !strcmp(*d, op_header_dir);
        /* Asked once each: the source's and the header's may be one. */
        int again = 0;
        for (const char *const *e = dirs; e < d; e++)
            again |= !strcmp(*e, *d);
        if (!again && !shadows_none(*d, own))
            return NULL;
    }
    *len = jit_tcc_prelude_len;
    return (const char *)jit_tcc_prelude_text;
}
