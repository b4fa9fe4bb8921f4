/*
 * cache/cache_fs.c - file-system helpers: directories, removal, fsync,
 * ownership checks and the per-key lock files.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache_int.h"

/* mkdir -p with mode 0700 for every directory it creates. */
int cache_mkdir_p(const char *path, char *why, size_t whylen)
{
    size_t n = strlen(path);
    char *p = malloc(n + 1);
    if (!p) {
        snprintf(why, whylen, "out of memory");
        return ENOMEM;
    }
    memcpy(p, path, n + 1);
    int rc = 0;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char saved = *s;
        *s = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST) {
            rc = errno;
            snprintf(why, whylen, "cannot create %s: %s", p, strerror(rc));
            break;
        }
        *s = saved;
        if (saved == '\0')
            break;
    }
    if (rc == 0) {
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
int cache_rm_rf(const char *path)
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

int cache_fsync_path(const char *path, int dir)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : 0));
    if (fd < 0)
        return errno;
    int rc = fsync(fd) == 0 ? 0 : errno;
    /* Some file systems cannot fsync a directory; the data is still safe. */
    if (rc == EINVAL && dir)
        rc = 0;
    close(fd);
    return rc;
}

/* Anyone able to write what we are about to dlopen could run code in our
 * process: refuse what others own or may write. */
const char *cache_untrusted(const struct stat *st, int owner, uid_t euid)
{
    static const char *const why_owner = "owned by another user";
    static const char *const why_mode = "writable by group or others";
    if (owner && st->st_uid != euid)
        return why_owner;
    if (st->st_mode & (S_IWGRP | S_IWOTH))
        return why_mode;
    return NULL;
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
int cache_relock(int fd, int which, int exclusive, int wait)
{
    return cache_setlk(fd, which, exclusive, wait);
}

/* Open locks/<hex> and lock it. A lock file is only ever unlinked by a
 * process holding the whole-file exclusive lock, so one we locked after it
 * was unlinked is stale: open the path again. */
int cache_lock(const cache *c, const char *hex, int which, int exclusive, int wait, int *fd)
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
