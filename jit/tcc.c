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
#include <fcntl.h>

#include "jit/jit.h"
#include "opjit.h"

static pthread_mutex_t tcc_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct diag_sink {
    char *buf;
    size_t len, cap;
    int errors;
    int write_failed; /* "could not write": an I/O error, not the source's */
    const char *text; /* to quote the offending line */
    const char *name;
} diag_sink;

static void sink_append(diag_sink *d, const char *s, size_t n)
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

/* tcc reports "name:line: error: msg". Keep it, and quote the line of our
 * source it points at. */
static void on_diag(void *opaque, const char *msg)
{
    diag_sink *d = opaque;
    if (strstr(msg, "could not write"))
        d->write_failed = 1;
    else if (strstr(msg, "error"))
        d->errors++;
    if (d->len)
        sink_append(d, "\n", 1);
    sink_append(d, msg, strlen(msg));
    size_t nl = strlen(d->name);
    if (!strncmp(msg, d->name, nl) && msg[nl] == ':') {
        long line = strtol(msg + nl + 1, NULL, 10);
        size_t len;
        const char *src = line > 0 ? nth_line(d->text, line, &len) : NULL;
        if (src) {
            char head[32];
            int n = snprintf(head, sizeof head, "\n%5ld | ", line);
            sink_append(d, head, (size_t)n);
            sink_append(d, src, len);
        }
    }
}

/* libtcc does not check its writes: a file cut short by a full disk or a
 * file-size limit must at least start as ELF (the cache checks the rest). */
static int jit_output_looks_elf(const char *path)
{
    unsigned char head[4];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int ok = fd >= 0 && read(fd, head, sizeof head) == (ssize_t)sizeof head &&
             !memcmp(head, "\177ELF", 4);
    if (fd >= 0)
        close(fd);
    return ok;
}

int jit_tcc_compile(const jit_tcc_job *job, char *diag, size_t diaglen)
{
    diag_sink d = {diag, 0, diaglen, 0, 0, job->text, job->source_name};
    if (diaglen)
        diag[0] = '\0';
    /* "#line" makes tcc report the source's own name in diagnostics. */
    size_t n = strlen(job->text) + strlen(job->source_name) + 32;
    char *text = malloc(n);
    if (!text) {
        snprintf(diag, diaglen, "out of memory");
        return OPJIT_ENOMEM;
    }
    /* A name with a quote, backslash or newline would break the directive:
     * those characters become '_' (in diagnostics too). */
    char *name = strdup(job->source_name);
    if (!name) {
        free(text);
        snprintf(diag, diaglen, "out of memory");
        return OPJIT_ENOMEM;
    }
    for (char *c = name; *c; c++)
        if (*c == '"' || *c == '\\' || *c == '\n' || *c == '\r')
            *c = '_';
    d.name = name;
    snprintf(text, n, "#line 1 \"%s\"\n%s", name, job->text);

    pthread_mutex_lock(&tcc_lock);
    int rc = OPJIT_OK;
    TCCState *s = tcc_new();
    if (!s) {
        rc = OPJIT_ENOMEM;
        snprintf(diag, diaglen, "libtcc: tcc_new failed");
        goto out;
    }
    tcc_set_error_func(s, &d, on_diag);
    if (job->tcc_lib_dir)
        tcc_set_lib_path(s, job->tcc_lib_dir);
    tcc_set_output_type(s, TCC_OUTPUT_DLL);
    for (const char *const *p = job->include_dirs; p && *p; p++)
        tcc_add_include_path(s, *p);
    for (const char *const *p = job->defines; p && *p; p++) {
        /* "NAME=VALUE" (NAME may be "F(x)"): tcc wants them apart. */
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
    if (tcc_compile_string(s, text) < 0 || d.errors) {
        rc = OPJIT_ECOMPILE;
        goto out;
    }
    for (const char *const *p = job->libraries; p && *p; p++)
        if (tcc_add_library(s, *p) < 0) {
            rc = OPJIT_ECOMPILE;
            sink_append(&d, "\nlibtcc: cannot find library -l", 31);
            sink_append(&d, *p, strlen(*p));
            goto out;
        }
    if (tcc_output_file(s, job->out_path) < 0) {
        /* tcc says why (an undefined symbol, or the file) through on_diag. */
        rc = d.errors || !d.write_failed ? OPJIT_ECOMPILE : OPJIT_EIO;
        if (!d.len)
            snprintf(diag, diaglen, "libtcc: cannot write %s", job->out_path);
        goto out;
    }
    if (!jit_output_looks_elf(job->out_path)) {
        rc = OPJIT_EIO;
        snprintf(diag, diaglen, "libtcc: %s was not written whole (disk full or a file-size "
                 "limit?)", job->out_path);
    }
out:
    if (s)
        tcc_delete(s);
    pthread_mutex_unlock(&tcc_lock);
    free(text);
    if (rc == OPJIT_ECOMPILE && !d.len)
        snprintf(diag, diaglen, "%s: compile failed", job->source_name);
    free(name);
    return rc;
}

void jit_tcc_fork_prepare(void) { pthread_mutex_lock(&tcc_lock); }
void jit_tcc_fork_done(void) { pthread_mutex_unlock(&tcc_lock); }
