/*
 * tools/cmd_list.c - `opjit list`: the operators on the search path, with
 * their schemas, devices, tiers and sources (opjit_discover).
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

static const char list_help[] =
    "usage: opjit list [--ops-path DIR] [options]\n"
    "\n"
    "Find every operator source (*.c, *.cu) on the search path and list the\n"
    "operators: schema, devices, the tier a load would get, the source of each\n"
    "device's kernel and its description. A source not listed before (or edited\n"
    "since) is compiled and its init run in a child process with a time limit\n"
    "($OPJIT_DISCOVER_TIMEOUT seconds, default 60): one that fails to compile,\n"
    "crashes, exits or hangs is reported on stderr and the others are still\n"
    "listed; the exit status is then 1. What a child reports is kept in the\n"
    "cache: a source listed before is reported from it, running nothing.\n"
    "\n"
    "The search path: the --ops-path directories, then $OPJIT_OPS_PATH.\n"
    "\n"
    "options:\n"
    "  --json           print JSON: an array with an object per (op, device)\n";

/* The --ops-path directories must exist: 1 (reported) when one cannot be
 * read, else 0. */
static int check_ops_dirs(const char *path)
{
    int fail = 0;
    for (const char *p = path ? path : ""; *p;) {
        size_t len = strcspn(p, ":");
        char *dir = strndup(p, len);
        DIR *d = len && dir ? opendir(dir) : NULL;
        if (d)
            closedir(d);
        else if (len && dir) {
            char esc[4 * 4096 + 1];
            int e = errno;
            fprintf(stderr, "opjit: --ops-path %s: %s\n", cli_escape(dir, 0, esc, sizeof esc),
                    strerror(e));
            fail = 1;
        }
        free(dir);
        p += len + (p[len] == ':');
    }
    return fail;
}

/* What `opjit list` prints: one row per (op, source). */
typedef struct listed_op {
    char *name, *schema, *path, *doc;
    const char *tier;
    int device;
} listed_op;

typedef struct listed_ops {
    listed_op *v;
    size_t n, cap;
    int sources, oom;
} listed_ops;

static int listed_add(listed_ops *ops, const opjit_source_ops *src, int i)
{
    if (ops->n == ops->cap) {
        size_t cap = ops->cap ? ops->cap * 2 : 16;
        listed_op *v = realloc(ops->v, cap * sizeof *v);
        if (!v)
            return -1;
        ops->v = v;
        ops->cap = cap;
    }
    const char *schema = src->schemas[i], *paren = strchr(schema, '(');
    listed_op *o = &ops->v[ops->n];
    o->name = strndup(schema, paren ? (size_t)(paren - schema) : strlen(schema));
    o->schema = strdup(schema);
    o->path = strdup(src->path);
    o->doc = strdup(src->docs[i]);
    o->tier = src->tier;
    o->device = src->device;
    ops->n++;
    return o->name && o->schema && o->path && o->doc ? 0 : -1;
}

static int collect_source(void *ud, const opjit_source_ops *src)
{
    listed_ops *ops = ud;
    ops->sources++;
    char *esc = NULL;
    size_t n = src->error ? strlen(src->error) * 4 + 1 : 0;
    if (src->status != OPJIT_OK && (src->status != OPJIT_EDEVICE || cli_opt.verbose > 0) &&
        (esc = malloc(n))) /* the diagnostics keep their lines; escapes go */
        fprintf(stderr, "opjit: %s\n",
                cli_escape(src->error, CLI_ESC_LINES | CLI_ESC_BACKSLASH, esc, n));
    free(esc);
    for (int i = 0; i < src->nops && !ops->oom; i++)
        if (listed_add(ops, src, i) != 0)
            ops->oom = 1;
    return 0;
}

static int cmp_listed(const void *pa, const void *pb)
{
    const listed_op *a = pa, *b = pb;
    int c = strcmp(a->name, b->name);
    return c ? c : a->device - b->device;
}

static void listed_free(listed_ops *ops)
{
    for (size_t i = 0; i < ops->n; i++) {
        free(ops->v[i].name);
        free(ops->v[i].schema);
        free(ops->v[i].path);
        free(ops->v[i].doc);
    }
    free(ops->v);
}

/* Each op's schema, then a row per device: "cpu/tcc  path  doc". What
 * came from the sources (names, docs) is printed escaped. */
static void print_listed(listed_ops *ops)
{
    if (ops->n > 1)
        qsort(ops->v, ops->n, sizeof *ops->v, cmp_listed);
    static char a[4 * 4096 + 1], b[4 * 4096 + 1];
    for (size_t i = 0; i < ops->n; i++) {
        const listed_op *o = &ops->v[i];
        if (i == 0 || strcmp(o->name, ops->v[i - 1].name))
            printf("%s%s\n", i ? "\n" : "", cli_escape(o->schema, 0, a, sizeof a));
        char where[64];
        snprintf(where, sizeof where, "%s/%s", opjit_device_name(o->device), o->tier);
        cli_escape(o->path, 0, a, sizeof a);
        if (*o->doc)
            printf("    %-9s %s  %s\n", where, a, cli_escape(o->doc, 0, b, sizeof b));
        else
            printf("    %-9s %s\n", where, a);
    }
}

/* The rows as JSON: {"op", "schema", "device", "tier", "source", "doc"}. */
static void print_listed_json(listed_ops *ops)
{
    if (ops->n > 1)
        qsort(ops->v, ops->n, sizeof *ops->v, cmp_listed);
    printf("[");
    for (size_t i = 0; i < ops->n; i++) {
        const listed_op *o = &ops->v[i];
        printf("%s\n  {\"op\": ", i ? "," : "");
        cli_json_str(stdout, o->name);
        printf(", \"schema\": ");
        cli_json_str(stdout, o->schema);
        printf(", \"device\": ");
        cli_json_str(stdout, opjit_device_name(o->device));
        printf(", \"tier\": ");
        cli_json_opt_str(stdout, o->tier);
        printf(", \"source\": ");
        cli_json_str(stdout, o->path);
        printf(", \"doc\": ");
        cli_json_str(stdout, o->doc);
        printf("}");
    }
    printf("%s]\n", ops->n ? "\n" : "");
}

int cmd_list(int argc, char **argv)
{
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
            continue;
        }
        if (cli_is_help(argv[i])) {
            printf("%s%s", list_help, cli_common_help);
            return CLI_EXIT_OK;
        }
        int r = cli_common_opt(argc, argv, &i);
        if (r < 0)
            return CLI_EXIT_USAGE;
        if (r == 0)
            return cli_usage_error("list", "unexpected argument '%s'", argv[i]);
    }
    opjit_runtime *rt;
    if (cli_create(&rt) != CLI_EXIT_OK)
        return CLI_EXIT_FAIL;
    int bad_dir = check_ops_dirs(cli_opt.ops_path);
    /* A source not listed before is loaded in a child process (one that
     * crashes, exits or hangs is reported and the others are still
     * listed); the others come from their records in the cache. */
    listed_ops ops = {0};
    int st = opjit_discover(rt, collect_source, &ops);
    int fail = bad_dir || (st != OPJIT_OK && st != OPJIT_EDEVICE) || ops.oom;
    if (json)
        print_listed_json(&ops);
    else
        print_listed(&ops);
    static char esc[4 * 4096 + 1];
    if (ops.n == 0 && !ops.sources)
        fprintf(stderr, "opjit: no operator sources found on the search path %s (give "
                        "--ops-path DIR or set OPJIT_OPS_PATH)\n",
                cli_escape(opjit_ops_path(rt), 0, esc, sizeof esc));
    listed_free(&ops);
    opjit_destroy(rt);
    return fail ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
