/*
 * cache/cache_fs.c - file-system helpers: directories, removal,
 * ownership checks and the per-key lock files; and the messages and paths
 * every file of cache/ uses. The bottom of cache/: it calls no other file.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <linux/openat2.h>

#include "cache/cache_int.h"

/* ---- messages and paths, for every file of cache/ ----------------------- */

void cache_logf(const cache *c, int level, const char *fmt, ...)
{
    if (!c || !c->log || level > c->log_level)
        return;
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->log(c->log_ud, level, msg);
}

int cache_errf(char *err, size_t errlen, int status, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* a + "/" + b [+ "/" + c], malloc'd. */
/* Paths are joined by copies, not snprintf: a cache hit makes a dozen. */
char *cache_path(const char *a, const char *b, const char *c)
{
    size_t na = strlen(a), nb = strlen(b), nc = c ? strlen(c) : 0;
    char *p = malloc(na + nb + nc + 3), *o = p;
    if (!p)
        return NULL;
    memcpy(o, a, na);
    o += na;
    *o++ = '/';
    memcpy(o, b, nb);
    o += nb;
    if (c) {
        *o++ = '/';
        memcpy(o, c, nc);
        o += nc;
    }
    *o = '\0';
    return p;
}

/* entries/<2 hex>/<32 hex>: where the entry of key hex lives (cut to
 * outlen, as snprintf would). */
void cache_entry_dir_of(const char *entries, const char *hex, char *out, size_t outlen)
{
    size_t ne = strlen(entries), nh = strnlen(hex, 2), nk = strlen(hex);
    if (!outlen)
        return;
    if (ne + 1 + nh + 1 + nk >= outlen) {
        snprintf(out, outlen, "%s/%.2s/%s", entries, hex, hex);
        return;
    }
    memcpy(out, entries, ne);
    out[ne] = '/';
    memcpy(out + ne + 1, hex, nh);
    out[ne + 1 + nh] = '/';
    memcpy(out + ne + 2 + nh, hex, nk + 1);
}

/* n lowercase hex digits, then the end or a '.'. */
int cache_is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return s[n] == '\0' || s[n] == '.';
}

/* s with every byte below 0x20, 0x7f and '\' written C-style (\n, \x1b,
 * \\), so a name from disk never reaches a terminal raw. */
const char *cache_printable(const char *s, char *out, size_t n)
{
    static const char hexd[] = "0123456789abcdef";
    size_t k = 0;
    if (!n)
        return out;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned ch = *p;
        char e[4] = {'\\', 0, 0, 0};
        size_t len = 2;
        if (ch == '\\' || ch == '\n' || ch == '\t' || ch == '\r') {
            e[1] = ch == '\\' ? '\\' : ch == '\n' ? 'n' : ch == '\t' ? 't' : 'r';
        } else if (ch < 0x20 || ch == 0x7f) {
            e[1] = 'x';
            e[2] = hexd[ch >> 4];
            e[3] = hexd[ch & 15];
            len = 4;
        } else {
            e[0] = (char)ch;
            len = 1;
        }
        if (k + len >= n)
            break;
        memcpy(out + k, e, len);
        k += len;
    }
    out[k] = '\0';
    return out;
}

/* The layer root of c that path lies below (the longest), or NULL. */
static const char *cache_root_of(const cache *c, const char *path)
{
    const char *best = NULL;
    size_t blen = 0;
    for (int i = -1; i < c->nro; i++) {
        const char *r = i < 0 ? c->root : c->ro[i];
        size_t n = r ? strlen(r) : 0;
        if (n > blen && !strncmp(path, r, n) && path[n] == '/') {
            best = r;
            blen = n;
        }
    }
    return best;
}

/* What is wrong with name in dirfd, which is not a directory we may
 * enter. */
static void cache_why_not_dir(int dirfd, const char *path, size_t len, const char *name,
                              char *why, size_t whylen)
{
    struct stat st;
    char shown[PATH_MAX];
    snprintf(shown, sizeof shown, "%.*s", (int)len, path);
    char esc[PATH_MAX];
    cache_printable(shown, esc, sizeof esc);
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
        snprintf(why, whylen, "%s is a symbolic link (the cache never follows one below its "
                 "root)", esc);
    else
        snprintf(why, whylen, "%s is not a directory", esc);
}

/* rel below the directory rootfd, in one system call that refuses every
 * symbolic link on the way (Linux 5.6's openat2): the descriptor, or -1
 * and errno. ENOSYS (or what a sandbox says instead) when there is no
 * openat2; ELOOP, ENOTDIR or EXDEV send the caller to the walk, which
 * says which component is wrong. */
static int cache_openat2_beneath(int rootfd, const char *rel)
{
#ifdef SYS_openat2
    static atomic_int missing;
    if (!atomic_load(&missing)) {
        struct open_how how = {.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
                               .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH |
                                          RESOLVE_NO_MAGICLINKS};
        int fd = (int)syscall(SYS_openat2, rootfd, rel, &how, sizeof how);
        if (fd >= 0 || (errno != ENOSYS && errno != EPERM && errno != E2BIG))
            return fd;
        atomic_store(&missing, 1);
    }
#else
    (void)rootfd, (void)rel;
#endif
    errno = ENOSYS;
    return -1;
}

/* rel has a "." or ".." component (or an empty one). */
static int cache_odd_components(const char *rel)
{
    for (const char *p = rel; *p;) {
        size_t n = strcspn(p, "/");
        if (!n || (n <= 2 && !strncmp(p, "..", n)))
            return 1;
        p += n + (p[n] == '/');
    }
    return 0;
}

int cache_open_below(const cache *c, const char *path, char *why, size_t whylen)
{
    const char *root = cache_root_of(c, path);
    if (!root)
        return open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const char *rel = path + strlen(root);
    while (*rel == '/')
        rel++;
    if (fd >= 0 && *rel && !cache_odd_components(rel)) {
        int below = cache_openat2_beneath(fd, rel), e = errno;
        if (below >= 0 || (e != ENOSYS && e != ELOOP && e != ENOTDIR && e != EXDEV)) {
            close(fd);
            errno = e;
            return below;
        }
    }
    for (const char *p = rel; fd >= 0 && *p;) {
        while (*p == '/')
            p++;
        size_t n = strcspn(p, "/");
        char name[NAME_MAX + 1];
        if (!n)
            break;
        int e = n > NAME_MAX ? ENAMETOOLONG : (n <= 2 && !strncmp(p, "..", n)) ? EINVAL : 0;
        int next = -1;
        if (!e) {
            memcpy(name, p, n);
            name[n] = '\0';
            next = openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            e = next < 0 ? errno : 0;
            if ((e == ENOTDIR || e == ELOOP) && why)
                cache_why_not_dir(fd, path, (size_t)(p + n - path), name, why, whylen);
        }
        close(fd);
        fd = next;
        errno = e;
        p += n;
    }
    return fd;
}

/* mkdir p, making its missing parents first (mode 0700 each): from the
 * deepest one that exists, never from "/". 0 or an errno. */
static int cache_mkdir_up(char *p, int depth)
{
    if (mkdir(p, 0700) == 0 || errno == EEXIST)
        return 0;
    char *slash = strrchr(p, '/');
    if (errno != ENOENT || !slash || slash == p || depth > 256)
        return errno;
    *slash = '\0';
    int e = cache_mkdir_up(p, depth + 1);
    *slash = '/';
    if (e)
        return e;
    return mkdir(p, 0700) == 0 || errno == EEXIST ? 0 : errno;
}

/* mkdir -p with mode 0700 for every directory it creates. */
static int cache_mkdir_p_errno(const char *path, char *why, size_t whylen);

/* An opjit status (cache_layer.h); errno says which failure. */
int cache_mkdir_p(const char *path, char *why, size_t whylen)
{
    return cache_status_errno(cache_mkdir_p_errno(path, why, whylen));
}

/* cache_mkdir_p, returning 0 or an errno. */
static int cache_mkdir_p_errno(const char *path, char *why, size_t whylen)
{
    size_t n = strlen(path);
    char *p = malloc(n + 1);
    if (!p) {
        snprintf(why, whylen, "out of memory");
        return ENOMEM;
    }
    memcpy(p, path, n + 1);
    while (n > 1 && p[n - 1] == '/')
        p[--n] = '\0';
    int rc = cache_mkdir_up(p, 0);
    if (rc) {
        snprintf(why, whylen, "cannot create %s: %s", path, strerror(rc));
    } else {
        struct stat st;
        if (stat(path, &st) != 0) {
            rc = errno;
            snprintf(why, whylen, "cannot create %s: %s", path, strerror(rc));
        } else if (!S_ISDIR(st.st_mode)) {
            rc = ENOTDIR;
            snprintf(why, whylen, "%s is not a directory", path);
        }
    }
    free(p);
    return rc;
}

/* Remove everything below dirfd, never following symbolic links. */
static int cache_rm_below(int dirfd, int depth)
{
    DIR *d = fdopendir(dirfd);
    if (!d) {
        close(dirfd);
        return errno;
    }
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        if (!strcmp(n, ".") || !strcmp(n, ".."))
            continue;
        if (unlinkat(dirfd, n, 0) == 0 || errno == ENOENT)
            continue;
        if (errno != EISDIR && errno != EPERM) {
            rc = errno;
            continue;
        }
        /* A directory (unlink says EISDIR on Linux, EPERM by POSIX). */
        int sub = depth < 64 ? openat(dirfd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
        if (sub < 0) {
            rc = depth < 64 ? errno : ELOOP;
            continue;
        }
        int r = cache_rm_below(sub, depth + 1);
        if (r)
            rc = r;
        if (unlinkat(dirfd, n, AT_REMOVEDIR) != 0 && errno != ENOENT)
            rc = errno;
    }
    closedir(d);
    return rc;
}

/* rm -rf path. Returns 0 (also when path did not exist) or an errno. */
static int rm_rf(const char *path);

/* An opjit status; errno says which failure. */
int cache_rm_rf(const char *path)
{
    return cache_status_errno(rm_rf(path));
}

/* cache_rm_rf, returning 0 or an errno. */
static int rm_rf(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        if (errno == ENOTDIR || errno == ELOOP)
            return unlink(path) == 0 ? 0 : errno;
        return errno;
    }
    int rc = cache_rm_below(fd, 0);
    if (rmdir(path) != 0 && errno != ENOENT && !rc)
        rc = errno;
    return rc;
}

/* Anyone able to write what we are about to dlopen could run code in our
 * process: refuse what others own or may write. owner: CACHE_OWNER_SELF
 * (our writable cache: ours only) or CACHE_OWNER_TRUSTED (ours or root's,
 * as a read-only layer a package installed may be). */
const char *cache_untrusted(const struct stat *st, int owner, uid_t euid)
{
    static const char *const why_owner = "owned by another user";
    static const char *const why_mode = "writable by group or others";
    if (st->st_uid != euid && (owner == CACHE_OWNER_SELF || st->st_uid != 0))
        return why_owner;
    if (st->st_mode & (S_IWGRP | S_IWOTH))
        return why_mode;
    return NULL;
}

/* One directory above a cache: ours or root's, and not writable by others
 * unless sticky (like /tmp: others cannot rename or remove what they do not
 * own, and what we use below is checked for its owner). A symbolic link's
 * own mode means nothing; its owner and its directory do. */
static const char *cache_untrusted_above(const struct stat *st, uid_t euid)
{
    if (st->st_uid != euid && st->st_uid != 0)
        return "owned by another user";
    if (S_ISDIR(st->st_mode) && (st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX))
        return "writable by group or others";
    return NULL;
}

/* Check path and every directory above it, "/" included. *links (may be
 * NULL) tells whether one of them is a symbolic link. */
static int cache_walk_up(const char *path, uid_t euid, int *links, char *why, size_t whylen)
{
    /* On the heap, not PATH_MAX of stack: the pages below it are ones a
     * fresh process would fault in for this walk alone. */
    char *p = strdup(path);
    int rc = 0;
    if (!p) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    for (;;) {
        struct stat st;
        const char *bad;
        const char *at = *p ? p : "/";
        if (lstat(at, &st) != 0) {
            snprintf(why, whylen, "cannot stat %s: %s", at, strerror(errno));
            rc = -1;
            break;
        }
        if ((bad = cache_untrusted_above(&st, euid))) {
            snprintf(why, whylen, "%s is %s", at, bad);
            rc = -1;
            break;
        }
        if (links && S_ISLNK(st.st_mode))
            *links = 1;
        char *slash = strrchr(p, '/');
        if (!*p || !slash)
            break;
        *slash = '\0';
    }
    free(p);
    return rc;
}

/* Whether path names itself canonically but for links: absolute, no "."
 * or ".." component, no "//", no trailing "/". */
static int cache_plain_path(const char *path)
{
    if (path[0] != '/' || (path[1] && path[strlen(path) - 1] == '/') || strstr(path, "//"))
        return 0;
    for (const char *p = path; (p = strstr(p, "/.")); p++)
        if (p[2] == '/' || p[2] == '\0' || (p[2] == '.' && (p[3] == '/' || p[3] == '\0')))
            return 0;
    return 1;
}

static int trusted_path(const char *path, uid_t euid, char *why, size_t whylen);

/* OPJIT_OK, or OPJIT_ECACHE and why (not a place to keep code). */
int cache_trusted_path(const char *path, uid_t euid, char *why, size_t whylen)
{
    return trusted_path(path, euid, why, whylen) ? OPJIT_ECACHE : OPJIT_OK;
}

/* cache_trusted_path, returning 0 or -1. */
static int trusted_path(const char *path, uid_t euid, char *why, size_t whylen)
{
    if (path[0] != '/') {
        snprintf(why, whylen, "%s is not an absolute path", path);
        return -1;
    }
    /* As spelled (whoever can change a link on the way could redirect us)
     * and as resolved (where the files really are). A plain path none of
     * whose components is a link resolves to itself: no second walk. */
    int links = 0;
    if (cache_walk_up(path, euid, &links, why, whylen) != 0)
        return -1;
    if (!links && cache_plain_path(path))
        return 0;
    char *real = realpath(path, NULL);
    if (!real) {
        snprintf(why, whylen, "cannot resolve %s: %s", path, strerror(errno));
        return -1;
    }
    int rc = strcmp(real, path) ? cache_walk_up(real, euid, NULL, why, whylen) : 0;
    free(real);
    return rc;
}

static int cache_setlk(int fd, int which, int exclusive, int wait)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = exclusive ? F_WRLCK : F_RDLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = which == CACHE_LOCK_FILE ? 0 : which;
    fl.l_len = which == CACHE_LOCK_FILE ? 0 : 1;
    for (;;) {
        if (fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0)
            return 0;
        if (errno == EINTR && wait)
            continue;
        return errno == EACCES ? EAGAIN : errno;
    }
}

/* Take another lock on an already locked lock file. */
static int cache_relock_errno(int fd, int which, int exclusive, int wait);

/* An opjit status (cache_layer.h); errno says which failure. */
int cache_relock(int fd, int which, int exclusive, int wait)
{
    return cache_status_errno(cache_relock_errno(fd, which, exclusive, wait));
}

/* cache_relock, returning 0 or an errno. */
static int cache_relock_errno(int fd, int which, int exclusive, int wait)
{
    return cache_setlk(fd, which, exclusive, wait);
}

/* Open locks/<hex> and lock it. A lock file is only ever unlinked by a
 * process holding the whole-file exclusive lock, so one we locked after it
 * was unlinked is stale: open the path again. */
static int cache_lock_errno(const cache *c, const char *hex, int which, int exclusive, int wait, int *fd);

/* An opjit status (cache_layer.h); errno says which failure. */
int cache_lock(const cache *c, const char *hex, int which, int exclusive, int wait, int *fd)
{
    return cache_status_errno(cache_lock_errno(c, hex, which, exclusive, wait, fd));
}

/* cache_lock, returning 0 or an errno. */
static int cache_lock_errno(const cache *c, const char *hex, int which, int exclusive, int wait, int *fd)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", c->locks, hex);
    for (int tries = 0; tries < 100; tries++) {
        int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (f < 0)
            return errno;
        int rc = cache_setlk(f, which, exclusive, wait);
        if (rc) {
            close(f);
            return rc;
        }
        struct stat st;
        if (fstat(f, &st) != 0) {
            rc = errno;
            close(f);
            return rc;
        }
        if (st.st_nlink > 0) {
            *fd = f;
            return 0;
        }
        close(f);
    }
    return EAGAIN;
}

static int cache_slot_take_errno(const cache *c, int nslots, int *fd);

/* An opjit status (cache_layer.h); errno says which failure. */
int cache_slot_take(const cache *c, int nslots, int *fd)
{
    return cache_status_errno(cache_slot_take_errno(c, nslots, fd));
}

/* cache_slot_take, returning 0 or an errno. */
static int cache_slot_take_errno(const cache *c, int nslots, int *fd)
{
    if (!c->writable)
        return ENOENT;
    int e = EAGAIN;
    for (int i = 0; i < nslots; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/slot.%d", c->locks, i);
        int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (f < 0)
            return errno;
        if ((e = cache_setlk(f, CACHE_LOCK_FILE, 1, 0)) == 0) {
            *fd = f;
            return 0;
        }
        close(f);
        if (e != EAGAIN)
            return e;
    }
    return e;
}

/* ---- private temporary directories ---------------------------------------
 *
 * base/<prefix>XXXXXX, made by a process for itself (the loader's scratch
 * directory, a build when the cache cannot be written). Its owner holds an
 * OFD lock on the file "lock" inside for as long as the directory lives, and
 * writes its pid there once it holds it. A process killed with the
 * directory still there leaves the lock free: the next process that makes
 * one of the same prefix removes it. */

#define CACHE_PRIVATE_LOCK "lock"
#define CACHE_PRIVATE_YOUNG 60 /* seconds: an empty lock file is being set up */

/* Remove what the owner puts in the directory name of parentfd (open as
 * dfd): the names in files (one ending in '/' is a directory, removed with
 * everything below it), the lock file, then the directory itself. Never
 * follows a symbolic link; leaves anything else (and so the directory). */
static void cache_private_clean(int parentfd, const char *name, int dfd,
                                const char *const *files)
{
    for (; files && *files; files++) {
        size_t n = strlen(*files);
        if (n > 1 && (*files)[n - 1] == '/') {
            char sub[256];
            snprintf(sub, sizeof sub, "%.*s", (int)(n - 1), *files);
            int sfd = openat(dfd, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sfd >= 0)
                cache_rm_below(sfd, 0); /* closes sfd */
            unlinkat(dfd, sub, AT_REMOVEDIR);
        } else {
            unlinkat(dfd, *files, 0);
        }
    }
    unlinkat(dfd, CACHE_PRIVATE_LOCK, 0);
    unlinkat(parentfd, name, AT_REMOVEDIR);
}

static int cache_private_name(const char *n, const char *prefix, size_t plen)
{
    if (strncmp(n, prefix, plen) != 0 || strlen(n) != plen + 6)
        return 0;
    for (const char *s = n + plen; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
            return 0;
    return 1;
}

/* One readdir of base: remove the directories of this prefix that are ours
 * and whose owner died (the lock can be taken). An empty lock file is left
 * alone while young (its owner is about to lock it); a directory without a
 * lock file always (being created, or made by an older opjit that may
 * still be using it). */
static void cache_private_sweep(const char *base, const char *prefix, const char *const *files)
{
    int bfd = open(base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = bfd < 0 ? NULL : fdopendir(bfd);
    if (!d) {
        if (bfd >= 0)
            close(bfd);
        return;
    }
    uid_t euid = geteuid();
    size_t plen = strlen(prefix);
    time_t now = time(NULL);
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        if ((de->d_type != DT_DIR && de->d_type != DT_UNKNOWN) || !cache_private_name(n, prefix, plen))
            continue;
        int dfd = openat(bfd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd < 0)
            continue;
        struct stat st, ls;
        int dead = 0;
        if (fstat(dfd, &st) == 0 && st.st_uid == euid) {
            int lfd = openat(dfd, CACHE_PRIVATE_LOCK, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
            if (lfd >= 0)
                dead = cache_setlk(lfd, CACHE_LOCK_FILE, 1, 0) == 0 && fstat(lfd, &ls) == 0 &&
                       S_ISREG(ls.st_mode) && ls.st_uid == euid &&
                       (ls.st_size > 0 || now - ls.st_mtime >= CACHE_PRIVATE_YOUNG);
            if (dead)
                cache_private_clean(bfd, n, dfd, files); /* holding the lock */
            if (lfd >= 0)
                close(lfd);
        }
        close(dfd);
    }
    closedir(d);
}

static int cache_private_mkdir_errno(const char *base, const char *prefix, const char *const *files,
                        char *path, size_t pathlen, int *lockfd);

/* An opjit status (cache_layer.h); errno says which failure. */
int cache_private_mkdir(const char *base, const char *prefix, const char *const *files,
                        char *path, size_t pathlen, int *lockfd)
{
    return cache_status_errno(cache_private_mkdir_errno(base, prefix, files, path, pathlen, lockfd));
}

/* cache_private_mkdir, returning 0 or an errno. */
static int cache_private_mkdir_errno(const char *base, const char *prefix, const char *const *files,
                        char *path, size_t pathlen, int *lockfd)
{
    cache_private_sweep(base, prefix, files);
    int n = snprintf(path, pathlen, "%s/%sXXXXXX", base, prefix);
    if (n < 0 || (size_t)n + sizeof CACHE_PRIVATE_LOCK + 1 > pathlen) {
        path[0] = '\0';
        return ENAMETOOLONG;
    }
    if (!mkdtemp(path)) {
        int e = errno;
        path[0] = '\0';
        return e;
    }
    char lp[PATH_MAX + 16], pid[32];
    snprintf(lp, sizeof lp, "%s/%s", path, CACHE_PRIVATE_LOCK);
    int fd = open(lp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    int e = fd < 0 ? errno : cache_setlk(fd, CACHE_LOCK_FILE, 1, 0);
    if (!e) {
        int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
        ssize_t w = write(fd, pid, (size_t)len);
        e = w == len ? 0 : w < 0 ? errno : ENOSPC;
    }
    if (e) {
        if (fd >= 0)
            close(fd);
        unlink(lp);
        rmdir(path);
        path[0] = '\0';
        return e;
    }
    *lockfd = fd;
    return 0;
}

void cache_private_rmdir(const char *path, const char *const *files)
{
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return;
    cache_private_clean(AT_FDCWD, path, dfd, files);
    close(dfd);
}

int cache_status_errno(int e)
{
    if (!e)
        return OPJIT_OK;
    errno = e;
    return e == ENOMEM ? OPJIT_ENOMEM : OPJIT_EIO;
}
