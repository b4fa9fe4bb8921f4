/*
 * tools/cmd_load.c - `opjit load`: compile (or fetch from the cache) and
 * register source files, printing what each registered and the timings.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

static const char load_help[] =
    "usage: opjit load [options] FILE...\n"
    "\n"
    "Compile (or fetch from the cache) and register each operator source FILE,\n"
    "then print the operators it registered and how long each step took:\n"
    "hashing the cache key, compiling (0 on a cache hit), loading.\n"
    "A FILE that fails is reported on stderr and the rest are still loaded;\n"
    "the exit status is then 1.\n"
    "\n"
    "The optimizing compile of a C source runs in a helper process that\n"
    "outlives this one, so the next process finds optimized code; this one\n"
    "does not wait for it unless asked.\n"
    "\n"
    "options:\n"
    "  --wait               wait for the optimizing compiles to finish (their\n"
    "                       failures are warnings; the exit status is the loads')\n";

typedef struct op_vec {
    const opjit_op **v;
    size_t n, cap;
} op_vec;

static int collect_op(void *ud, const opjit_op *op)
{
    op_vec *ops = ud;
    if (ops->n == ops->cap) {
        size_t cap = ops->cap ? ops->cap * 2 : 16;
        const opjit_op **v = realloc(ops->v, cap * sizeof *v);
        if (!v)
            return 1;
        ops->v = v;
        ops->cap = cap;
    }
    ops->v[ops->n++] = op;
    return 0;
}

/* The ops whose kernels come from the source (src, as loaded; file, as
 * given), with their devices; "(registered no operator)" when none. */
static void print_ops_of(opjit_runtime *rt, const opjit_op *op, const char *src,
                         const char *file)
{
    op_vec ops = {0};
    int shown = 0;
    opjit_list(rt, collect_op, &ops);
    for (size_t i = 0; i < ops.n; i++) {
        opjit_op_info oi = {.size = sizeof oi};
        if (opjit_op_info_get(rt, ops.v[i], &oi) != OPJIT_OK)
            continue;
        char devs[64] = "";
        size_t n = 0;
        for (int d = 0; d < OPJIT_DEVICE_COUNT; d++)
            if (oi.source[d] && (cli_same_file(oi.source[d], src) ||
                                 cli_same_file(oi.source[d], file)))
                n += (size_t)snprintf(devs + n, sizeof devs - n, "%s%s", n ? ", " : "",
                                      opjit_device_name(d) ? opjit_device_name(d) : "?");
        if (n == 0 && ops.v[i] != op)
            continue;
        printf("    %s  [%s]\n", oi.schema ? oi.schema : oi.name, devs);
        shown++;
    }
    if (!shown)
        printf("    (registered no operator)\n");
    free(ops.v);
}

/* Load one file and report it. 0, or 1 when it failed (reported). */
static int load_one(opjit_runtime *rt, const char *file)
{
    opjit_op *op = NULL;
    opjit_load_info info = {.size = sizeof info};
    if (opjit_load_file(rt, file, &op, &info) != OPJIT_OK) {
        cli_rt_error(rt, file);
        return 1;
    }
    const char *src = info.source[0] ? info.source : file;
    printf("%s: %s%s%s%s\n", src,
           !info.cache_hit                  ? "compiled (cache miss)"
           : !strcmp(info.origin, "remote") ? "remote cache hit"
                                            : "cache hit",
           info.tier[0] ? " [" : "", info.tier[0] ? info.tier : "", info.tier[0] ? "]" : "");
    printf("    key %.2f ms, compile %.2f ms, load %.2f ms, total %.2f ms\n", info.key_ms,
           info.compile_ms, info.load_ms, info.total_ms);
    print_ops_of(rt, op, src, file);
    return 0;
}

/* The FILE arguments into files; CLI_EXIT_OK, or the exit status to end
 * with (help printed, a usage error). */
static int parse_load_args(int argc, char **argv, cli_strs *files, int *done, int *wait)
{
    int only_files = 0;
    *done = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!only_files && a[0] == '-' && a[1] != '\0') {
            if (strcmp(a, "--") == 0) {
                only_files = 1;
                continue;
            }
            if (strcmp(a, "--wait") == 0) {
                *wait = 1;
                continue;
            }
            if (cli_is_help(a)) {
                printf("%s%s", load_help, cli_common_help);
                *done = 1;
                return CLI_EXIT_OK;
            }
            int r = cli_common_opt(argc, argv, &i);
            if (r == 1)
                continue;
            return r < 0 ? CLI_EXIT_USAGE : cli_usage_error("load", "unknown option '%s'", a);
        }
        if (cli_strs_add(files, a) != 0) {
            fprintf(stderr, "opjit: out of memory\n");
            return CLI_EXIT_FAIL;
        }
    }
    return files->n ? CLI_EXIT_OK : cli_usage_error("load", "no source file given");
}

int cmd_load(int argc, char **argv)
{
    cli_strs files = {0};
    opjit_runtime *rt = NULL;
    int done, fail = 0, wait = 0;
    int rc = parse_load_args(argc, argv, &files, &done, &wait);
    if (rc != CLI_EXIT_OK || done)
        goto out;
    if ((rc = cli_create(&rt)) != CLI_EXIT_OK)
        goto out;
    for (int k = 0; k < files.n; k++)
        fail |= load_one(rt, files.v[k]);
    if (wait)
        opjit_wait(rt); /* a failure was logged as a warning */
    rc = fail ? CLI_EXIT_FAIL : CLI_EXIT_OK;
out:
    opjit_destroy(rt);
    cli_strs_free(&files);
    return rc;
}
