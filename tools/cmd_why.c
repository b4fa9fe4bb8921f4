/*
 * tools/cmd_why.c - `opjit cache why OP|FILE [--arch LIST]`: what a load
 * of OP or FILE would look up in the cache now, what went into each key,
 * and for a miss the closest cached entry with the inputs that differ.
 * A client of opjit_cache_why.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/cli.h"

static const char why_help[] =
    "usage: opjit cache why OP|FILE [--arch LIST] [options]\n"
    "\n"
    "For each artifact a load of OP (a name on the search path) or FILE would\n"
    "use now (the optimized code when tiering is on, the code a load compiles,\n"
    "a .cu's device code per architecture): its key, whether a cache holds it,\n"
    "and what went into the key (opjit's ABI and op header, the source and each\n"
    "local header by hash, the compiler's identity, options, target). For a\n"
    "miss, the cached entry of the same source and compiler whose inputs differ\n"
    "least, and how they differ. Compiles nothing; it may run the optimizing\n"
    "compiler's --version and load NVRTC to learn who they are.\n"
    "\n"
    "options:\n"
    "  --arch LIST        CUDA architectures (\"sm_90,compute_90\") instead of\n"
    "                     those a load would use\n"
    "  --json             print JSON: an array with an object per artifact\n"
    "  -h, --help         this help\n";

/* Each line of text, indented. */
static void print_lines(const char *text, const char *indent)
{
    for (const char *p = text; p && *p;) {
        const char *e = strchr(p, '\n');
        int n = e ? (int)(e - p) : (int)strlen(p);
        printf("%s%.*s\n", indent, n, p);
        p = e ? e + 1 : NULL;
    }
}

/* Each line of text as a JSON string in an array. */
static void json_lines(const char *text)
{
    printf("[");
    for (const char *p = text; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char *line = strndup(p, n);
        printf("%s", p != text ? ", " : "");
        cli_json_str(stdout, line ? line : "");
        free(line);
        p = e ? e + 1 : NULL;
    }
    printf("]");
}

static int print_why_json(void *ud, const opjit_cache_why_report *w)
{
    int *n = ud;
    printf("%s\n  {\"source\": ", (*n)++ ? "," : "");
    cli_json_str(stdout, w->source);
    printf(", \"compiler\": ");
    cli_json_str(stdout, w->compiler);
    printf(", \"target\": ");
    cli_json_str(stdout, w->target);
    printf(", \"key\": ");
    cli_json_str(stdout, w->key);
    printf(", \"cached\": %s, \"inputs\": ", w->cached ? "true" : "false");
    json_lines(w->inputs);
    printf(", \"note\": ");
    cli_json_opt_str(stdout, w->note);
    printf(", \"closest\": ");
    if (w->cached || !w->closest_key) {
        printf("null}");
        return 0;
    }
    printf("{\"key\": ");
    cli_json_str(stdout, w->closest_key);
    printf(", \"created\": %lld, \"differs\": ", (long long)w->closest_created);
    json_lines(w->differs);
    printf("}}");
    return 0;
}

static int print_why(void *ud, const opjit_cache_why_report *w)
{
    (void)ud;
    printf("%s: %s %s: %s (key %s)\n", w->source, w->compiler, w->target,
           w->cached ? "cached" : "not cached", w->key);
    if (w->note)
        printf("  note: %s\n", w->note);
    printf("  inputs:\n");
    print_lines(w->inputs, "    ");
    if (w->cached)
        return 0;
    if (!w->closest_key) {
        printf("  no entry of this source and compiler is in the cache\n");
        return 0;
    }
    char when[32] = "-";
    time_t t = (time_t)w->closest_created;
    struct tm tm;
    if (localtime_r(&t, &tm))
        strftime(when, sizeof when, "%Y-%m-%d %H:%M", &tm);
    printf("  closest cached entry %s (made %s) differs in:\n", w->closest_key, when);
    print_lines(w->differs, "    ");
    return 0;
}

int cmd_cache_why(int argc, char **argv)
{
    const char *spec = NULL, *arch = NULL;
    int json = 0, n = 0;
    for (int i = 1; i < argc;) {
        int r = cli_common_option(argc, argv, &i);
        if (r == CLI_EXIT_USAGE)
            return r;
        if (r)
            continue;
        const char *a = argv[i++];
        if (cli_is_help(a)) {
            printf("%s\ncommon options:\n%s", why_help, cli_common_help);
            return CLI_EXIT_OK;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--arch") && i < argc) {
            arch = argv[i++];
        } else if (!strncmp(a, "--arch=", 7)) {
            arch = a + 7;
        } else if (a[0] == '-') {
            return cli_usage_error("cache why", "unknown option '%s'", a);
        } else if (!spec) {
            spec = a;
        } else {
            return cli_usage_error("cache why", "unexpected argument '%s'", a);
        }
    }
    if (!spec)
        return cli_usage_error("cache why", "no OP or FILE given");
    if (arch && cli_check_archs("cache why", arch) != 0)
        return CLI_EXIT_USAGE;
    opjit_runtime *rt;
    if (cli_create(&rt) != CLI_EXIT_OK)
        return CLI_EXIT_FAIL;
    if (json)
        printf("[");
    int rc = opjit_cache_why(rt, spec, arch, json ? print_why_json : print_why, &n);
    if (json)
        printf("%s]\n", n ? "\n" : "");
    if (rc)
        cli_rt_error(rt, spec);
    opjit_destroy(rt);
    return rc ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
