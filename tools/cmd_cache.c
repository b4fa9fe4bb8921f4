/*
 * tools/cmd_cache.c - `opjit cache`: look at and maintain the on-disk cache.
 *
 *   opjit cache ls|info|verify|prune|clear [--cache DIR] [--json] ...
 *   opjit cache ls|info --remote
 *
 * A client of opjit.h's cache functions (opjit_cache_list, _info_get,
 * _verify, _prune, _clear) on a runtime made for the purpose.
 *
 * Exit status: 0 success, 1 a failure (verify: any damaged entry), 2 a
 * usage error. Results go to stdout, warnings and errors to stderr.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/cli.h"

static const char cache_help[] =
    "usage: opjit cache COMMAND [options]\n"
    "\n"
    "Look at and maintain the cache of compiled operators.\n"
    "\n"
    "commands:\n"
    "  ls       list the compiled artifacts: read-only layers first, then the\n"
    "           writable cache (--remote: what the remote cache shared by the\n"
    "           fleet holds; --all: the index entries lookups go through too)\n"
    "  info     where the cache is, its size, its cap and its layers (--remote:\n"
    "           the remote cache: its entries, memory and eviction policy)\n"
    "  verify   check every entry's manifest and checksums; exits 1 if any is\n"
    "           damaged\n"
    "  prune    evict the least recently used entries down to the size cap, and\n"
    "           remove what killed processes left behind\n"
    "  clear    remove every entry of the writable cache\n"
    "  why      OP|FILE: what a load would look up, and why it would miss\n"
    "           (see 'opjit cache why --help')\n"
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
    "  --all              ls: also the index entries (the text says how many it hid)\n"
    "  --repair           verify: also evict damaged entries of the writable cache\n"
    "  --remote           ls, info: the remote cache ($OPJIT_REMOTE_CACHE)\n"
    "  -h, --help         this help\n";

static int cmd_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "opjit cache: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry 'opjit cache --help'.\n");
    return CLI_EXIT_USAGE;
}

/* ---- output helpers ----------------------------------------------------- */

static void json_str(const char *s) { cli_json_str(stdout, s); }

/* s made safe for a terminal (cli_escape), in one of a few buffers that
 * rotate: good for the arguments of one printf. */
static const char *esc_as(const char *s, int keep)
{
    static char bufs[8][4 * 4096 + 1];
    static int next;
    char *b = bufs[next++ % 8];
    return cli_escape(s, keep, b, sizeof bufs[0]);
}

static const char *esc(const char *s) { return esc_as(s, 0); }
/* A message of the library's: its lines stay, its escapes too. */
static const char *esc_msg(const char *s) { return esc_as(s, CLI_ESC_LINES | CLI_ESC_BACKSLASH); }

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

static const char *layer_name(const opjit_cache_entry *e, char *buf, size_t len)
{
    if (e->layer == 0)
        snprintf(buf, len, "writable");
    else if (e->layer < 0)
        snprintf(buf, len, "remote");
    else
        snprintf(buf, len, "ro:%s", esc(e->layer_dir));
    return buf;
}

static int internal_entry(const opjit_cache_entry *e);

static void json_entry(FILE *f, const opjit_cache_entry *e)
{
    const char *names[] = {"key", "op", "source", "compiler", "options", "target", "tier"};
    const char *vals[] = {e->key,     e->op_name, e->source_name, e->compiler,
                          e->options, e->target,  e->tier};
    for (int i = 0; i < 7; i++) {
        fprintf(f, "%s\"%s\": ", i ? ", " : "{", names[i]);
        cli_json_str(f, vals[i]);
    }
    fprintf(f, ", \"size\": %" PRIu64 ", \"created\": %lld, \"last_use\": %lld, \"artifacts\": %d",
            e->size, (long long)e->created, (long long)e->last_use, e->nartifacts);
    fprintf(f, ", \"layer\": \"%s\", \"layer_dir\": ",
            e->layer == 0 ? "writable" : e->layer < 0 ? "remote" : "readonly");
    cli_json_str(f, e->layer_dir);
    fprintf(f, ", \"dir\": ");
    cli_json_str(f, e->dir);
    fprintf(f, ", \"internal\": %s, \"problem\": ", internal_entry(e) ? "true" : "false");
    cli_json_opt_str(f, e->problem);
    fprintf(f, "}");
}

/* ---- ls ----------------------------------------------------------------- */

typedef struct walk_state {
    int json;
    int n;
    int damaged;
    int verbose_ok; /* verify: print the good ones too */
} walk_state;

/* An index entry (what a lookup by name or by compiler file goes through,
 * tier "index" or "<compiler>-index"): opjit's bookkeeping, not an
 * artifact a user built. */
static int internal_entry(const opjit_cache_entry *e)
{
    size_t n = e->tier ? strlen(e->tier) : 0;
    return n && (!strcmp(e->tier, "index") || (n > 6 && !strcmp(e->tier + n - 6, "-index")));
}

enum { LS_COLS = 8, LS_SIZE = 5 };
static const char *const ls_header[LS_COLS] = {"KEY",  "OP",   "SOURCE",   "TARGET",
                                               "TIER", "SIZE", "LAST USE", "LAYER"};

/* `cache ls`: the rows kept until the listing succeeded, then printed in
 * columns as wide as their widest cell (JSON: the document, kept). */
typedef struct ls_state {
    int json, all, n, hidden, oom;
    char *(*rows)[LS_COLS]; /* a damaged entry: key, NULL, problem, layer */
    size_t nrows, cap;
    FILE *js; /* --json: the document so far */
} ls_state;

static int ls_add_row(ls_state *w, const opjit_cache_entry *e)
{
    char sz[32], tm[32], layer[4 * 4096 + 8], problem[4 * 4096 + 16];
    if (w->nrows == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        char *(*v)[LS_COLS] = realloc(w->rows, cap * sizeof *v);
        if (!v)
            return -1;
        w->rows = v;
        w->cap = cap;
    }
    char **r = w->rows[w->nrows++];
    memset(r, 0, sizeof(char *) * LS_COLS);
    layer_name(e, layer, sizeof layer);
    if (e->problem) {
        snprintf(problem, sizeof problem, "DAMAGED: %s", esc_as(e->problem, CLI_ESC_BACKSLASH));
        const char *cells[] = {esc(e->key), NULL, problem, layer};
        for (int c = 0; c < 4; c++)
            if (cells[c] && !(r[c] = strdup(cells[c])))
                return -1;
        return 0;
    }
    const char *cells[LS_COLS] = {esc(e->key), esc(e->op_name), esc(e->source_name),
                                  esc(e->target), esc(e->tier), human_size(e->size, sz, sizeof sz),
                                  human_time(e->last_use, tm, sizeof tm), layer};
    for (int c = 0; c < LS_COLS; c++)
        if (!(r[c] = strdup(cells[c])))
            return -1;
    return 0;
}

static int ls_one(void *ud, const opjit_cache_entry *e)
{
    ls_state *w = ud;
    if (!w->all && internal_entry(e)) {
        w->hidden++;
        return 0;
    }
    if (w->json) {
        fprintf(w->js, "%s\n  ", w->n ? "," : "");
        json_entry(w->js, e);
    } else if (ls_add_row(w, e) != 0) {
        w->oom = 1;
        return 1;
    }
    w->n++;
    return 0;
}

static void ls_print_rows(const ls_state *w)
{
    int width[LS_COLS];
    for (int c = 0; c < LS_COLS; c++)
        width[c] = (int)strlen(ls_header[c]);
    for (size_t i = 0; i < w->nrows; i++)
        for (int c = 0; c < LS_COLS && w->rows[i][1]; c++)
            if ((int)strlen(w->rows[i][c]) > width[c])
                width[c] = (int)strlen(w->rows[i][c]);
    for (size_t i = 0; i <= w->nrows; i++) {
        const char *const *r = i ? (const char *const *)w->rows[i - 1] : ls_header;
        if (!r[1]) { /* damaged: its problem instead of the manifest's columns */
            printf("%-*s  %s  %s\n", width[0], r[0], r[2], r[3]);
            continue;
        }
        for (int c = 0; c < LS_COLS - 1; c++)
            printf(c == LS_SIZE ? "%*s  " : "%-*s  ", width[c], r[c]);
        printf("%s\n", r[LS_COLS - 1]);
    }
}

static void ls_free(ls_state *w)
{
    for (size_t i = 0; i < w->nrows; i++)
        for (int c = 0; c < LS_COLS; c++)
            free(w->rows[i][c]);
    free(w->rows);
}

static int cmd_ls(opjit_runtime *rt, int json, int remote, int all)
{
    ls_state w = {.json = json, .all = all};
    char *doc = NULL;
    size_t doclen = 0;
    if (json && !(w.js = open_memstream(&doc, &doclen))) {
        fprintf(stderr, "opjit cache ls: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    int rc = remote ? opjit_cache_remote_list(rt, ls_one, &w) : opjit_cache_list(rt, ls_one, &w);
    if (w.js)
        fclose(w.js);
    /* A failure prints the entries seen before it (a remote listing cut
     * short), but never a header alone: it would read as "empty". */
    int ok = rc == OPJIT_OK && !w.oom;
    if (ok || w.n) {
        if (json)
            printf("[%s%s]\n", doc ? doc : "", w.n ? "\n" : "");
        else
            ls_print_rows(&w);
    }
    if (ok && !json && w.hidden)
        fprintf(stderr, "opjit cache ls: %d index entr%s not shown (--all shows them)\n",
                w.hidden, w.hidden == 1 ? "y" : "ies");
    if (!ok)
        fprintf(stderr, "opjit cache ls: %s\n",
                w.oom ? "out of memory" : esc_msg(opjit_errmsg(rt)));
    rc = ok ? CLI_EXIT_OK : CLI_EXIT_FAIL;
    free(doc);
    ls_free(&w);
    return rc;
}

/* ---- info --------------------------------------------------------------- */

static void info_json(opjit_runtime *rt, const opjit_cache_info *t)
{
    printf("{\"dir\": ");
    json_str(t->dir);
    printf(", \"writable\": %s, \"readonly\": [", t->writable ? "true" : "false");
    for (int i = 0; i < t->nreadonly; i++) {
        printf("%s", i ? ", " : "");
        json_str(opjit_cache_readonly_dir(rt, i));
    }
    printf("], \"entries\": %" PRIu64 ", \"bytes\": %" PRIu64, t->entries, t->bytes);
    printf(", \"readonly_entries\": %" PRIu64 ", \"readonly_bytes\": %" PRIu64,
           t->readonly_entries, t->readonly_bytes);
    if (t->max_size == UINT64_MAX)
        printf(", \"max_size\": null");
    else
        printf(", \"max_size\": %" PRIu64, t->max_size);
    printf(", \"tmp_dirs\": %" PRIu64 ", \"offline\": %s}\n", t->tmp_dirs,
           t->offline ? "true" : "false");
}

static void info_text(opjit_runtime *rt, const opjit_cache_info *t)
{
    char a[32], b[32];
    printf("cache directory:  %s%s\n", *t->dir ? esc(t->dir) : "(none)",
           t->writable ? "" : " (unusable: operators compile into temporary directories)");
    printf("entries:          %" PRIu64 " (%s)\n", t->entries, human_size(t->bytes, a, sizeof a));
    printf("size cap:         %s\n",
           t->max_size == UINT64_MAX ? "none" : human_size(t->max_size, b, sizeof b));
    printf("read-only layers: %s\n", t->nreadonly ? "" : "none");
    for (int i = 0; i < t->nreadonly; i++)
        printf("  %s\n", esc(opjit_cache_readonly_dir(rt, i)));
    if (t->nreadonly)
        printf("read-only entries: %" PRIu64 " (%s)\n", t->readonly_entries,
               human_size(t->readonly_bytes, a, sizeof a));
    printf("temporary dirs:   %" PRIu64 "%s\n", t->tmp_dirs,
           t->tmp_dirs ? " (builds in progress, or left over: prune removes those)" : "");
    printf("offline:          %s\n", t->offline ? "yes" : "no");
}

/* info --remote */
static int cmd_remote_info(opjit_runtime *rt, int json)
{
    opjit_cache_remote_info r = {.size = sizeof r};
    char a[32], b[32], c[32];
    if (opjit_cache_remote_info_get(rt, &r) != OPJIT_OK) {
        fprintf(stderr, "opjit cache info: %s\n", esc_msg(opjit_errmsg(rt)));
        return CLI_EXIT_FAIL;
    }
    if (json) {
        printf("{\"url\": ");
        json_str(r.url);
        printf(", \"enabled\": %s, \"readonly\": %s, \"signed\": %s, \"reachable\": %s, "
               "\"entries\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"used_memory\": %" PRIu64
               ", \"maxmemory\": %" PRIu64 ", \"policy\": ",
               r.enabled ? "true" : "false", r.readonly ? "true" : "false",
               r.is_signed ? "true" : "false", r.reachable ? "true" : "false", r.entries, r.bytes,
               r.used_memory, r.maxmemory);
        json_str(r.policy);
        printf("}\n");
        return r.enabled && r.reachable ? CLI_EXIT_OK : CLI_EXIT_FAIL;
    }
    printf("remote cache:     %s%s\n", *r.url ? esc(r.url) : "(none: set OPJIT_REMOTE_CACHE)",
           !*r.url || r.enabled ? "" : " (not used: see the warning)");
    if (!r.enabled)
        return CLI_EXIT_FAIL;
    printf("mode:             %s, %s\n", r.readonly ? "read-only" : "read-write",
           r.is_signed ? "signed entries" : "UNSIGNED entries (unsafe)");
    if (!r.reachable) {
        printf("reachable:        no\n");
        return CLI_EXIT_FAIL;
    }
    printf("entries:          %" PRIu64 " (%s)\n", r.entries, human_size(r.bytes, a, sizeof a));
    printf("server memory:    %s used, maxmemory %s, policy %s\n",
           human_size(r.used_memory, b, sizeof b),
           r.maxmemory ? human_size(r.maxmemory, c, sizeof c) : "none", esc(r.policy));
    return CLI_EXIT_OK;
}

static int cmd_info(opjit_runtime *rt, int json)
{
    opjit_cache_info t = {.size = sizeof t};
    if (opjit_cache_info_get(rt, &t) != OPJIT_OK) {
        fprintf(stderr, "opjit cache info: %s\n", esc_msg(opjit_errmsg(rt)));
        return CLI_EXIT_FAIL;
    }
    if (json)
        info_json(rt, &t);
    else
        info_text(rt, &t);
    return CLI_EXIT_OK;
}

/* ---- verify ------------------------------------------------------------- */

static int verify_one(void *ud, const opjit_cache_entry *e)
{
    walk_state *w = ud;
    char layer[4 * 4096 + 8];
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
            printf("DAMAGED %s (%s): %s\n  %s\n", esc(e->key), layer_name(e, layer, sizeof layer),
                   esc_as(e->problem, CLI_ESC_BACKSLASH), esc(e->dir));
        }
        w->damaged++;
    }
    w->n++;
    return 0;
}

static int cmd_verify(opjit_runtime *rt, int json, int repair)
{
    walk_state w = {json, 0, 0, 0};
    int nd = 0;
    if (json)
        printf("{\"damaged\": [");
    int rc = opjit_cache_verify(rt, repair, verify_one, &w, &nd);
    if (json)
        printf("%s], \"checked\": %d, \"ndamaged\": %d, \"repaired\": %s}\n",
               w.damaged ? "\n  " : "", w.n, nd, repair && nd ? "true" : "false");
    else
        printf("verified %d entr%s: %d damaged%s\n", w.n, w.n == 1 ? "y" : "ies", nd,
               nd && repair ? " (those in the writable cache evicted, unless in use)" : "");
    if (rc != OPJIT_OK) {
        fprintf(stderr, "opjit cache verify: %s\n", esc_msg(opjit_errmsg(rt)));
        return CLI_EXIT_FAIL;
    }
    return nd ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

/* ---- prune, clear ------------------------------------------------------- */

static int cmd_prune(opjit_runtime *rt, int json, int clear, uint64_t max)
{
    opjit_cache_prune_result r = {.size = sizeof r};
    char a[32], b[32];
    int rc = clear ? opjit_cache_clear(rt, &r) : opjit_cache_prune(rt, max, &r);
    if (rc != OPJIT_OK) {
        fprintf(stderr, "opjit cache %s: %s\n", clear ? "clear" : "prune",
                esc_msg(opjit_errmsg(rt)));
        return CLI_EXIT_FAIL;
    }
    if (json) {
        printf("{\"removed\": %" PRIu64 ", \"removed_bytes\": %" PRIu64 ", \"busy\": %" PRIu64
               ", \"tmp_removed\": %" PRIu64 ", \"bytes\": %" PRIu64 "}\n",
               r.removed, r.removed_bytes, r.busy, r.tmp_removed, r.bytes_after);
        return CLI_EXIT_OK;
    }
    printf("removed %" PRIu64 " entr%s (%s)", r.removed, r.removed == 1 ? "y" : "ies",
           human_size(r.removed_bytes, a, sizeof a));
    if (r.busy)
        printf(", skipped %" PRIu64 " in use", r.busy);
    if (r.tmp_removed)
        printf(", removed %" PRIu64 " leftover temporary director%s", r.tmp_removed,
               r.tmp_removed == 1 ? "y" : "ies");
    printf("; the cache now holds %s\n", human_size(r.bytes_after, b, sizeof b));
    return CLI_EXIT_OK;
}

/* ---- main --------------------------------------------------------------- */

typedef struct cache_args {
    const char *verb, *readonly;
    int json, repair, remote, all;
    uint64_t max;
} cache_args;

/* --readonly DIRS / --max-size SIZE (or =VALUE): 1 consumed, 0 not one of
 * them, else CLI_EXIT_USAGE (reported). */
static int cache_value_option(int argc, char **argv, int *i, cache_args *ca)
{
    const char *a = argv[*i - 1], *v;
    int ro = !strcmp(a, "--readonly") || !strncmp(a, "--readonly=", 11);
    if (!ro && strcmp(a, "--max-size") != 0 && strncmp(a, "--max-size=", 11) != 0)
        return 0;
    v = a[10] == '=' ? a + 11 : *i < argc ? argv[(*i)++] : NULL;
    if (!v)
        return cmd_usage("%s needs a value", a);
    if (ro)
        ca->readonly = v;
    else if (opjit_parse_size(v, &ca->max) != OPJIT_OK)
        return cmd_usage("'%s' is not a size (like 100M or 2G)", v);
    return 1;
}

/* argv into ca: -1 to go on, else the exit status to end with. */
static int parse_cache_args(int argc, char **argv, cache_args *ca)
{
    for (int i = 1; i < argc;) {
        int r = cli_common_option(argc, argv, &i);
        if (r == CLI_EXIT_USAGE)
            return r;
        if (r)
            continue;
        const char *a = argv[i++];
        if (cli_is_help(a)) {
            printf("%s\ncommon options:\n%s", cache_help, cli_common_help);
            return CLI_EXIT_OK;
        } else if (!strcmp(a, "--json")) {
            ca->json = 1;
        } else if (!strcmp(a, "--all")) {
            ca->all = 1;
        } else if (!strcmp(a, "--repair")) {
            ca->repair = 1;
        } else if (!strcmp(a, "--remote")) {
            ca->remote = 1;
        } else if ((r = cache_value_option(argc, argv, &i, ca)) != 0) {
            if (r != 1)
                return r;
        } else if (a[0] == '-') {
            return cmd_usage("unknown option '%s'", a);
        } else if (!ca->verb) {
            ca->verb = a;
        } else {
            return cmd_usage("unexpected argument '%s'", a);
        }
    }
    return -1;
}

/* The verb's index into *v: -1 to go on, else the exit status of a usage
 * error (reported). */
static int check_verb(const cache_args *ca, int *v)
{
    static const char *const verbs[] = {"ls", "info", "verify", "prune", "clear"};
    int n = (int)(sizeof verbs / sizeof verbs[0]);
    if (!ca->verb) {
        fputs(cache_help, stderr);
        return CLI_EXIT_USAGE;
    }
    for (*v = 0; *v < n && strcmp(ca->verb, verbs[*v]); ++*v)
        ;
    if (*v == n)
        return cmd_usage("unknown command '%s'", ca->verb);
    if (ca->max && *v != 3)
        return cmd_usage("--max-size is for prune, not %s", ca->verb);
    if (ca->repair && *v != 2)
        return cmd_usage("--repair is for verify, not %s", ca->verb);
    if (ca->all && *v != 0)
        return cmd_usage("--all is for ls, not %s", ca->verb);
    if (ca->remote && *v > 1)
        return cmd_usage("--remote is for ls and info, not %s", ca->verb);
    return -1;
}

int cmd_cache(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "why")) { /* its own arguments: tools/cmd_why.c */
            memmove(argv + i, argv + i + 1, (size_t)(argc - i) * sizeof *argv);
            return cmd_cache_why(argc - 1, argv);
        }
    cache_args ca = {0};
    int v, rc = parse_cache_args(argc, argv, &ca);
    if (rc >= 0 || (rc = check_verb(&ca, &v)) >= 0)
        return rc;
    /* A runtime for its cache only: no optimizing compiler is looked for. */
    opjit_config cfg;
    opjit_runtime *rt;
    cli_config(&cfg);
    cfg.tiering = 0;
    if (ca.readonly)
        cfg.readonly_caches = ca.readonly;
    if (cli_create_with(&cfg, &rt) != CLI_EXIT_OK)
        return CLI_EXIT_FAIL;
    switch (v) {
    case 0: rc = cmd_ls(rt, ca.json, ca.remote, ca.all); break;
    case 1: rc = ca.remote ? cmd_remote_info(rt, ca.json) : cmd_info(rt, ca.json); break;
    case 2: rc = cmd_verify(rt, ca.json, ca.repair); break;
    default: rc = cmd_prune(rt, ca.json, v == 4, ca.max); break;
    }
    opjit_destroy(rt);
    return rc;
}
