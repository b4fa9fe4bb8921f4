/* jit/tcc.c - libtcc: C source text -> shared object.
 *
 * Debian's libtcc 0.9.27 keeps global state behind a semaphore that is not
 * initialised thread-safely, so every use goes through one mutex. We write
 * a shared object and let the loader dlopen it (no RWX pages; the same file
 * is what the cache stores) rather than relocating in memory. */
#include <libtcc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "jit/jit.h"
#include "jit/tcc_defines.h"
#include "jit/tcc_prelude.h"
#include "runtime/settings.h"
#include "opjit.h"
#include "opjit_build_config.h"

static pthread_mutex_t tcc_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct diag_sink {
    jit_diag out;
    int errors;
    int write_failed; /* "could not write": an I/O error, not the source's */
    const char *text; /* to quote the offending line */
    const char *name;
    char build_dir[PATH_MAX]; /* the compiled file's: libtcc puts it before the #line name */
    size_t build_dir_len;
} diag_sink;

/* Line `line` (1-based) of text, or NULL. */
static const char *nth_line(const char *text, long line, size_t *len)
{
    const char *p = text;
    for (long i = 1; i < line && p; i++) {
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    if (!p || !*p)
        return NULL;
    const char *e = strchr(p, '\n');
    *len = e ? (size_t)(e - p) : strlen(p);
    return p;
}

/* msg with the source's name as the job gives it: libtcc reads the text
 * from a copy (tcc_compile_text) and puts the copy's directory before the
 * name a #line directive gives. */
static void sink_append_names(diag_sink *d, const char *msg)
{
    char prefixed[PATH_MAX * 2];
    size_t nl = strlen(d->name), pl;
    if (!d->build_dir_len ||
        (pl = (size_t)snprintf(prefixed, sizeof prefixed, "%s/%s", d->build_dir, d->name)) >=
            sizeof prefixed) {
        jit_diag_put(&d->out, msg, strlen(msg));
        return;
    }
    const char *p = msg, *hit;
    while ((hit = strstr(p, prefixed))) {
        jit_diag_put(&d->out, p, (size_t)(hit - p));
        jit_diag_put(&d->out, d->name, nl);
        p = hit + pl;
    }
    jit_diag_put(&d->out, p, strlen(p));
}

/* tcc reports "name:line: error: msg". Keep it, and quote the line of our
 * source it points at. */
static void on_diag(void *opaque, const char *msg)
{
    diag_sink *d = opaque;
    if (strstr(msg, "could not write"))
        d->write_failed = 1;
    else if (strstr(msg, "error"))
        d->errors++;
    if (d->out.len)
        jit_diag_put(&d->out, "\n", 1);
    size_t start = d->out.len;
    sink_append_names(d, msg);
    msg = d->out.cap ? d->out.buf + start : "";
    size_t nl = strlen(d->name);
    if (!strncmp(msg, d->name, nl) && msg[nl] == ':') {
        long line = strtol(msg + nl + 1, NULL, 10);
        size_t len;
        const char *src = line > 0 ? nth_line(d->text, line, &len) : NULL;
        if (src) {
            char head[32];
            int n = snprintf(head, sizeof head, "\n%5ld | ", line);
            jit_diag_put(&d->out, head, (size_t)n);
            jit_diag_put(&d->out, src, len);
        }
    }
}

/* The source prefixed with the job's prelude and "#line 1 \"name\"" (tcc
 * then reports the source's own name), and that name with a quote,
 * backslash or newline, which would break the directive, made '_' (in
 * diagnostics too). NULL when out of memory. */
static char *with_line_directive(const jit_tcc_job *job, char **name)
{
    size_t n = job->prelude_len + strlen(job->text) + strlen(job->source_name) + 32;
    char *text = malloc(n);
    *name = strdup(job->source_name);
    if (!text || !*name) {
        free(text);
        free(*name);
        *name = NULL;
        return NULL;
    }
    for (char *c = *name; *c; c++)
        if (*c == '"' || *c == '\\' || *c == '\n' || *c == '\r')
            *c = '_';
    if (job->prelude_len)
        memcpy(text, job->prelude, job->prelude_len);
    snprintf(text + job->prelude_len, n - job->prelude_len, "#line 1 \"%s\"\n%s", *name,
             job->text);
    return text;
}

/* Include paths and defines ("NAME=VALUE", NAME may be "F(x)": tcc wants
 * them apart) of job for a state that compiles, and its library paths;
 * for a shared object (type TCC_OUTPUT_DLL) the C library as tcc_link.c
 * hands it over. */
static void tcc_configure(TCCState *s, const jit_tcc_job *job, jit_tcc_link *k, int type,
                          int compiles)
{
    if (job->tcc_lib_dir)
        tcc_set_lib_path(s, job->tcc_lib_dir);
    if (type == TCC_OUTPUT_DLL)
        jit_tcc_link_start(k, s);
    tcc_set_output_type(s, type);
    if (type == TCC_OUTPUT_DLL)
        jit_tcc_link_crt(k, s);
    for (const char *const *p = job->include_dirs; compiles && p && *p; p++)
        tcc_add_include_path(s, *p);
    for (const char *const *p = job->defines; compiles && p && *p; p++) {
        const char *eq = strchr(*p, '=');
        char name[256];
        if (eq && (size_t)(eq - *p) < sizeof name) {
            memcpy(name, *p, (size_t)(eq - *p));
            name[eq - *p] = '\0';
            tcc_define_symbol(s, name, eq + 1);
        } else {
            tcc_define_symbol(s, *p, NULL);
        }
    }
    for (const char *const *p = job->library_dirs; p && *p; p++)
        tcc_add_library_path(s, *p);
}

/* dir/name into path (n bytes), dir being out_path's directory. */
static int build_path(const char *out_path, const char *name, char *path, size_t n)
{
    const char *slash = strrchr(out_path, '/');
    int dlen = slash ? (int)(slash - out_path) : 1;
    return (size_t)snprintf(path, n, "%.*s/%s", dlen, slash ? out_path : ".", name) < n ? 0 : -1;
}

/* An anonymous file in memory (memfd) and the path libtcc opens it by,
 * /proc/self/fd/N: the build's copy of the text and its object then make
 * and remove no file on the cache's file system (about 60 us each on
 * ext4, 2% of a cold load apiece). -1 where there is no memfd or no /proc:
 * the caller writes a file in the build directory instead. */
static int mem_file(const char *name, char *path, size_t n)
{
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    snprintf(path, n, "/proc/self/fd/%d", fd);
    int again = open(path, O_RDWR | O_CLOEXEC); /* as libtcc will: a policy may refuse it */
    if (again < 0) {
        close(fd);
        return -1;
    }
    close(again);
    return fd;
}

/* A scratch file of mem_file's done with: its memfd closed, or the file
 * at path (the fallback) removed: the build directory holds the artifact
 * only. */
static void drop_scratch(const char *path, int mfd)
{
    if (mfd >= 0)
        close(mfd);
    else
        unlink(path);
}

/* All of buf to fd: 0, or the errno that stopped it (a write cut short,
 * by a file-size limit say, is tried again to learn why). */
static int write_whole(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t w = write(fd, buf, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? errno : EIO;
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Where libtcc reads the text from: a file beside the output, in the
 * build's private directory, unless mem_file gives one in memory.
 * Compiled as a string, the text would have no directory of its own and
 * libtcc would look for its "quoted" headers in the process's working
 * directory first: a same-named header there would be compiled instead of
 * the one hashed into the key. /proc/self/fd/ holds no names but numbers.
 * Returns the memfd, -1 for a file (path), or -2 on an error (diag). */
static int write_build_source(const char *out_path, const char *text, char *path, size_t n,
                              char *diag, size_t diaglen)
{
    size_t len = strlen(text);
    int mfd = mem_file("opjit-source", path, n);
    if (mfd >= 0 && write_whole(mfd, text, len) == 0)
        return mfd;
    if (mfd >= 0)
        close(mfd);
    if (build_path(out_path, ".opjit-source.c", path, n) < 0) {
        snprintf(diag, diaglen, "libtcc: %s: path too long", out_path);
        return -2;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST && unlink(path) == 0) /* left by a crashed build */
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    int e = fd < 0 ? errno : write_whole(fd, text, len), ok = !e;
    if (fd >= 0 && close(fd) && ok)
        ok = 0, e = errno;
    if (!ok) {
        if (fd >= 0)
            unlink(path);
        snprintf(diag, diaglen, "libtcc: cannot write %s: %s", path, strerror(e));
        return -2;
    }
    return -1;
}

/* The text compiled into s (configured); d learns the copy's directory. */
static int tcc_compile_text(TCCState *s, const jit_tcc_job *job, const char *text,
                            diag_sink *d, char *diag, size_t diaglen)
{
    char src[PATH_MAX];
    int mfd = write_build_source(job->out_path, text, src, sizeof src, diag, diaglen);
    if (mfd == -2)
        return OPJIT_EIO;
    d->build_dir_len = (size_t)(strrchr(src, '/') - src);
    memcpy(d->build_dir, src, d->build_dir_len);
    d->build_dir[d->build_dir_len] = '\0';
    int bad = tcc_add_file(s, src) < 0;
    drop_scratch(src, mfd);
    return bad || d->errors ? OPJIT_ECOMPILE : OPJIT_OK;
}

/* What s has compiled, linked with the libraries and written. */
static int tcc_link_out(TCCState *s, const jit_tcc_job *job, diag_sink *d, jit_tcc_link *k,
                        char *diag, size_t diaglen)
{
    for (const char *const *p = job->libraries; p && *p; p++)
        if (jit_tcc_link_library(k, s, *p) < 0) {
            jit_diag_put(&d->out, "\nlibtcc: cannot find library -l", 31);
            jit_diag_put(&d->out, *p, strlen(*p));
            return OPJIT_ECOMPILE;
        }
    /* What libtcc's own runtime step would add: libc, libtcc1.a, crtn.o. */
    if (jit_tcc_link_runtime(k, s) < 0) {
        snprintf(diag, diaglen, "libtcc: cannot add the C library's files");
        return OPJIT_EIO;
    }
    if (tcc_output_file(s, job->out_path) < 0) {
        /* tcc says why (an undefined symbol, or the file) through on_diag. */
        if (!d->out.len)
            snprintf(diag, diaglen, "libtcc: cannot write %s", job->out_path);
        return d->errors || !d->write_failed ? OPJIT_ECOMPILE : OPJIT_EIO;
    }
    /* libtcc does not check its writes (the cache checks that every byte
     * is there) and writes no PT_GNU_STACK: add it. */
    char why[PATH_MAX + 128];
    if (jit_elf_stack_noexec(job->out_path, why, sizeof why)) {
        snprintf(diag, diaglen, "libtcc: %s", why);
        return OPJIT_EIO;
    }
    return OPJIT_OK;
}

/* A fresh libtcc state reporting to d; NULL (and diag says so) when none. */
static TCCState *tcc_state(diag_sink *d, char *diag, size_t diaglen)
{
    TCCState *s = tcc_new();
    if (s)
        tcc_set_error_func(s, d, on_diag);
    else
        snprintf(diag, diaglen, "libtcc: tcc_new failed");
    return s;
}

/* Compile and link in one state: libtcc's own link. */
static int tcc_build_one(const jit_tcc_job *job, const char *text, diag_sink *d,
                         jit_tcc_link *k, char *diag, size_t diaglen)
{
    TCCState *s = tcc_state(d, diag, diaglen);
    if (!s)
        return OPJIT_ENOMEM;
    tcc_configure(s, job, k, TCC_OUTPUT_DLL, 1);
    int rc = tcc_compile_text(s, job, text, d, diag, diaglen);
    if (!rc)
        rc = tcc_link_out(s, job, d, k, diag, diaglen);
    tcc_delete(s);
    return rc;
}

/* Compile to an object, then link it with the files tcc_link.c hands over
 * (the shared libraries as stubs when they can be). */
static int tcc_build_two(const jit_tcc_job *job, const char *text, diag_sink *d,
                         jit_tcc_link *k, char *diag, size_t diaglen)
{
    char obj[PATH_MAX];
    int mfd = mem_file("opjit-object", obj, sizeof obj);
    if (mfd < 0 && build_path(job->out_path, ".opjit-op.o", obj, sizeof obj) < 0) {
        snprintf(diag, diaglen, "libtcc: %s: path too long", job->out_path);
        return OPJIT_EIO;
    }
    TCCState *s = tcc_state(d, diag, diaglen);
    if (!s) {
        if (mfd >= 0)
            close(mfd);
        return OPJIT_ENOMEM;
    }
    tcc_configure(s, job, k, TCC_OUTPUT_OBJ, 1);
    int rc = tcc_compile_text(s, job, text, d, diag, diaglen);
    if (!rc && tcc_output_file(s, obj) < 0)
        rc = d->write_failed || !d->errors ? OPJIT_EIO : OPJIT_ECOMPILE;
    if (rc == OPJIT_EIO && !d->out.len && diaglen && !diag[0])
        snprintf(diag, diaglen, "libtcc: cannot write %s", obj);
    tcc_delete(s);
    if (rc) {
        drop_scratch(obj, mfd);
        return rc;
    }
    /* libtcc does not check its writes: an object cut short by a full
     * disk or a file-size limit is not handed back to it. */
    jit_names undefined = {0};
    if (jit_object_undefined(obj, &undefined) < 0) {
        jit_names_free(&undefined);
        drop_scratch(obj, mfd);
        snprintf(diag, diaglen, "libtcc: the op's object was not written whole (disk full or "
                 "a file-size limit?)");
        return OPJIT_EIO;
    }
    char dir[PATH_MAX]; /* the build's: the stubs go there */
    if (build_path(job->out_path, "", dir, sizeof dir) == 0) {
        dir[strlen(dir) - 1] = '\0';
        jit_tcc_link_stubs(k, &undefined, dir, job->libraries, job->library_dirs);
    }
    jit_names_free(&undefined);
    s = tcc_state(d, diag, diaglen);
    rc = OPJIT_ENOMEM;
    if (s) {
        tcc_configure(s, job, k, TCC_OUTPUT_DLL, 0); /* links only */
        tcc_set_options(s, "-xb"); /* an object: /proc/self/fd/N has no ".o" to say so */
        int bad = tcc_add_file(s, obj) < 0;
        tcc_set_options(s, "-xn"); /* the rest by their names again */
        rc = bad ? OPJIT_ECOMPILE : tcc_link_out(s, job, d, k, diag, diaglen);
        tcc_delete(s);
    }
    jit_tcc_link_done(k);
    drop_scratch(obj, mfd);
    return rc;
}

int jit_tcc_compile(const jit_tcc_job *job, char *diag, size_t diaglen)
{
    diag_sink d = {{diag, 0, diaglen}, 0, 0, job->text, job->source_name, "", 0};
    if (diaglen)
        diag[0] = '\0';
    char *name = NULL, *text = with_line_directive(job, &name);
    jit_tcc_link *k = calloc(1, sizeof *k);
    if (!text || !k) {
        free(text);
        free(name);
        free(k);
        snprintf(diag, diaglen, "out of memory");
        return OPJIT_ENOMEM;
    }
    d.name = name;
    pthread_mutex_lock(&tcc_lock);
    jit_tcc_link_init(k, job->tcc_lib_dir);
    int rc = k->on ? tcc_build_two(job, text, &d, k, diag, diaglen)
                   : tcc_build_one(job, text, &d, k, diag, diaglen);
    pthread_mutex_unlock(&tcc_lock);
    free(k);
    free(text);
    if (rc == OPJIT_ECOMPILE && !d.out.len)
        snprintf(diag, diaglen, "%s: compile failed", job->source_name);
    free(name);
    return rc;
}

void jit_tcc_fork_prepare(void) { pthread_mutex_lock(&tcc_lock); }
void jit_tcc_fork_done(void) { pthread_mutex_unlock(&tcc_lock); }

/* ---- libtcc in the table of compilers --------------------------------------- */

/* The defines every op gets; the host half of a .cu gets cu_host_defines. */
static const char *const tcc_defines[] = {JIT_TCC_DEFINES, NULL};

/* The host half of a .cu under libtcc: what cudnn.h / cuda.h ask of an
 * unknown compiler (crt/host_defines.h), plus the defines every op gets. */
static const char *const cu_host_defines[] = {
    JIT_TCC_DEFINES,
    "OPJIT_CUDA_HOST",
    "__align__(n)=__attribute__((aligned(n)))",
    "CUDARTAPI=",
    "CUDARTAPI_CDECL=",
    "__location__(a)=",
    NULL,
};

/* The CUDA toolkit's include directory, found once per process. */
static char toolkit_inc[PATH_MAX];
static pthread_once_t toolkit_inc_once = PTHREAD_ONCE_INIT;
static void find_toolkit_inc(void) { jit_cuda_include_dir(toolkit_inc, sizeof toolkit_inc); }

static const char *cu_toolkit_include(void)
{
    pthread_once(&toolkit_inc_once, find_toolkit_inc);
    return toolkit_inc[0] ? toolkit_inc : NULL;
}

/* cuDNN's headers when the toolkit's include directory lacks them, as where
 * pip installs cuDNN apart from the toolkit: the include directory beside
 * the library $OPJIT_CUDNN_LIBRARY names (.../lib/libcudnn.so.9 ->
 * .../include/cudnn.h). Found once per process. */
static char cudnn_inc[PATH_MAX];
static pthread_once_t cudnn_inc_once = PTHREAD_ONCE_INIT;
static void find_cudnn_inc(void)
{
    char probe[PATH_MAX + 32], inc[PATH_MAX];
    const char *tk = cu_toolkit_include(), *lib = settings_libs_get()->cudnn;
    struct stat st;
    if (tk && (snprintf(probe, sizeof probe, "%s/cudnn.h", tk), stat(probe, &st) == 0))
        return;
    if (!lib || !*lib || strlen(lib) >= sizeof inc)
        return;
    memcpy(inc, lib, strlen(lib) + 1);
    for (int up = 0; up < 2; up++) { /* drop the file, then lib/ */
        char *slash = strrchr(inc, '/');
        if (!slash)
            return;
        *slash = '\0';
    }
    if (strlen(inc) + sizeof "/include" > sizeof inc)
        return;
    strcat(inc, "/include");
    snprintf(probe, sizeof probe, "%s/cudnn.h", inc);
    if (stat(probe, &st) == 0 && S_ISREG(st.st_mode))
        memcpy(cudnn_inc, inc, sizeof inc);
}

static const char *cu_cudnn_include(void)
{
    pthread_once(&cudnn_inc_once, find_cudnn_inc);
    return cudnn_inc[0] ? cudnn_inc : NULL;
}

/* CUDA_VERSION's value in text (a line "#define CUDA_VERSION 13000"
 * whose value ends before the text does, unless at_end); 1 when found. */
static int cu_version_in(const char *text, int at_end, char *version, size_t n)
{
    static const char def[] = "#define CUDA_VERSION";
    for (const char *p = text; (p = strstr(p, def)); p += sizeof def - 1) {
        const char *v = p + sizeof def - 1;
        if ((p != text && p[-1] != '\n') || (*v != ' ' && *v != '\t'))
            continue;
        v += strspn(v, " \t");
        size_t len = strcspn(v, " \t\r\n");
        if (len && (v[len] || at_end)) {
            snprintf(version, n, "%.*s", (int)(len < 63 ? len : 63), v);
            return 1;
        }
    }
    return 0;
}

/* CUDA_VERSION from cuda.h's first 256 KiB, read 4 KiB at a time until
 * it is found (some 14 KiB in, in CUDA 13): "unknown" when not. */
static void cu_version_of(const char *path, char *version, size_t n)
{
    enum { CHUNK = 4096, KEEP = 128, LIMIT = 256 << 10 }; /* a page of stack, not four */
    char buf[KEEP + CHUNK + 1];
    size_t have = 0, total = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    snprintf(version, n, "unknown");
    while (fd >= 0 && total < LIMIT) {
        ssize_t r = read(fd, buf + have, CHUNK);
        buf[r > 0 ? have + (size_t)r : have] = '\0';
        if (r <= 0) {
            cu_version_in(buf, 1, version, n);
            break;
        }
        total += (size_t)r;
        have += (size_t)r;
        if (cu_version_in(buf, 0, version, n))
            break;
        /* Keep the tail: a define cut by the chunk's end is whole next time. */
        size_t keep = have < KEEP ? have : KEEP;
        memmove(buf, buf + have - keep, keep);
        have = keep;
    }
    if (fd >= 0)
        close(fd);
}

/* XXH3-64 of the first `limit` bytes of path, read a page at a time (no
 * 64 KiB buffer: the heap would grow and shrink around it); 0 when it
 * cannot be read. */
static unsigned long long hash_head(const char *path, size_t limit)
{
    char buf[4096];
    XXH3_state_t *st = XXH3_createState();
    int fd = st ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    unsigned long long h = 0;
    size_t got = 0;
    if (fd >= 0) {
        XXH3_64bits_reset(st);
        while (got < limit) {
            size_t want = limit - got < sizeof buf ? limit - got : sizeof buf;
            ssize_t r = read(fd, buf, want);
            if (r <= 0)
                break;
            XXH3_64bits_update(st, buf, (size_t)r);
            got += (size_t)r;
        }
        h = XXH3_64bits_digest(st);
        close(fd);
    }
    XXH3_freeState(st);
    return h;
}

/* The toolkit headers a host half may include, by version: CUDA_VERSION
 * from cuda.h and a hash of cudnn_version.h. They belong to the toolkit
 * found once per process, so they are read once too, not at every load
 * of a .cu. */
static char cu_versions[256];
static pthread_once_t cu_versions_once = PTHREAD_ONCE_INIT;

static void cu_versions_find(void)
{
    const char *inc = cu_toolkit_include(), *dnn = cu_cudnn_include();
    if (!inc) {
        snprintf(cu_versions, sizeof cu_versions, "cuda-toolkit=none");
        return;
    }
    char p[PATH_MAX + 32], version[64];
    snprintf(p, sizeof p, "%s/cuda.h", inc);
    cu_version_of(p, version, sizeof version);
    snprintf(p, sizeof p, "%s/cudnn_version.h", dnn ? dnn : inc);
    unsigned long long dnn_hash = hash_head(p, 65536);
    snprintf(cu_versions, sizeof cu_versions, "cuda-version=%s cudnn_version.h=%016llx", version,
             dnn_hash);
}

static void cu_host_versions(char *out, size_t n)
{
    pthread_once(&cu_versions_once, cu_versions_find);
    snprintf(out, n, "%s", cu_versions);
}

static int tcc_identity(const jit_settings *set, char *out, size_t n, char *err, size_t errlen)
{
    (void)set, (void)err, (void)errlen;
    snprintf(out, n, "%s", OPJIT_TCC_IDENTITY);
    return OPJIT_OK;
}

static const char *const *tcc_defines_of(const jit_job *job)
{
    return job->half == JIT_CU_HOST ? cu_host_defines : tcc_defines;
}

/* What tcc_compile passes, as flags: the defines, libm and maybe OpenBLAS,
 * and for a .cu host half the versions of the CUDA headers it includes. */
static void tcc_options(const jit_job *job, char *out, size_t n)
{
    size_t k = jit_join(out, n, 0, "", (const char *const[]){"-shared", NULL});
    k = jit_join(out, n, k, "-D", tcc_defines_of(job));
    k += (size_t)snprintf(out + k, n - k, " -lm link-blas=%s", job->link_blas ? "yes" : "no");
    if (job->half == JIT_CU_HOST && k < n - 1) {
        out[k++] = ' ';
        cu_host_versions(out + k, n - k);
    }
}

static void tcc_targets(const jit_settings *set, char *out, size_t n)
{
    (void)set;
    snprintf(out, n, "%s", jit_host_target());
}

static int tcc_compile(const jit_job *job, char *diag, size_t n)
{
    char out[PATH_MAX + 64], libdir[PATH_MAX];
    const char *includes[8];
    int ni = jit_host_includes(job, includes, 6);
    if (job->half == JIT_CU_HOST) { /* cuda.h, cudnn.h */
        if (cu_toolkit_include())
            includes[ni++] = cu_toolkit_include();
        if (cu_cudnn_include())
            includes[ni++] = cu_cudnn_include();
    }
    includes[ni] = NULL;
    const char *libs[] = {"m", job->link_blas ? "openblas" : NULL, NULL};
    jit_blas_dir(libdir, sizeof libdir);
    const char *libdirs[] = {libdir, NULL};
    snprintf(out, sizeof out, "%s/%s", job->dir, job->artifact);
    jit_tcc_job tj = {
        .source_name = job->source_name,
        .text = job->text,
        .include_dirs = includes,
        .defines = tcc_defines_of(job),
        .libraries = libs,
        .library_dirs = libdirs,
        .tcc_lib_dir = OPJIT_TCC_LIB_DIR,
        .out_path = out,
    };
    /* A .c op's include of opjit_op.h, preprocessed at build time under
     * these defines (the last include directory holds the header). */
    if (job->half == JIT_C && job->include_dirs && job->include_dirs[0]) {
        int nd = 0;
        while (job->include_dirs[nd])
            nd++;
        tj.prelude = jit_tcc_prelude(job->text, job->include_dirs, job->include_dirs[nd - 1],
                                     &tj.prelude_len);
    }
    return jit_tcc_compile(&tj, diag, n);
}

const jit_compiler jit_tcc = {
    .name = "tcc",
    .what = "libtcc",
    .halves = JIT_C | JIT_CU_HOST,
    .background = 0,
    .file_id = NULL, /* linked in: its identity costs nothing */
    .identity = tcc_identity,
    .options = tcc_options,
    .targets = tcc_targets,
    .artifact = jit_host_artifact,
    .compile = tcc_compile,
    .fork_prepare = jit_tcc_fork_prepare,
    .fork_done = jit_tcc_fork_done,
};
