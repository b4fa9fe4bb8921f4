/*
 * cache/cache_note.c - text values kept as cache entries, and index
 * entries: a note holding the key of another entry.
 *
 * Some answers are worth remembering across processes but cost too much to
 * compute on every load: which entry holds the optimized code of a source
 * when the compiler's identity is unknown (no compiler here) or too slow to
 * ask, which version of NVRTC a library file is, which ops the sources of
 * a directory register (loader/index.c: about a megabyte for 10,000
 * sources). Each is one entry with one artifact, published and checked
 * like any other entry.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "opjit.h"
#include "cache/cache_int.h"

typedef struct cache_note {
    const char *name, *text;
} cache_note;

static int cache_note_build(void *ud, const char *dir, char *err, size_t errlen)
{
    const cache_note *n = ud;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, n->name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    size_t len = strlen(n->text);
    ssize_t w = fd < 0 ? -1 : write(fd, n->text, len);
    int e = w == (ssize_t)len ? 0 : w < 0 ? errno : ENOSPC;
    if (fd >= 0 && close(fd) != 0 && !e)
        e = errno;
    if (e)
        return cache_errf(err, errlen, OPJIT_EIO, "cannot write %s: %s", path, strerror(e));
    return OPJIT_OK;
}

int cache_note_put(cache *c, const cache_request *req, const char *name, const char *text)
{
    cache_note n = {name, text};
    cache_entry *e = NULL;
    cache_request r = *req;
    r.note = 1;
    char err[512];
    int hit, rc = cache_fetch(c, &r, cache_note_build, &n, &e, &hit, err, sizeof err);
    cache_entry_release(e);
    return rc;
}

int cache_note_get(cache *c, const cache_request *req, const char *name, char **text)
{
    *text = NULL;
    cache_entry *e = NULL;
    cache_request r = *req;
    r.note = 1;
    char err[512];
    int hit, rc = cache_fetch(c, &r, NULL, NULL, &e, &hit, err, sizeof err);
    if (rc)
        return rc;
    const char *path = cache_entry_path(e, name);
    int fd = path ? open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
    struct stat st;
    /* The entry was verified: its size is the manifest's. */
    size_t size = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                          st.st_size <= CACHE_NOTE_MAX ? (size_t)st.st_size : SIZE_MAX;
    char *buf = size != SIZE_MAX ? malloc(size + 1) : NULL;
    size_t n = 0;
    while (buf && n < size) {
        ssize_t r = read(fd, buf + n, size - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    if (fd >= 0)
        close(fd);
    cache_entry_release(e);
    if (!buf || n != size || memchr(buf, '\0', n)) { /* missing, unreadable, or not a note */
        free(buf);
        return OPJIT_ENOTFOUND;
    }
    buf[n] = '\0';
    *text = buf;
    return OPJIT_OK;
}

/* The key a note holds: 32 lower-case hex digits. */
static int cache_key_from_hex(const char *hex, cache_key *k)
{
    if (strlen(hex) != 32 || !cache_is_hex(hex, 32))
        return 0;
    for (int i = 0; i < 16; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return 0;
        k->bytes[i] = (unsigned char)v;
    }
    memcpy(k->hex, hex, 33);
    return 1;
}

int cache_index_put(cache *c, const cache_request *index, const cache_key *target)
{
    return cache_note_put(c, index, "key", target->hex);
}

int cache_index_get(cache *c, const cache_request *index, cache_key *target)
{
    char *hex = NULL;
    int rc = cache_note_get(c, index, "key", &hex);
    if (!rc && !cache_key_from_hex(hex, target))
        rc = OPJIT_ENOTFOUND;
    free(hex);
    return rc;
}
