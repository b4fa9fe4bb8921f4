/* tests/test_op_header.c - the copy of opjit_op.h a build reads instead of
 * writing one into its directory (loader/pipeline.c): only a copy that is
 * this library's byte for byte, in a file and a directory nobody but
 * their owner can change, and only while it stays the file that was read.
 * That the builds use the source tree's copy is seen in
 * test_load_syscalls.sh. */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "loader/loader_int.h"
#include "opjit_build_config.h"
#include "t.h"
#include "t_files.h"

static char base[256];

/* base/name holding an opjit_op.h of len bytes of text (dir mode dmode,
 * file mode fmode); its path. */
static const char *copy_in(const char *name, const void *text, size_t len, mode_t dmode,
                           mode_t fmode)
{
    static char dir[512];
    snprintf(dir, sizeof dir, "%s", t_path(base, name));
    const char *file = t_path(dir, "opjit_op.h");
    CHECK(mkdir(dir, 0700) == 0);
    t_write(file, text, len);
    CHECK(chmod(file, fmode) == 0 && chmod(dir, dmode) == 0);
    return dir;
}

static void the_librarys_own_bytes_are_used(void)
{
    struct stat st;
    const char *d = copy_in("same", opjit_op_h_text, sizeof opjit_op_h_text, 0755, 0644);
    CHECK(loader_op_header_copy(d, &st) == 1);
    CHECK(S_ISREG(st.st_mode) && st.st_size == (off_t)sizeof opjit_op_h_text);
    CHECK(loader_op_header_unchanged(d, &st) == 1);
}

static void other_bytes_are_not(void)
{
    struct stat st;
    char *text = malloc(sizeof opjit_op_h_text);
    memcpy(text, opjit_op_h_text, sizeof opjit_op_h_text);
    text[sizeof opjit_op_h_text / 2] ^= 1;
    CHECK(loader_op_header_copy(copy_in("flipped", text, sizeof opjit_op_h_text, 0755, 0644),
                                &st) == 0);
    CHECK(loader_op_header_copy(copy_in("short", text, sizeof opjit_op_h_text - 1, 0755, 0644),
                                &st) == 0);
    free(text);
    CHECK(loader_op_header_copy(base, &st) == 0); /* none there */
}

/* Someone else could change it between the check and the compile. */
static void a_copy_others_can_write_is_not(void)
{
    struct stat st;
    const void *t = opjit_op_h_text;
    size_t n = sizeof opjit_op_h_text;
    CHECK(loader_op_header_copy(copy_in("group-file", t, n, 0755, 0664), &st) == 0);
    CHECK(loader_op_header_copy(copy_in("world-file", t, n, 0755, 0646), &st) == 0);
    CHECK(loader_op_header_copy(copy_in("group-dir", t, n, 0775, 0644), &st) == 0);
    CHECK(loader_op_header_copy(copy_in("world-dir", t, n, 0757, 0644), &st) == 0);
    /* A link to a good copy is not followed. */
    char dir[PATH_MAX + 64], link[PATH_MAX + 96], target[PATH_MAX + 96];
    const char *good = copy_in("target", t, n, 0755, 0644);
    snprintf(target, sizeof target, "%s/opjit_op.h", good);
    snprintf(dir, sizeof dir, "%s/link", base);
    snprintf(link, sizeof link, "%s/opjit_op.h", dir);
    CHECK(mkdir(dir, 0755) == 0 && symlink(target, link) == 0);
    CHECK(loader_op_header_copy(dir, &st) == 0);
}

/* Below a directory others can write (not sticky), someone could rename
 * the copy's directory and put another in its place: not used. A sticky
 * one (as /tmp) lets nobody move what is ours. */
static void a_copy_under_a_directory_others_can_write_is_not(void)
{
    struct stat st;
    char open_dir[PATH_MAX + 64], sticky[PATH_MAX + 64], under[PATH_MAX + 96];
    snprintf(open_dir, sizeof open_dir, "%s/open", base);
    snprintf(sticky, sizeof sticky, "%s/sticky", base);
    CHECK(mkdir(open_dir, 0700) == 0 && mkdir(sticky, 0700) == 0);
    snprintf(under, sizeof under, "open/inner");
    const char *d = copy_in(under, opjit_op_h_text, sizeof opjit_op_h_text, 0755, 0644);
    CHECK(loader_op_header_copy(d, &st) == 1);
    CHECK(chmod(open_dir, 0777) == 0);
    CHECK(loader_op_header_copy(d, &st) == 0);
    snprintf(under, sizeof under, "sticky/inner");
    d = copy_in(under, opjit_op_h_text, sizeof opjit_op_h_text, 0755, 0644);
    CHECK(chmod(sticky, 01777) == 0);
    CHECK(loader_op_header_copy(d, &st) == 1);
}

/* Rewritten with the same bytes and its times put back, or replaced by
 * another file: no longer the file that was read (its ctime, its inode). */
static void a_copy_changed_after_the_check_is_seen(void)
{
    struct stat st, before;
    char file[PATH_MAX + 96], other[PATH_MAX + 96];
    const char *d = copy_in("changes", opjit_op_h_text, sizeof opjit_op_h_text, 0755, 0644);
    CHECK(loader_op_header_copy(d, &st) == 1);
    snprintf(file, sizeof file, "%s/opjit_op.h", d);
    CHECK(stat(file, &before) == 0);
    struct timespec pause = {0, 20 * 1000 * 1000}; /* past the clock's tick */
    nanosleep(&pause, NULL);
    int fd = open(file, O_WRONLY);
    CHECK(fd >= 0 && pwrite(fd, opjit_op_h_text, 16, 0) == 16);
    close(fd);
    struct timespec times[2] = {before.st_atim, before.st_mtim};
    CHECK(utimensat(AT_FDCWD, file, times, 0) == 0);
    CHECK(loader_op_header_unchanged(d, &st) == 0);

    CHECK(loader_op_header_copy(d, &st) == 1);
    snprintf(other, sizeof other, "%s/opjit_op.h.new", d);
    fd = open(other, O_WRONLY | O_CREAT | O_EXCL, 0644);
    CHECK(fd >= 0 && write(fd, opjit_op_h_text, sizeof opjit_op_h_text) ==
                         (ssize_t)sizeof opjit_op_h_text);
    close(fd);
    CHECK(rename(other, file) == 0);
    CHECK(loader_op_header_unchanged(d, &st) == 0);
}

int main(void)
{
    snprintf(base, sizeof base, "%s", t_tmpdir("op-header"));
    char why[PATH_MAX + 64];
    if (cache_trusted_path(base, geteuid(), why, sizeof why) != OPJIT_OK) {
        /* No copy there can be used: nothing to tell apart. */
        fprintf(stderr, "note: %s: the checks are skipped\n", why);
        t_tmpdirs_remove();
        return t_done();
    }
    T_RUN(the_librarys_own_bytes_are_used);
    T_RUN(other_bytes_are_not);
    T_RUN(a_copy_others_can_write_is_not);
    T_RUN(a_copy_under_a_directory_others_can_write_is_not);
    T_RUN(a_copy_changed_after_the_check_is_seen);
    t_tmpdirs_remove();
    return t_done();
}
