/* jit/shared.c - what the compilers of the table share: the machine's
 * triple (the build's), a cheap identity of a compiler's file, the host code's include
 * and library paths, the artifact's name, the buffer diagnostics gather in. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <xxhash.h>

#include "jit/jit.h"
#include "opjit_build_config.h"

void jit_diag_put(jit_diag *d, const char *s, size_t n)
{
    if (!d->cap)
        return;
    size_t room = d->cap - 1 - d->len;
    if (n > room)
        n = room;
    memcpy(d->buf + d->len, s, n);
    d->len += n;
    d->buf[d->len] = '\0';
}

/* A constant: no uname and no once-flag (a static the first load would
 * write: one more page a fresh process faults in). */
const char *jit_host_target(void)
{
    return OPJIT_HOST_MACHINE "-linux";
}

/* The file stat(2) finds at the end of path's links names it: a link
 * retargeted gives another device and inode (no realpath, whose readlink
 * per component a cache hit would pay). */
int jit_file_id(const char *prefix, const char *path, char *out, size_t n)
{
    struct stat st;
    if (!path || !path[0] || stat(path, &st) != 0)
        return 0;
    return jit_file_id_of(prefix, path, &st, out, n);
}

int jit_file_id_of(const char *prefix, const char *path, const struct stat *st, char *out,
                   size_t n)
{
    char buf[PATH_MAX + 128];
    int len = snprintf(buf, sizeof buf, "%s\n%llu %llu %lld %lld.%09ld", path,
                       (unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
                       (long long)st->st_size, (long long)st->st_mtim.tv_sec, st->st_mtim.tv_nsec);
    XXH128_hash_t h = XXH3_128bits(buf, (size_t)len < sizeof buf ? (size_t)len : sizeof buf);
    snprintf(out, n, "%s:%016llx%016llx", prefix, (unsigned long long)h.high64,
             (unsigned long long)h.low64);
    return 1;
}

/* ---- what the host compilers share ---------------------------------------- */

/* dir/opjit_op.h exists. */
static int has_op_header(const char *dir)
{
    char path[PATH_MAX];
    struct stat st;
    return (size_t)snprintf(path, sizeof path, "%s/opjit_op.h", dir) < sizeof path &&
           stat(path, &st) == 0;
}

int jit_host_includes(const jit_job *job, const char **out, int max)
{
    /* Searched before the compilers' own directories for every <header>:
     * the source's directory (first, as -I), the machine's
     * (x86_64-linux-gnu) and /usr/include, as they come in the compilers'
     * own lists (glibc's <bits/...> are not looked for in /usr/include
     * first), then the build's directory, which holds opjit_op.h alone: no
     * system header is looked for in it (about 45 failed opens a compile of
     * nms.c under libtcc, 0.2 ms). Where a system directory has an
     * opjit_op.h of its own (an installed copy), the build's comes second,
     * before it, so that the one compiled is the library's. */
    const char *const *dirs = job->include_dirs;
    int n = 0, nd = 0;
    while (dirs && dirs[nd])
        nd++;
    int late = !has_op_header(OPJIT_CBLAS_INCLUDE_DIR) && !has_op_header(OPJIT_DLPACK_INCLUDE_DIR);
    for (int i = 0; i < nd && n < max - 3; i++)
        if (i == 0 || !late)
            out[n++] = dirs[i];
    out[n++] = OPJIT_CBLAS_INCLUDE_DIR;
    out[n++] = OPJIT_DLPACK_INCLUDE_DIR;
    for (int i = 1; late && i < nd && n < max - 1; i++)
        out[n++] = dirs[i];
    out[n] = NULL;
    return n;
}

void jit_blas_dir(char *out, size_t n)
{
    snprintf(out, n, "%s", OPJIT_OPENBLAS_LIBRARY);
    char *slash = strrchr(out, '/');
    if (slash)
        *slash = '\0';
}

void jit_host_artifact(const char *target, char *out, size_t n)
{
    (void)target;
    snprintf(out, n, "host.so");
}

size_t jit_join(char *out, size_t n, size_t k, const char *prefix, const char *const *v)
{
    for (int i = 0; v[i] && k < n; i++)
        k += (size_t)snprintf(out + k, n - k, "%s%s%s", k ? " " : "", prefix, v[i]);
    return k < n ? k : n - 1;
}
