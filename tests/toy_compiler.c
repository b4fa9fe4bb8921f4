/* tests/toy_compiler.c - a toy compiler for the table (jit/jit.h): libtcc
 * with OPJIT_TOY defined, under its own name and key. Built into the
 * library only by a test build (cmake -DOPJIT_EXTRA_COMPILER=
 * tests/toy_compiler.c:jit_toy), to show that a compiler is one file and
 * one line of jit/compilers.c: nothing else of the library names it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/jit.h"
#include "opjit.h"

static const char toy_define[] = "#define OPJIT_TOY 1\n";

static int toy_identity(const jit_settings *set, char *out, size_t n, char *err, size_t errlen)
{
    char tcc[512];
    int rc = jit_tcc.identity(set, tcc, sizeof tcc, err, errlen);
    if (!rc)
        snprintf(out, n, "toy 1 over %s", tcc);
    return rc;
}

static void toy_options(const jit_job *job, char *out, size_t n)
{
    char tcc[2048];
    jit_tcc.options(job, tcc, sizeof tcc);
    snprintf(out, n, "-DOPJIT_TOY %s", tcc);
}

static void toy_targets(const jit_settings *set, char *out, size_t n)
{
    (void)set;
    snprintf(out, n, "%s", jit_host_target());
}

/* libtcc compiles the text with the define in front. */
static int toy_compile(const jit_job *job, char *diag, size_t n)
{
    size_t head = sizeof toy_define - 1;
    char *text = malloc(head + job->len + 1);
    if (!text) {
        snprintf(diag, n, "out of memory");
        return OPJIT_ENOMEM;
    }
    memcpy(text, toy_define, head);
    memcpy(text + head, job->text, job->len);
    text[head + job->len] = '\0';
    jit_job mine = *job;
    mine.text = text;
    mine.len = head + job->len;
    int rc = jit_tcc.compile(&mine, diag, n);
    free(text);
    return rc;
}

const jit_compiler jit_toy = {
    .name = "toy",
    .what = "the toy compiler",
    .halves = JIT_C,
    .background = 0,
    .identity = toy_identity,
    .options = toy_options,
    .targets = toy_targets,
    .artifact = jit_host_artifact,
    .compile = toy_compile,
};
