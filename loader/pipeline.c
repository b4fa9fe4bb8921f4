/* loader/pipeline.c - the one way from a source to a compiler's artifact.
 *
 * For one source, one compiler of the table (jit/jit.h) and one of its
 * targets: make the key from the source digest and what the compiler says
 * goes into it, then fetch the entry from the cache or build it there.
 * Every artifact opjit makes (libtcc's host.so, the optimized one, each
 * architecture's device code) comes through pipeline_get.
 *
 * Compilers whose identity is costly to learn (running `cc --version`,
 * loading libnvrtc) have a cheap file id as well. Their artifacts are also
 * reachable through index entries (cache_index_put): one keyed by the
 * compiler's file, so a hit costs neither, and one keyed by no compiler at
 * all, which is how a machine without that compiler uses artifacts warmed
 * elsewhere. With the compiler here, only what it built serves.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "loader/loader_int.h"
#include "opjit_build_config.h"

/* What the scratch directory may hold: cc-version.txt while the
 * optimizing compiler is asked for its version (and opjit_op.h, which
 * older versions kept there). A process killed with it still there leaves
 * it to the next one that makes one (see cache_private_mkdir). */
static const char *const scratch_files[] = {"opjit_op.h", "cc-version.txt", NULL};

/* Where a compile finds opjit_op.h: a copy on disk that is this library's
 * byte for byte (op_header_copy), else the build's own directory (after
 * the source's on the include path), removed before the build ends (so
 * never an artifact), and by the cache's sweep with the directory when
 * the process is killed meanwhile. Not a directory of its own: a mkdir
 * and an rmdir (a tenth of a millisecond or more each, on ext4) per build
 * saved. */

int pipeline_init(pipeline *p, cache *c, const jit_settings *set)
{
    /* Field by field: the two path buffers (9 KiB, pages a fresh process
     * has not touched) are written only up to their strings. */
    p->cache = c;
    p->set.cc_name = set->cc_name;
    p->set.path = set->path;
    memcpy(p->set.cc, set->cc, strnlen(set->cc, sizeof set->cc - 1) + 1);
    p->set.cc[sizeof p->set.cc - 1] = '\0';
    p->set.cc_timeout_ms = set->cc_timeout_ms;
    p->set.cuda_archs = set->cuda_archs;
    p->set.scratch = NULL;
    p->set.tmpdir = set->tmpdir;
    p->set.cpu_level = set->cpu_level;
    p->scratch[0] = '\0';
    p->scratch_lock = -1;
    memset(p->comp, 0, sizeof p->comp);
    return pthread_mutex_init(&p->lock, NULL) ? OPJIT_ENOMEM : OPJIT_OK;
}

void pipeline_cache_config(const settings *s, cache_config *cc)
{
    *cc = (cache_config){
        .dir = s->cache_dir,
        .xdg_cache_home = s->xdg_cache_home,
        .home = s->home,
        .readonly = s->readonly_caches,
        .tmpdir = s->tmpdir,
        .offline = s->offline,
        .disabled = s->no_cache,
        .max_size = s->cache_max_size,
        .remote_url = s->remote_url,
        .remote_key_file = s->remote_key_file,
        .remote_unsigned = s->remote_unsigned,
        .remote_ro = s->remote_ro,
        .remote_connect_timeout_ms = s->remote_connect_ms,
        .remote_timeout_ms = s->remote_timeout_ms,
        .remote_lease_ms = s->remote_lease_ms,
        .remote_backoff_ms = s->remote_backoff_ms,
        .remote_push = s->remote_push,
    };
}

void pipeline_fini(pipeline *p)
{
    for (int i = 0; i < PIPELINE_MAX_COMPILERS; i++) {
        free(p->comp[i].id);
        free(p->comp[i].id_err);
    }
    if (p->scratch[0]) {
        cache_private_rmdir(p->scratch, scratch_files);
        close(p->scratch_lock); /* after: nobody sweeps it under us */
        p->scratch[0] = '\0';
    }
    pthread_mutex_destroy(&p->lock);
}

/* dir/opjit_op.h, the header this library was built with. */
static int write_op_header(const char *dir, char *err, size_t errlen)
{
    char path[PATH_MAX + 32];
    if ((size_t)snprintf(path, sizeof path, "%s/opjit_op.h", dir) >= sizeof path) {
        snprintf(err, errlen, "%s: path too long", dir);
        return OPJIT_EIO;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    int ok = fd >= 0 && write(fd, opjit_op_h_text, sizeof opjit_op_h_text) ==
                            (ssize_t)sizeof opjit_op_h_text;
    int e = errno;
    if (fd >= 0 && close(fd) && ok)
        ok = 0, e = errno;
    if (!ok)
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(e));
    return ok ? OPJIT_OK : OPJIT_EIO;
}

static void remove_op_header(const char *dir)
{
    char path[PATH_MAX + 32];
    if ((size_t)snprintf(path, sizeof path, "%s/opjit_op.h", dir) < sizeof path)
        unlink(path);
}

/* ---- a copy of opjit_op.h already on disk ----------------------------------
 *
 * Where the headers are installed beside this copy of the library (as a
 * wheel and `make install` put them), or where they were at configure
 * time, or in the source tree a build tree's library comes from, there is
 * usually an opjit_op.h that is this library's byte for byte. Builds then
 * search its directory instead of writing the header into their own (a
 * file made and removed per build: 60 to 140 us of a cold load on ext4).
 * Only a copy that nobody but its owner (us or root) can change, file,
 * directory and every directory above (cache_trusted_path), is used. It
 * is read whole once per process; each build then checks that it is
 * still that file, unchanged (inode, size, mtime, ctime), or fails as for
 * a local header changed during the compile. */

static struct {
    pthread_mutex_t lock;
    int state; /* 0: not looked for; 1: dir holds it (st: as read); -1: none */
    char dir[PATH_MAX];
    struct stat st;
} op_header_copy = {PTHREAD_MUTEX_INITIALIZER, 0, "", {0}};

int loader_op_header_copy(const char *dir, struct stat *st)
{
    /* The directories above it too: whoever could rename one could put
     * another header in its place between this check and the compile,
     * and back again before op_header_unchanged looks. */
    char why[PATH_MAX + 64];
    uid_t me = geteuid();
    if (dir[0] != '/' || cache_trusted_path(dir, me, why, sizeof why) != OPJIT_OK)
        return 0;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), fd = -1, same = 0;
    struct stat dst;
    if (dfd < 0)
        return 0;
    if (fstat(dfd, &dst) == 0 && !cache_untrusted(&dst, CACHE_OWNER_TRUSTED, me))
        fd = openat(dfd, "opjit_op.h", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    close(dfd);
    if (fd < 0)
        return 0;
    char *text = NULL;
    if (fstat(fd, st) == 0 && S_ISREG(st->st_mode) &&
        !cache_untrusted(st, CACHE_OWNER_TRUSTED, me) &&
        st->st_size == (off_t)sizeof opjit_op_h_text && (text = malloc(sizeof opjit_op_h_text)))
        same = read(fd, text, sizeof opjit_op_h_text) == (ssize_t)sizeof opjit_op_h_text &&
               !memcmp(text, opjit_op_h_text, sizeof opjit_op_h_text);
    free(text);
    close(fd);
    return same;
}

/* The copy's directory (into dir), looked for once; 0, or -1: none. */
static int op_header_dir(char *dir, size_t n)
{
    pthread_mutex_lock(&op_header_copy.lock);
    if (!op_header_copy.state) {
        char rel[PATH_MAX + 64], near[PATH_MAX], lib[PATH_MAX];
        int shared;
        near[0] = '\0';
        if (loader_library_dir(lib, sizeof lib, &shared) == 0 &&
            (size_t)snprintf(rel, sizeof rel, "%s/%s", lib, shared ? OPJIT_INCLUDEDIR_FROM_LIBDIR
                                                                 : OPJIT_INCLUDEDIR_FROM_BINDIR) <
                sizeof rel &&
            !realpath(rel, near)) /* its name in diagnostics without "/.." */
            near[0] = '\0';
        const char *const where[] = {near, OPJIT_INSTALLED_INCLUDE_DIR, OPJIT_SOURCE_INCLUDE_DIR};
        op_header_copy.state = -1;
        for (size_t i = 0; i < sizeof where / sizeof *where && op_header_copy.state < 0; i++)
            if (where[i][0] && strlen(where[i]) < sizeof op_header_copy.dir &&
                loader_op_header_copy(where[i], &op_header_copy.st)) {
                strcpy(op_header_copy.dir, where[i]);
                op_header_copy.state = 1;
            }
    }
    int found = op_header_copy.state > 0 && strlen(op_header_copy.dir) < n;
    if (found)
        strcpy(dir, op_header_copy.dir);
    pthread_mutex_unlock(&op_header_copy.lock);
    return found ? 0 : -1;
}

int loader_op_header_unchanged(const char *dir, const struct stat *st)
{
    char path[PATH_MAX + 32];
    struct stat now;
    file_sig was = file_sig_of(st), is;
    return (size_t)snprintf(path, sizeof path, "%s/opjit_op.h", dir) < sizeof path &&
           lstat(path, &now) == 0 && (is = file_sig_of(&now), file_sig_eq(&is, &was));
}

/* After a compile that read the copy in dir: 1 when it is still the file
 * read, else 0, and no later build of this process uses it. */
static int op_header_unchanged(const char *dir)
{
    pthread_mutex_lock(&op_header_copy.lock);
    int same = loader_op_header_unchanged(dir, &op_header_copy.st);
    if (!same)
        op_header_copy.state = -1;
    pthread_mutex_unlock(&op_header_copy.lock);
    return same;
}

/* The private directory for the optimizing compiler's version log: made
 * when its identity is first asked, so cache hits never touch /tmp. */
static int scratch_dir(pipeline *p, char *err, size_t errlen)
{
    pthread_mutex_lock(&p->lock);
    int rc = OPJIT_OK;
    if (!p->scratch[0]) {
        const char *tmp = p->set.tmpdir && *p->set.tmpdir ? p->set.tmpdir : "/tmp";
        int e = cache_private_mkdir(tmp, "opjit-", scratch_files, p->scratch, sizeof p->scratch,
                                    &p->scratch_lock) ? errno : 0;
        if (e) {
            p->scratch[0] = '\0';
            snprintf(err, errlen, "cannot create a temporary directory in %s: %s", tmp,
                     strerror(e));
            rc = OPJIT_EIO;
        } else {
            p->set.scratch = p->scratch;
        }
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

static pipeline_compiler *compiler_of(pipeline *p, const jit_compiler *jc)
{
    int i = 0;
    while (jit_compilers[i] && jit_compilers[i] != jc)
        i++;
    return &p->comp[i];
}

/* The compiler's file id, learnt once; NULL when it is not here. */
static const char *file_id(pipeline *p, const jit_compiler *jc)
{
    pipeline_compiler *pc = compiler_of(p, jc);
    pthread_mutex_lock(&p->lock);
    if (!pc->file_known) {
        pc->file_found = jc->file_id(&p->set, pc->file_id, sizeof pc->file_id);
        pc->file_known = 1;
    }
    pthread_mutex_unlock(&p->lock);
    return pc->file_found ? pc->file_id : NULL;
}

/* The compiler's identity, learnt once (a failure is kept too: it would
 * fail the same way for every source). */
static int identity(pipeline *p, const jit_compiler *jc, const char **id, char *err,
                    size_t errlen)
{
    pipeline_compiler *pc = compiler_of(p, jc);
    int rc = jc->file_id ? scratch_dir(p, err, errlen) : OPJIT_OK; /* cc --version's log */
    if (rc)
        return rc;
    pthread_mutex_lock(&p->lock);
    if (!pc->id_known) {
        enum { ID = PATH_MAX + 128, ERR = 1024 };
        char *buf = malloc(ID + ERR); /* learnt once: the heap, not the stack */
        if (buf) {
            buf[0] = buf[ID] = '\0';
            pc->id_rc = jc->identity(&p->set, buf, ID, buf + ID, ERR);
            pc->id = strdup(buf);
            pc->id_err = strdup(buf + ID);
        }
        free(buf);
        pc->id_known = pc->id && pc->id_err; /* else asked again next time */
        if (!pc->id_known) {
            free(pc->id);
            free(pc->id_err);
            pc->id = pc->id_err = NULL;
        }
    }
    rc = pc->id_known ? pc->id_rc : OPJIT_ENOMEM;
    if (rc)
        snprintf(err, errlen, "%s", pc->id_known ? pc->id_err : "out of memory");
    *id = pc->id_known ? pc->id : "";
    pthread_mutex_unlock(&p->lock);
    return rc;
}

/* What keys one artifact: the source, the compiler, its options for this
 * source, the target. */
typedef struct key_parts {
    const source *src;
    const jit_compiler *jc;
    const char *target;
    int link_blas; /* source_uses_blas, asked once */
    char options[1024];
} key_parts;

/* The compile a wants, as far as its key depends on it (no directory or
 * artifact name yet), and the key's parts. */
static jit_job job_of(pipeline *p, const pipeline_get_args *a, const key_parts *k)
{
    return (jit_job){.source_name = a->src->path, .text = a->src->text, .len = a->src->len,
                     .half = a->half, .link_blas = k->link_blas, .target = a->target,
                     .set = &p->set};
}

static void key_parts_of(pipeline *p, const pipeline_get_args *a, key_parts *k)
{
    k->src = a->src;
    k->jc = a->jc;
    k->target = a->target;
    k->link_blas = source_uses_blas(a->src);
    jit_job job = job_of(p, a, k);
    a->jc->options(&job, k->options, sizeof k->options);
}

/* The request of an artifact: by = the compiler's identity for the
 * artifact itself, or, for an index entry, its file id or NULL (no
 * compiler). */
static int make_request(const key_parts *k, const char *by, int index, pipeline_request *r)
{
    cache_keygen *g = source_keygen(k->src);
    if (!g)
        return OPJIT_ENOMEM;
    snprintf(r->tier, sizeof r->tier, "%s%s", k->jc->name, index ? "-index" : "");
    if (by)
        snprintf(r->compiler, sizeof r->compiler, "%s", by);
    else
        snprintf(r->compiler, sizeof r->compiler, "any %s", k->jc->what);
    cache_keygen_add_str(g, "compiler", k->jc->name);
    cache_keygen_add_str(g, index ? "index-by" : "identity", by ? by : "none");
    cache_keygen_add_str(g, "options", k->options);
    cache_keygen_add_str(g, "target", k->target);
    snprintf(r->inputs, sizeof r->inputs, "%scompiler %s\nidentity %s\noptions %s\ntarget %s\n",
             k->src->inputs.text ? k->src->inputs.text : "", k->jc->name, by ? by : "none",
             k->options, k->target);
    r->req = (cache_request){
        .op_name = k->src->stem,
        .source_name = k->src->name,
        .compiler = r->compiler,
        .options = k->options,
        .target = k->target,
        .tier = r->tier,
        .inputs = index ? NULL : r->inputs,
    };
    cache_keygen_finish(g, &r->req.key);
    return OPJIT_OK;
}

typedef struct build_ctx {
    pipeline *p;
    const source *src;
    jit_job job;
    const jit_compiler *jc;
    char *diag;
    size_t diaglen;
} build_ctx;

static int build(void *ud, const char *dir, char *err, size_t errlen)
{
    build_ctx *b = ud;
    char hdr[PATH_MAX];
    int copy = op_header_dir(hdr, sizeof hdr) == 0, rc = OPJIT_OK;
    if (!copy && (rc = write_op_header(dir, err, errlen)) != OPJIT_OK) {
        remove_op_header(dir);
        return rc;
    }
    /* An inline source given no directory has none to search. */
    const char *includes[] = {b->src->dir[0] ? b->src->dir : copy ? hdr : dir, copy ? hdr : dir,
                              NULL};
    b->job.include_dirs = includes;
    b->job.dir = dir;
    rc = b->jc->compile(&b->job, b->diag, b->diaglen);
    b->job.include_dirs = NULL;
    if (!copy)
        remove_op_header(dir);
    /* A header changed while we compiled: the artifact may not be what
     * the key says. Never publish it. */
    if (!rc && !source_unchanged(b->src)) {
        snprintf(b->diag, b->diaglen, "%s: a local header changed during the compile; load "
                 "it again", b->src->path);
        rc = OPJIT_ECOMPILE;
    } else if (!rc && copy && !op_header_unchanged(hdr)) {
        snprintf(b->diag, b->diaglen, "%s: %s/opjit_op.h changed during the compile; load it "
                 "again", b->src->path, hdr);
        rc = OPJIT_ECOMPILE;
    }
    if (rc)
        snprintf(err, errlen, "%.*s", (int)(errlen > 1 ? errlen - 1 : 0),
                 rc == OPJIT_ECOMPILE ? "compile error" : b->diag);
    return rc;
}

/* Through the index entry keyed by the compiler's file (or by none): the
 * key it names, then that entry, probed (never built). One request, 12 KiB
 * on the heap as in get_by_key, made twice: first the index entry's, then
 * the artifact's with the key the index gave (fewer fresh pages than two). */
static int get_by_index(pipeline *p, const key_parts *k, const char *by, pipeline_artifact *out)
{
    pipeline_request *r = malloc(sizeof *r);
    cache_key target;
    char err[256];
    int hit, rc = !r || make_request(k, by, 1, r) ? OPJIT_ENOMEM
                  : cache_index_get(p->cache, &r->req, &target) != OPJIT_OK ? OPJIT_ENOTFOUND
                  : make_request(k, NULL, 0, r)                              ? OPJIT_ENOMEM
                                                                             : OPJIT_OK;
    if (!rc) {
        r->req.key = target;
        if (cache_fetch(p->cache, &r->req, NULL, NULL, &out->entry, &hit, err, sizeof err) !=
            OPJIT_OK)
            rc = OPJIT_ENOTFOUND;
    }
    if (!rc)
        out->hit = cache_entry_origin(out->entry);
    free(r);
    return rc;
}

/* Make a fresh artifact findable without running or loading its compiler,
 * and without one; best effort. */
static void put_index(pipeline *p, const key_parts *k, const char *fid, const cache_key *key)
{
    const char *by[] = {fid, NULL};
    for (int i = fid ? 0 : 1; i < 2; i++) {
        pipeline_request r;
        if (!make_request(k, by[i], 1, &r))
            cache_index_put(p->cache, &r.req, key);
    }
}

/* From the cache by the full key, or built. */
static int get_by_key(pipeline *p, const pipeline_get_args *a, const key_parts *k,
                      const char *id, pipeline_artifact *out, char *diag, size_t diaglen)
{
    /* On the heap: 12 KiB of stack would push the fetch below it onto
     * pages a fresh process has not touched yet. */
    pipeline_request *r = malloc(sizeof *r);
    if (!r || make_request(k, id, 0, r)) {
        free(r);
        snprintf(diag, diaglen, "out of memory");
        return OPJIT_ENOMEM;
    }
    build_ctx b = {
        .p = p,
        .src = a->src,
        .jc = a->jc,
        .job = job_of(p, a, k),
        .diag = diag,
        .diaglen = diaglen,
    };
    char err[1024];
    err[0] = '\0';
    b.job.artifact = out->name;
    int rc = cache_fetch(p->cache, &r->req, a->build ? build : NULL, &b, &out->entry, &out->hit,
                         err, sizeof err);
    if (rc && rc != OPJIT_ECOMPILE)
        snprintf(diag, diaglen, "%s", err[0] ? err : "not in a cache");
    if (!rc)
        out->key = r->req.key;
    free(r);
    return rc;
}

int pipeline_get_host(pipeline *p, const source *s, const jit_compiler *jc, unsigned half,
                      int build, pipeline_artifact *out, char *diag, size_t diaglen)
{
    char targets[256], *save = NULL;
    jc->targets(&p->set, targets, sizeof targets);
    int rc = OPJIT_ENOTFOUND, first = 1;
    for (char *t = strtok_r(targets, ",", &save); t && rc == OPJIT_ENOTFOUND;
         t = strtok_r(NULL, ",", &save), first = 0) {
        pipeline_get_args a = {s, jc, half, t, build && first};
        rc = pipeline_get(p, &a, out, diag, diaglen);
        if (rc == OPJIT_OK) {
            snprintf(out->target, sizeof out->target, "%s", t);
            out->best = first;
        }
    }
    return rc;
}

/* ---- what a background compiler rejected ------------------------------------
 *
 * A background compiler that rejects a source (its exit status: an error
 * of its own, a flag it lacks such as -march=x86-64-v4 before gcc 11) does
 * so again for the same source, compiler and options, and every process
 * loading the source would run it again (seconds of a CPU each). The
 * failure is kept as a note keyed as the artifact's index entry plus the
 * hour it happened in: the loads of that hour skip the compile and say
 * why; the next hour tries once more (what the key cannot see, a system
 * header installed meanwhile, is not held against the source for long). A
 * compile cut short (its time limit, a signal) is not kept. */

#define FAILURE_HOURS_S 3600

/* jc's failure note for s at its best target, this hour: kept (msg), or
 * looked up (*out). The request points into k and targets: used here. */
static int failure_note(pipeline *p, const source *s, const jit_compiler *jc, const char *msg,
                        char **out)
{
    char targets[256], *save = NULL, by[160];
    jc->targets(&p->set, targets, sizeof targets);
    const char *t = strtok_r(targets, ",", &save), *fid = jc->file_id ? file_id(p, jc) : NULL;
    if (!t || !fid)
        return OPJIT_ENOTFOUND;
    pipeline_get_args a = {s, jc, JIT_C, t, 0};
    key_parts k;
    key_parts_of(p, &a, &k);
    snprintf(by, sizeof by, "%s; failed in hour %lld", fid,
             (long long)(time(NULL) / FAILURE_HOURS_S));
    pipeline_request *r = malloc(sizeof *r);
    int rc = !r ? OPJIT_ENOMEM : make_request(&k, by, 1, r);
    if (rc == OPJIT_OK) {
        snprintf(r->tier, sizeof r->tier, "%s-failed", jc->name);
        rc = msg ? cache_note_put(p->cache, &r->req, "error", msg)
                 : cache_note_get(p->cache, &r->req, "error", out);
    }
    free(r);
    return rc;
}

void pipeline_failure_put(pipeline *p, const source *s, const jit_compiler *jc,
                          const char *msg)
{
    failure_note(p, s, jc, msg, NULL);
}

int pipeline_failure_get(pipeline *p, const source *s, const jit_compiler *jc, char **msg)
{
    return failure_note(p, s, jc, NULL, msg);
}

int pipeline_describe(pipeline *p, const pipeline_get_args *a, pipeline_request *r,
                      int *cached, char *note, size_t n)
{
    key_parts k;
    key_parts_of(p, a, &k);
    const char *id = NULL;
    note[0] = '\0';
    int index = identity(p, a->jc, &id, note, n) != OPJIT_OK;
    int rc = make_request(&k, index ? NULL : id, index, r);
    if (rc)
        return rc;
    r->req.inputs = r->inputs; /* an index entry's too: what a machine without it uses */
    cache_entry *e = NULL;
    int hit;
    char err[256];
    *cached = cache_fetch(p->cache, &r->req, NULL, NULL, &e, &hit, err, sizeof err) == OPJIT_OK;
    cache_entry_release(e);
    return OPJIT_OK;
}

int pipeline_get(pipeline *p, const pipeline_get_args *a, pipeline_artifact *out, char *diag,
                 size_t diaglen)
{
    const jit_compiler *jc = a->jc;
    key_parts k;
    key_parts_of(p, a, &k);
    memset(out, 0, sizeof *out);
    jc->artifact(a->target, out->name, sizeof out->name);
    const char *fid = jc->file_id ? file_id(p, jc) : NULL, *id = NULL;
    int rc = jc->file_id ? get_by_index(p, &k, fid, out) : OPJIT_ENOTFOUND;
    if (rc == OPJIT_OK)
        ;
    else if (!a->build)
        snprintf(diag, diaglen, "no %s artifact of %s for %s is in a cache", jc->what,
                 a->src->path, a->target);
    else if ((rc = identity(p, jc, &id, diag, diaglen)) != OPJIT_OK)
        rc = fid && get_by_index(p, &k, NULL, out) == OPJIT_OK ? OPJIT_OK : rc; /* broken here */
    else if ((rc = get_by_key(p, a, &k, id, out, diag, diaglen)) == OPJIT_OK && jc->file_id)
        put_index(p, &k, fid, &out->key);
    if (!rc)
        out->path = cache_entry_path(out->entry, out->name);
    return rc;
}
