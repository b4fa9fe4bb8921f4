/*
 * tools/cmd_cache.c - `opjit cache`: look at and maintain the on-disk cache.
 *
 *   opjit cache ls|info|verify|prune|clear [--cache DIR] [--json] ...
 *
 * Exit status: 0 success, 1 a failure (verify: any damaged entry), 2 a
 * usage error. Results go to stdout, warnings and errors to stderr.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "opjit.h"
#include "cache/cache.h"
#include "tools/commands.h"

static const char cache_help[] =
    "usage: opjit cache COMMAND [options]\n"
    "\n"
    "Look at and maintain the cache of compiled operators.\n"
    "\n"
    "commands:\n"
    "  ls       list the entries: read-only layers first, then the writable cache\n"
    "  info     where the cache is, its size, its cap and its layers\n"
    "  verify   check every entry's manifest and checksums; exits 1 if any is\n"
    "           damaged\n"
    "  prune    evict the least recently used entries down to the size cap, and\n"
    "           remove what killed processes left behind\n"
    "  clear    remove every entry of the writable cache\n"
    "\n"
    "Entries another process is using are never removed (prune and clear skip\n"
    "them), and read-only layers are never changed.\n"
    "\n"
    "options:\n"
    "  --json             print JSON instead of text\n"
    "  --readonly DIRS    read-only cache layers, colon-separated (default:\n"
    "                     $OPJIT_CACHE_READONLY)\n"
    "  --max-size SIZE    prune: down to SIZE (like 100M, 2G) instead of the cap\n"
    "                     ($OPJIT_CACHE_MAX_SIZE, default 512M)\n"
    "  --repair           verify: also evict damaged entries of the writable cache\n"
    "  -h, --help         this help\n";

static int cmd_verbosity = OPJIT_LOG_WARN;

static void cmd_log(void *ud, int level, const char *msg)
{
    static const char *const names[] = {"error", "warning", "info", "debug"};
    (void)ud;
    if (level > cmd_verbosity)
        return;
    fprintf(stderr, "opjit: %s: %s\n",
            level >= 0 && level <= OPJIT_LOG_DEBUG ? names[level] : "log", msg);
}

static int cmd_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "opjit cache: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry 'opjit cache --help'.\n");
    return OPJIT_EXIT_USAGE;
}

/* ---- output helpers ----------------------------------------------------- */

static void json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", stdout);
        else if (*p == '\t')
            fputs("\\t", stdout);
        else if (*p < 0x20 || *p == 0x7f)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

static const char *human_size(uint64_t n, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%" PRIu64 " B", n);
    else
        snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}

static const char *human_time(int64_t t, char *buf, size_t len)
{
    time_t tt = (time_t)t;
    struct tm tm;
    if (t <= 0 || !localtime_r(&tt, &tm) || !strftime(buf, len, "%Y-%m-%d %H:%M", &tm))
        snprintf(buf, len, "-");
    return buf;
}

static const char *layer_name(const cache_entry_info *e, char *buf, size_t len)
{
    if (e->layer == 0)
        snprintf(buf, len, "writable");
    else
        snprintf(buf, len, "ro:%s", e->layer_dir);
    return buf;
}

static void json_entry(const cache_entry_info *e)
{
    printf("{\"key\": ");
    json_str(e->key);
    printf(", \"op\": ");
    json_str(e->op_name);
    printf(", \"source\": ");
    json_str(e->source_name);
    printf(", \"compiler\": ");
    json_str(e->compiler);
    printf(", \"options\": ");
    json_str(e->options);
    printf(", \"target\": ");
    json_str(e->target);
    printf(", \"tier\": ");
    json_str(e->tier);
    printf(", \"size\": %" PRIu64 ", \"created\": %lld, \"last_use\": %lld, \"artifacts\": %d",
           e->size, (long long)e->created, (long long)e->last_use, e->nartifacts);
    printf(", \"layer\": \"%s\", \"layer_dir\": ", e->layer == 0 ? "writable" : "readonly");
    json_str(e->layer_dir);
    printf(", \"dir\": ");
    json_str(e->dir);
    printf(", \"problem\": ");
    if (e->problem)
        json_str(e->problem);
    else
        printf("null");
    printf("}");
}

/* ---- ls ----------------------------------------------------------------- */

typedef struct walk_state {
    int json;
    int n;
    int damaged;
    int verbose_ok; /* verify: print the good ones too */
} walk_state;

static int ls_one(void *ud, const cache_entry_info *e)
{
    walk_state *w = ud;
    char sz[32], tm[32], layer[1100];
    if (w->json) {
        printf("%s\n  ", w->n ? "," : "");
        json_entry(e);
    } else if (e->problem) {
        printf("%-32s  DAMAGED: %s  %s\n", e->key, e->problem, layer_name(e, layer, sizeof layer));
    } else {
        printf("%-32s  %-14s %-16s %-14s %-5s %10s  %-16s  %s\n", e->key, e->op_name,
               e->source_name, e->target, e->tier, human_size(e->size, sz, sizeof sz),
               human_time(e->last_use, tm, sizeof tm), layer_name(e, layer, sizeof layer));
    }
    w->n++;
    return 0;
}

static int cmd_ls(cache *c, int json)
{
    walk_state w = {json, 0, 0, 0};
    char err[1024];
    if (json)
        printf("[");
    else
        printf("%-32s  %-14s %-16s %-14s %-5s %10s  %-16s  %s\n", "KEY", "OP", "SOURCE",
               "TARGET", "TIER", "SIZE", "LAST USE", "LAYER");
    int rc = cache_foreach(c, ls_one, &w, err, sizeof err);
    if (json)
        printf("%s]\n", w.n ? "\n" : "");
    if (rc != OPJIT_OK) {
        fprintf(stderr, "opjit cache ls: %s\n", err);
        return OPJIT_EXIT_FAIL;
    }
    return OPJIT_EXIT_OK;
}

/* ---- info --------------------------------------------------------------- */

static int cmd_info(cache *c, int json)
{
    cache_totals t;
    char err[1024], a[32], b[32];
    if (cache_get_totals(c, &t, err, sizeof err) != OPJIT_OK) {
        fprintf(stderr, "opjit cache info: %s\n", err);
        return OPJIT_EXIT_FAIL;
    }
    uint64_t cap = cache_max_size(c);
    int nro = cache_readonly_count(c);
    if (json) {
        printf("{\"dir\": ");
        json_str(cache_root_dir(c));
        printf(", \"writable\": %s, \"readonly\": [", cache_writable(c) ? "true" : "false");
        for (int i = 0; i < nro; i++) {
            printf("%s", i ? ", " : "");
            json_str(cache_readonly_dir(c, i));
        }
        printf("], \"entries\": %" PRIu64 ", \"bytes\": %" PRIu64, t.entries, t.bytes);
        printf(", \"readonly_entries\": %" PRIu64 ", \"readonly_bytes\": %" PRIu64, t.ro_entries,
               t.ro_bytes);
        if (cap == UINT64_MAX)
            printf(", \"max_size\": null");
        else
            printf(", \"max_size\": %" PRIu64, cap);
        printf(", \"tmp_dirs\": %" PRIu64 ", \"offline\": %s}\n", t.tmp_dirs,
               cache_offline(c) ? "true" : "false");
        return OPJIT_EXIT_OK;
    }
    printf("cache directory:  %s%s\n", *cache_root_dir(c) ? cache_root_dir(c) : "(none)",
           cache_writable(c) ? "" : " (unusable: operators compile into temporary directories)");
    printf("entries:          %" PRIu64 " (%s)\n", t.entries, human_size(t.bytes, a, sizeof a));
    printf("size cap:         %s\n", cap == UINT64_MAX ? "none" : human_size(cap, b, sizeof b));
    printf("read-only layers: %s\n", nro ? "" : "none");
    for (int i = 0; i < nro; i++)
        printf("  %s\n", cache_readonly_dir(c, i));
    if (nro)
        printf("read-only entries: %" PRIu64 " (%s)\n", t.ro_entries,
               human_size(t.ro_bytes, a, sizeof a));
    printf("temporary dirs:   %" PRIu64 "%s\n", t.tmp_dirs,
           t.tmp_dirs ? " (builds in progress, or left over: prune removes those)" : "");
    printf("offline:          %s\n", cache_offline(c) ? "yes" : "no");
    return OPJIT_EXIT_OK;
}

/* ---- verify ------------------------------------------------------------- */

static int verify_one(void *ud, const cache_entry_info *e)
{
    walk_state *w = ud;
    char layer[1100];
    if (e->problem) {
        if (w->json) {
            printf("%s\n    {\"key\": ", w->damaged ? "," : "");
            json_str(e->key);
            printf(", \"dir\": ");
            json_str(e->dir);
            printf(", \"layer\": \"%s\", \"problem\": ", e->layer == 0 ? "writable" : "readonly");
            json_str(e->problem);
            printf("}");
        } else {
            printf("DAMAGED %s (%s): %s\n  %s\n", e->key, layer_name(e, layer, sizeof layer),
                   e->problem, e->dir);
        }
        w->damaged++;
    }
    w->n++;
    return 0;
}

static int cmd_verify(cache *c, int json, int repair)
{
    walk_state w = {json, 0, 0, 0};
    char err[1024];
    int nd = 0;
    if (json)
        printf("{\"damaged\": [");
    int rc = cache_verify_all(c, repair, verify_one, &w, &nd, err, sizeof err);
    if (json)
        printf("%s], \"checked\": %d, \"ndamaged\": %d, \"repaired\": %s}\n", w.damaged ? "\n  " : "",
               w.n, nd, repair && nd ? "true" : "false");
    else
        printf("verified %d entr%s: %d damaged%s\n", w.n, w.n == 1 ? "y" : "ies", nd,
               nd && repair ? " (those in the writable cache evicted, unless in use)" : "");
    if (rc != OPJIT_OK) {
        fprintf(stderr, "opjit cache verify: %s\n", err);
        return OPJIT_EXIT_FAIL;
    }
    return nd ? OPJIT_EXIT_FAIL : OPJIT_EXIT_OK;
}

/* ---- prune, clear ------------------------------------------------------- */

static int cmd_prune(cache *c, int json, int clear, uint64_t max)
{
    cache_prune_result r;
    char err[1024], a[32], b[32];
    int rc = clear ? cache_clear(c, &r, err, sizeof err) : cache_prune(c, max, &r, err, sizeof err);
    if (rc != OPJIT_OK) {
        fprintf(stderr, "opjit cache %s: %s\n", clear ? "clear" : "prune", err);
        return OPJIT_EXIT_FAIL;
    }
    if (json) {
        printf("{\"removed\": %" PRIu64 ", \"removed_bytes\": %" PRIu64 ", \"busy\": %" PRIu64
               ", \"tmp_removed\": %" PRIu64 ", \"bytes\": %" PRIu64 "}\n",
               r.removed, r.removed_bytes, r.busy, r.tmp_removed, r.bytes_after);
        return OPJIT_EXIT_OK;
    }
    printf("removed %" PRIu64 " entr%s (%s)", r.removed, r.removed == 1 ? "y" : "ies",
           human_size(r.removed_bytes, a, sizeof a));
    if (r.busy)
        printf(", skipped %" PRIu64 " in use", r.busy);
    if (r.tmp_removed)
        printf(", removed %" PRIu64 " leftover temporary director%s", r.tmp_removed,
               r.tmp_removed == 1 ? "y" : "ies");
    printf("; the cache now holds %s\n", human_size(r.bytes_after, b, sizeof b));
    return OPJIT_EXIT_OK;
}

/* ---- main --------------------------------------------------------------- */

int opjit_cmd_cache(int argc, char **argv)
{
    const char *verb = NULL, *readonly = NULL;
    int json = 0, repair = 0;
    uint64_t max = 0;
    for (int i = 1; i < argc;) {
        int r = opjit_cli_common_option(argc, argv, &i);
        if (r == OPJIT_EXIT_USAGE)
            return r;
        if (r)
            continue;
        const char *a = argv[i++];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s\ncommon options:\n%s", cache_help, opjit_cli_common_help);
            return OPJIT_EXIT_OK;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--repair")) {
            repair = 1;
        } else if (!strcmp(a, "--readonly") || !strncmp(a, "--readonly=", 11)) {
            if (a[10] == '=')
                readonly = a + 11;
            else if (i < argc)
                readonly = argv[i++];
            else
                return cmd_usage("%s needs a value", a);
        } else if (!strcmp(a, "--max-size") || !strncmp(a, "--max-size=", 11)) {
            const char *v = a[10] == '=' ? a + 11 : i < argc ? argv[i++] : NULL;
            if (!v)
                return cmd_usage("%s needs a value", a);
            if (cache_parse_size(v, &max) != 0)
                return cmd_usage("'%s' is not a size (like 100M or 2G)", v);
        } else if (a[0] == '-') {
            return cmd_usage("unknown option '%s'", a);
        } else if (!verb) {
            verb = a;
        } else {
            return cmd_usage("unexpected argument '%s'", a);
        }
    }
    if (!verb) {
        fputs(cache_help, stderr);
        return OPJIT_EXIT_USAGE;
    }
    static const char *const verbs[] = {"ls", "info", "verify", "prune", "clear"};
    size_t v;
    for (v = 0; v < sizeof verbs / sizeof verbs[0]; v++)
        if (!strcmp(verb, verbs[v]))
            break;
    if (v == sizeof verbs / sizeof verbs[0])
        return cmd_usage("unknown command '%s'", verb);
    if (max && strcmp(verb, "prune") != 0)
        return cmd_usage("--max-size is for prune, not %s", verb);
    if (repair && strcmp(verb, "verify") != 0)
        return cmd_usage("--repair is for verify, not %s", verb);

    opjit_config ocfg;
    opjit_cli_config(&ocfg);
    cmd_verbosity = ocfg.verbosity;
    cache_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.dir = ocfg.cache_dir;
    cfg.readonly = readonly ? readonly : ocfg.readonly_caches;
    cfg.offline = -1;
    cfg.log = ocfg.log ? cmd_log : NULL; /* NULL: -q */
    cache *c = NULL;
    char err[1024];
    if (cache_open(&cfg, &c, err, sizeof err) != OPJIT_OK) {
        fprintf(stderr, "opjit cache: %s\n", err);
        return OPJIT_EXIT_FAIL;
    }
    int rc;
    switch (v) {
    case 0: rc = cmd_ls(c, json); break;
    case 1: rc = cmd_info(c, json); break;
    case 2: rc = cmd_verify(c, json, repair); break;
    default: rc = cmd_prune(c, json, v == 4, max); break;
    }
    cache_close(c);
    return rc;
}
