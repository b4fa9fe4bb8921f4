/* jit/tcc_link.c - what libtcc links every op with, handed to it file by
 * file (jit/tcc.c uses it).
 *
 * libtcc links every op with libm and libc. On Debian libm.so and libc.so
 * are GNU ld scripts naming the real files, and libtcc reads a script one
 * byte per read() (about 400 system calls). Once per process the two
 * scripts are read here, where libtcc would find them
 * (OPJIT_TCC_LIB_PATHS, OPJIT_TCC_CRT_DIR: what `tcc -vv` said at build
 * time), and libtcc is handed the files they name, in the order it adds
 * them itself (with -nostdlib: crti.o, the source, libm's files, libc's
 * files, libtcc1.a, crtn.o): the same link, the same bytes out. Anything
 * unexpected (no script, a script saying more than GROUP/INPUT of
 * absolute paths) leaves libtcc to link as usual.
 *
 * libtcc would also read the whole dynamic symbol tables of libc.so.6,
 * libm.so.6 and what they need (a fifth of a small op's cold load), for
 * the versions of the few the op calls (memcpy@GLIBC_2.14: an artifact
 * from a cache warmed on another glibc then fails to load where a version
 * is missing instead of binding to another ABI). Once the op is compiled
 * to an object, each shared library is handed over as a stub holding
 * only what that object and the other files need (jit/tcc_stub.c): the
 * same versions, the same bytes out. */
#include <fcntl.h>
#include <libtcc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jit/jit.h"
#include "opjit_build_config.h"

#define TCC_LINK_MAX 4 /* files one script may name */

typedef struct tcc_stdlib {
    int ok;
    char crti[PATH_MAX], crtn[PATH_MAX], libtcc1[PATH_MAX];
    char m[TCC_LINK_MAX][PATH_MAX], c[TCC_LINK_MAX][PATH_MAX];
    int nm, nc;
} tcc_stdlib;

static tcc_stdlib tcc_std;
static pthread_once_t tcc_std_once = PTHREAD_ONCE_INIT;

/* The next token of a linker script at *p: a word, "(" or ")"; comments
 * skipped. 0 at the end. */
static size_t tcc_ld_token(const char **p)
{
    for (;;) {
        while (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r' || **p == ',')
            (*p)++;
        if ((*p)[0] != '/' || (*p)[1] != '*')
            break;
        const char *end = strstr(*p + 2, "*/");
        if (!end)
            return 0;
        *p = end + 2;
    }
    if (**p == '(' || **p == ')')
        return 1;
    return strcspn(*p, " \t\n\r,()");
}

/* The files a script's GROUP and INPUT name (AS_NEEDED ones left out, as
 * libtcc leaves them), into files; their count, or -1 when the script says
 * anything else. */
static int tcc_ld_files(const char *text, char files[TCC_LINK_MAX][PATH_MAX])
{
    const char *p = text;
    int n = 0, depth = 0, needed = 0, list = 0;
    for (size_t len; (len = tcc_ld_token(&p)); p += len) {
        if (*p == '(') {
            depth++;
        } else if (*p == ')') {
            if (--depth < 0)
                return -1;
            needed = needed && depth > 1;
            list = list && depth > 0;
        } else if (depth == 0) { /* a command */
            list = (len == 5 && !strncmp(p, "GROUP", 5)) || (len == 5 && !strncmp(p, "INPUT", 5));
            if (!list && !(len == 13 && !strncmp(p, "OUTPUT_FORMAT", 13)))
                return -1;
        } else if (list && len == 9 && !strncmp(p, "AS_NEEDED", 9)) {
            needed = 1;
        } else if (list && !needed) {
            if (*p != '/' || len >= PATH_MAX || n == TCC_LINK_MAX)
                return -1;
            memcpy(files[n], p, len);
            files[n++][len] = '\0';
        }
    }
    return depth == 0 && *p == '\0' && n > 0 ? n : -1;
}

/* lib<name>.so where libtcc finds it: a script's files, or the library
 * itself. Their count, or -1. */
static int tcc_lib_files(const char *name, char files[TCC_LINK_MAX][PATH_MAX])
{
    char so[64], path[PATH_MAX], text[4096];
    snprintf(so, sizeof so, "lib%s.so", name);
    if (!jit_find_in(OPJIT_TCC_LIB_PATHS, so, path, sizeof path))
        return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd < 0 ? -1 : read(fd, text, sizeof text - 1);
    if (fd >= 0)
        close(fd);
    if (got < 4 || got == (ssize_t)sizeof text - 1)
        return -1;
    text[got] = '\0';
    if (!memcmp(text, "\177ELF", 4)) {
        snprintf(files[0], PATH_MAX, "%s", path);
        return 1;
    }
    return strlen(text) == (size_t)got ? tcc_ld_files(text, files) : -1;
}

static void tcc_std_find(void)
{
    tcc_stdlib *t = &tcc_std;
    if (!OPJIT_TCC_CRT_DIR[0] || strchr(OPJIT_TCC_LIB_PATHS, '{') ||
        !jit_find_in(OPJIT_TCC_CRT_DIR, "crti.o", t->crti, sizeof t->crti) ||
        !jit_find_in(OPJIT_TCC_CRT_DIR, "crtn.o", t->crtn, sizeof t->crtn) ||
        !jit_find_in(OPJIT_TCC_LIB_DIR, "libtcc1.a", t->libtcc1, sizeof t->libtcc1))
        return;
    t->nm = tcc_lib_files("m", t->m);
    t->nc = tcc_lib_files("c", t->c);
    t->ok = t->nm > 0 && t->nc > 0;
}

const char *jit_tcc_link_mode(const char *tcc_lib_dir)
{
    if (!tcc_lib_dir || strcmp(tcc_lib_dir, OPJIT_TCC_LIB_DIR))
        return "libtcc";
    pthread_once(&tcc_std_once, tcc_std_find);
    return tcc_std.ok ? "files" : "libtcc";
}

/* What the link's fixed inputs (crti.o, crtn.o, libtcc1.a and the
 * scripts' archives) use and do not define, once per process; which of
 * the scripts' files are shared libraries in m_dso, c_dso. Under libtcc's
 * lock. */
static jit_names fixed_want;
static int fixed_state; /* 0 not yet, 1 read, -1 unreadable */
static int m_dso[TCC_LINK_MAX], c_dso[TCC_LINK_MAX];

static int fixed_read(void)
{
    if (fixed_state)
        return fixed_state;
    int ok = jit_object_undefined(tcc_std.crti, &fixed_want) == 0 &&
             jit_object_undefined(tcc_std.crtn, &fixed_want) == 0 &&
             jit_archive_undefined(tcc_std.libtcc1, &fixed_want) == 0;
    /* A file a script names is an archive or a shared library. */
    for (int i = 0; ok && i < tcc_std.nm; i++)
        if (!(m_dso[i] = !jit_is_archive(tcc_std.m[i])))
            ok = jit_archive_undefined(tcc_std.m[i], &fixed_want) == 0;
    for (int i = 0; ok && i < tcc_std.nc; i++)
        if (!(c_dso[i] = !jit_is_archive(tcc_std.c[i])))
            ok = jit_archive_undefined(tcc_std.c[i], &fixed_want) == 0;
    fixed_state = ok ? 1 : -1;
    return fixed_state;
}

/* lib<name>.so where libtcc's -l finds it: its library paths, then
 * library_dirs. */
static int find_library(const char *name, const char *search, char *out)
{
    char so[256];
    return (size_t)snprintf(so, sizeof so, "lib%s.so", name) < sizeof so &&
           jit_find_in(search, so, out, PATH_MAX);
}

void jit_tcc_link_stubs(jit_tcc_link *k, jit_names *want, const char *dir,
                        const char *const *libs, const char *const *library_dirs)
{
    k->stubbed = 0;
    if (!k->on || fixed_read() < 0 || strlen(dir) >= sizeof k->dir)
        return;
    char search[2 * PATH_MAX];
    size_t n = (size_t)snprintf(search, sizeof search, "%s", OPJIT_TCC_LIB_PATHS);
    for (const char *const *d = library_dirs; d && *d && n < sizeof search; d++)
        n += (size_t)snprintf(search + n, sizeof search - n, ":%s", *d);
    if (n >= sizeof search)
        return;
    int nreal = 0, ok = 1;
    for (int i = 0; ok && i < fixed_want.n; i++)
        ok = jit_names_add(want, fixed_want.v[i], strlen(fixed_want.v[i])) == 0;
    /* In link order: libm's libraries, the other -l, libc's. */
    for (const char *const *l = libs; ok && l && *l; l++) {
        if (!strcmp(*l, "m")) {
            for (int i = 0; i < tcc_std.nm; i++)
                if (m_dso[i] && nreal < JIT_TCC_LINK_LIBS)
                    k->real[nreal++] = tcc_std.m[i];
        } else if (nreal < JIT_TCC_LINK_LIBS - TCC_LINK_MAX &&
                   find_library(*l, search, k->lib[nreal])) {
            k->real[nreal] = k->lib[nreal];
            k->lname[nreal++] = *l;
        } else {
            ok = 0;
        }
    }
    for (int i = 0; ok && i < tcc_std.nc; i++)
        if (c_dso[i] && nreal < JIT_TCC_LINK_LIBS)
            k->real[nreal++] = tcc_std.c[i];
    k->nreal = nreal;
    snprintf(k->dir, sizeof k->dir, "%s", dir);
    if (ok && jit_tcc_stubs_write(dir, k->real, nreal, search, want, &k->written, k->stub) == 0)
        k->stubbed = 1;
    else
        jit_tcc_link_done(k);
}

void jit_tcc_link_done(jit_tcc_link *k)
{
    char path[PATH_MAX];
    for (int i = 0; i < k->written.n; i++)
        if ((size_t)snprintf(path, sizeof path, "%s/%s", k->dir, k->written.v[i]) < sizeof path)
            unlink(path);
    jit_names_free(&k->written);
    k->stubbed = 0;
}

/* The file to link for path: its stub when there is one. */
static const char *link_file(const jit_tcc_link *k, const char *path)
{
    for (int i = 0; k->stubbed && i < k->nreal; i++)
        if (k->real[i] == path)
            return k->stub[i];
    return path;
}

/* tcc_add_file for each of files; -1 at the first that fails. */
static int link_add(const jit_tcc_link *k, struct TCCState *s, const char (*files)[PATH_MAX],
                    int n)
{
    for (int i = 0; i < n; i++)
        if (tcc_add_file(s, link_file(k, files[i])) < 0)
            return -1;
    return 0;
}

void jit_tcc_link_init(jit_tcc_link *k, const char *tcc_lib_dir)
{
    k->on = !strcmp(jit_tcc_link_mode(tcc_lib_dir), "files");
}

void jit_tcc_link_start(jit_tcc_link *k, struct TCCState *s)
{
    if (k->on)
        tcc_set_options(s, "-nostdlib");
    /* Searched before libtcc's own paths (added with the output type):
     * each library a stub needs is found as its stub. */
    if (k->stubbed)
        tcc_add_library_path(s, k->dir);
}

void jit_tcc_link_crt(jit_tcc_link *k, struct TCCState *s)
{
    if (k->on)
        tcc_add_file(s, tcc_std.crti);
}

int jit_tcc_link_library(jit_tcc_link *k, struct TCCState *s, const char *name)
{
    if (k->on && !strcmp(name, "m"))
        return link_add(k, s, tcc_std.m, tcc_std.nm);
    for (int i = 0; k->stubbed && i < k->nreal; i++)
        if (k->lname[i] && !strcmp(k->lname[i], name))
            return tcc_add_file(s, k->stub[i]) < 0 ? -1 : 0;
    return tcc_add_library(s, name) < 0 ? -1 : 0;
}

int jit_tcc_link_runtime(jit_tcc_link *k, struct TCCState *s)
{
    if (!k->on)
        return 0;
    if (link_add(k, s, tcc_std.c, tcc_std.nc) < 0 || tcc_add_file(s, tcc_std.libtcc1) < 0 ||
        tcc_add_file(s, tcc_std.crtn) < 0)
        return -1;
    return 0;
}
