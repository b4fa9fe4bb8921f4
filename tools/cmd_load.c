/*
 * tools/cmd_load.c - `opjit load`: compile (or fetch from the cache) and
 * register source files, printing what each registered and the timings.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/cli.h"

static const char load_help[] =
    "usage: opjit load [options] OP|FILE...\n"
    "\n"
    "Compile (or fetch from the cache) and register each operator source FILE,\n"
    "or the sources of op OP (a name on the search path, as 'opjit call' takes\n"
    "it: each of its sources usable here), then print the operators each\n"
    "registered and how long each step took: hashing the cache key, compiling\n"
    "(0 on a cache hit), loading; and how long it waited when another process\n"
    "was compiling the same source. A FILE or OP that fails is reported on\n"
    "stderr and the rest are still loaded; the exit status is then 1.\n"
    "\n"
    "The optimizing compile of a C source runs in a helper process that\n"
    "outlives this one, so the next process finds optimized code; this one\n"
    "does not wait for it unless asked.\n"
    "\n"
    "options:\n"
    "  --wait               wait for the optimizing compiles to finish (their\n"
    "                       failures are warnings; the exit status is the loads')\n"
    "  --json               print JSON: an array with an object per source\n";

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

/* How the loads are reported: text, or the objects of one JSON array. */
typedef struct load_out {
    int json, n; /* --json; sources reported so far */
} load_out;

/* The ops whose kernels come from the source (src, as loaded; file, as
 * given), with their devices; "(registered no operator)" when none. json:
 * {"op", "schema", "devices"} objects, comma-separated. */
static void print_ops_of(opjit_runtime *rt, const opjit_op *op, const char *src,
                         const char *file, int json)
{
    op_vec ops = {0};
    int shown = 0;
    opjit_list(rt, collect_op, &ops);
    for (size_t i = 0; i < ops.n; i++) {
        opjit_op_info oi = {.size = sizeof oi};
        if (opjit_op_info_get(rt, ops.v[i], &oi) != OPJIT_OK)
            continue;
        char devs[64] = "", jdevs[96] = "";
        size_t n = 0, jn = 0;
        for (int d = 0; d < OPJIT_DEVICE_COUNT; d++)
            if (oi.source[d] && (cli_same_file(oi.source[d], src) ||
                                 cli_same_file(oi.source[d], file))) {
                const char *dn = opjit_device_name(d) ? opjit_device_name(d) : "?";
                n += (size_t)snprintf(devs + n, sizeof devs - n, "%s%s", n ? ", " : "", dn);
                jn += (size_t)snprintf(jdevs + jn, sizeof jdevs - jn, "%s\"%s\"", jn ? ", " : "",
                                       dn);
            }
        if (n == 0 && ops.v[i] != op)
            continue;
        if (json) {
            printf("%s{\"op\": ", shown ? ", " : "");
            cli_json_str(stdout, oi.name);
            printf(", \"schema\": ");
            cli_json_str(stdout, oi.schema ? oi.schema : oi.name);
            printf(", \"devices\": [%s]}", jdevs);
        } else {
            printf("    %s  [%s]\n", oi.schema ? oi.schema : oi.name, devs);
        }
        shown++;
    }
    if (!shown && !json)
        printf("    (registered no operator)\n");
    free(ops.v);
}

/* "waited 1.44 s for another process's compile", or "". */
static const char *waited_note(const opjit_load_info *info, char *buf, size_t len)
{
    buf[0] = '\0';
    if (info->wait_ms > 0)
        snprintf(buf, len, "waited %.2f s for another process's compile", info->wait_ms / 1e3);
    return buf;
}

static void report_text(opjit_runtime *rt, const opjit_op *op, const opjit_load_info *info,
                        const char *src, const char *file)
{
    char waited[96];
    printf("%s: %s%s%s%s\n", src,
           !info->cache_hit                  ? "compiled (cache miss)"
           : !strcmp(info->origin, "remote") ? "remote cache hit"
                                             : "cache hit",
           info->tier[0] ? " [" : "", info->tier[0] ? info->tier : "",
           info->tier[0] ? "]" : "");
    if (waited_note(info, waited, sizeof waited)[0])
        printf("    %s\n", waited);
    printf("    key %.2f ms, compile %.2f ms, load %.2f ms, total %.2f ms\n", info->key_ms,
           info->compile_ms, info->load_ms, info->total_ms);
    print_ops_of(rt, op, src, file, 0);
}

static void report_json(opjit_runtime *rt, const opjit_op *op, const opjit_load_info *info,
                        const char *src, const char *file)
{
    printf("{\"source\": ");
    cli_json_str(stdout, src);
    printf(", \"loaded\": true, \"cache_hit\": %s, \"origin\": ",
           info->cache_hit ? "true" : "false");
    cli_json_str(stdout, info->origin);
    printf(", \"tier\": ");
    cli_json_opt_str(stdout, info->tier[0] ? info->tier : NULL);
    printf(", \"key_ms\": %.3f, \"compile_ms\": %.3f, \"load_ms\": %.3f, \"wait_ms\": %.3f, "
           "\"total_ms\": %.3f, \"ops\": [",
           info->key_ms, info->compile_ms, info->load_ms, info->wait_ms, info->total_ms);
    print_ops_of(rt, op, src, file, 1);
    printf("], \"error\": null}");
}

/* A source that did not load: on stderr, and in the JSON array. */
static void report_failure(opjit_runtime *rt, const char *file, load_out *out)
{
    if (out->json) {
        printf("%s\n  {\"source\": ", out->n++ ? "," : "");
        cli_json_str(stdout, file);
        printf(", \"loaded\": false, \"error\": ");
        cli_json_str(stdout, opjit_errmsg(rt));
        printf("}");
    }
    cli_rt_error(rt, file);
}

/* Load one file and report it. 0, or 1 when it failed (reported);
 * OPJIT_EDEVICE (reported by the caller) when skip_device and the file
 * cannot be served on this machine. */
static int load_one(opjit_runtime *rt, const char *file, load_out *out, int skip_device)
{
    opjit_op *op = NULL;
    opjit_load_info info = {.size = sizeof info};
    int st = opjit_load_file(rt, file, &op, &info);
    if (st == OPJIT_EDEVICE && skip_device)
        return OPJIT_EDEVICE;
    if (st != OPJIT_OK) {
        report_failure(rt, file, out);
        return 1;
    }
    const char *src = info.source[0] ? info.source : file;
    if (out->json) {
        printf("%s\n  ", out->n++ ? "," : "");
        report_json(rt, op, &info, src, file);
    } else {
        report_text(rt, op, &info, src, file);
    }
    return 0;
}

/* ---- a name: its sources, as `opjit call NAME` loads them ---- */

typedef struct named_sources {
    cli_strs paths;
    size_t dirlen; /* of the first directory holding one; 0 before */
} named_sources;

/* The sources named after the op in the first directory that has one: a
 * later directory's are shadowed, as for a load by name. */
static int add_named(void *ud, const char *path)
{
    named_sources *ns = ud;
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
    if (ns->paths.n && (dirlen != ns->dirlen || strncmp(path, ns->paths.v[0], dirlen)))
        return 1; /* past the deciding directory */
    ns->dirlen = dirlen;
    return cli_strs_add(&ns->paths, path) ? 1 : 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A source opjit_load_op loaded: how long it took, not how (a compile or
 * a hit, each step's time: opjit_load_op does not say). */
static void report_lookup(opjit_runtime *rt, const opjit_op *op, const char *src,
                          const char *name, double ms, load_out *out)
{
    if (!out->json) {
        printf("%s: loaded (the module of op %s)\n    total %.2f ms\n", src, name, ms);
        print_ops_of(rt, op, src, src, 0);
        return;
    }
    printf("%s\n  {\"source\": ", out->n++ ? "," : "");
    cli_json_str(stdout, src);
    printf(", \"loaded\": true, \"cache_hit\": null, \"origin\": null, \"tier\": null, "
           "\"key_ms\": null, \"compile_ms\": null, \"load_ms\": null, \"wait_ms\": null, "
           "\"total_ms\": %.3f, \"ops\": [", ms);
    print_ops_of(rt, op, src, src, 1);
    printf("], \"error\": null}");
}

/* A name that has no source named after it (an op of a module, like
 * rmsnorm of llama_ops.c; "module::op"): opjit_load_op finds it. */
static int load_by_lookup(opjit_runtime *rt, const char *name, load_out *out)
{
    opjit_op *op = NULL;
    opjit_op_info oi = {.size = sizeof oi};
    double t0 = now_ms();
    if (opjit_load_op(rt, name, &op) != OPJIT_OK || opjit_op_info_get(rt, op, &oi) != OPJIT_OK) {
        report_failure(rt, name, out);
        return 1;
    }
    double ms = now_ms() - t0;
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
        int seen = 0;
        for (int k = 0; k < d; k++)
            seen |= oi.source[k] && oi.source[d] && !strcmp(oi.source[k], oi.source[d]);
        if (oi.source[d] && !seen)
            report_lookup(rt, op, oi.source[d], name, ms, out);
    }
    return 0;
}

/* Load op name's sources (those usable here) and report each. */
static int load_name(opjit_runtime *rt, const char *name, load_out *out)
{
    named_sources ns = {0};
    int fail = 0, loaded = 0, skipped = 0;
    if (opjit_sources(rt, name, add_named, &ns) != OPJIT_OK || ns.paths.n == 0) {
        cli_strs_free(&ns.paths);
        return load_by_lookup(rt, name, out);
    }
    for (int k = 0; k < ns.paths.n; k++) {
        int r = load_one(rt, ns.paths.v[k], out, 1);
        if (r == OPJIT_EDEVICE) {
            skipped++;
            if (cli_opt.verbose > 0)
                fprintf(stderr, "opjit: skipped %s: %s\n", ns.paths.v[k], opjit_errmsg(rt));
            continue;
        }
        fail |= r;
        loaded += !r;
    }
    if (!loaded && !fail && skipped) /* none is usable here: say why */
        fail = load_one(rt, ns.paths.v[0], out, 0);
    cli_strs_free(&ns.paths);
    return fail;
}

/* A FILE argument is a path when it has a '/' or a source suffix. */
static int is_path(const char *spec) { return strchr(spec, '/') || cli_source_stem(spec); }

/* The FILE arguments into files; CLI_EXIT_OK, or the exit status to end
 * with (help printed, a usage error). */
static int parse_load_args(int argc, char **argv, cli_strs *files, int *done, int *wait,
                           int *json)
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
            if (strcmp(a, "--wait") == 0 || strcmp(a, "--json") == 0) {
                *(a[2] == 'w' ? wait : json) = 1;
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
    return files->n ? CLI_EXIT_OK : cli_usage_error("load", "no OP or FILE given");
}

int cmd_load(int argc, char **argv)
{
    cli_strs files = {0};
    opjit_runtime *rt = NULL;
    int done, fail = 0, wait = 0;
    load_out out = {0};
    int rc = parse_load_args(argc, argv, &files, &done, &wait, &out.json);
    if (rc != CLI_EXIT_OK || done)
        goto out;
    if ((rc = cli_create(&rt)) != CLI_EXIT_OK)
        goto out;
    if (out.json)
        printf("[");
    for (int k = 0; k < files.n; k++)
        fail |= is_path(files.v[k]) ? load_one(rt, files.v[k], &out, 0)
                                    : load_name(rt, files.v[k], &out);
    if (out.json)
        printf("%s]\n", out.n ? "\n" : "");
    if (wait)
        opjit_wait(rt); /* a failure was logged as a warning */
    rc = fail ? CLI_EXIT_FAIL : CLI_EXIT_OK;
out:
    opjit_destroy(rt);
    cli_strs_free(&files);
    return rc;
}
