/*
 * tools/cli.c - what the subcommands of `opjit` share: the global options,
 * the runtime's configuration, usage errors, small utilities.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tools/cli.h"

cli_options cli_opt;

const char cli_common_help[] =
    "  --cache DIR      the writable cache directory (default: $OPJIT_CACHE_DIR,\n"
    "                   else $XDG_CACHE_HOME/opjit, else ~/.cache/opjit)\n"
    "  --ops-path DIR   look for operator sources in DIR, before $OPJIT_OPS_PATH\n"
    "                   (repeatable; DIR may itself be a colon-separated list)\n"
    "  -v, --verbose    log what the runtime does to stderr (-vv: debug)\n"
    "  -q, --quiet      no warnings on stderr (errors are still reported)\n";

static void cli_log(void *ud, int level, const char *msg)
{
    static const char *const names[] = {"error", "warning", "info", "debug"};
    (void)ud;
    const char *name = level >= 0 && level <= OPJIT_LOG_DEBUG ? names[level] : "log";
    fprintf(stderr, "opjit: %s: %s\n", name, msg);
}

void cli_config(opjit_config *cfg)
{
    opjit_config_init(cfg, sizeof *cfg);
    if (cli_opt.cache_dir)
        cfg->cache_dir = cli_opt.cache_dir;
    if (cli_opt.ops_path)
        cfg->ops_path = cli_opt.ops_path;
    /* Warnings reach stderr unless -q: a cache that stopped caching, a
     * failed optimizing compile. */
    if (cli_opt.verbose >= 0) {
        cfg->log = cli_log;
        cfg->log_ud = NULL;
        cfg->verbosity = cli_opt.verbose >= 2   ? OPJIT_LOG_DEBUG
                         : cli_opt.verbose == 1 ? OPJIT_LOG_INFO
                                                : OPJIT_LOG_WARN;
    }
}

int cli_create_with(const opjit_config *cfg, opjit_runtime **rt)
{
    int st = opjit_create(cfg, rt);
    if (st != OPJIT_OK) {
        fprintf(stderr, "opjit: cannot create the runtime: %s (%s)\n", opjit_errstr(st),
                opjit_status_name(st));
        *rt = NULL;
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

int cli_create(opjit_runtime **rt)
{
    opjit_config cfg;
    cli_config(&cfg);
    return cli_create_with(&cfg, rt);
}

int cli_opt_value(int argc, char **argv, int *i, const char *name, const char **val)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0)
        return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "opjit: option %s needs a value\n", name);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

/* --ops-path DIR: appended to the colon-separated list. */
static int cli_add_ops_path(const char *val)
{
    if (!*val) {
        fprintf(stderr, "opjit: --ops-path needs a directory\n");
        return CLI_EXIT_USAGE;
    }
    size_t old = cli_opt.ops_path ? strlen(cli_opt.ops_path) : 0;
    char *p = realloc(cli_opt.ops_path, old + strlen(val) + 2);
    if (!p) {
        fprintf(stderr, "opjit: out of memory\n");
        return CLI_EXIT_USAGE;
    }
    if (old)
        p[old++] = ':';
    strcpy(p + old, val);
    cli_opt.ops_path = p;
    return 1;
}

/* --cache DIR. */
static int cli_set_cache(const char *val)
{
    if (!*val) {
        fprintf(stderr, "opjit: --cache needs a directory\n");
        return CLI_EXIT_USAGE;
    }
    cli_opt.cache_dir = val;
    /* Subcommands that build their own config see it too. */
    setenv("OPJIT_CACHE_DIR", val, 1);
    return 1;
}

int cli_common_option(int argc, char **argv, int *i)
{
    const char *a = argv[*i], *val;
    int r = 0;
    if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0)
        cli_opt.verbose++, r = 1;
    else if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0)
        cli_opt.verbose = -1, r = 1;
    else if (strcmp(a, "-vv") == 0)
        cli_opt.verbose += 2, r = 1;
    else if ((r = cli_opt_value(argc, argv, i, "--cache", &val)) > 0)
        r = cli_set_cache(val);
    else if (r == 0 && (r = cli_opt_value(argc, argv, i, "--ops-path", &val)) > 0)
        r = cli_add_ops_path(val);
    if (r < 0)
        return CLI_EXIT_USAGE;
    if (r == 1)
        (*i)++;
    return r;
}

int cli_common_opt(int argc, char **argv, int *i)
{
    int r = cli_common_option(argc, argv, i);
    if (r == CLI_EXIT_USAGE)
        return -1;
    if (r == 1)
        (*i)--; /* the caller's loop advances */
    return r;
}

int cli_is_help(const char *a) { return strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0; }

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "opjit: %s%s", cmd ? cmd : "", cmd ? ": " : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'opjit %s%s--help'.\n", cmd ? cmd : "", cmd ? " " : "");
    return CLI_EXIT_USAGE;
}

void cli_rt_error(opjit_runtime *rt, const char *what)
{
    const char *msg = rt ? opjit_errmsg(rt) : "";
    if (!msg || !*msg)
        fprintf(stderr, "opjit: %s: failed\n", what);
    else if (strstr(msg, what))
        fprintf(stderr, "opjit: %s\n", msg);
    else
        fprintf(stderr, "opjit: %s: %s\n", what, msg);
}

size_t cli_source_stem(const char *file)
{
    size_t n = strlen(file);
    if (file[0] == '.')
        return 0;
    if (n > 2 && strcmp(file + n - 2, ".c") == 0)
        return n - 2;
    if (n > 3 && strcmp(file + n - 3, ".cu") == 0)
        return n - 3;
    return 0;
}

int cli_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (!a || !b)
        return 0;
    if (strcmp(a, b) == 0)
        return 1;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

int cli_strs_add(cli_strs *l, const char *s)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        char **v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(s)))
        return -1;
    l->n++;
    return 0;
}

void cli_strs_free(cli_strs *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

/* One architecture of an --arch list: sm_XY or compute_XY, maybe with a
 * letter (sm_90a). The library checks the rest (which numbers exist). */
static int cli_arch_word(const char *a, size_t len)
{
    size_t p = !strncmp(a, "sm_", 3) ? 3 : !strncmp(a, "compute_", 8) ? 8 : 0, d = p;
    while (d < len && a[d] >= '0' && a[d] <= '9')
        d++;
    if (d < len && a[d] >= 'a' && a[d] <= 'z')
        d++;
    return p && p < len && a[p] != '0' && d > p && d == len;
}

int cli_check_archs(const char *cmd, const char *list)
{
    int any = 0;
    for (const char *p = list; *p;) {
        p += strspn(p, ", ");
        size_t len = strcspn(p, ", ");
        if (!len)
            break;
        if (!cli_arch_word(p, len))
            return cli_usage_error(cmd, "--arch: '%.*s' is not a CUDA architecture (expected "
                                   "sm_XY for a cubin or compute_XY for PTX, e.g. --arch "
                                   "sm_80,sm_90,compute_90)", (int)len, p);
        any = 1;
        p += len;
    }
    return any ? 0 : cli_usage_error(cmd, "--arch needs a list such as sm_80,sm_90,compute_90");
}
