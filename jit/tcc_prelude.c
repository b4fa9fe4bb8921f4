/* jit/tcc_prelude.c - when the build's preprocessed <opjit_op.h> may stand
 * in for the include (jit/tcc_prelude.h). */

#include "jit/tcc_prelude.h"

#include <limits.h>
#include <stdatomic.h>
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

/* The names of text's leading #include <name> directives, each alone on
 * its line with blanks and comments between, into names (at most max;
 * each names[i] points into text, its length in lens[i]). Their number. */
static int leading_includes(const char *text, const char **names, size_t *lens, int max)
{
    int n = 0;
    for (const char *p = skip_blank(text); n < max; p = skip_blank(p)) {
        if (*p++ != '#')
            break;
        while (*p == ' ' || *p == '\t')
            p++;
        if (strncmp(p, "include", 7))
            break;
        p += 7;
        while (*p == ' ' || *p == '\t')
            p++;
        const char *close = *p == '<' ? strpbrk(p, ">\n") : NULL;
        if (!close || *close != '>')
            break;
        const char *name = p + 1;
        p = close + 1;
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (*p != '\n' && !(p[0] == '/' && (p[1] == '/' || p[1] == '*')))
            break;
        names[n] = name;
        lens[n++] = (size_t)(close - name);
    }
    return n;
}

/* The prelude standing for the most of text's leading includes, or NULL
 * (none stands for its first). */
static const jit_prelude *prelude_for(const char *text)
{
    const char *names[JIT_PRELUDE_MAX_INCLUDES];
    size_t lens[JIT_PRELUDE_MAX_INCLUDES];
    int n = leading_includes(text, names, lens, JIT_PRELUDE_MAX_INCLUDES), most = 0;
    const jit_prelude *best = NULL;
    for (const jit_prelude *p = jit_tcc_preludes; p->includes[0]; p++) {
        int k = 0;
        while (k < JIT_PRELUDE_MAX_INCLUDES && p->includes[k])
            k++;
        int same = k <= n;
        for (int i = 0; same && i < k; i++)
            same = strlen(p->includes[i]) == lens[i] && !strncmp(p->includes[i], names[i], lens[i]);
        if (same && k > most)
            best = p, most = k;
    }
    return best;
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

/* The system headers are checked once a process (an upgrade of them under
 * a running process is the cache key's concern as much as this), without
 * a lock: threads that race both check and agree, and a child forked
 * meanwhile (discovery's) never waits on another thread's check. 0: not
 * checked yet; 1: as built; -1: not. */
static atomic_int headers_state;
static int headers_ok(void)
{
    int st = atomic_load_explicit(&headers_state, memory_order_acquire);
    if (!st) {
        st = jit_tcc_preludes[0].includes[0] &&
                     jit_prelude_headers_unchanged(jit_tcc_prelude_headers) &&
                     jit_prelude_paths_absent(jit_tcc_prelude_absent)
                 ? 1
                 : -1;
        atomic_store_explicit(&headers_state, st, memory_order_release);
    }
    return st > 0;
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
    const jit_prelude *p = prelude_for(text);
    if (!p)
        return NULL;
    if (!headers_ok())
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
    *len = p->len;
    return (const char *)p->text;
}
